"""The prioritized shared tree: draws in proportion to ``priority ** alpha`` and
priority updates, on the flat sum tree every process maps
(:mod:`replaybuffer.sampling.flat_tree`), read and written under the buffer's lock.

A position's priority is 0 while it is rewritten, so it is not drawn; then the largest
priority seen (the writer sets both, :mod:`.writer`). ``update`` ignores ids whose step
was overwritten since they were drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.buffers.prioritized import checked_priorities
from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling import flat_tree


class SharedPriorities:
    """The priorities of a prioritized shared buffer.

    Args:
        layout: the buffer's control arrays (a prioritized layout).
        lock: its process lock.
        num_rows, max_length: its shape (a position is ``slot * num_rows + row``).
        alpha: the prioritization exponent.
    """

    def __init__(self, layout: SharedLayout, lock: ProcessLock, num_rows: int,
                 max_length: int, alpha: float):
        self._tree, self._max_priority = layout.tree, layout.max_priority
        self._version, self._next_id = layout.version, layout.next_id
        self._lock = lock
        self._rows_total, self._length = num_rows, max_length
        self._alpha = alpha

    @property
    def max_priority(self) -> float:
        """The largest priority seen; new steps enter with it."""
        return float(self._max_priority[0])

    def draw(self, count: int, steps: int, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows, first step ids (int64 ``[count]`` each) and probabilities (float64
        ``[count]``) of ``count`` steps drawn by priority; a draw whose window of
        ``steps`` would run past its row's head gets probability 0 (so it is drawn
        again).

        Raises:
            EmptyBufferError: no step has a positive priority.
        """
        with self._lock:
            total = float(self._tree[1])
            if not total > 0:
                raise EmptyBufferError("get_next: no step with a positive priority (the "
                                       "buffer is empty, or every priority is 0)")
            positions = flat_tree.find_prefix(self._tree, rng.random(count) * total)
            p = flat_tree.leaves_of(self._tree, positions) / total
            heads = self._next_id.copy()
        rows = positions % self._rows_total
        slots = positions // self._rows_total
        row_heads = heads[rows]
        # The newest step id at each slot: the last id below the head with that slot.
        starts = slots + self._length * ((row_heads - 1 - slots) // self._length)
        bad = (starts < 0) | (starts + steps > row_heads)
        p[bad] = 0.0  # rejected by the caller, as zero leaves rounding may land on
        starts[bad] = 0
        return rows, starts, p

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
        with self._lock:
            current = self._version[positions] == 2 * steps + 2
            flat_tree.update(self._tree, positions[current],
                             np.power(values[current], self._alpha))
            if largest is not None and largest > self._max_priority[0]:
                self._max_priority[0] = largest
        return int(current.sum())
