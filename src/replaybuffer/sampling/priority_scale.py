"""Priorities as the sum tree stores them: ``priority ** alpha``, and a bound of them.

The sum tree holds ``v = p ** alpha`` per storage position (:mod:`replaybuffer.sampling.
prioritized`). Drawing by rejection (:mod:`~replaybuffer.sampling.rejection`) needs an
upper bound of every stored ``v``: ``max_priority ** alpha`` (every stored priority is
at most ``max_priority``), slackened by :data:`BOUND_SLACK` because ``np.power``
(vectorised) and ``math.pow`` may round ``p ** alpha`` a few ulp (2 ** -52 each) apart.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

#: Relative slack on the rejection bound (module docstring).
BOUND_SLACK = 1.0 + 2.0 ** -40

#: Below the largest float by more than any slack used here.
FINITE = 1e307


def exponent(value: float, dtype: type) -> np.ndarray:
    """``value`` as a read-only 0-d array of ``dtype`` (float64 or float32), for
    ``np.power``: the same exponent as the Python float, which numpy converts to the
    base's dtype on every call otherwise (float32's power of a float32 array takes
    ``float32(value)`` either way), for about 0.3 us less per call."""
    out: np.ndarray = np.array(value, dtype)
    out.flags.writeable = False
    return out


def exponent_row(value: float, dtype: type, count: int) -> np.ndarray:
    """``value`` as ``np.power``'s exponent for ``count`` bases of ``dtype`` (float64 or
    float32): a read-only row of ``count`` copies where numpy's power gives the bits of
    the 0-d :func:`exponent` (the Python float's) with it, else that 0-d exponent.

    Why: numpy's power runs its loop over two contiguous rows about 0.15 us faster (256
    bases) than over a broadcast 0-d exponent. But it computes some exponents given as
    a scalar another way (here 2, 0.5 and -1: a square, a square root, a reciprocal,
    which round otherwise than its power), and those must keep the scalar's bits. Which
    exponents do is asked of numpy, not listed: both ways are compared once per value
    and dtype on a spread of bases (where the two ways round differently they differ
    on a large share of such bases), :func:`_row_matches`.

    Rows of up to :data:`KEPT_ROW_COUNT` bases are kept (read-only, so shared): making
    one costs about 1.5 us, ten times what a call saves with it, and callers keep only
    the last batch size's, so sizes that change from call to call (a shard's share of
    each update or draw) would otherwise make one at every call."""
    if count <= KEPT_ROW_COUNT:
        return _kept_row(value, dtype, count)
    return _made_row(value, dtype, count)


def _made_row(value: float, dtype: type, count: int) -> np.ndarray:
    """:func:`exponent_row`, made anew."""
    if not _row_matches(float(value), np.dtype(dtype).char):
        return exponent(value, dtype)
    row: np.ndarray = np.full(count, value, dtype)
    row.flags.writeable = False
    return row


#: The largest row :func:`exponent_row` keeps, and how many it keeps (at most 4 MiB).
KEPT_ROW_COUNT, _KEPT_ROWS = 4096, 128
_kept_row = lru_cache(maxsize=_KEPT_ROWS)(_made_row)


@lru_cache(maxsize=64)
def _row_matches(value: float, char: str) -> bool:
    """Whether ``np.power`` with a row of ``value`` gives the 0-d exponent's bits on
    :data:`_PROBE` (as ``char``, a float dtype's character)."""
    bases = _PROBE.astype(char)
    with np.errstate(all="ignore"):
        scalar: np.ndarray = np.power(bases, exponent(value, np.dtype(char).type))
        row: np.ndarray = np.power(bases, np.full(len(bases), value, char))
    return bool(scalar.tobytes() == row.tobytes())


# Bases from tiny to huge (overflowing float32), zeros and ones, both signs of zero.
_PROBE = np.concatenate([np.random.default_rng(0).lognormal(0.0, 12.0, 4096),
                         np.random.default_rng(1).random(1024), [0.0, -0.0, 1.0, 2.0]])


def scale(priorities: np.ndarray, alpha: float, largest: float,
          alpha_exponent: np.ndarray | None = None, out: np.ndarray | None = None
          ) -> tuple[np.ndarray, float]:
    """``(priorities ** alpha, a bound of it)`` for raw priorities (float64 ``[K]``,
    finite and >= 0) whose largest is ``largest``: float64 ``[K]`` and a float (``inf``
    when ``largest ** alpha`` overflows). ``alpha = 0`` keeps a zero priority at 0 (never
    drawn) and makes every other one 1. ``alpha_exponent`` is ``exponent(alpha,
    np.float64)`` if the caller keeps one; ``out`` (float64 ``[K]``) takes the powers
    where they are computed (the result may be ``priorities`` itself or a new array)."""
    if alpha == 1.0:
        return priorities, largest
    if alpha == 0.0:  # 0 ** 0 is 1, but a zero priority must stay unsampled
        return np.where(priorities > 0, 1.0, 0.0), 1.0
    scaled = np.power(priorities, alpha if alpha_exponent is None else alpha_exponent, out)
    # A bound of scaled.max() without another pass over it (math.pow and the
    # vectorised np.power round a few ulp apart, far inside the slack).
    try:
        return scaled, math.pow(largest, alpha) * BOUND_SLACK
    except OverflowError:
        return scaled, math.inf


def scaled_bound(max_priority: float, alpha: float, floor: float) -> float:
    """An upper bound of every stored ``priority ** alpha`` (``inf`` if unknown): from
    ``max_priority``, or ``floor`` where a restored state holds more."""
    try:
        top = math.pow(max_priority, alpha)
    except OverflowError:
        return math.inf
    return max(top, floor) * BOUND_SLACK
