"""A few leaves of the shared sum tree set and their ancestors recomputed, path by
path: a prioritized ``add_batch`` step's publish (adjacent leaves, one value:
:func:`walk_up`) and an ``extend`` block's (any leaves, their own values:
:func:`walk_up_each`), the one thing each does under the tree's lock, so its time is the
serial section every writer waits on.

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

from replaybuffer.sampling import flat_tree, tree_kernels

PYTHON_WALKS = 16
"""Without numba, the most leaves walked path by path in Python (more: numpy's level
by level walk, which costs about as much as 16 paths of a 2**20-leaf tree)."""


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


def walk_up_each_python(nodes: Any, leaves: Any, values: Any) -> None:
    """Set the leaf nodes ``leaves`` (int64 ``[n]``, node numbers; a node given twice
    takes its last value) of ``nodes`` (the float64 tree, or its memoryview) to
    ``values`` (float64 ``[n]``), then each one's ancestors from their children."""
    for k in range(len(leaves)):
        nodes[leaves[k]] = values[k]
    for k in range(len(leaves)):
        node = leaves[k] >> 1
        while node:
            nodes[node] = nodes[2 * node] + nodes[2 * node + 1]
            node >>= 1


_compiled_each = tree_kernels.compile_kernel(walk_up_each_python)


def walk_up_each(tree: np.ndarray, positions: np.ndarray, values: np.ndarray) -> None:
    """Set the leaves of ``positions`` (int64 ``[n]``, leaf indices) of ``tree`` (the flat
    layout) to ``values`` (float64 ``[n]``) and recompute their ancestors, path by path:
    the nodes of :func:`~replaybuffer.sampling.flat_tree.update`, bit for bit (compiled
    where numba is: about 0.3 us a leaf of a 2**20-leaf tree, where the level by level
    walk costs about 100 us for 16 leaves)."""
    nodes = np.asarray(positions, np.int64).ravel() + len(tree) // 2
    values = np.ascontiguousarray(values, np.float64).ravel()
    if tree_kernels.AVAILABLE:
        _compiled_each(tree, nodes, values)
    elif len(nodes) <= PYTHON_WALKS:
        walk_up_each_python(tree.data, nodes.tolist(), values.tolist())
    else:  # in Python, many paths cost more than numpy's level by level walk
        flat_tree.update(tree, nodes - len(tree) // 2, values)
