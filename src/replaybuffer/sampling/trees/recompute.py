"""Exact recomputation of a tree's binary levels from the leaves, as pure functions.

Exact recomputation, not deltas: an update writes the new leaves, then recomputes
every affected binary ancestor from its two children, level by level, and then the
root value from its level. Adding deltas (``node += new - old``) would carry rounding
error into the ancestors on every update, so after millions of updates the total
would drift from the sum of the leaves, and could go negative as priorities shrink.
Recomputed, every node is a pure function of the current leaves, always combined in
the same order: ``combine(left, right)`` per binary node, a pairwise reduction over
the total level, and a sequential running sum over the subtree roots. So the tree
after any sequence of updates is bit-for-bit the tree that
:meth:`~replaybuffer.sampling.trees.segment.SegmentTree.rebuild` builds from scratch.

Row heights: while nothing reads the tree between updates, an update recomputes the
heights 3, 6, ... (up to the total level's) from *rows*: the 8 nodes three levels
below node ``n`` are ``nodes[8n:8n + 8]``, one 64-byte line (the array is aligned so),
and three pairwise combines over a gathered row give the node, the same value the
three binary levels give (:func:`recompute_rows`). That takes three levels' random
accesses, each a cache miss on a large tree, down to one.

Vectorised: a batch of ``K`` updates walks all ``K`` paths together, one Python
iteration per binary level, none per item. Every function takes the flat node array
(float64 ``[2 * size]``, :mod:`~replaybuffer.sampling.trees.layout`), its complex128
view of child pairs (``pairs[i]`` is nodes ``2i`` and ``2i + 1``) and the tree's ufunc
(``np.add`` or ``np.minimum``), and writes the nodes in place.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def combine_levels(nodes: np.ndarray, pairs: np.ndarray, combine: np.ufunc, lo: int,
                   stop: int) -> None:
    """Recompute whole levels, from the nodes ``[lo, 2 lo)`` up to the nodes
    ``[stop, 2 stop)``, each node from its two children (powers of two)."""
    while lo >= stop:
        pair = pairs[lo:2 * lo]  # the children of the nodes [lo, 2 lo)
        combine(pair.real, pair.imag, out=nodes[lo:2 * lo])
        lo >>= 1


def recompute_paths(nodes: np.ndarray, pairs: np.ndarray, combine: np.ufunc,
                    shifts: np.ndarray, size: int, leaves: np.ndarray, lo: int,
                    stop: int) -> None:
    """Recompute the levels from the nodes ``[lo, 2 lo)`` up to ``[stop, 2 stop)``
    along the paths of ``leaves`` (int64 leaf nodes ``[K]``, height 0), each node from
    its children. ``shifts`` is int64 ``[height, 1]``, the column ``1 .. height`` that
    takes a leaf node to its ancestors; ``size`` the number of leaves.

    The low levels along the ``K`` paths, three calls a level: gather the child
    pairs, combine, scatter. A parent reached by several paths is written several
    times with the same value, which is cheaper than deduplicating. High levels,
    with few nodes, are recomputed whole instead: one call over a contiguous level
    of ``n`` nodes costs less than three calls over ``K`` paths while ``n`` is below
    about ``1024 + 8 K`` (measured).
    """
    limit = 1024 + 8 * len(leaves)
    first = size.bit_length() - lo.bit_length()  # the height of the nodes [lo, 2 lo)
    paths = 0
    while lo >= stop and lo > limit:
        paths += 1
        lo >>= 1
    if paths:
        for node in leaves >> shifts[first - 1:first - 1 + paths]:  # per level
            pair = pairs[node]
            nodes[node] = combine(pair.real, pair.imag)
    combine_levels(nodes, pairs, combine, lo, stop)


def recompute_rows(row_levels: Sequence[tuple[np.ndarray, np.ndarray]], combine: np.ufunc,
                   slots: np.ndarray) -> None:
    """Recompute the row heights (3, 6, ...) along the paths of ``slots`` (int64
    ``[K]``) from rows of 8 (module docstring).

    ``row_levels`` holds, per row height ``h`` from 3 up, the level ``h - 3`` as rows
    of 8 (float64 ``[n, 8]``) and the level ``h`` (float64 ``[n]``), both views of the
    nodes; a node's index within its level is its slot's, shifted by the height. The
    rows read are the ones just written below (the leaves, or the last row height),
    so one gather of rows and three pairwise combines replace three path levels (nine
    calls, each touching a line of its own level). The pairwise combines are the
    binary levels' own, so the values are the same.
    """
    index = slots
    for rows, level in row_levels:
        index = index >> 3
        row = rows.take(index, axis=0).ravel()
        half = combine(row[0::2], row[1::2])
        quarter = combine(half[0::2], half[1::2])
        level[index] = combine(quarter[0::2], quarter[1::2])


def last_wins(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``indices`` (int64 ``[M]``, sorted) and the last of ``values`` (float64
    ``[M]``) for each.

    A stable sort keeps equal indices in call order, so the last of each run of equal
    indices is the last occurrence.
    """
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    last = np.empty(ordered.shape, bool)
    last[-1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
    return ordered[last], values[order[last]]
