"""Sum and min trees in one flat float64 array, as pure functions.

:class:`~replaybuffer.sampling.trees.sum_tree.SumTree` keeps bookkeeping in Python
attributes (lazily recomputed levels), so it cannot be shared between processes. These
functions keep *everything* in the array they are given, which may live in memory
shared by processes (:mod:`replaybuffer.distributed.shared`); callers serialise updates
and reads with a lock of their own.

Layout: for ``capacity`` leaves, ``P`` is the next power of two (at least 2); the array has ``2 * P``
nodes, the root at 1 (node 0 unused), node ``k``'s children at ``2k`` and ``2k + 1``,
leaf ``i`` at ``P + i``. Leaves past ``capacity`` hold the operation's identity (0 for
sums, +inf for minima).
"""

from __future__ import annotations

import numpy as np


def tree_nodes(capacity: int) -> int:
    """Length of the flat array for ``capacity`` leaves: twice the next power of two."""
    if capacity < 1:
        raise ValueError(f"capacity must be positive, got {capacity}")
    return 2 * max(2, 1 << (int(capacity) - 1).bit_length())  # a root above the leaves


def fill(tree: np.ndarray, identity: float) -> None:
    """Every node to ``identity`` (0.0 for a sum tree, ``inf`` for a min tree)."""
    tree[...] = identity


def update(tree: np.ndarray, leaves: np.ndarray, values: np.ndarray,
           combine: np.ufunc = np.add) -> None:
    """Set ``leaves`` (int64 ``[n]``) to ``values`` (float64 ``[n]``) and recompute their
    ancestors with ``combine`` (``np.add`` or ``np.minimum``). A leaf given twice takes
    its last value."""
    leaves = np.asarray(leaves, np.int64).ravel()
    if not len(leaves):
        return
    set_leaves(tree, leaves, values)
    propagate(tree, leaves, combine)


def set_leaves(tree: np.ndarray, leaves: np.ndarray, values: np.ndarray) -> None:
    """Set ``leaves`` (int64 ``[n]``) to ``values`` (float64 ``[n]``) alone, their
    ancestors left stale until :func:`propagate` (a leaf given twice takes its last
    value)."""
    tree[len(tree) // 2 + np.asarray(leaves, np.int64)] = values  # numpy: last wins


def propagate(tree: np.ndarray, leaves: np.ndarray, combine: np.ufunc = np.add) -> None:
    """Recompute the ancestors of ``leaves`` (int64 ``[n]``) from their children.

    One leaf (a shared buffer's step of one row) walks up with scalar reads and writes:
    a numpy call per level costs more than the level's arithmetic. Several go level by
    level on their sorted, deduplicated parents (shifting a sorted array keeps it sorted,
    so dropping repeats needs no new sort)."""
    half = len(tree) // 2
    leaves = np.asarray(leaves, np.int64).ravel()
    if not len(leaves):
        return
    if len(leaves) == 1:
        node = (half + int(leaves[0])) >> 1
        add = combine is np.add
        while node:
            left, right = tree[2 * node], tree[2 * node + 1]
            tree[node] = left + right if add else combine(left, right)
            node >>= 1
        return
    nodes = np.unique((half + leaves) >> 1)
    while True:
        tree[nodes] = combine(tree[2 * nodes], tree[2 * nodes + 1])
        if nodes[0] == 1:
            return
        nodes >>= 1
        fresh = np.empty(len(nodes), bool)
        fresh[0] = True
        np.not_equal(nodes[1:], nodes[:-1], out=fresh[1:])
        nodes = nodes[fresh]


def rebuild(tree: np.ndarray, combine: np.ufunc = np.add) -> None:
    """Recompute every interior node from the leaves, level by level (O(nodes),
    vectorised): what a tree whose updater died between a leaf and its ancestors needs."""
    level = len(tree) // 2
    while level > 1:
        tree[level // 2:level] = combine(tree[level:2 * level:2], tree[level + 1:2 * level:2])
        level //= 2


def leaves_of(tree: np.ndarray, leaves: np.ndarray) -> np.ndarray:
    """The values of ``leaves`` (int64, any shape), float64."""
    return tree[len(tree) // 2 + np.asarray(leaves, np.int64)]


def find_prefix(tree: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """For each ``target`` in ``[0, total)`` (float64 ``[n]``), the leaf ``i`` whose
    prefix sum interval ``[sum(leaves[:i]), sum(leaves[:i + 1]))`` holds it: a draw with
    probability proportional to the leaves when the targets are uniform. Int64 ``[n]``.

    Rounding may land a target near the total on a zero leaf; callers check the drawn
    leaves' values and redraw those (a zero leaf is never a valid draw)."""
    half = len(tree) // 2
    node = np.ones(len(targets), np.int64)
    left_target = np.asarray(targets, np.float64).copy()
    while half > 1:
        node <<= 1
        left = tree[node]
        right = left_target >= left
        left_target -= np.where(right, left, 0.0)
        node += right
        half >>= 1
    return node - len(tree) // 2
