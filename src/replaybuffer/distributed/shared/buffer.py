"""One buffer, many processes: writers and samplers on one machine, data in shared memory.

:class:`SharedReplayBuffer` keeps its steps in ``.npy`` files mapped by every process
that uses it (:class:`~replaybuffer.storage.shared_storage.SharedStorage`, by default
under ``/dev/shm``, so in RAM). Hand the buffer to a ``multiprocessing.Process`` (it
pickles as its directory and spec, never its data) and call ``add_batch``/``extend``/
``get_next``/``as_dataset``/``update_priorities`` there: batches go straight into and
out of the shared arrays, never through a pipe.

Layout and writers. The buffer has ``num_rows`` rows of ``max_length`` steps, as
TF-Agents' buffers do. A process's first ``add_batch`` of ``B`` items claims ``B``
adjacent free rows for that process (an env worker with ``B`` envs owns ``B`` rows);
each row has one writer, so writes need no lock against each other (threads of one
process share its rows and write one step at a time). Rows of a process that ended
(however it ended) are free again, with their steps, for the next claim.

Space. Creation allocates every file (``posix_fallocate``): a buffer larger than its
file system (a container's 64 MB ``/dev/shm``) is refused with
:class:`~replaybuffer.storage.shared_storage.StorageSpaceError`, not met later as a
writer's ``SIGBUS``. A creation that fails removes what it made; a temporary directory
goes with :meth:`close`, with the object, or when the process that made it ends (a
``multiprocessing`` child too).

Torn steps. Every position carries a version: ``2 * id + 1`` while step ``id`` is being
written there, ``2 * id + 2`` once written. A reader reads the versions of the positions
it drew, copies the data, reads the versions again, and keeps a sample only when both
reads show exactly the steps it meant (a window's consecutive ids): a step half written,
overwritten while copied, or left half written by a writer that was killed is never
returned; such draws are drawn again. A uniform buffer's writers and samplers take no
lock for this: the version stores and loads are ordered by :mod:`.memory_fences`
(nothing to issue on x86-64, a full fence elsewhere), as :mod:`.writer` and
:mod:`.sampling` argue. The lock (an ``flock``, released by the kernel when a holder
dies) is taken to claim rows, by calls the rate limiter holds back, and for the
priority tree.

Priorities (``prioritized=True``): a flat sum tree of ``priority ** alpha`` in shared
memory (:mod:`replaybuffer.sampling.flat_tree`), written under the lock, each change
marked first so that the next holder repairs what a killed one left
(:mod:`.priorities`). A position's priority is 0 while it is rewritten, so it is not
drawn; then the largest priority seen. ``update_priorities`` ignores ids whose step was
overwritten or cleared since.

Rate limiters: any :class:`~replaybuffer.RateLimiter`; its counters live in shared
memory, so every writer and sampler is paced by the same totals. A held-back call polls
(50 us, doubling to 2 ms) until it may go, ``timeout`` passes, or, with
``block=False``, at once. With a :class:`~replaybuffer.Queue` reads consume: each
window is returned once, oldest first, over every process (:mod:`.queue`).

As the local buffers: ``track_episodes=True`` and ``within_episodes=True`` reads
(:mod:`.episodes`), :meth:`clear` while writers go on (:mod:`.clearing`), checkpoints
in the local buffers' format while writers go on (:meth:`save`, :meth:`load`;
:mod:`.checkpoint`), frame dedup (``frame_stack``: each frame stored once, stacks
rebuilt on read; :mod:`.frame_ring`). n-step transitions are the local buffers' alone
(see the docs' shared-memory page).

The parts live beside this module: :mod:`.layout` (the shared control block),
:mod:`.row_marks` (row floors and read cursors), :mod:`.process_lock`, :mod:`.inserts`
(an insert's order: items checked, rows claimed, admitted, written), :mod:`.writer`
(claiming rows, publishing steps), :mod:`.sampling` (whole windows) and
:mod:`.windows` (which windows), :mod:`.priorities` (the shared sum tree) and
:mod:`.admission` (the rate limiter on shared counters).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from replaybuffer import nest
from replaybuffer.arguments import check_timeout, positive_or_none
from replaybuffer.buffers.base import package
from replaybuffer.distributed.errors import BufferClosedError
from replaybuffer.distributed.shared.admission import Pacing, SharedAdmission
from replaybuffer.distributed.shared.checkpoint import SharedCheckpoints
from replaybuffer.distributed.shared.clearing import Clearing
from replaybuffer.distributed.shared.config import SharedConfig
from replaybuffer.distributed.shared.counters import ProcessCounters
from replaybuffer.distributed.shared.episodes import step_type_leaf
from replaybuffer.distributed.shared.frame_ring import frame_storage
from replaybuffer.distributed.shared.inserts import Inserting
from replaybuffer.distributed.shared.items import ItemChecker
from replaybuffer.distributed.shared.iteration import SharedIteration
from replaybuffer.distributed.shared.layout import CLOSED, SharedLayout
from replaybuffer.distributed.shared.local_only import refuse_local_only
from replaybuffer.distributed.shared.priorities import SharedPriorities
from replaybuffer.distributed.shared.queue import config_with_queue
from replaybuffer.distributed.shared.row_marks import RowMarks
from replaybuffer.distributed.shared.process_lock import (ProcessLock, directory_remover,
                                                            removed_on_failure)
from replaybuffer.distributed.shared.sampling import SharedSampler
from replaybuffer.distributed.shared.read_choice import ReadChoice
from replaybuffer.distributed.shared.read_pins import ReadPins
from replaybuffer.distributed.shared.writer import SharedWriter
from replaybuffer.errors import EmptyBufferError
from replaybuffer.protocols import BufferInfo
from replaybuffer.rate_limiter import Queue, RateLimiter
from replaybuffer.storage.base import identity

if TYPE_CHECKING:
    from replaybuffer.protocols import Buffer, PrioritizedBuffer

__all__ = ["SharedReplayBuffer", "BufferClosedError"]


class SharedReplayBuffer(Inserting, Clearing, SharedCheckpoints, ReadChoice, SharedIteration,
                         Pacing):
    """A replay buffer that processes on one machine write to and sample from at once.

    Args:
        data_spec: a nest of :class:`ArraySpec` (or anything :func:`as_data_spec`
            takes) describing one item.
        num_rows: rows of the ring; each writing process claims as many as its
            ``add_batch`` has items (so the rows bound the total envs writing).
        max_length: steps per row. Capacity is ``num_rows * max_length`` items.
        prioritized: sample in proportion to ``priority ** alpha`` (see the module
            docstring); ``update_priorities`` sets them.
        alpha, beta: the prioritization and importance-sampling exponents.
        rate_limiter: paces every process's inserts and samples; with a ``Queue``,
            reads consume (each window once, oldest first).
        path: a new or empty directory for the files (default: a fresh one under
            ``/dev/shm``, removed by :meth:`close`; a given path is left in place).
        seed: seeds the sampling generators: process ``k`` to attach (the creator is
            0) draws from ``SeedSequence(seed, spawn_key=(k,))``.
        track_episodes: allow ``within_episodes=True`` reads (the spec needs a
            top-level ``step_type`` leaf).
        frame_stack, stack_axis, side_frames: store the named top-level stacked leaf
            one frame per step, as the local buffers do; ``side_frames`` per row keep
            stacks that neither slide nor are padding (:mod:`.frame_ring`).
        n_step: refused (:mod:`.local_only`): the local buffers' alone.

    The object pickles as a handle: unpickled in another process (a
    ``multiprocessing.Process`` argument) it maps the same files.

    Raises:
        ValueError: a bad size, exponent or limiter (a ``min_size_to_sample`` or a
            ``Queue`` size above the capacity), or a path in use.
        SpecError: ``track_episodes`` without a ``step_type`` leaf; a ``frame_stack``
            that names no top-level leaf, or a ``stack_axis`` outside its shape.
        NotSupportedError: ``n_step`` given.
        StorageSpaceError: (an ``OSError``) ``path``'s file system cannot hold the
            buffer. A creation that fails removes what it made.
    """

    def __init__(self, data_spec: Any, num_rows: int, max_length: int, *,
                 prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
                 rate_limiter: RateLimiter | None = None,
                 path: str | os.PathLike[str] | None = None, seed: int | None = None,
                 track_episodes: bool = False, frame_stack: str | None = None,
                 stack_axis: int = 0, side_frames: int = 16, n_step: int | None = None):
        refuse_local_only(type(self), n_step)
        made_directory = path is None or not Path(path).exists()
        self._config, temporary = config_with_queue(
            data_spec, num_rows, max_length, prioritized, alpha, beta, rate_limiter, path,
            seed, (frame_stack, stack_axis, side_frames))
        self._track_episodes = bool(track_episodes)
        with removed_on_failure(self._config.path, made_directory):  # no space, memory
            self._map(create=True)
        self._creator = os.getpid()
        self._remover = directory_remover(self, self._config.path) if temporary else None

    # ----------------------------------------------------------------- mapping
    def __getstate__(self) -> tuple[SharedConfig, bool]:
        """A handle: the configuration (directory, spec, sizes) and whether episodes
        are tracked, never the data."""
        return self._config, self._track_episodes

    def __setstate__(self, state: tuple[SharedConfig, bool]) -> None:
        """Unpickled (in another process): map the files the creator made."""
        self._config, self._track_episodes = state
        self._creator, self._remover = -1, None
        self._map(create=False)

    def _map(self, create: bool) -> None:
        """Make (``create``) or attach the files, and wire the parts over them."""
        config = self._config
        self._data_spec = config.data_spec
        specs, self._structure = nest.flatten(self._data_spec)
        rows, length = self._rows_total, self._length = config.num_rows, config.max_length
        self.path = Path(config.path)
        self._storage, self._frames = frame_storage(
            specs, config.frames, rows, length, self.path, create)
        paths = nest.leaf_paths(self._data_spec)
        self._episode_leaf = step_type_leaf(paths) if self._track_episodes else None
        self._lock = ProcessLock(self.path / "lock")
        self._marks = marks = RowMarks(self._storage, rows, length)  # before the layout
        pins = ReadPins(self._storage, rows, self._lock) \
            if isinstance(config.rate_limiter, Queue) else None  # before the layout too
        self._layout = layout = SharedLayout(self._storage, rows, length,
                                             config.prioritized, create)
        if self._frames is not None:  # the files are reserved now: attachers check it
            self._frames.publish_config()
        self._next_id, self._control = layout.next_id, layout.control
        self._priorities = SharedPriorities(layout, self._lock, rows, length,
                                            config.alpha) if config.prioritized else None
        self._sampler = SharedSampler(layout, self._storage, self._lock, rows, length,
                                      self._priorities, config.beta, config.seed, self._frames)
        self._limiter: RateLimiter | None = config.rate_limiter
        self._admission = None if self._limiter is None else SharedAdmission(
            self._limiter, self._control, self._lock, self.__len__, self._items_counted,
            self._check_open,
            ProcessCounters(layout.counters, layout.counter_owners, self._lock), rows * length)
        self._writer = SharedWriter(layout, self._storage, self._lock, rows, length,
                                    self._priorities, self._admission, pins, self._frames)
        self._items = ItemChecker(self._data_spec)
        self._insert_admission = self._admission if self._admission is not None and \
            self._admission.admits_inserts else None
        self._wire_choices(layout, marks, self._storage, self._lock, self._priorities,
                           pins, self._admission)
        self._sampler.process_rng()  # the creator is process 0 of the seed

    # -------------------------------------------------------------- properties
    @property
    def data_spec(self) -> Any:
        """The nest of :class:`ArraySpec` describing one item (no batch dimension)."""
        return self._data_spec

    @property
    def num_rows(self) -> int:
        return self._rows_total

    @property
    def max_length(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        """``num_rows * max_length`` items."""
        return self._rows_total * self._length

    @property
    def rate_limiter(self) -> RateLimiter | None:
        return self._limiter

    @property
    def layout(self) -> SharedLayout:
        """The shared control block (versions, row heads, owners, counters, the
        priority tree), for tools and tests that inspect it; writing to it bypasses
        the buffer's protocol."""
        return self._layout

    @property
    def max_priority(self) -> float:
        """The largest priority seen (``prioritized`` buffers); new steps enter with it."""
        if self._priorities is None:
            raise ValueError("max_priority: the buffer is not prioritized")
        return self._priorities.max_priority

    def __len__(self) -> int:
        """Items a sample can return, exact whatever a killed writer left (see
        :meth:`SharedLayout.held_by_versions` and :meth:`RowMarks.items_held`)."""
        return self._marks.items_held(self._layout.held_by_versions(), self._next_id)

    def _items_counted(self) -> int:
        """:meth:`__len__` by the counts the writers keep (a fifth of its cost): the
        same while the writers live, short after a writer was killed mid-step (the
        limiter's first look; it looks at :meth:`__len__` before holding a sample back)."""
        return self._marks.items_held(self._layout.held, self._next_id)

    def __repr__(self) -> str:
        return (f"SharedReplayBuffer(num_rows={self._rows_total}, "
                f"max_length={self._length}, items={len(self)}, path='{self.path}')")

    # ------------------------------------------------------------------- state
    def _check_open(self) -> None:
        if self._control[CLOSED]:
            raise BufferClosedError(f"the shared buffer in {self.path} was closed by the "
                                    "process that made it")

    # ---------------------------------------------------------------- sampling
    @overload
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None,
                 block: Literal[True] = True) -> tuple[Any, BufferInfo]: ...

    @overload
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None,
                 block: bool = True) -> tuple[Any, BufferInfo] | None: ...

    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None,
                 block: bool = True) -> tuple[Any, BufferInfo] | None:
        """Sample items as :meth:`replaybuffer.ReplayBuffer.get_next` does (same shapes).

        ``BufferInfo.ids`` are item ids (``step * num_rows + row``), unique per step and
        row, for :meth:`update_priorities`; ``probabilities`` are float32 ``[S]``;
        prioritized buffers add ``weights`` (``(P_min / P(i)) ** beta`` over the batch,
        so the batch's largest is 1). A window lies in one row, consecutive steps,
        never across the write head. ``within_episodes=True`` (a buffer built with
        ``track_episodes=True``): never across an episode start either.

        Raises:
            EmptyBufferError: no row holds ``num_steps`` steps (nothing with a positive
                priority, for prioritized buffers).
            RateLimitedError: ``timeout`` passed with the sample held back.
            BufferClosedError: the buffer was closed.
        """
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        return self.draw(sample_batch_size, num_steps, time_stacked,
                         within_episodes=within_episodes, timeout=timeout, block=block)

    @overload
    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: Literal[True] = True) -> tuple[Any, BufferInfo]: ...

    @overload
    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None: ...

    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None:
        """:meth:`get_next` after its argument checks, drawing from ``rng`` (default:
        this process's generator); the :class:`~replaybuffer.protocols.SampleSource`
        seam of dataset streams."""
        if within_episodes:  # refused before anything is counted
            self._window_choice(within_episodes)
        self._check_open()
        check_timeout(timeout)
        count = sample_batch_size or 1
        steps = num_steps or 1
        if steps > self._length:
            raise EmptyBufferError(f"num_steps={steps} is longer than a row "
                                   f"(max_length={self._length})")
        if self._limiter is not None and not self._admit(False, count, timeout, block):
            return None
        rng = self._sampler.process_rng() if rng is None else rng
        choice = self._window_choice(within_episodes)  # after the wait: a clear since
        with nullcontext() if self._admission is None else \
                self._admission.given_back_on_error(False, count), \
                self._reading(choice):  # a failed draw never counts; a Queue's pins
            leaves, ids, info = self._sampler.draw(
                count, steps, rng, choice, lambda: self._window_choice(within_episodes))
        if num_steps is None:
            leaves = [leaf[:, 0] for leaf in leaves]
            ids = ids[:, 0]
        return package(self._structure, identity, leaves, ids, info, sample_batch_size,
                       num_steps, time_stacked)

    # -------------------------------------------------------------- priorities
    def update_priorities(self, ids: Any, priorities: Any) -> int:
        """Set the priorities of sampled items (``BufferInfo.ids``: ``[S]``, or
        ``[S, T]`` windows, whose first step carries the priority).

        Returns:
            How many were applied: ids of steps overwritten since they were drawn are
            ignored.

        Raises:
            ValueError: not prioritized; mismatched shapes; a NaN, infinite or
                negative priority; an id no sample could have returned. Nothing is
                changed then.
        """
        if self._priorities is None:
            raise ValueError("update_priorities: the buffer was built without "
                             "prioritized=True")
        self._check_open()
        return self._priorities.update(ids, priorities)

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Give up this process's rows. In the process that made the buffer, also mark
        it closed for every process and remove its temporary directory."""
        if not self._control[CLOSED]:
            self._writer.release_rows()
        if self._creator == os.getpid():
            self._control[CLOSED] = 1
            if self._remover is not None:
                self._remover()
        self._lock.close()

    def __enter__(self) -> "SharedReplayBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


if TYPE_CHECKING:  # the buffer surface, checked by mypy
    def _is_a_buffer(buffer: SharedReplayBuffer) -> Buffer:
        return buffer

    def _is_a_prioritized_buffer(buffer: SharedReplayBuffer) -> PrioritizedBuffer:
        return buffer
