"""A prioritized draw by descent in one compiled call: targets, search, ids, weights.

The numpy path of a descent draw (:func:`~replaybuffer.sampling.proportional_descent.
draw_descending`, then :func:`~replaybuffer.sampling.importance.
probabilities_and_ratios`) is a dozen calls whose fixed costs, beside the search's own
cache misses, were about a third of a ``get_next(256)`` at 1M steps. With numba
(:data:`~replaybuffer.sampling.tree_kernels.AVAILABLE`), :func:`draw_weighted` makes
one call into :func:`_fused` for the whole batch, which does the same arithmetic in the
same order, so it gives the same bits and the same draws from the same generator:

1. ``u * mass`` (the generator's ``random(count)``, drawn in the call:
   :mod:`~replaybuffer.sampling.generator_draws`; scaled in place), and each target
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
from replaybuffer.sampling.generator_draws import NO_SOURCE, bit_source, next_double
from replaybuffer.sampling.importance import probabilities_and_ratios, weigh_into
from replaybuffer.sampling.priority_range import range_segments
from replaybuffer.sampling.proportional_descent import WHOLE, draw_descending
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.trees import SumTree


def draw_weighted(tree: SumTree, ring: Ring, count: int, rng: np.random.Generator,
                  first: int, span: int, hi: int,
                  segments: tuple[np.ndarray, np.ndarray] | None, valid_mass: float,
                  floor: float = math.nan
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~replaybuffer.sampling.proportional_descent.draw_descending` (same
    arguments) and the batch's probabilities and weight ratios
    (:func:`~replaybuffer.sampling.importance.probabilities_and_ratios` with
    ``valid_mass`` and ``floor``), in one compiled call when numba is present.

    Returns ``(positions, ids, probabilities, ratios)``: int64, int64, float32,
    float32, each ``[count]``; bit for bit what the numpy path gives from the same
    generator state.
    """
    if not tree_kernels.AVAILABLE:
        positions, ids, values = draw_descending(tree, ring, count, rng, first, span, hi,
                                                 segments)
        return (positions, ids, *probabilities_and_ratios(values, valid_mass, floor))
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
    # The draws land in u inside the call (generator_draws), or, from a bit generator
    # it cannot call, come in it: rng.random(count) either way.
    u = np.empty(count)
    source = bit_source(rng)
    if source is None:
        rng.random(out=u)
        source = NO_SOURCE
    # Outputs allocated here and filled in place: a compiled call's returned arrays
    # cost about a microsecond each to box, five of them more than the search.
    indices = np.empty((2, count), np.int64)
    weighed = np.empty((2, count), np.float32)
    last, L = ring.last_id, ring.max_length
    # Under the bit generator's lock, as rng.random draws: another thread may share
    # the generator (a draw's rng=). (The numpy path below takes it itself.)
    lock = rng.bit_generator.lock
    lock.acquire()  # (not `with`: its __exit__ call costs more than release())
    try:
        usual = _fused(nodes, runs, root_width, height, limit, *source, u, mass, parts,
                       start0, start1, mass0, ring.batch_size, L,
                       last + 1 - L if last >= L else 0,  # (the oldest id held, inline)
                       hi, valid_mass, floor, indices, weighed)
    finally:
        lock.release()
    if usual:
        return indices[1], indices[0], weighed[0], weighed[1]
    # Odd (rare): the numpy path from the same scaled draws (_fused scaled u in place).
    positions, ids, values = draw_descending(tree, ring, count, rng, first, span, hi,
                                             segments, u)
    return (positions, ids, *probabilities_and_ratios(values, valid_mass, floor))


@tree_kernels.compile_kernel
def _fused(nodes: np.ndarray, runs: np.ndarray, root_width: int, height: int,
           limit: float, function: int, state: int, u: np.ndarray, mass: float,
           parts: int, start0: float, start1: float, mass0: float, batch_size: int,
           max_length: int, oldest: int, hi: int, valid_mass: float, floor: float,
           indices: np.ndarray, weighed: np.ndarray) -> bool:
    """The module docstring's steps 1-4, into ``indices`` (int64 ``[2, K]``: ids,
    positions) and ``weighed`` (float32 ``[2, K]``: probabilities, ratios). ``u``
    (float64 ``[K]``) holds the generator's draws, or gets them here first from
    ``function`` and ``state`` unless ``function`` is 0
    (:func:`~replaybuffer.sampling.generator_draws.bit_source`). Returns whether the
    batch was usual; if not, only ``u`` (scaled) is meaningful."""
    count = u.shape[0]
    if function:
        for k in range(count):
            u[k] = next_double(function, state)
    t = np.empty(count, np.float64)
    for k in range(count):
        x = u[k] * mass
        u[k] = x
        if parts == 2:  # np.where(u < masses[0], starts[0] + u, starts[-1] + u - masses[0])
            x = start0 + x if x < mass0 else start1 + x - mass0
        elif parts == 1:
            x = start0 + x
        t[k] = x
    for k in range(count):  # find()'s odd targets: at or past the limit
        if t[k] >= limit:
            return False
    node = tree_kernels.descend(nodes, runs[1:], runs, root_width, height, t)
    size = nodes.shape[0] >> 1
    values = t  # (the targets are spent)
    shift = oldest % max_length
    for k in range(count):
        v = nodes[node[k]]
        position = node[k] - size
        values[k] = v
        slot = position // batch_size if batch_size > 1 else position
        i = slot if oldest == 0 else (slot - shift) % max_length + oldest
        indices[0, k] = i
        indices[1, k] = position
        if v == 0.0 or i >= hi:  # a slot of 0, or a start outside the range
            return False
    weigh_into(values, count, valid_mass, floor, weighed)
    return True


@tree_kernels.compile_kernel
def steps(nodes: np.ndarray, runs: np.ndarray, root_width: int, height: int,
          total: float, function: int, state: int, u: np.ndarray, batch_size: int,
          max_length: int, last_id: int, key_base: int, indices: np.ndarray,
          weighed: np.ndarray) -> bool:
    """A descent over the whole tree for single steps (``num_steps = 1``: no mass
    outside the valid range, which is every step held) with batch-normalized weights,
    and the ids made item ids: :func:`_fused` with the arguments that case fixes
    (``mass = valid_mass = total``, no segments, the limit and the oldest id held
    computed here from ``runs``' last running sum and ``last_id``), then
    ``(key_base + id) * batch_size + row`` (:func:`~replaybuffer.sampling.item_ids.
    to_item_ids`) into ``indices[0]``. Fewer arguments to unbox than :func:`_fused`
    and no Python between them: the usual read's draw
    (:mod:`~replaybuffer.sampling.step_draws`). Returns whether the batch was usual;
    if not, only ``u`` (scaled by ``total``) is meaningful, as for :func:`_fused`."""
    oldest = last_id + 1 - max_length if last_id >= max_length else 0
    last_sum = runs[runs.shape[0] - 1]
    limit = last_sum if last_sum < total else total  # (Python's min(total, last_sum))
    if not _fused(nodes, runs, root_width, height, limit, function, state, u, total, 0,
                  0.0, 0.0, 0.0, batch_size, max_length, oldest, last_id + 1, total,
                  math.nan, indices, weighed):
        return False
    if batch_size > 1 or key_base:
        for k in range(u.shape[0]):
            indices[0, k] = ((key_base + indices[0, k]) * batch_size
                             + indices[1, k] % batch_size)
    return True
