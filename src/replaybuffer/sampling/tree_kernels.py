"""Compiled loops for the segment trees, with numba (the optional ``fast`` extra).

The numpy tree (:mod:`replaybuffer.sampling.trees`) walks a batch of ``K`` paths
one level at a time, about five numpy calls per level, and those calls' fixed costs
are most of a search or an update on a large tree. These kernels do the same walks
in one compiled loop each. They are the reference's arithmetic, operation for
operation, so they give the same bits:

- :func:`descend`: the wide root's ``searchsorted(upto, t, side="right")`` is a
  binary search for the first running sum greater than ``t``, then ``t -= runs[j]``;
  each binary level computes ``right = t >= left``, ``t -= left * right``,
  ``node = 2 node + right``, as numpy does. Below the top ``height % 3`` levels it
  reads three levels from one cache line: node ``n``'s eight great-grandchildren
  ``8n .. 8n + 7`` are one aligned 64-byte row, and every node is stored as the sum
  of its two children in that order, so ``(r0 + r1) + (r2 + r3)`` *is* the left
  child's stored value, bit for bit: the same turns with one cache miss where the
  binary walk took three. :func:`find` wraps it with the search's
  usual case (targets below the total, slots > 0 found) and the found values.
- :func:`assign_sum` / :func:`assign_min`: the leaves written in order (a repeated
  slot keeps its last value), then every ancestor on the paths from its two
  children, ``left + right`` (``min(left, right)``). Walking path by path rather
  than level by level gives the same nodes: the last path through a node recomputes
  it after every path through its children (all pass through it) has recomputed them.
- :func:`running_sums`: the wide root, ``np.add.accumulate``'s sequential sums.

The root value (the pairwise ``np.add.reduce`` of the total level) stays a numpy
call in both, so the tree's total is defined in one place. Without numba, or with
``REPLAYBUFFER_NUMBA=0`` in the environment, :data:`AVAILABLE` is false and the trees
use their numpy loops.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from replaybuffer.sampling import kernel_cache

numba: Any
try:  # optional: pip install 'replaybuffer[fast]'
    import numba
except ImportError:  # pragma: no cover - depends on the installed extras
    numba = None

#: Whether the compiled loops can be used (numba imports and is not switched off).
AVAILABLE: bool = numba is not None and os.environ.get("REPLAYBUFFER_NUMBA", "1") != "0"


def compile_kernel(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by numba when :data:`AVAILABLE` (else ``fn`` itself, which the
    callers then do not use: they take their numpy paths)."""
    if not AVAILABLE:
        return fn
    # cache: compiled once per machine, not per process (a few hundred ms each), and
    # discarded when a kernel module it may call changed (numba checks only fn's own
    # file: kernel_cache), saved and loaded only under the stamps this process imported
    # with; nogil: a sampling thread does not hold up a collecting one.
    kernel_cache.check(fn)
    return kernel_cache.compiled(fn)


def direct_entry(kernel: Callable[..., Any], *example: Any) -> Callable[..., Any]:
    """The compiled entry point of ``kernel`` for the argument types of ``example``:
    calling it skips numba's dispatch, which types every argument anew on each call
    (about 15 ns an argument here: 0.2 us of a call of 14). ``kernel`` itself without
    numba (or when it is a plain function).

    Only for calls whose every argument has exactly its example's type (an array's
    dtype, dimensions and layout; an int for an int, a float for a float): the entry
    converts what it is given as if it had that type, so an array of another dtype or
    layout would be misread. Callers make it from the arrays they pass, keep it while
    those live, and pass nothing else (``sampling/step_draws.py``).
    """
    compile_ = getattr(kernel, "compile", None)
    if not AVAILABLE or compile_ is None:
        return kernel
    entry: Callable[..., Any] = compile_(tuple(kernel.typeof_pyval(value)  # type: ignore[attr-defined]
                                               for value in example))
    return entry


@compile_kernel
def descend(nodes: np.ndarray, upto: np.ndarray, runs: np.ndarray, root_width: int,
            height: int, t: np.ndarray) -> np.ndarray:
    """Leaf nodes (int64 ``[K]``) reached by targets ``t`` (float64 ``[K]`` in
    ``[0, total())``, consumed): :func:`replaybuffer.sampling.trees.descent.descend`
    compiled.

    ``nodes`` is the tree's flat node array, ``upto`` the wide root's inclusive
    running sums (``root_width`` of them) and ``runs`` the same behind a leading 0.
    Level by level over all targets, as the numpy loop, the wide root's binary search
    included: the ``K`` loads of a level are independent, so the processor overlaps
    them (their cache misses below, and the search's compare-and-step chains above).
    One target's walk is a chain of dependent loads; walking each target's whole
    search before the next took four times as long on fresh targets at 1M slots.
    """
    count = t.shape[0]
    node = np.zeros(count, np.int64)
    # The first j with upto[j] > t (searchsorted side="right"), branch-free: the answer
    # stays in [node, node + n] while n halves, the same halvings for every target.
    n = root_width
    while n > 1:
        half = n >> 1
        for k in range(count):
            base = node[k]
            node[k] = base + half * (upto[base + half - 1] <= t[k])
        n -= half
    for k in range(count):
        x = t[k]
        base = node[k]
        base += upto[base] <= x
        t[k] = x - runs[base]
        node[k] = base + root_width
    for _ in range(height % 3):  # the top binary levels, one node read each
        for k in range(count):
            n = node[k] + node[k]
            left = nodes[n]
            x = t[k]
            right = x >= left  # branch-free: the turns are coin flips to a predictor
            t[k] = x - left * right
            node[k] = n + right
    for _ in range(height // 3):  # then three levels per cache line (module docstring)
        for k in range(count):
            row = node[k] << 3  # the 8 great-grandchildren: one 64-byte line
            x = t[k]
            a = nodes[row] + nodes[row + 1]  # the stored grandchildren, bit for bit
            c = nodes[row + 4] + nodes[row + 5]
            left = a + (nodes[row + 2] + nodes[row + 3])  # the stored left child
            right = x >= left
            x = x - left * right
            left = c if right else a
            right2 = x >= left
            x = x - left * right2
            at = row + 4 * right + 2 * right2
            left = nodes[at]
            right3 = x >= left
            t[k] = x - left * right3
            node[k] = at + right3
    return node


@compile_kernel
def find(nodes: np.ndarray, upto: np.ndarray, runs: np.ndarray, root_width: int,
         height: int, targets: np.ndarray, limit: float
         ) -> tuple[np.ndarray, np.ndarray, int]:
    """:meth:`SumTree.find <replaybuffer.sampling.trees.sum_tree.SumTree.find>`'s usual
    case in one call: ``(slots, values, odd)``.

    ``targets`` (float64 ``[K]``, finite, >= 0) are left unchanged; ``limit`` is the
    lower of the total and the last running sum. Returns the slots (int64 ``[K]``) the
    targets descend to, their values (float64 ``[K]``), and how many targets are odd:
    at or past ``limit``, or landing on a slot of value 0 (both from rounding, rare).
    With ``odd > 0`` the caller redoes the search with the numpy tree's handling of
    those; the others' slots are :func:`descend`'s.
    """
    count = targets.shape[0]
    t = np.empty(count, np.float64)
    odd = 0
    for k in range(count):
        x = targets[k]
        past = x >= limit
        odd += past
        t[k] = 0.0 if past else x  # (a past target descends from 0 meanwhile)
    node = descend(nodes, upto, runs, root_width, height, t)
    size = (nodes.shape[0] >> 1)
    values = np.empty(count, np.float64)
    for k in range(count):
        v = nodes[node[k]]
        values[k] = v
        odd += v == 0.0
        node[k] -= size
    return node, values, odd


@compile_kernel
def running_sums(roots: np.ndarray, upto: np.ndarray) -> None:
    """``np.add.accumulate(roots, out=upto)`` (float64 ``[W]``): the same sequential
    sums, without the call's fixed cost (a third of a sample at 1M slots)."""
    acc = roots[0]
    upto[0] = acc
    for j in range(1, roots.shape[0]):
        acc = acc + roots[j]
        upto[j] = acc


@compile_kernel
def assign_sum(nodes: np.ndarray, slots: np.ndarray, values: np.ndarray, size: int,
               stop: int) -> None:
    """Write ``values`` (float64 ``[K]``) to ``slots`` (int64 ``[K]``, leaf ``size + slot``)
    in order, so a repeated slot ends with its last value (what the numpy tree's
    ``_last_wins`` resolves), then recompute every ancestor ``>= stop`` as the sum of
    its two children, level by level (the loads of one level are independent, so
    their cache misses overlap)."""
    count = slots.shape[0]
    node = np.empty(count, np.int64)
    for k in range(count):
        leaf = slots[k] + size
        nodes[leaf] = values[k]
        node[k] = leaf >> 1
    while count and node[0] >= stop:  # all paths reach a level together
        for k in range(count):
            n = node[k]
            nodes[n] = nodes[2 * n] + nodes[2 * n + 1]
            node[k] = n >> 1


@compile_kernel
def assign_min(nodes: np.ndarray, slots: np.ndarray, values: np.ndarray, size: int,
               stop: int) -> None:
    """:func:`assign_sum` with the minimum (slots are never NaN). Of two equal children
    the right one is taken, as ``np.minimum`` does (it matters for 0.0 and -0.0 only)."""
    count = slots.shape[0]
    node = np.empty(count, np.int64)
    for k in range(count):
        leaf = slots[k] + size
        nodes[leaf] = values[k]
        node[k] = leaf >> 1
    while count and node[0] >= stop:
        for k in range(count):
            n = node[k]
            left, right = nodes[2 * n], nodes[2 * n + 1]
            nodes[n] = left if left < right else right
            node[k] = n >> 1


@compile_kernel
def pairwise_sum(values: np.ndarray, start: int, count: int) -> float:
    """``np.add.reduce(values[start:start + count])`` (float64, contiguous) in the same
    order: numpy's pairwise summation (blocks of at most 128 summed by 8 interleaved
    accumulators, longer runs split in two at a multiple of 8 near the middle), so a
    compiled write can leave the tree's total as the numpy call would. Whether the
    installed numpy still sums this way is checked once (:func:`pairwise_matches`)."""
    if count < 8:
        total = -0.0  # numpy's start: -0.0 + x is x for every x, -0.0 included
        for i in range(start, start + count):
            total += values[i]
        return total
    if count <= 128:
        r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
        r4, r5, r6, r7 = (values[start + 4], values[start + 5], values[start + 6],
                          values[start + 7])
        end = start + count - count % 8
        i = start + 8
        while i < end:
            r0 += values[i]
            r1 += values[i + 1]
            r2 += values[i + 2]
            r3 += values[i + 3]
            r4 += values[i + 4]
            r5 += values[i + 5]
            r6 += values[i + 6]
            r7 += values[i + 7]
            i += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for j in range(end, start + count):
            total += values[j]
        return float(total)
    half = count // 2
    half -= half % 8
    return float(pairwise_sum(values, start, half)
                 + pairwise_sum(values, start + half, count - half))


_pairwise_matches: list[bool] = []


def pairwise_matches() -> bool:
    """Whether :func:`pairwise_sum` gives ``np.add.reduce``'s bits here (checked once,
    on sums of several lengths up to a total level's largest); a tree whose total a
    compiled write leaves uses it only then (:meth:`~replaybuffer.sampling.trees.
    sum_tree.SumTree.write_target`)."""
    if not _pairwise_matches:
        rng = np.random.default_rng(0)
        ok = AVAILABLE
        for count in (1, 7, 8, 9, 100, 128, 129, 1000, 2048, 16384):
            values = rng.lognormal(0.0, 3.0, count + 3) * (rng.random(count + 3) < 0.8)
            ok = ok and pairwise_sum(values, 3, count) == np.add.reduce(values[3:])
        _pairwise_matches.append(bool(ok))
    return _pairwise_matches[0]
