"""A block of consecutive steps written to a prioritized shared buffer with one lock
section in all, as an ``add_batch`` step (:mod:`.writer`).

``extend`` of ``T`` steps (``T <= max_length``; a longer call is cut into blocks of
``max_length``) to rows ``first .. first + count - 1`` from head ``s0``, whose positions
are :func:`~.priorities.span_positions`:

1. no lock: ``held`` down to the steps the block leaves whole (it overwrites the oldest
   ``s0 + T - max_length`` of them); the old versions and leaves kept aside; every
   version odd (``2 * id + 1``), in step order, so that the positions being rewritten
   are a run from each row's head (:mod:`.rewrite_runs`);
2. order fence, then each step's data, then an order fence (no lock: a draw hides the
   run of odd versions from each row's head before it reads the tree, and a read that
   copied any of them sees an odd or later version: :mod:`.writer`'s seqlock argument,
   per position);
3. publish, one section: leaves to the entering priority (their paths walked to the
   root: :meth:`~.priorities.SharedPriorities.set_each`), versions even, in step order
   (so a kill among these stores leaves rows at most one step apart, as one step does),
   then the heads to ``s0 + T`` and ``held``.

A kill at any moment leaves what one step's protocol leaves, ``T`` steps wide: outside
the section, a run of odd versions from the heads, which every draw hides; inside it,
the next lock holder repairs the tree from the recorded span (leaves of odd versions to
0); the next claim of the rows moves each head past the steps it finds published
(:meth:`~.writer.SharedWriter.claim_rows`); the steps no longer whole are a run at the
rows' oldest end (:mod:`.held_steps`). A data write that raises publishes the steps
written before it and restores the versions and leaves of the others, whose old steps
it never touched: the row is as if the call had written those steps only. (A leaf a
draw hid is restored from the copy kept before step 1, read with no lock: an
``update_priorities`` of such a step that lands between that read and the odd versions,
and whose leaf a draw then hides, is lost, only on this failure path.)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.distributed.shared.admission import SharedAdmission
from replaybuffer.distributed.shared.held_steps import held_steps
from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.memory_fences import order_fence
from replaybuffer.distributed.shared.priorities import SharedPriorities, span_positions
from replaybuffer.distributed.shared.read_pins import ReadPins
from replaybuffer.storage.shared_storage import SharedStorage


class StepBlocks:
    """Blocks of steps into a prioritized shared buffer (see the module).

    Args:
        layout: the buffer's control arrays.
        storage: its data.
        priorities: its tree.
        num_rows, max_length: its shape.
        pins: (``Queue`` buffers) windows being read (:mod:`.read_pins`).
        commits: the rate limiter that counts inserts at the commit, or ``None``.

    Attributes:
        published: steps of the last :meth:`write` that were published (all of them,
            or those written before a data write raised).
    """

    def __init__(self, layout: SharedLayout, storage: SharedStorage,
                 priorities: SharedPriorities, num_rows: int, max_length: int,
                 pins: ReadPins | None, commits: SharedAdmission | None):
        self._version, self._next_id = layout.version, layout.next_id
        self._storage, self._priorities = storage, priorities
        self._rows_total, self._length = num_rows, max_length
        self._pins, self._commits = pins, commits
        self.published = 0

    def write(self, first: int, count: int, steps: Sequence[Sequence[Any]],
              write_exact: Any, heads: np.ndarray, held: np.ndarray,
              torn: np.ndarray | None = None) -> None:
        """Write ``steps`` (each the storage's converted leaves ``[count, *shape]``; at
        most ``max_length`` of them) to rows ``first .. first + count - 1``, whose head
        and count views are ``heads`` and ``held``; ``write_exact``: the storage's fused
        writer for ``count`` rows (or ``None``); ``torn``: per row, the run of oldest
        steps a killed writer left torn (``None``: at most one). The caller holds the
        thread lock."""
        self.published = 0
        length, rows_total = self._length, self._rows_total
        n = len(steps)
        assert 0 < n <= length
        s0 = int(self._next_id[first])
        ids = s0 + np.arange(n)
        start = (s0 % length) * rows_total + first
        positions = span_positions(start, count, n, rows_total, length)  # [n, count]
        flat = positions.ravel()
        last = s0 + n - 1
        if self._pins is not None and last >= length:  # a Queue's read copying a
            # step the block overwrites (at or below the newest of them): wait
            self._pins.wait_for_readers(first, count, last - length)
        priorities, version = self._priorities, self._version
        if last >= length:  # 1. the oldest steps go: uncounted right before they tear
            if torn is None:
                held.fill(max(0, s0 - max(0, s0 - length, last + 1 - length)))
            else:  # those of the torn run were uncounted already
                held[:] = np.maximum(0, s0 - np.maximum(
                    max(0, last + 1 - length), s0 - length + torn))
            if ARMED is not None:
                crash_point("shared.write.uncount")
        kept = version[flat], priorities.leaves(flat)  # (fancy reads: copies)
        version[flat] = np.repeat(2 * ids + 1, count)  # in step order: runs from heads
        order_fence()  # 2.
        written = 0
        try:
            for k, arrays in enumerate(steps):
                at = int(positions[k, 0])
                if write_exact is None or not write_exact(at, arrays):
                    self._storage.write(at, arrays)
                if ARMED is not None:
                    crash_point("shared.write.data")
                written += 1
        finally:
            order_fence()
            self._publish(first, count, positions, ids, written, kept, heads, held, torn)

    def _publish(self, first: int, count: int, positions: np.ndarray, ids: np.ndarray,
                 written: int, kept: tuple[np.ndarray, np.ndarray], heads: np.ndarray,
                 held: np.ndarray, torn: np.ndarray | None) -> None:
        """3.: publish the first ``written`` steps of the block, restore the others'
        ``kept`` versions and leaves (their old steps are whole)."""
        priorities, version = self._priorities, self._version
        n, length = len(ids), self._length
        done = written * count
        flat = positions.ravel()
        with priorities.changing(int(positions[0, 0]), count, n):
            values = np.full(len(flat), priorities.entering_value())
            if done < len(flat):  # the steps not written: their old leaves, unless a
                # draw hid them (0) since the copy; none for a torn step (odd)
                restored = priorities.leaves(flat[done:])
                hidden = restored == 0
                restored[hidden] = kept[1][done:][hidden]
                restored[kept[0][done:] % 2 == 1] = 0.0
                floor = priorities.floor
                if floor is not None:  # a clear since the copy: its old steps are
                    # gone, not restored to draws
                    old_ids = kept[0][done:] // 2 - 1
                    restored[old_ids < floor[flat[done:] % self._rows_total]] = 0.0
                values[done:] = restored
            priorities.set_each(flat, values)
            versions = np.repeat(2 * ids + 2, count)
            versions[done:] = kept[0][done:]
            version[flat] = versions  # in step order: rows end at most a step apart
            if ARMED is not None:
                crash_point("shared.write.publish")
            if written:
                heads.fill(int(ids[0]) + written)
            if written == n and torn is None:
                held.fill(min(int(ids[-1]) + 1, length))
            elif written == n and torn is not None:  # the block's steps, whole, and
                # the steps left whole beyond what is left of the run
                held[:] = int(ids[-1]) + 1 - np.maximum(
                    max(0, int(ids[-1]) + 1 - length), int(ids[0]) - length + torn)
            else:  # the restored steps: count what is whole
                rows = np.arange(first, first + count)
                held[:] = held_steps(version, self._next_id.copy(), length, rows)
        self.published = written
        if written and self._commits is not None:
            self._commits.committed(count * written)
