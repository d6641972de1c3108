"""Proportional draws by rejection: uniform candidates kept with probability ``v / bound``.

A candidate drawn uniformly from the valid starts is kept with probability
``v / bound``, where ``v = priority ** alpha`` and ``bound >= max(v)``
(:mod:`~replaybuffer.sampling.priority_scale`). Kept candidates are exactly proportional
draws, independent of each other, in the order drawn. A batch costs a dozen numpy
calls over about ``K / a`` candidates, ``a = valid_mass / (range * bound)`` being the
chance of keeping one, against about five calls per tree level for a descent
(:mod:`~replaybuffer.sampling.proportional_descent`); the sampler uses it while
``a >= ACCEPT_MIN``.
"""

from __future__ import annotations

import math

import numpy as np

from replaybuffer.sampling.item_ids import ids_at
from replaybuffer.sampling.ring import Ring

#: Draw by rejection while a uniform candidate is kept at least this often (module
#: docstring). At 1/4 a batch of 256 takes about 1,200 candidates, still well under
#: the cost of a descent through a tree of 1e5-1e6 slots.
ACCEPT_MIN = 0.25

#: The most candidates in one round (a bound on memory when few are kept).
POOL_MAX = 1 << 20

#: Rounds of rejection before the rest of a batch is drawn otherwise. Each round's pool
#: is sized to fill the batch with probability ~99%, so a second round is rare and a
#: sixteenth unheard of.
ROUNDS = 16


def pool_size(need: int, accept: float) -> int:
    """Candidates for one round of rejection that keep ``need`` or more with probability
    ~99% (2.5 standard deviations of the binomial count kept) when each is kept with
    probability ``accept`` (in ``(0, 1]``), so one round usually does; at most
    :data:`POOL_MAX`."""
    n = math.ceil((need + 2.5 * math.sqrt(need * (1.0 - accept)) + 2.0) / accept)
    return min(n, POOL_MAX)


def draw_rejecting(leaves: np.ndarray, ring: Ring, rng: np.random.Generator, count: int,
                   lo: int, span: int, bound: float, accept: float, rounds: int = ROUNDS
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Up to ``count`` valid starts, in proportion to their values, by rejection.

    The valid starts are the ``span`` steps-and-rows from id ``lo`` on (the cyclic
    position range ``[first, first + span)`` in slot-major order). Each candidate is
    uniform over them and kept with probability ``value / bound`` (``bound`` >= every
    value of ``leaves``, float64 ``[capacity]``), so each kept one is an exact
    proportional draw, independent of the others; kept ones are returned in the order
    drawn. ``accept`` is the chance of keeping a candidate, ``valid_mass / (span * bound)``.

    Returns ``(positions, ids, values)`` (int64, int64, float64), fewer than
    ``count`` only after ``rounds`` (:data:`ROUNDS`) short rounds (practically never).
    """
    B, L, cap = ring.batch_size, ring.max_length, ring.capacity
    first = (lo % L) * B
    # Offsets are floor(u * span) for u uniform in [0, 1). With span itself the
    # product can round up to span (u = 1 - 2**-53, span a power of two); scaled by
    # 1 - 2**-53 it stays below span, and the buckets change by 2**-53 relative.
    scale = span * (1.0 - 2.0 ** -53)
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    need = count
    for _ in range(rounds):
        n = pool_size(need, accept)
        u = rng.random(2 * n)
        pick = u[:n]
        pick *= scale
        offset = pick.astype(np.int64)  # in [0, span)
        if B == 1:  # the offset counts steps: the id is lo + offset
            ids = offset
            ids += lo
            pos = ids % L if lo else ids  # ids below max_length are their positions
        else:
            ids = None
            pos = offset
            pos += first
            if first + span > cap:  # the range wraps past the last position
                pos[pos >= cap] -= cap
        vals = leaves[pos]
        # The first `need` kept (never a value of 0); indices gather faster than masks.
        keep = (u[n:] * bound < vals).nonzero()[0][:need]
        pos, vals = pos[keep], vals[keep]
        ids = ids_at(ring, pos) if ids is None else ids[keep]
        kept.append((pos, ids, vals))
        need -= len(pos)
        if not need:
            break
    if len(kept) == 1:
        return kept[0]
    positions, ids_kept, values = zip(*kept)
    return np.concatenate(positions), np.concatenate(ids_kept), np.concatenate(values)
