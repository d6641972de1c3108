"""A prioritized draw by rejection in one compiled call: candidates, keep test, ids,
weights.

The numpy path of a rejection draw (:func:`~replaybuffer.sampling.rejection.
draw_rejecting`, then :func:`~replaybuffer.sampling.importance.probabilities_and_ratios`)
is about fifteen numpy calls on a pool of a few hundred candidates, whose fixed costs
are nearly all of its time on a batch of 256. With numba
(:data:`~replaybuffer.sampling.tree_kernels.AVAILABLE`), :func:`draw_kept_weighted`
makes one call into :func:`_kept`, which draws the first round's pool from the
generator exactly as the numpy path does (``rng.random(2 * n)``, ``n`` =
:func:`~replaybuffer.sampling.rejection.pool_size`, inside the call:
:mod:`~replaybuffer.sampling.generator_draws`), then does the numpy path's arithmetic
in the same order, so it gives the same bits:

1. each candidate's offset ``int(u * span * (1 - 2**-53))`` (numpy's ``astype``
   truncates the same way), its position and logical id as ``draw_rejecting`` and
   :func:`~replaybuffer.sampling.item_ids.ids_at` compute them;
2. kept while ``u' * bound < value``, the first ``count`` kept in the order drawn;
3. the probabilities and weight ratios of a full batch
   (:func:`~replaybuffer.sampling.importance.weigh_into`).

A first round that keeps fewer than ``count`` (about 1 in 100) hands what it kept to
the numpy loop, which draws the rest in further rounds from the same generator, as it
would have after its own first round.
"""

from __future__ import annotations

import math

import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.generator_draws import NO_SOURCE, bit_source, next_double
from replaybuffer.sampling.importance import weigh_into
from replaybuffer.sampling.rejection import ROUNDS, draw_rejecting, pool_size
from replaybuffer.sampling.ring import Ring

_NO_POOL = np.empty(0)  # (the pool is drawn inside the call)
_pool_size = tree_kernels.compile_kernel(pool_size)  # (for _kept; the same arithmetic)

Drawn = tuple[np.ndarray, np.ndarray, np.ndarray]
"""``(positions, ids, values)``: int64, int64, float64, each ``[K]``."""


def draw_kept_weighted(leaves: np.ndarray, ring: Ring, rng: np.random.Generator,
                       count: int, lo: int, span: int, bound: float, accept: float,
                       valid_mass: float, floor: float = math.nan
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | Drawn:
    """:func:`~replaybuffer.sampling.rejection.draw_rejecting` (same arguments; numba
    present), with the probabilities and weight ratios of a full batch
    (:func:`~replaybuffer.sampling.importance.probabilities_and_ratios` with
    ``valid_mass`` and ``floor``) from the same call.

    Returns ``(positions, ids, probabilities, ratios)`` (int64, int64, float32, float32,
    each ``[count]``) when the first round kept the whole batch, else
    ``draw_rejecting``'s ``(positions, ids, values)``, which may be short of ``count``
    as its own; bit for bit what the numpy path gives from the same generator state.
    """
    # The pool is sized and drawn inside the call (generator_draws), or, from a bit
    # generator it cannot call, here: rng.random(2 * pool_size(count, accept)) either way.
    source = bit_source(rng)
    if source is None:
        u = rng.random(2 * pool_size(count, accept))
        source = NO_SOURCE
    else:
        u = _NO_POOL
    B, L = ring.batch_size, ring.max_length
    # Outputs allocated here: they are handed to the caller (and on to the user).
    indices = np.empty((2, count), np.int64)
    weighed = np.empty((2, count), np.float32)
    # (lo, the first valid start, is the oldest id held.)
    # Under the bit generator's lock, as rng.random draws: another thread may share
    # the generator (a draw's rng=).
    lock = rng.bit_generator.lock
    lock.acquire()  # (not `with`: its __exit__ call costs more than release())
    try:
        kept = _kept(leaves, *source, u, accept, count, span * (1.0 - 2.0 ** -53), bound,
                     lo, (lo % L) * B, ring.capacity, B, L, lo, valid_mass, floor, indices,
                     weighed)
    finally:
        lock.release()
    if kept == count:
        return indices[1], indices[0], weighed[0], weighed[1]
    return continued(leaves, ring, rng, count, lo, span, bound, accept, indices, kept)


def continued(leaves: np.ndarray, ring: Ring, rng: np.random.Generator, count: int,
              lo: int, span: int, bound: float, accept: float, indices: np.ndarray,
              kept: int) -> Drawn:
    """A first compiled round that kept ``kept < count`` (its logical ids and positions
    in ``indices[:, :kept]``) continued by the numpy loop's later rounds, as
    ``draw_rejecting`` would continue its own first round: ``(positions, ids,
    values)``, possibly still short of ``count``."""
    positions, ids = indices[1, :kept], indices[0, :kept]
    more = draw_rejecting(leaves, ring, rng, count - kept, lo, span, bound, accept,
                          rounds=ROUNDS - 1)
    return (np.concatenate((positions, more[0])), np.concatenate((ids, more[1])),
            np.concatenate((leaves[positions], more[2])))


@tree_kernels.compile_kernel
def steps(leaves: np.ndarray, function: int, state: int, accept: float, count: int,
          span: int, bound: float, lo: int, batch_size: int, max_length: int,
          total: float, key_base: int, indices: np.ndarray, weighed: np.ndarray) -> int:
    """The first round of a rejection draw of single steps (``num_steps = 1``: the
    valid starts are every step held, from id ``lo`` on, ``span`` of them, of mass
    ``total``) with batch-normalized weights: :func:`_kept` with the arguments that
    case fixes filled in here (the pool drawn inside from ``function`` and ``state``,
    nonzero), then, for a full batch, the ids made item ids, ``(key_base + id) *
    batch_size + row`` (:func:`~replaybuffer.sampling.item_ids.to_item_ids`) in
    ``indices[0]``: the usual read's draw (:mod:`~replaybuffer.sampling.step_draws`).
    Returns how many were kept; fewer than ``count`` leaves logical ids in
    ``indices[0, :kept]`` for :func:`continued`."""
    kept: int = _kept(leaves, function, state, np.empty(0, np.float64), accept, count,
                      span * (1.0 - 2.0 ** -53), bound, lo, (lo % max_length) * batch_size,
                      batch_size * max_length, batch_size, max_length, lo, total,
                      math.nan, indices, weighed)
    if kept == count and (batch_size > 1 or key_base):
        for k in range(count):
            indices[0, k] = ((key_base + indices[0, k]) * batch_size
                             + indices[1, k] % batch_size)
    return kept


@tree_kernels.compile_kernel
def _kept(leaves: np.ndarray, function: int, state: int, u: np.ndarray, accept: float,
          count: int, scale: float, bound: float, lo: int, first: int, capacity: int,
          batch_size: int, max_length: int, oldest: int, valid_mass: float, floor: float,
          indices: np.ndarray, weighed: np.ndarray) -> int:
    """The module docstring's steps 1-3 over the pool ``u`` (float64 ``[2n]``: the
    candidates' draws, then their keep tests), into ``indices`` (int64 ``[2, count]``:
    ids, positions) and, for a full batch, ``weighed`` (float32 ``[2, count]``:
    probabilities, ratios). Unless ``function`` is 0, the pool is drawn here instead
    (``u`` is ignored), ``2n`` numbers from ``function`` and ``state``
    (:func:`~replaybuffer.sampling.generator_draws.bit_source`), ``n`` being
    :func:`~replaybuffer.sampling.rejection.pool_size` ``(count, accept)`` (compiled
    from the same function, one Python call less): the generator is left as
    ``random(2n)`` leaves it, whatever is kept. Returns how many were kept (at most
    ``count``)."""
    if function:
        n = _pool_size(count, accept)
        u = np.empty(2 * n, np.float64)
        for k in range(2 * n):
            u[k] = next_double(function, state)
    else:
        n = u.shape[0] // 2
    values = np.empty(count, np.float64)
    shift = oldest % max_length
    kept = 0
    for k in range(n):
        offset = int(u[k] * scale)  # in [0, span)
        if batch_size == 1:  # the offset counts steps: the id is lo + offset
            i = offset + lo
            position = i % max_length if lo else i
        else:
            position = offset + first
            if position >= capacity:  # the range wraps past the last position
                position -= capacity
            slot = position // batch_size
            i = slot if oldest == 0 else (slot - shift) % max_length + oldest
        v = leaves[position]
        if u[n + k] * bound < v:
            indices[0, kept] = i
            indices[1, kept] = position
            values[kept] = v
            kept += 1
            if kept == count:
                weigh_into(values, count, valid_mass, floor, weighed)
                return kept
    return kept
