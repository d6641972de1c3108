"""The ``Queue`` limiter on a shared buffer: reads consume, first in, first out, over
every process.

With a :class:`~replaybuffer.Queue` limiter a read returns the oldest unread windows,
each once, whichever process reads (as :class:`~replaybuffer.FIFOReplayBuffer` reads
its ring): in order of start id, then row; a row's next window starts ``num_steps``
after the one read, so every step is read once. The rows' read cursors are shared
(:class:`~replaybuffer.distributed.shared.row_marks.RowMarks`) and claimed under the
buffer's lock, so two readers never take the same window. The limiter paces inserts
and reads by the shared counters as any limiter does: inserts wait while ``size``
items are unread, reads wait for unread items.

A claimed window is pinned while it is copied (:mod:`.read_pins`): its row's writer
waits rather than overwrite it, however long the reader is descheduled. Steps
overwritten before they were read anyway (a row's writer lapped its cursor; a window
claimed unpinned, or in the race pins leave open) are skipped and counted
(:attr:`~replaybuffer.distributed.SharedReplayBuffer.dropped`); a claimed window lost
so is replaced by the next unread one, and the replacement is counted as a read by the
rate limiter too, so that its counts keep matching the unread windows (otherwise an
admitted read would later find one window fewer than the limiter promised).
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.read_pins import ReadPins
from replaybuffer.distributed.shared.row_marks import DROPPED, RowMarks
from replaybuffer.distributed.shared.config import SharedConfig
from replaybuffer.errors import EmptyBufferError
from replaybuffer.rate_limiter import Queue, RateLimiter


UNPUBLISHED_WAIT_S = 1.0
"""How long a read waits for unread windows before it raises ``EmptyBufferError``: the
rate limiter counts an insert when it admits it, a moment before the writer publishes
the step, so an admitted read may find the step not there yet."""


class QueueWindows:
    """The oldest unread windows of a shared buffer, claimed as they are drawn (a
    :class:`~replaybuffer.distributed.shared.windows.WindowChoice`).

    Args:
        layout: the buffer's control arrays.
        marks: its row floors and read cursors.
        lock: its process lock (held while cursors are read and moved).
        pins: the pins of windows being copied.
        count_reads: counts ``n`` more reads in the rate limiter (replacements).
    """

    def __init__(self, layout: SharedLayout, marks: RowMarks, lock: ProcessLock,
                 pins: ReadPins, count_reads: Callable[[int], None]):
        self._next_id = layout.next_id
        self._marks = marks
        self._lock = lock
        self._pins = pins
        self._count_reads = count_reads
        self._replacing = False
        self._first_claim = (0, 0)  # (windows, steps) of the read's first claim

    @contextmanager
    def reading(self) -> Iterator[None]:
        """The context of one read (its claims stay pinned until it ends); a claim
        after its first is a replacement of windows lost while copied. A read that
        fails after its first claim consumed its windows all the same: they count as
        read (the caller gives its admitted count back) and as dropped."""
        with self._pins.reading():
            self._replacing = False
            self._first_claim = (0, 0)
            try:
                yield
            except BaseException:
                count, steps = self._first_claim
                if count:
                    with self._lock:
                        self._marks.counts[DROPPED] += count * steps
                    self._count_reads(count)
                raise

    def _unread_from(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Per row (int64 ``[num_rows]`` each): where its next unread window starts (past
        the steps it no longer holds) and how many unread windows of ``steps`` it has."""
        heads = self._next_id.copy()
        start = np.maximum(self._marks.cursor, self._marks.oldest(heads))
        return start, np.maximum((heads - start - steps) // steps + 1, 0)

    def unread(self, num_steps: int = 1) -> int:
        """Windows of ``num_steps`` waiting to be read, over every row."""
        with self._lock:
            return int(self._unread_from(num_steps)[1].sum())

    def positions(self, count: int, steps: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Claim the ``count`` oldest unread windows: their rows, start ids and
        probabilities (1: nothing is random).

        Raises:
            EmptyBufferError: fewer than ``count`` are unread after
                :data:`UNPUBLISHED_WAIT_S` (nothing is claimed).
        """
        deadline, pause = time.monotonic() + UNPUBLISHED_WAIT_S, 50e-6
        while True:
            with self._lock:
                start, windows = self._unread_from(steps)
                available = int(windows.sum())
                if available >= count:
                    return self._claim(start, windows, count, steps)
            if time.monotonic() >= deadline:
                raise EmptyBufferError(
                    f"get_next: {available} unread window(s) of num_steps={steps}, asked "
                    f"for {count} (a Queue limiter's reads consume). Make sure to add "
                    "items before sampling the buffer.")
            time.sleep(pause)
            pause = min(2 * pause, 2e-3)

    def _claim(self, start: np.ndarray, windows: np.ndarray, count: int, steps: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Claim the ``count`` oldest of the unread windows (``start``, ``windows``: per
        row, from :meth:`_unread_from`); the lock held."""
        marks = self._marks
        marks.counts[DROPPED] += int(np.maximum(start - marks.cursor, 0).sum())
        if self._replacing:  # the read's windows lost while copied: dropped, and read
            marks.counts[DROPPED] += count * steps
            self._count_reads(count)
        else:
            self._first_claim = (count, steps)
        self._replacing = True
        # Each row's first min(windows, count) windows; the count oldest of them.
        nth = np.arange(min(count, int(windows.max())), dtype=np.int64)
        candidate = nth < windows[:, None]
        rows = np.nonzero(candidate)[0].astype(np.int64)
        starts = (start[:, None] + nth * steps)[candidate]
        order = np.lexsort((rows, starts))[:count]
        rows, starts = rows[order], starts[order]
        marks.cursor[:] = start
        np.maximum.at(marks.cursor, rows, starts + steps)
        claimed = np.zeros(len(start), bool)
        claimed[rows] = True
        self._pins.pin(claimed, start)  # a row's claimed windows begin at its start
        return rows, starts, np.ones(count)

    def keeps(self, leaves: list[np.ndarray]) -> np.ndarray | None:
        return None


def config_with_queue(data_spec: Any, num_rows: int, max_length: int, prioritized: bool,
                      alpha: float, beta: float, rate_limiter: RateLimiter | None,
                      path: str | os.PathLike[str] | None, seed: int | None,
                      frames: tuple[str | None, int, int] = (None, 0, 16)
                      ) -> tuple[SharedConfig, bool]:
    """:meth:`SharedConfig.checked`, which refuses a ``Queue``, taking one: a Queue's
    unread items must fit in the buffer (``size <= num_rows * max_length``).

    Raises:
        ValueError: what ``SharedConfig.checked`` raises, or a ``Queue`` larger than
            the buffer.
    """
    if not isinstance(rate_limiter, Queue):
        return SharedConfig.checked(data_spec, num_rows, max_length, prioritized, alpha,
                                    beta, rate_limiter, path, seed, frames)
    config, temporary = SharedConfig.checked(data_spec, num_rows, max_length, prioritized,
                                             alpha, beta, None, path, seed, frames)
    capacity = config.num_rows * config.max_length
    if rate_limiter.max_diff > capacity:
        if temporary:
            os.rmdir(config.path)
        raise ValueError(f"a Queue of size {rate_limiter.max_diff:g} needs a capacity of "
                         f"at least that; the buffer holds {capacity}")
    return dataclasses.replace(config, rate_limiter=rate_limiter), temporary
