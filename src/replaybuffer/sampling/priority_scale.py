"""Priorities as the sum tree stores them: ``priority ** alpha``, and a bound of them;
the exponents as rows for ``np.power`` (:func:`exponent_row`), kept per sampler by size
(:class:`ExponentRows`, read through :func:`kept_row`).

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
    Made anew (about 1.5 us): callers keep theirs in :class:`ExponentRows`.

    Why: numpy's power runs its loop over two contiguous rows about 0.15 us faster (256
    bases) than over a broadcast 0-d exponent. But it computes some exponents given as
    a scalar another way (here 2, 0.5 and -1: a square, a square root, a reciprocal,
    which round otherwise than its power), and those must keep the scalar's bits. Which
    exponents do is asked of numpy, not listed: both ways are compared once per value
    and dtype on a spread of bases (where the two ways round differently they differ
    on a large share of such bases), :func:`_row_matches`."""
    if not _row_matches(float(value), np.dtype(dtype).char):
        return exponent(value, dtype)
    row: np.ndarray = np.full(count, value, dtype)
    row.flags.writeable = False
    return row


#: How many rows an :class:`ExponentRows` keeps, and how many exponents in all (4 MiB of
#: float64); a single larger row is kept alone.
KEPT_ROWS, KEPT_EXPONENTS = 128, 1 << 19


class ExponentRows(dict[int, np.ndarray]):
    """The :func:`exponent_row` s of one ``value`` and ``dtype`` that a sampler made, by
    ``count``: the one cache of them (:func:`exponent_row` keeps none), so that sizes
    changing from call to call (a shard's share of each update or draw) find the row
    they made earlier instead of making one at every call.

    Bounded: at most :data:`KEPT_ROWS` rows and :data:`KEPT_EXPONENTS` exponents, the
    oldest made dropped first (a single larger row is kept alone, so a fixed large
    batch size is made once too). Rows are read-only, so they are handed out as they
    are kept. A sampler reads it through :func:`kept_row`.
    """

    __slots__ = ("value", "dtype", "held")

    def __init__(self, value: float, dtype: type):
        super().__init__()
        self.value = value
        self.dtype = dtype
        self.held = 0  # exponents in the rows kept

    def made(self, count: int) -> np.ndarray:
        """The row for ``count`` bases, made now and kept (the caller found none)."""
        row = exponent_row(self.value, self.dtype, count)
        while self and (len(self) >= KEPT_ROWS or self.held + row.size > KEPT_EXPONENTS):
            self.held -= self.pop(next(iter(self))).size  # the oldest made
        self[count] = row
        self.held += row.size
        return row


KeptRow = tuple[float, int, np.ndarray, ExponentRows]
"""``(value, count, row, rows)``: the row a sampler used last (for ``count`` bases of
``value``) and the :class:`ExponentRows` it came from."""


def no_kept_row(dtype: type) -> KeptRow:
    """A :data:`KeptRow` of no value (NaN: every value differs), for a sampler's first
    call; nothing is ever kept in its rows."""
    return math.nan, 0, exponent(0.0, dtype), ExponentRows(math.nan, dtype)


def kept_row(kept: KeptRow, value: float, count: int, dtype: type) -> KeptRow:
    """The :data:`KeptRow` for ``count`` bases of ``value`` (``dtype``'s), where
    ``kept``, the one used last, is for another value or count: from ``kept``'s rows
    while the value is theirs, else from new rows (the old value's are dropped).

    Why a sampler holds the last one beside its rows rather than asking them at every
    call: its update (and draw) asks for its batch size's row each time, and the usual
    size is the last one. Comparing ``kept``'s value and count is the cheapest test of
    that: asking the rows instead (``rows.value``, ``rows.get(count)``) cost 0.07-0.13 us
    more of an ``update_priorities(256)`` of 6 us, an ``lru_cache`` call 0.15-0.19 us
    (median thread CPU, interleaved rounds, on a shared 2-core machine). The last one
    is an entry of the rows, not a second cache: it is never made or kept elsewhere."""
    rows = kept[3]
    if rows.value != value:
        rows = ExponentRows(value, dtype)
    row = rows.get(count)
    if row is None:
        row = rows.made(count)
    return value, count, row, rows


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
