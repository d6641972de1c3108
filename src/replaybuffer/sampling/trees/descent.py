"""Prefix-sum search down a sum tree, as pure functions over its arrays (numpy loops).

A batch of ``K`` targets descends together: one ``np.searchsorted`` over the wide
root's running sums picks each target's subtree, then one Python iteration per binary
level, none per item. The compiled twin of :func:`descend` is
:func:`replaybuffer.sampling.tree_kernels.descend` (the same arithmetic, the same bits).

The arrays are a sum tree's (:mod:`~replaybuffer.sampling.trees.layout`): ``nodes``
(float64 ``[2 * size]``), ``runs`` (float64 ``[root_width + 1]``: the running sums of
the subtree roots behind a leading 0, so ``runs[j]`` sums the subtrees before ``j``),
``upto = runs[1:]`` (inclusive running sums, sorted), and ``left``/``right`` (the
strided views ``nodes[0::2]`` and ``nodes[1::2]``: the children of node ``i``). They
must be current (the tree synced).
"""

from __future__ import annotations

import numpy as np


def descend_root(upto: np.ndarray, runs: np.ndarray, root_width: int,
                 t: np.ndarray) -> np.ndarray:
    """The subtree-root nodes (int64 ``[K]``) for targets ``t`` (float64 ``[K]`` in
    ``[0, total())``), minus the sums of the subtrees before them (subtracted from
    ``t`` in place).

    The first subtree whose inclusive running sum exceeds the target. Its root is
    > 0, since a 0 would leave the running sum equal to the one before it, and
    the target keeps ``>= 0``, since the subtracted running sum is <= the target.
    """
    j = upto.searchsorted(t, side="right")
    t -= runs[j]
    j += root_width
    return j


def descend(nodes: np.ndarray, upto: np.ndarray, runs: np.ndarray, root_width: int,
            height: int, t: np.ndarray) -> np.ndarray:
    """Leaf nodes int64 ``[K]`` reached by targets ``t`` (float64 ``[K]`` in
    ``[0, total())``, consumed), ``height`` binary levels below the wide root."""
    node = descend_root(upto, runs, root_width, t)
    for _ in range(height):
        node += node  # the left child
        left = nodes[node]
        right = t >= left
        # left * False is exactly 0.0: one multiply beats a masked subtract or a where.
        t -= left * right
        node += right
    return node


def descend_guarded_from(left_of: np.ndarray, right_of: np.ndarray, height: int,
                         node: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The binary part of a descent that turns right only into a subtree with a sum
    > 0: from subtree-root nodes ``node`` (int64 ``[K]``, consumed) with targets ``t``
    (float64 ``[K]``, consumed) down ``height`` levels, to leaf nodes (int64 ``[K]``).

    Each node on the path has a sum > 0: the subtree root does (:func:`descend_root`),
    a right turn needs a right sum > 0, and a left turn either has ``t < left`` with
    ``t >= 0`` (subtracting a number no larger than ``t`` never goes below 0), so
    ``left > 0``, or a right sum of 0, so ``left`` is the node's sum. The leaf reached
    is therefore a slot with a priority > 0, hence inside capacity. Where this guard
    never fires the path is the plain descent's.
    """
    for _ in range(height):
        left = left_of[node]
        right = (t >= left) & (right_of[node] > 0.0)
        t -= left * right
        node += node
        node += right
    return node
