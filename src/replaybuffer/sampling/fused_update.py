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
bit for bit the one the general path builds. It also leaves what the tree's next
read would compute: the wide root's running sums and the total (numpy's pairwise sum
of the total level, :func:`~replaybuffer.sampling.tree_kernels.pairwise_sum`, where it
gives numpy's bits), so an update and the next sample make no further call for them.

The priorities are checked (finite, >= 0) before, by the caller
(:func:`checked_largest` in one compiled call, which also finds the largest), and
raised to ``alpha`` by numpy: numpy's vectorised power rounds differently from a
compiled loop's, and the stored values must not depend on whether numba is installed.
"""

from __future__ import annotations

import math

import numpy as np

from replaybuffer.sampling import tree_kernels


@tree_kernels.compile_kernel
def write_live(item_ids: np.ndarray, values: np.ndarray, key_base: int, batch_size: int,
               oldest: int, last_id: int, max_length: int, nodes: np.ndarray, size: int,
               stop: int, total_start: int, upto: np.ndarray, positions: np.ndarray
               ) -> float:
    """Write ``values`` (float64 ``[S]``, ``S >= 1``) to the positions of ``item_ids``
    (int64 ``[S]``) in the sum tree ``nodes`` (leaf ``size + position``; ancestors
    ``>= stop`` recomputed, level by level, as ``assign_sum``), if every id is live;
    then, unless ``upto`` is empty, the wide root's running sums into it and, unless
    ``total_start`` is 0, the total level's sum (:meth:`SumTree.write_target
    <replaybuffer.sampling.trees.sum_tree.SumTree.write_target>`).

    Returns that sum (0.0 when not asked for), or -1.0 when nothing was written (a
    stale or negative id); the positions in ``positions`` (int64 ``[S]``, filled in
    place: a returned array costs about a microsecond to box; partial when nothing
    was written).
    """
    count = item_ids.shape[0]
    for k in range(count):  # all_live_positions, before anything is written
        item = item_ids[k]
        step = item // batch_size - key_base
        if item < 0 or step < oldest or step > last_id:
            return -1.0
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
    if upto.shape[0]:
        tree_kernels.running_sums(nodes[stop:2 * stop], upto)
    if total_start == 0:
        return 0.0
    return float(tree_kernels.pairwise_sum(nodes, total_start, total_start))


@tree_kernels.compile_kernel
def checked_largest(priorities: np.ndarray) -> float:
    """The largest of ``priorities`` (float64 ``[S]``, ``S >= 1``) when every one is
    finite and >= 0, else ``-1 - i`` for the first ``i`` that is not (NaN, infinite or
    negative; ``-0.0`` is allowed): an update's check in one compiled call, where numpy
    takes three or four (:func:`~replaybuffer.buffers.prioritized.checked_priorities`
    keeps them, and its error message, for whatever this refuses)."""
    top = 0.0
    for k in range(priorities.shape[0]):
        v = priorities[k]
        if not (v >= 0.0 and v < math.inf):
            return -1.0 - k
        if v > top:
            top = v
    return top
