"""The prioritized shared tree: draws in proportion to ``priority ** alpha`` and
priority updates, on the flat sum tree every process maps
(:mod:`replaybuffer.sampling.flat_tree`), read and written under the buffer's lock.

A position's priority is 0 while it is rewritten, so it is not drawn; then the largest
priority seen. An ``add_batch`` step makes its versions odd with no lock and publishes
its leaves in one section (:meth:`SharedPriorities.enter`); the zero in between is set
by the next draw, which under the lock zeroes the leaves of the runs of odd versions
from the rows' heads before it draws (:meth:`SharedPriorities.draw`: one pass over the
heads, as the draw reads them anyway, and a run's versions where a head's is odd:
:mod:`.rewrite_runs`). A block of an ``extend`` marks its ``T`` steps odd and
publishes them in one section the same way (:mod:`.step_blocks`).
``update`` ignores ids whose step was overwritten since they were drawn.

A holder killed midway. Changing the tree takes several stores (leaves, then each level
of ancestors), and a process can be killed between any two of them; the kernel then
releases its ``flock`` and the next process takes it. So every change is bracketed in the
shared ``tree_intent`` record, under the lock: ``TREE_DIRTY`` set (with the span of
positions a writer is hiding or publishing) before the first store, cleared after the
last. The span is ``TREE_STEP`` consecutive steps of ``TREE_COUNT`` adjacent rows, the
first step's first position at ``TREE_START`` (one step for ``add_batch``, a block of
up to ``max_length`` for a prioritized ``extend``: :mod:`.step_blocks`; a step's
positions are ``slot * num_rows + row``, so the steps' runs are ``num_rows`` apart and
wrap at the ring's end: :func:`span_positions`). A holder that finds it set repairs first
(:meth:`SharedPriorities.repair`): the
leaves of the recorded span whose version is odd (a step not published) go to 0, and the
interior is recomputed from the leaves. Every leaf is then a priority a completed call
set (or 0 for a step being written) and every interior node the sum below it, whatever
instant the kill came at: a committed step is drawable, probabilities are
``priority ** alpha`` over the true total. A repair costs one pass over the tree
(vectorised: milliseconds for a million positions), only after a kill.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from replaybuffer.buffers.prioritized import checked_priorities
from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.distributed.shared.layout import (TREE_COUNT, TREE_DIRTY, TREE_START,
                                                    TREE_STEP, SharedLayout)
from replaybuffer.distributed.shared.leaf_walks import walk_up, walk_up_each
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.rewrite_runs import rewrite_runs
from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling import flat_tree, tree_kernels


class SharedPriorities:
    """The priorities of a prioritized shared buffer.

    Args:
        layout: the buffer's control arrays (a prioritized layout).
        lock: its process lock.
        num_rows, max_length: its shape (a position is ``slot * num_rows + row``).
        alpha: the prioritization exponent.

    Attributes:
        repairs: how many times this process repaired the tree after a killed holder.
    """

    def __init__(self, layout: SharedLayout, lock: ProcessLock, num_rows: int,
                 max_length: int, alpha: float):
        self._tree, self._max_priority = layout.tree, layout.max_priority
        self._version, self._next_id = layout.version, layout.next_id
        self._intent = layout.tree_intent
        self._lock = lock
        self._rows_total, self._length = num_rows, max_length
        self._alpha = alpha
        self._leaf_base = len(layout.tree) // 2
        self._row_numbers = np.arange(num_rows, dtype=np.int64)
        self.repairs = 0
        # The compiled loops are loaded (and numba's runtime started: 0.1-1.5 s) before
        # this process first takes the lock, never inside it, where every writer and
        # sampler would wait on it (:meth:`load_kernels`).
        self._kernels_loaded = not tree_kernels.AVAILABLE
        self.floor: np.ndarray | None = None
        """The rows' floors (int64 ``[num_rows]``, :mod:`.row_marks`), once the buffer
        wires them: an id below its row's floor was cleared and is not updated."""

    @property
    def alpha(self) -> float:
        """The prioritization exponent: a leaf is ``priority ** alpha``."""
        return self._alpha

    @property
    def max_priority(self) -> float:
        """The largest priority seen; new steps enter with it."""
        return float(self._max_priority[0])

    # ------------------------------------------------------------- the guard
    @contextmanager
    def changing(self, start: int = 0, count: int = 0, steps: int = 1) -> Iterator[None]:
        """Hold the lock to change the tree (and, for a writer, the versions of the
        positions of ``steps`` consecutive steps of ``count`` rows, the first at
        ``start``: :func:`span_positions`): repair first what a killed holder left, mark
        the change in ``tree_intent``, unmark it after."""
        if not self._kernels_loaded:
            self.load_kernels()
        with self._lock:
            intent = self._intent
            if intent[TREE_DIRTY]:
                self.repair()
            intent[TREE_START], intent[TREE_COUNT] = start, count
            intent[TREE_STEP] = steps
            intent[TREE_DIRTY] = 1
            yield
            intent[TREE_DIRTY] = 0

    def load_kernels(self) -> None:
        """Call each compiled loop the lock sections use once, on arrays of their
        types that no other process sees (with no lock; a no-op once done)."""
        if self._kernels_loaded:
            return
        tree, one = np.zeros(4), np.ones(1, np.int64)
        walk_up(tree, 2, 1, 1.0)
        walk_up_each(tree, one, np.ones(1))
        rewrite_runs(one, one.copy(), np.zeros(1, np.int64), 1)
        self._kernels_loaded = True

    def repair(self) -> None:
        """Make the tree whole after a holder of the lock died changing it (the lock
        held; see the module): unpublished steps of the recorded span to 0, the interior
        recomputed from the leaves."""
        start, count = int(self._intent[TREE_START]), int(self._intent[TREE_COUNT])
        steps = max(1, int(self._intent[TREE_STEP]))  # 0: a record of one step
        if count:
            positions = span_positions(start, count, steps, self._rows_total,
                                       self._length).ravel()
            unpublished = positions[self._version[positions] % 2 == 1]
            flat_tree.set_leaves(self._tree, unpublished, np.zeros(len(unpublished)))
        flat_tree.rebuild(self._tree)
        self._intent[TREE_DIRTY] = 0
        self.repairs += 1

    def set(self, positions: np.ndarray, values: np.ndarray) -> None:
        """Set the leaves ``positions`` (int64 ``[n]``) to ``values`` (float64 ``[n]``,
        already ``** alpha``) and their ancestors; inside :meth:`changing`."""
        flat_tree.set_leaves(self._tree, positions, values)
        if ARMED is not None:
            crash_point("shared.priorities.update")
        flat_tree.propagate(self._tree, positions)

    def set_each(self, positions: np.ndarray, values: np.ndarray) -> None:
        """:meth:`set` of a few leaves (a block's publish, a draw's hiding), their paths
        walked to the root one by one (:func:`~.leaf_walks.walk_up_each`: compiled where
        numba is, the same nodes as :meth:`set`'s); inside :meth:`changing`."""
        if ARMED is not None:  # a kill between the leaves and their ancestors
            flat_tree.set_leaves(self._tree, positions, values)
            crash_point("shared.priorities.update")
        walk_up_each(self._tree, positions, values)

    def enter(self, start: int, count: int) -> None:
        """Set the leaves of positions ``start .. start + count - 1`` (a step of
        ``count`` rows) to :meth:`entering_value`, and their ancestors, path by path
        (:mod:`.leaf_walks`: compiled where numba is); inside :meth:`changing`."""
        value = self.entering_value()
        first = self._leaf_base + start
        if ARMED is not None:  # a kill between the leaves and their ancestors
            self._tree[first:first + count] = value
            crash_point("shared.priorities.update")
        walk_up(self._tree, first, count, value)

    def leaves(self, positions: np.ndarray) -> np.ndarray:
        """The leaves of ``positions`` (int64, any shape), float64 (``** alpha``); read
        inside :meth:`changing`."""
        return flat_tree.leaves_of(self._tree, positions)

    def entering_value(self) -> float:
        """A new step's leaf: the largest priority seen, ``** alpha``."""
        return float(float(self._max_priority[0]) ** self._alpha)

    # ------------------------------------------------------------- the reads
    def draw(self, count: int, steps: int, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows, first step ids (int64 ``[count]`` each) and probabilities (float64
        ``[count]``) of ``count`` steps drawn by priority; a draw whose window of
        ``steps`` would run past its row's head gets probability 0 (so it is drawn
        again).

        Raises:
            EmptyBufferError: no step has a positive priority.
        """
        if not self._kernels_loaded:
            self.load_kernels()
        with self._lock:
            if self._intent[TREE_DIRTY]:
                self.repair()
            heads = self._next_id.copy()
            self._hide_rewrites(heads)
            total = float(self._tree[1])
            if not total > 0:
                raise EmptyBufferError("get_next: no step with a positive priority (the "
                                       "buffer is empty, or every priority is 0)")
            positions = flat_tree.find_prefix(self._tree, rng.random(count) * total)
            p = flat_tree.leaves_of(self._tree, positions) / total
        rows = positions % self._rows_total
        slots = positions // self._rows_total
        row_heads = heads[rows]
        # The newest step id at each slot: the last id below the head with that slot.
        starts = slots + self._length * ((row_heads - 1 - slots) // self._length)
        bad = (starts < 0) | (starts + steps > row_heads)
        p[bad] = 0.0  # rejected by the caller, as zero leaves rounding may land on
        starts[bad] = 0
        return rows, starts, p

    def _hide_rewrites(self, heads: np.ndarray) -> None:
        """Zero the leaves of the steps being written from the rows' heads ``heads``
        (int64 ``[num_rows]``, read under the lock): a prioritized ``add_batch`` step,
        or an ``extend`` block, makes its positions' versions odd with no lock and keeps
        the old steps' leaves until its one lock section publishes the new ones, so the
        draw hides them (each row's run of odd versions from its head:
        :mod:`.rewrite_runs`), as the writer's own section would have (a writer killed
        mid-write leaves its leaves hidden too). Bracketed in ``tree_intent`` (no span:
        a repair rebuilds the interior)."""
        odd = rewrite_runs(self._version, heads, self._row_numbers, self._length)
        if not len(odd):
            return
        odd = odd[flat_tree.leaves_of(self._tree, odd) != 0]
        if not len(odd):
            return
        intent = self._intent
        intent[TREE_START] = intent[TREE_COUNT] = 0
        intent[TREE_DIRTY] = 1
        self.set_each(odd, np.zeros(len(odd)))
        intent[TREE_DIRTY] = 0

    def update(self, ids: Any, priorities: Any) -> int:
        """Set the priorities of the items ``ids`` (int64 item ids ``[S]`` or ``[S, T]``,
        as :meth:`~replaybuffer.distributed.SharedReplayBuffer.update_priorities`
        takes them); returns how many were applied.

        Raises:
            ValueError: mismatched shapes; a NaN, infinite or negative priority; an id
                no sample could have returned. Nothing is changed then.
        """
        id_array, values, largest = checked_priorities(ids, priorities)
        if len(id_array) and (id_array.min() < 0):
            i = int(np.argmin(id_array))
            raise ValueError(f"update_priorities: ids[{i}] = {int(id_array[i])} is no item "
                             "id (they are >= 0)")
        steps, rows = np.divmod(id_array, self._rows_total)
        positions = (steps % self._length) * self._rows_total + rows
        if largest is None and len(values):
            largest = float(values.max())
        with self.changing():
            current = self._version[positions] == 2 * steps + 2
            if self.floor is not None:  # a clear leaves versions as they were
                current &= steps >= self.floor[rows]
            self.set(positions[current], np.power(values[current], self._alpha))
            if largest is not None and largest > self._max_priority[0]:
                self._max_priority[0] = largest
        return int(current.sum())


def span_positions(start: int, count: int, steps: int, num_rows: int,
                   max_length: int) -> np.ndarray:
    """The positions (int64 ``[steps, count]``) of ``steps`` consecutive steps of rows
    ``start % num_rows ..`` ``+ count - 1``, the first step at slot ``start // num_rows``:
    row ``k`` of the result is step ``k``'s run, its slot wrapping at ``max_length``."""
    slot, first = divmod(start, num_rows)
    slots = (slot + np.arange(steps)) % max_length
    return slots[:, None] * num_rows + (first + np.arange(count))[None, :]
