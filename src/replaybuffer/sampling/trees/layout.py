"""The tree's shape: a wide root over a forest of binary trees, in one flat array.

Shape: ``size`` is the smallest power of two >= ``capacity`` and
``width = min(size, root_width)`` (``root_width`` a power of two, 1024 by default). The
slots are split into ``width`` runs of ``size / width`` slots, each the leaves of a
complete binary tree of height ``height = log2(size / width)``, and one wide root node
has those ``width`` subtree roots as its children. At capacity 1,000,000 that is a
root of 1024 children over binary trees of height 10, rather than a binary tree of
depth 20.

Layout: one flat float64 array ``nodes`` of length ``2 * size``, a binary heap. Node
``i`` has children ``2i`` and ``2i + 1``, and slot ``j`` is the leaf ``size + j``. The
subtree roots, the wide root's children, are the nodes ``[width, 2 * width)``. The
nodes ``[0, width)`` are unused and hold the identity. The leaves past ``capacity``
hold the identity of the tree's operation (0 for a sum, +inf for a min), so they
never change a result.

The *total level* is the lowest binary level with at most :data:`TOTAL_WIDTH` nodes
(the subtree roots if none is lower); the root value is reduced over it
(:mod:`replaybuffer.sampling.trees`). Everything here is integer arithmetic on these
numbers.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Default fan-out of the wide root. The root costs one running sum over ``width``
#: floats per search after an update (about 4 us for 1024 here) and saves
#: ``log2(width)`` binary levels (about 3 us each per search). 512, 1024 and 2048
#: measured within noise of each other at capacities 1e3-1e6.
DEFAULT_ROOT_WIDTH = 1024

#: The most nodes a total level may have (module docstring). An update pays one
#: pairwise reduction over it (about 3.5 us for 16384 here) instead of a path level
#: per halving above it (about 2 us each, more when the level misses the cache) and
#: the running sums. At 1M slots, 8192 measured 5% slower on sample+update.
TOTAL_WIDTH = 16384

#: The largest batch recomputed by rows (:mod:`~replaybuffer.sampling.trees.recompute`);
#: larger ones recompute every level along their paths, or whole.
ROWS_MAX = 4096


def total_level_start(size: int, root_width: int) -> int:
    """The first node of the total level, a power of two: the level's nodes are
    ``[start, 2 * start)`` for a tree of ``size`` leaves (a power of two) under a wide
    root of ``root_width`` children."""
    start = size
    while start > max(TOTAL_WIDTH, root_width):
        start >>= 1
    return start


def aligned_full(length: int, value: float) -> npt.NDArray[np.float64]:
    """``np.full(length, value)``, float64, starting on a 64-byte boundary: a row of 8
    nodes is then one cache line (numpy only promises 16 bytes)."""
    spare = np.full(length + 7, value, np.float64)
    skip = (-spare.ctypes.data % 64) // 8
    return spare[skip:skip + length]
