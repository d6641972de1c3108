"""A prioritized shared buffer's ``add_batch`` step with few Python operations: the
stores of :meth:`~.writer.SharedWriter._write_step` for a prioritized step (the module
docstring of :mod:`.writer`, 1. to 7.), in the same order, with the same one lock
section, as the uniform buffer's :meth:`~.writer.SharedWriter._write_plain_step` is
the plain step's.

Where the general path spends its time on an ``add_batch(1)`` (about 8 us of thread CPU
a step, measured: a uniform step takes 2.3): numpy scalar loads and stores of the
heads, versions and ``tree_intent`` (60-100 ns each, a memoryview's cost a third), the
``@contextmanager`` of :meth:`~.priorities.SharedPriorities.changing` (a generator, two
``next`` calls and its bookkeeping: about 1 us), and the calls between the writer, the
tree's guard, :meth:`~.priorities.SharedPriorities.enter` and ``_publish``. Here the
section is written out in one method on memoryviews of the shared int64 and float64
arrays (each scalar access one aligned 8-byte load or store, as numpy's:
:mod:`.memory_fences`), so the readers' guarantees are those of the general path: one
tree lock section a step; inside it, ``tree_intent`` marks the step's span (a killed
holder's leaves are repaired from it), the leaves and their paths to the root, the even
versions, then the heads and ``held``, all published together; outside it, the odd
versions hide the step from a draw (:meth:`~.priorities.SharedPriorities.draw`).

Taken by a step whose rows' oldest steps are whole (no torn run a killed block left),
in a buffer without frame dedup or a ``Queue`` (whose waits for readers and frame
writes the general path does).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.distributed.shared.admission import SharedAdmission
from replaybuffer.distributed.shared.layout import (TREE_COUNT, TREE_DIRTY, TREE_START,
                                                    TREE_STEP, SharedLayout)
from replaybuffer.distributed.shared.leaf_walks import walk_up
from replaybuffer.distributed.shared.memory_fences import order_fence
from replaybuffer.distributed.shared.priorities import SharedPriorities
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.storage.shared_storage import SharedStorage


class PrioritizedSteps:
    """One ``add_batch`` step at a time into a prioritized shared buffer (see the module).

    Args:
        layout: the buffer's control arrays (a prioritized layout).
        storage: its data.
        priorities: its tree (its kernels are loaded before the first section, and it
            repairs what a killed holder left).
        lock: the buffer's process lock (the tree's).
        num_rows, max_length: its shape.
        commits: the rate limiter that counts inserts at the commit, or ``None``.
    """

    def __init__(self, layout: SharedLayout, storage: SharedStorage,
                 priorities: SharedPriorities, lock: ProcessLock, num_rows: int,
                 max_length: int, commits: SharedAdmission | None):
        self._version, self._version_at = layout.version, layout.version.data
        self._head_at, self._held_at = layout.next_id.data, layout.held.data
        self._intent_at = layout.tree_intent.data
        self._max_at = layout.max_priority.data
        self._tree = layout.tree
        self._leaf_base = len(layout.tree) // 2
        self._storage, self._priorities, self._lock = storage, priorities, lock
        self._rows_total, self._length = num_rows, max_length
        self._alpha = priorities.alpha
        self._commits = commits
        self._loaded = False  # the tree's compiled loops, loaded before the first section

    def write(self, first: int, count: int, arrays: Sequence[Any], write_exact: Any,
              heads: np.ndarray, held: np.ndarray) -> None:
        """Write one step (``arrays``: the storage's converted leaves ``[count, *shape]``)
        to rows ``first .. first + count - 1``, whose head and count views are ``heads``
        and ``held``; ``write_exact``: the storage's fused writer for ``count`` rows (or
        ``None``). The caller holds the thread lock; the rows' oldest steps are whole."""
        length = self._length
        step = self._head_at[first]
        start = (step % length) * self._rows_total + first
        one = count == 1  # one row: memoryview stores; several: numpy slices and fills
        version: Any = self._version_at if one else self._version
        span: int | slice = start if one else slice(start, start + count)
        if step >= length:  # 1.
            if one:
                self._held_at[first] = length - 1
            else:
                held.fill(length - 1)
            if ARMED is not None:
                crash_point("shared.write.uncount")
        version[span] = 2 * step + 1  # 2.
        order_fence()  # 3.
        if write_exact is None or not write_exact(start, arrays):  # 4.
            self._storage.write(start, arrays)
        if ARMED is not None:
            crash_point("shared.write.data")
        order_fence()  # 5.
        priorities = self._priorities
        if not self._loaded:  # (once, never inside the lock)
            priorities.load_kernels()
            self._loaded = True
        intent, tree = self._intent_at, self._tree
        with self._lock:  # the step's one section: SharedPriorities.changing's stores
            if intent[TREE_DIRTY]:
                priorities.repair()
            intent[TREE_START] = start
            intent[TREE_COUNT] = count
            intent[TREE_STEP] = 1
            intent[TREE_DIRTY] = 1
            value = self._max_at[0] ** self._alpha  # SharedPriorities.entering_value
            node = self._leaf_base + start
            if ARMED is not None:  # a kill between the leaves and their ancestors
                tree[node:node + count] = value
                crash_point("shared.priorities.update")
            walk_up(tree, node, count, value)
            version[span] = 2 * step + 2  # 6.
            if ARMED is not None:
                crash_point("shared.write.publish")
            whole = step + 1 if step < length else length
            if one:
                self._head_at[first] = step + 1
                self._held_at[first] = whole
            else:
                heads.fill(step + 1)
                held.fill(whole)
            intent[TREE_DIRTY] = 0
        if self._commits is not None:  # 7.
            self._commits.committed(count)
