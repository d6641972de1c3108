"""Which windows a shared buffer's read draws: :class:`ReadChoice`, the part of
:class:`~replaybuffer.distributed.SharedReplayBuffer` that picks the
:class:`~replaybuffer.distributed.shared.windows.WindowChoice` of each read (episodes,
a ``Queue``'s unread windows, the rows since a clear, or the sampler's own draw), and
the ``Queue`` limiter's counts.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

from replaybuffer.distributed.shared.admission import SharedAdmission
from replaybuffer.distributed.shared.episodes import EpisodeWindows
from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.priorities import SharedPriorities
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.queue import QueueWindows
from replaybuffer.distributed.shared.read_pins import ReadPins
from replaybuffer.distributed.shared.row_marks import DROPPED, RowMarks
from replaybuffer.distributed.shared.windows import HeldWindows, WindowChoice
from replaybuffer.rate_limiter import Queue, RateLimiter
from replaybuffer.storage.shared_storage import SharedStorage


class ReadChoice:
    """The window choice of each read, and the ``Queue`` limiter's counts."""

    _episodes: EpisodeWindows | None
    _queue: QueueWindows | None
    _held_windows: HeldWindows
    _marks: RowMarks
    _episode_leaf: int | None
    _limiter: RateLimiter | None

    def _wire_choices(self, layout: SharedLayout, marks: RowMarks, storage: SharedStorage,
                      lock: ProcessLock, priorities: SharedPriorities | None,
                      pins: ReadPins | None, admission: SharedAdmission | None) -> None:
        """Make the window choices of this buffer's reads (at mapping); ``pins`` and
        ``admission``: a ``Queue`` buffer's."""
        rows, length = len(layout.next_id), len(layout.version) // len(layout.next_id)
        self._held_windows = HeldWindows(layout, marks, priorities)
        if priorities is not None:  # ids below a floor were cleared: not updated
            priorities.floor = marks.floor
        self._episodes = None if self._episode_leaf is None else EpisodeWindows(
            layout, marks, lock, storage.arrays[self._episode_leaf], self._episode_leaf,
            rows, length, priorities)
        self._queue = None
        if isinstance(self._limiter, Queue):
            assert pins is not None and admission is not None
            self._queue = QueueWindows(layout, marks, lock, pins,
                                       lambda n: admission.count_more(False, n))

    def _reading(self, choice: WindowChoice | None) -> ContextManager[None]:
        """The context of a read drawing from ``choice``: a ``Queue``'s pins its
        claimed windows while they are copied (:mod:`.read_pins`)."""
        if self._queue is not None and choice is self._queue:
            return self._queue.reading()
        return nullcontext()

    def _window_choice(self, within_episodes: bool) -> WindowChoice | None:
        """The windows a read draws from (:mod:`.windows`); ``None``: any window below
        a row's head, the sampler's own draw."""
        if within_episodes:
            if self._episodes is None:
                raise ValueError("within_episodes=True needs a buffer built with "
                                 "track_episodes=True (SharedReplayBuffer was not)")
            if self._queue is not None:
                raise ValueError("within_episodes is not supported by a Queue limiter's "
                                 "first-in-first-out reads")
            return self._episodes
        if self._queue is not None:
            return self._queue
        return self._held_windows if self._marks.cleared else None

    @property
    def dropped(self) -> int:
        """(``Queue`` limiter) Steps overwritten before any read returned them."""
        return int(self._marks.counts[DROPPED])

    def unread(self, num_steps: int = 1) -> int:
        """(``Queue`` limiter) Windows of ``num_steps`` waiting to be read.

        Raises:
            ValueError: the buffer has no ``Queue`` limiter.
        """
        if self._queue is None:
            raise ValueError("unread: reads consume only with a Queue rate limiter")
        return self._queue.unread(num_steps)
