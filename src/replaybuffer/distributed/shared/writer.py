"""The write path of a shared buffer: claiming rows, and publishing steps under the
version protocol, with no lock on a uniform buffer's steps.

A process's first write of ``B`` items claims ``B`` adjacent free rows (an env worker
with ``B`` envs owns ``B`` rows) under the buffer's lock; each row has one writer, so
writes need no lock against each other. Rows of a process that ended (however it ended)
are free again, with their steps, for the next claim (which rows, and what a claim
repairs of a killed writer's rows: :mod:`.row_claims`).

A step of a uniform buffer, at positions ``span`` of the rows, is written with no lock
(with a ``Queue`` limiter, after waiting for any read still copying a window the step
overwrites: :mod:`.read_pins`):

1. ``held`` of the rows drops by one when the step overwrites the row's oldest;
2. ``version[span] = 2 * id + 1`` (odd: being written);
3. order fence: the odd versions become visible before any of the data;
4. the data (with frame dedup, the step's ring and side frames too: :mod:`.frame_ring`,
   whose references are computed before 1., so that a step it refuses writes nothing);
5. order fence: all the data becomes visible before the even versions;
6. ``version[span] = 2 * id + 2`` (published), then the row heads ``next_id`` and
   ``held``;
7. a rate limiter that counts inserts at the commit: this process's counter slot.

A uniform buffer's step without frames or a ``Queue`` (the usual actor's) is written by
:meth:`SharedWriter._write_plain_step`: these stores in this order, with fewer Python
operations (one row's through memoryviews).

A reader (:mod:`.sampling`) loads the versions, fences, copies the data, fences and
loads the versions again, keeping a step only if both loads show ``2 * id + 2``: if it
copied any byte of a later write to the position, its second load sees that write's odd
version or later (fences 3 and the reader's second), and if its first load saw
``2 * id + 2`` it sees every byte of step ``id`` (fence 5 and the reader's first). The
heads are published after the versions; a reader that sees a head before the version of
its newest step just redraws that window. The fences are free on x86 (whose stores and
loads keep program order) and a ``seq_cst`` fence elsewhere (:mod:`.memory_fences`).

A prioritized ``add_batch`` step takes the tree's lock once: 1. to 5. as above, with no
lock, then its leaves set to the entering priority with the even versions and the heads,
in one section (:meth:`~.priorities.SharedPriorities.changing`, which repairs what a
killed holder left). While it is written, its positions keep the old step's leaves; a
draw, under the lock, zeroes the leaves of odd versions at the rows' heads before it
draws (:meth:`~.priorities.SharedPriorities.draw`), so it never draws the step being
rewritten and its probabilities are over the steps drawable; a draw that read a version
just before the odd store copies a step the seqlock check then rejects, as for a uniform
step. A whole ``extend`` of up to ``max_length`` steps takes one section too: its
odd versions are a run from the rows' heads, which a draw hides whole
(:mod:`.rewrite_runs`), and it is published together (:mod:`.step_blocks`). A
prioritized ``add_batch`` step without frames or a ``Queue`` is written by
:class:`~.prioritized_steps.PrioritizedSteps`: the same stores and section, with fewer
Python operations.

Threads. The rows belong to a process, so every thread of it writes the same rows: a
per-process thread lock spans a claim, and a step from reading its id off the row head
to publishing it (two threads reading one head would write one step twice, mixed, and
lose an add). It is uncontended in a process with one writing thread.
"""

from __future__ import annotations

import os
import threading
import weakref
from contextlib import nullcontext
from typing import Any, ContextManager, Iterable, Sequence

import numpy as np

from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.distributed.shared.admission import SharedAdmission
from replaybuffer.distributed.shared.frame_ring import SharedFrameRing
from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.memory_fences import order_fence
from replaybuffer.distributed.shared.prioritized_steps import PrioritizedSteps
from replaybuffer.distributed.shared.priorities import SharedPriorities
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.read_pins import ReadPins
from replaybuffer.distributed.shared.row_claims import claim_adjacent_rows
from replaybuffer.distributed.shared.step_blocks import StepBlocks
from replaybuffer.errors import SpecError
from replaybuffer.storage.shared_storage import SharedStorage


class SharedWriter:
    """This process's rows of a shared buffer and the steps it writes to them.

    Args:
        layout: the buffer's control arrays.
        storage: its data.
        lock: its process lock.
        num_rows, max_length: its shape.
        priorities: the prioritized tree (``None``: uniform).
        admission: the rate limiter's admission (``None``: no rate limiter). One that
            admits (and counts) each insert before it is written gets the count of a
            write that fails back, so that an insert that never happened holds no later
            call back, and the size of one that went through (the largest insert); one
            that never holds an insert back counts it at the commit.
        pins: (``Queue`` buffers) windows being read, which a step waits for rather than
            overwrite (:mod:`.read_pins`).
        frames: the frame ring of a stacked leaf (:mod:`.frame_ring`): a step's stacks
            are encoded before step 1 (a full side area raises with nothing written)
            and their frames written with its data (4.).
    """

    def __init__(self, layout: SharedLayout, storage: SharedStorage, lock: ProcessLock,
                 num_rows: int, max_length: int, priorities: SharedPriorities | None,
                 admission: SharedAdmission | None, pins: ReadPins | None = None,
                 frames: SharedFrameRing | None = None):
        self._layout = layout
        self._version, self._next_id = layout.version, layout.next_id
        self._owner, self._control = layout.owner, layout.control
        self._held = layout.held
        self._priorities = priorities
        self._pins = pins
        self._frames = frames
        self._storage = storage
        self._lock = lock
        self._rows_total, self._length = num_rows, max_length
        admits = admission is not None and admission.admits_inserts
        self._admission = admission if admits else None  # gives failed writes back
        self._commits = None if admits else admission  # counts inserts at the commit
        # Plain steps (:meth:`_write_plain_step`): no priorities, pins or frames.
        self._plain = priorities is None and pins is None and frames is None
        # Memoryviews of the shared int64 arrays, for the plain step's scalar loads and
        # stores (each one 8-byte access, as numpy's: see :mod:`.memory_fences`).
        self._head_at, self._held_at = layout.next_id.data, layout.held.data
        self._version_at = layout.version.data
        self._blocks = None if priorities is None else StepBlocks(
            layout, storage, priorities, num_rows, max_length, pins, self._commits)
        # A prioritized step without frames or a Queue: :mod:`.prioritized_steps`.
        self._quick = None if priorities is None or pins is not None or frames is not None \
            else PrioritizedSteps(layout, storage, priorities, lock, num_rows, max_length,
                                  self._commits)
        self._forget_rows()
        self._threads = threading.Lock()  # this process's writing threads, one at a time
        mine = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(mine))

    def _forget_rows(self) -> None:
        """Own no rows (yet, or any more, or in a forked child)."""
        self._rows: tuple[int, int] | None = None  # (first row, count) this process owns
        self._owner_pid = -1
        # Views of this process's rows' heads and counts (a view's fill() is 4x
        # faster than a slice store on the write path).
        self._my_heads = self._my_held = self._held[:0]
        # Per row, the run of oldest steps a killed writer left torn, while some row's
        # is longer than one step (a prioritized block, step_blocks); None otherwise.
        # ``held`` is then kept by increments, exact, rather than by fills.
        self._torn: np.ndarray | None = None
        # The storage's fused check-and-write for batches of this process's row count
        # (converted leaves always pass its check: 2-3 us where storage.write's loop
        # of field assignments takes 4-5).
        self._write_exact: Any = None

    def forked(self) -> None:
        """In a forked child: own none of the parent's rows (so a claim need not ask
        for the pid on every write), and a fresh thread lock (the parent's may be
        held by a thread the child does not have)."""
        self._forget_rows()
        self._threads = threading.Lock()

    @property
    def rows(self) -> tuple[int, int] | None:
        """``(first row, count)`` this process writes to, once it has claimed them."""
        return self._rows if self._owner_pid == os.getpid() else None

    def claim_rows(self, count: int, method: str = "add_batch") -> tuple[int, int]:
        """The rows this process writes, ``(first, count)`` (see
        :meth:`~replaybuffer.distributed.SharedReplayBuffer.claim_rows`); ``method``
        names the caller in the error of a zero-item batch."""
        rows = self._rows
        if rows is not None:  # a forked child forgets its parent's (forked())
            return rows if rows[1] == count else self._same_rows(count)
        with self._threads:  # one thread claims; the others then find its rows
            if self._rows is not None:
                return self._same_rows(count)
            return self._claim_new_rows(count, method, os.getpid())

    def _same_rows(self, count: int) -> tuple[int, int]:
        """This process's rows, which a batch of ``count`` items must match."""
        assert self._rows is not None
        first, owned = self._rows
        if owned != count:
            raise SpecError(f"add_batch: this process writes {owned} rows "
                            f"({first}..{first + owned - 1}); got a batch of {count}")
        return self._rows

    def _claim_new_rows(self, count: int, method: str, pid: int) -> tuple[int, int]:
        """Claim ``count`` adjacent free rows for process ``pid`` (see :meth:`claim_rows`)."""
        if count < 1:  # claiming 0 rows would pin this process to batches of 0
            raise SpecError(f"{method}: a batch of {count} items; expected at least 1 "
                            "(one per row this process writes)")
        if count > self._rows_total:
            raise SpecError(f"add_batch: a batch of {count} needs {count} rows; the buffer "
                            f"has {self._rows_total}")
        with self._lock:
            first = claim_adjacent_rows(self._layout, self._priorities, count, pid)
            self._rows, self._owner_pid = (first, count), pid
            block = slice(first, first + count)
            self._my_heads, self._my_held = self._next_id[block], self._held[block]
            self._write_exact = self._storage.exact_writer((count,))
            self._torn = self._torn_run()
            if self._frames is not None:  # a previous writer's state is not ours
                self._frames.forget()
            return self._rows

    def _torn_run(self) -> np.ndarray | None:
        """Per row of this process, the run of oldest steps no longer whole (the
        ``held`` counts are exact: just recounted, or kept so), when some row's is
        longer than one step; ``None`` otherwise (a fill of ``held`` is then exact)."""
        run: np.ndarray = np.minimum(self._my_heads, self._length) - self._my_held
        return run if len(run) and int(run.max()) > 1 else None

    def release_rows(self) -> None:
        """Give up this process's rows (they keep their steps for the next claim)."""
        if self._owner_pid == os.getpid() and self._rows is not None:
            with self._threads:
                first, count = self._rows
                with self._lock:
                    mine = self._owner[first:first + count] == os.getpid()
                    self._owner[first:first + count][mine] = 0
                self._forget_rows()

    def write_step(self, first: int, count: int, arrays: Sequence[Any]) -> None:
        """Write one step to rows ``first .. first + count - 1`` under the version
        protocol: ``arrays``, the storage's converted leaves ``[count, *shape]``."""
        if self._admission is None:  # no give-back to arm: the cheaper context
            with self._threads:
                if self._torn is not None:
                    self._write_step(first, count, arrays)
                elif self._plain:
                    self._write_plain_step(first, count, arrays)
                elif self._quick is not None:
                    self._quick.write(first, count, arrays, self._write_exact,
                                      self._my_heads, self._my_held)
                else:
                    self._write_step(first, count, arrays)
            return
        with self._threads, self._given_back(count):
            if self._torn is not None:
                self._write_step(first, count, arrays)
            elif self._plain:
                self._write_plain_step(first, count, arrays)
            elif self._quick is not None:
                self._quick.write(first, count, arrays, self._write_exact,
                                  self._my_heads, self._my_held)
            else:
                self._write_step(first, count, arrays)

    def _write_plain_step(self, first: int, count: int, arrays: Sequence[Any]) -> None:
        """:meth:`_write_step` of a plain step (a uniform buffer's, without frames or a
        ``Queue``, its rows' oldest steps whole), the thread lock held: the same stores
        in the same order (the module's 1. to 7.) with fewer Python operations, as an
        actor's ``add_batch`` of one step is the hottest write."""
        length = self._length
        step = self._head_at[first]  # (a memoryview's read: 60 ns less than numpy's)
        start = (step % length) * self._rows_total + first
        one = count == 1  # one row (an actor with one env): memoryview stores, as cheap
        # as a third of a fill; several rows: numpy's slice store and fills
        version: Any = self._version_at if one else self._version
        span: int | slice = start if one else slice(start, start + count)
        if step >= length:  # 1.
            if one:
                self._held_at[first] = length - 1
            else:
                self._my_held.fill(length - 1)
            if ARMED is not None:
                crash_point("shared.write.uncount")
        version[span] = 2 * step + 1  # 2.
        order_fence()  # 3.
        write_exact = self._write_exact  # 4.
        if write_exact is None or not write_exact(start, arrays):
            self._storage.write(start, arrays)
        if ARMED is not None:
            crash_point("shared.write.data")
        order_fence()  # 5.
        version[span] = 2 * step + 2  # 6.
        if ARMED is not None:
            crash_point("shared.write.publish")
        held = step + 1 if step < length else length
        if one:
            self._head_at[first] = step + 1
            self._held_at[first] = held
        else:
            self._my_heads.fill(step + 1)
            self._my_held.fill(held)
        if self._commits is not None:  # 7.
            self._commits.committed(count)

    def write_steps(self, first: int, count: int, steps: Iterable[Sequence[Any]]) -> None:
        """Write consecutive steps (each as :meth:`write_step`'s ``arrays``), with no
        other thread's step between them."""
        steps = list(steps)  # views: the count of steps, for a give-back
        written = 0
        try:
            with self._threads:
                blocks = self._blocks
                if self._frames is not None:  # every step encoded before the first write
                    for encoded, frame_writes in self._encoded(first, count, steps):
                        self._write_step(first, count, encoded, frame_writes)
                        written += 1
                elif blocks is None:
                    for arrays in steps:
                        self._write_step(first, count, arrays)
                        written += 1
                else:  # prioritized: one lock section a block (more than max_length
                    # steps: blocks of max_length, the last max_length steps survive)
                    for at in range(0, len(steps), self._length):
                        try:
                            blocks.write(first, count, steps[at:at + self._length],
                                         self._write_exact, self._my_heads, self._my_held,
                                         self._torn)
                        finally:
                            written += blocks.published
                            self._torn = self._torn_run()
        except BaseException:
            if self._admission is not None:  # the steps not written were never inserted
                self._admission.give_back(True, count * (len(steps) - written))
            raise
        if self._admission is not None:  # went through: the limiter's largest insert
            self._admission.record_largest(True, count * len(steps))

    def _encoded(self, first: int, count: int, steps: list[Sequence[Any]]
                 ) -> list[tuple[list[Any], tuple[Any, ...]]]:
        """``steps`` (of an ``extend``, the thread lock held) with the stacked leaf
        encoded to references, and each step's frame writes: all encoded before any is
        written, so that a step refused for its side frames leaves the buffer unchanged
        (:mod:`.frame_ring`)."""
        frames = self._frames
        assert frames is not None
        step = int(self._next_id[first])
        plan = frames.plan(step, first, count)
        plan.method = "extend"
        encoded = []
        for offset, arrays in enumerate(steps):
            arrays = list(arrays)
            arrays[frames.leaf], writes = frames.encode(step + offset, first,
                                                        arrays[frames.leaf], plan)
            encoded.append((arrays, writes))
        return encoded

    def _given_back(self, n: int) -> ContextManager[None]:
        """The context of an admitted insert of ``n`` items: if it raises, the count
        goes back (no admission: nothing to give back)."""
        if self._admission is None:
            return nullcontext()
        return self._admission.given_back_on_error(True, n)

    def _write_step(self, first: int, count: int, arrays: Sequence[Any],
                    frame_writes: tuple[Any, ...] | None = None) -> None:
        """:meth:`write_step`, the thread lock held (the row head is read here); the
        steps of the protocol are numbered in the module docstring. ``frame_writes``:
        the step's frames, its stacked leaf already encoded (:meth:`_encoded`)."""
        step = int(self._next_id[first])
        frames = self._frames
        if frames is not None and frame_writes is None:  # raises before anything
            arrays = list(arrays)
            leaf = frames.leaf
            arrays[leaf], frame_writes = frames.encode(step, first, arrays[leaf],
                                                       frames.plan(step, first, count))
        start = (step % self._length) * self._rows_total + first
        # One row (an actor with one env): a scalar store, cheaper than a slice's.
        span: int | slice = start if count == 1 else slice(start, start + count)
        # 1. the oldest step goes: uncounted just before it is torn (right before its odd
        # version, never before a wait for the lock: a writer killed while it waited
        # would leave len() short of steps that are still whole and drawable).
        rewrites = step >= self._length
        if rewrites and self._pins is not None:  # a Queue's read copying it: wait
            self._pins.wait_for_readers(first, count, step - self._length)
        if rewrites:
            if self._torn is None:
                self._my_held.fill(self._length - 1)
            else:
                self._count_out()
            if ARMED is not None:
                crash_point("shared.write.uncount")
        # 2. (a prioritized step too: its leaf is hidden by the next draw that finds the
        # odd version, under the tree's lock, SharedPriorities.draw)
        self._version[span] = 2 * step + 1
        order_fence()  # 3.
        write_exact = self._write_exact  # 4.
        if write_exact is None or not write_exact(start, arrays):
            self._storage.write(start, arrays)
        if frames is not None and frame_writes is not None:
            frames.commit(frame_writes)
        if ARMED is not None:
            crash_point("shared.write.data")
        order_fence()  # 5.
        priorities = self._priorities
        if priorities is None:
            self._publish(span, step)
        else:  # the one lock section of a prioritized step
            with priorities.changing(start, count):
                priorities.enter(start, count)
                self._publish(span, step)
        if self._commits is not None:  # 7.
            self._commits.committed(count)

    def _count_out(self) -> None:
        """1.: the rows' oldest steps leave ``held`` (one whole step each; where a
        killed writer left the oldest torn, it was counted out already)."""
        if self._torn is None:
            self._my_held.fill(self._length - 1)
        else:  # a row whose oldest is torn holds fewer already
            np.minimum(self._my_held, self._length - 1, out=self._my_held)

    def _publish(self, span: int | slice, step: int) -> None:
        """6.: the even versions of ``span``, then this process's row heads and counts."""
        self._version[span] = 2 * step + 2
        if ARMED is not None:
            crash_point("shared.write.publish")
        self._my_heads.fill(step + 1)
        if self._torn is None:
            self._my_held.fill(min(step + 1, self._length))
        else:  # one whole step more than after 1.
            self._my_held += 1
            self._torn = self._torn_run()


def _after_fork(writer: "weakref.ref[SharedWriter]") -> None:
    """In a forked child: :meth:`SharedWriter.forked` on ``writer``, if it still exists."""
    alive = writer()
    if alive is not None:
        alive.forked()
