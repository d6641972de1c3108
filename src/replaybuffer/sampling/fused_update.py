"""A priority update's tree write in one compiled call: item ids to positions, the
liveness test, the leaves written and their paths recomputed.

On the numpy path (and before this module, with numba too) an update of a prioritized
sampler is the item-id map (:func:`~replaybuffer.sampling.item_ids.
all_live_positions`), then the tree's checked write (:meth:`SegmentTree.assign
<replaybuffer.sampling.trees.segment.SegmentTree.assign>`: overflow test, then
:func:`~replaybuffer.sampling.tree_kernels.assign_sum`): two compiled calls and their
Python layers. :func:`write_live` is both in one call when every id is live (the
usual case); otherwise it writes nothing and says so, and the caller takes the
general path, which drops stale ids. The nodes it leaves are those of
:func:`~replaybuffer.sampling.tree_kernels.assign_sum` (the same loop), so the tree is
bit for bit the one the general path builds.

The priorities are checked (finite, >= 0) and raised to ``alpha`` before, by the
caller: numpy's vectorised power rounds differently from a compiled loop's, and the
stored values must not depend on whether numba is installed.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.sampling import tree_kernels


@tree_kernels.compile_kernel
def write_live(item_ids: np.ndarray, values: np.ndarray, key_base: int, batch_size: int,
               oldest: int, last_id: int, max_length: int, nodes: np.ndarray, size: int,
               stop: int, positions: np.ndarray) -> bool:
    """Write ``values`` (float64 ``[S]``, ``S >= 1``) to the positions of ``item_ids``
    (int64 ``[S]``) in the sum tree ``nodes`` (leaf ``size + position``; ancestors
    ``>= stop`` recomputed, level by level, as ``assign_sum``), if every id is live.

    Returns whether the write was made, with the positions in ``positions`` (int64
    ``[S]``, filled in place: a returned array costs about a microsecond to box); with
    a stale or negative id nothing is written (and the positions are partial).
    """
    count = item_ids.shape[0]
    for k in range(count):  # all_live_positions, before anything is written
        item = item_ids[k]
        step = item // batch_size - key_base
        if item < 0 or step < oldest or step > last_id:
            return False
        positions[k] = (step % max_length) * batch_size + item % batch_size
    node = np.empty(count, np.int64)
    for k in range(count):  # in order: a repeated position keeps its last value
        leaf = positions[k] + size
        nodes[leaf] = values[k]
        node[k] = leaf >> 1
    while node[0] >= stop:  # all paths reach a level together
        for k in range(count):
            n = node[k]
            nodes[n] = nodes[2 * n] + nodes[2 * n + 1]
            node[k] = n >> 1
    return True
