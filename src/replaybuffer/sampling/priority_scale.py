"""Priorities as the sum tree stores them: ``priority ** alpha``, and a bound of them.

The sum tree holds ``v = p ** alpha`` per storage position (:mod:`replaybuffer.sampling.
prioritized`). Drawing by rejection (:mod:`~replaybuffer.sampling.rejection`) needs an
upper bound of every stored ``v``: ``max_priority ** alpha`` (every stored priority is
at most ``max_priority``), slackened by :data:`BOUND_SLACK` because ``np.power``
(vectorised) and ``math.pow`` may round ``p ** alpha`` a few ulp (2 ** -52 each) apart.
"""

from __future__ import annotations

import math

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
