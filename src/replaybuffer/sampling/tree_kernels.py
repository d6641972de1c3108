"""Compiled loops for the segment trees, with numba (the optional ``fast`` extra).

The numpy tree (:mod:`replaybuffer.sampling.segment_tree`) walks a batch of ``K`` paths
one level at a time, about five numpy calls per level, and those calls' fixed costs
are most of a search or an update on a large tree. These kernels do the same walks
in one compiled loop each. They are the reference's arithmetic, operation for
operation, so they give the same bits:

- :func:`descend`: the wide root's ``searchsorted(upto, t, side="right")`` is a
  binary search for the first running sum greater than ``t``, then ``t -= runs[j]``;
  each binary level computes ``right = t >= left``, ``t -= left * right``,
  ``node = 2 node + right``, as numpy does.
- :func:`recompute_sum` / :func:`recompute_min`: every ancestor on the paths, from
  its two children, ``left + right`` (``min(left, right)``). Walking path by path
  rather than level by level gives the same nodes: the last path through a node
  recomputes it after every path through its children (all pass through it) has
  recomputed them.

The root value (the pairwise ``np.add.reduce`` of the total level) and the wide root
(``np.add.accumulate``) stay numpy calls, so the tree's values are defined in one
place. Without numba, or with ``REPLAYBUFFER_NUMBA=0`` in the environment,
:data:`AVAILABLE` is false and the trees use their numpy loops.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

numba: Any
try:  # optional: pip install 'replaybuffer[fast]'
    import numba
except ImportError:  # pragma: no cover - depends on the installed extras
    numba = None

#: Whether the compiled loops can be used (numba imports and is not switched off).
AVAILABLE: bool = numba is not None and os.environ.get("REPLAYBUFFER_NUMBA", "1") != "0"


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    if not AVAILABLE:
        return fn
    # cache: compiled once per machine, not per process (a few hundred ms each);
    # nogil: a sampling thread does not hold up a collecting one.
    compiled: Callable[..., Any] = numba.njit(cache=True, nogil=True, boundscheck=False)(fn)
    return compiled


@_compile
def descend(nodes: np.ndarray, upto: np.ndarray, runs: np.ndarray, root_width: int,
            height: int, t: np.ndarray) -> np.ndarray:
    """Leaf nodes (int64 ``[K]``) reached by targets ``t`` (float64 ``[K]`` in
    ``[0, total())``, consumed): :meth:`SumTree._descend` compiled.

    ``nodes`` is the tree's flat node array, ``upto`` the wide root's inclusive
    running sums (``root_width`` of them) and ``runs`` the same behind a leading 0.
    Level by level over all targets, as the numpy loop: the ``K`` loads of a level
    are independent, so the processor overlaps their cache misses (one target's
    walk is a chain of dependent misses).
    """
    count = t.shape[0]
    node = np.empty(count, np.int64)
    for k in range(count):
        x = t[k]
        # The first j with upto[j] > x (searchsorted side="right"), branch-free: the
        # answer stays in [base, base + n] while n halves.
        base, n = 0, root_width
        while n > 1:
            half = n >> 1
            base += half * (upto[base + half - 1] <= x)
            n -= half
        base += upto[base] <= x
        t[k] = x - runs[base]
        node[k] = base + root_width
    for _ in range(height):
        for k in range(count):
            n = node[k] + node[k]
            left = nodes[n]
            x = t[k]
            right = x >= left  # branch-free: the turns are coin flips to a predictor
            t[k] = x - left * right
            node[k] = n + right
    return node


@_compile
def recompute_sum(nodes: np.ndarray, leaves: np.ndarray, stop: int) -> None:
    """Recompute every ancestor ``>= stop`` of the leaf nodes ``leaves`` (int64
    ``[K]``) as the sum of its two children, level by level (the loads of one level
    are independent, so their cache misses overlap)."""
    count = leaves.shape[0]
    node = leaves >> 1
    while count and node[0] >= stop:  # all paths reach a level together
        for k in range(count):
            n = node[k]
            nodes[n] = nodes[2 * n] + nodes[2 * n + 1]
            node[k] = n >> 1


@_compile
def recompute_min(nodes: np.ndarray, leaves: np.ndarray, stop: int) -> None:
    """:func:`recompute_sum` with the minimum (slots are never NaN). Of two equal
    children the right one is taken, as ``np.minimum`` does (it matters for 0.0 and
    -0.0 only)."""
    count = leaves.shape[0]
    node = leaves >> 1
    while count and node[0] >= stop:
        for k in range(count):
            n = node[k]
            left, right = nodes[2 * n], nodes[2 * n + 1]
            nodes[n] = left if left < right else right
            node[k] = n >> 1
