"""A few leaves of the shared sum tree set and their ancestors recomputed, path by
path: a prioritized ``add_batch`` step's publish, the one thing it does under the
tree's lock, so its time is the serial section every writer waits on.

:func:`~replaybuffer.sampling.flat_tree.propagate` walks one leaf up with numpy's scalar
loads and stores (the larger cost of a step's section before this module) and several
level by level with numpy calls; :func:`walk_up` sets every leaf first, then
walks each leaf's path to the root, ``node = left + right``. The last path through a
node recomputes it after every path below it, so the nodes are those of the level by
level walk, bit for bit (the same float64 additions of the same two children). With
numba (the ``fast`` extra) the loop is compiled (0.3 us for a leaf of a 2**20-leaf
tree, 2.8 us in Python); without it, :func:`walk_up_python` on the tree's memoryview.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.sampling import tree_kernels


def walk_up_python(nodes: Any, first: int, count: int, value: float) -> None:
    """Set the ``count`` adjacent leaf nodes from ``first`` (node numbers: leaf index
    plus half the tree's length) of ``nodes`` (the float64 tree, or its memoryview) to
    ``value``, then each one's ancestors from their children."""
    for leaf in range(first, first + count):
        nodes[leaf] = value
    for leaf in range(first, first + count):
        node = leaf >> 1
        while node:
            nodes[node] = nodes[2 * node] + nodes[2 * node + 1]
            node >>= 1


_compiled = tree_kernels.compile_kernel(walk_up_python)


def walk_up(tree: np.ndarray, first: int, count: int, value: float) -> None:
    """:func:`walk_up_python` on ``tree`` (float64 ``[2 * P]``, the flat layout of
    :mod:`~replaybuffer.sampling.flat_tree`), compiled where numba is available (else
    on its memoryview, whose scalar loads and stores cost a third of numpy's)."""
    if tree_kernels.AVAILABLE:
        _compiled(tree, first, count, value)
    else:
        walk_up_python(tree.data, first, count, value)
