"""A prioritized draw by descent in one compiled call: targets, search, ids, weights.

The numpy path of a descent draw (:func:`~replaybuffer.sampling.proportional_descent.
draw_descending`, then :func:`~replaybuffer.sampling.importance.
probabilities_and_ratios`) is a dozen calls whose fixed costs, beside the search's own
cache misses, were about a third of a ``get_next(256)`` at 1M steps. With numba
(:data:`~replaybuffer.sampling.tree_kernels.AVAILABLE`), :func:`draw_weighted` makes
one call into :func:`_fused` for the whole batch, which does the same arithmetic in the
same order, so it gives the same bits and the same draws from the same generator:

1. ``u * mass`` (the generator's ``random(count)`` scaled, in place), and each target
   placed in the range's segments as ``np.where`` would place it;
2. :func:`~replaybuffer.sampling.tree_kernels.descend`, with
   :func:`~replaybuffer.sampling.tree_kernels.find`'s test for odd targets (at or past
   the limit, or landing on a slot of 0);
3. the logical ids of the found positions (:func:`~replaybuffer.sampling.item_ids.
   ids_at`) and the test that all are below ``hi``;
4. the probabilities and weight ratios (:mod:`~replaybuffer.sampling.importance`).

Whenever step 2 or 3 finds something unusual (rare: rounding, or a target in the
sliver of mass outside the range), the call reports it and the numpy path takes over
from the very targets drawn (``u``, already scaled), so the result is the numpy path's.
"""

from __future__ import annotations

import math

import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.importance import probabilities_and_ratios
from replaybuffer.sampling.priority_range import range_segments
from replaybuffer.sampling.proportional_descent import WHOLE, draw_descending
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.trees import SumTree


def draw_weighted(tree: SumTree, ring: Ring, count: int, rng: np.random.Generator,
                  first: int, span: int, hi: int,
                  segments: tuple[np.ndarray, np.ndarray] | None, valid_mass: float,
                  floor: float = math.nan
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~replaybuffer.sampling.proportional_descent.draw_descending` (same
    arguments) and the batch's probabilities and weight ratios
    (:func:`~replaybuffer.sampling.importance.probabilities_and_ratios` with
    ``valid_mass`` and ``floor``), in one compiled call when numba is present.

    Returns ``(positions, ids, values, probabilities, ratios)``: int64, int64,
    float64, float32, float32, each ``[count]``; bit for bit what the numpy path
    gives from the same generator state.
    """
    if not tree_kernels.AVAILABLE:
        positions, ids, values = draw_descending(tree, ring, count, rng, first, span, hi,
                                                 segments)
        return (positions, ids, values, *probabilities_and_ratios(values, valid_mass, floor))
    if segments is WHOLE:
        mass, start0, start1, mass0, parts = tree.total(), 0.0, 0.0, 0.0, 0
    else:
        if segments is None:
            segments = range_segments(tree, first, span, ring.capacity)
        starts, masses = segments
        mass = float(masses.sum())
        parts = len(starts)
        start0, start1, mass0 = float(starts[0]), float(starts[-1]), float(masses[0])
    nodes, runs, root_width, height, limit = tree.search_arrays()
    u = rng.random(count)
    out = _fused(nodes, runs, root_width, height, limit, u, mass, parts, start0, start1,
                 mass0, ring.batch_size, ring.max_length, ring.oldest_id, hi, valid_mass,
                 floor)
    if out[5]:
        return out[0], out[1], out[2], out[3], out[4]
    # Odd (rare): the numpy path from the same scaled draws (_fused scaled u in place).
    positions, ids, values = draw_descending(tree, ring, count, rng, first, span, hi,
                                             segments, u)
    return (positions, ids, values, *probabilities_and_ratios(values, valid_mass, floor))


@tree_kernels.compile_kernel
def _fused(nodes: np.ndarray, runs: np.ndarray, root_width: int, height: int,
           limit: float, u: np.ndarray, mass: float, parts: int, start0: float,
           start1: float, mass0: float, batch_size: int, max_length: int, oldest: int,
           hi: int, valid_mass: float, floor: float
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """The module docstring's steps 1-4: ``(positions, ids, values, probabilities,
    ratios, ok)``; with ``ok`` false only ``u`` (scaled) is meaningful."""
    count = u.shape[0]
    t = np.empty(count, np.float64)
    for k in range(count):
        x = u[k] * mass
        u[k] = x
        if parts == 2:  # np.where(u < masses[0], starts[0] + u, starts[-1] + u - masses[0])
            x = start0 + x if x < mass0 else start1 + x - mass0
        elif parts == 1:
            x = start0 + x
        t[k] = x
    empty_i = np.empty(0, np.int64)
    empty_f = np.empty(0, np.float32)
    for k in range(count):  # find()'s odd targets: at or past the limit
        if t[k] >= limit:
            return empty_i, empty_i, np.empty(0, np.float64), empty_f, empty_f, False
    node = tree_kernels.descend(nodes, runs[1:], runs, root_width, height, t)
    size = nodes.shape[0] >> 1
    values = np.empty(count, np.float64)
    ids = np.empty(count, np.int64)
    shift = oldest % max_length
    for k in range(count):
        v = nodes[node[k]]
        position = node[k] - size
        node[k] = position
        values[k] = v
        slot = position // batch_size if batch_size > 1 else position
        i = slot if oldest == 0 else (slot - shift) % max_length + oldest
        ids[k] = i
        if v == 0.0 or i >= hi:  # a slot of 0, or a start outside the range
            return empty_i, empty_i, values, empty_f, empty_f, False
    probabilities = np.empty(count, np.float32)
    low = values[0]
    for k in range(count):
        v = values[k]
        probabilities[k] = v / valid_mass
        low = v if v < low else low
    if not math.isnan(floor):
        low = floor
    ratios = np.empty(count, np.float32)
    for k in range(count):
        ratios[k] = low / values[k]
    return node, ids, values, probabilities, ratios, True
