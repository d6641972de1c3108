"""The importance-sampling exponent's schedule: ``beta`` annealed linearly per sample call.

Prioritized replay corrects its bias with weights ``(N * P(i)) ** -beta``; ``beta``
usually starts below 1 and grows to 1 over training (Schaul et al., 2016). Counted in
sample calls, it is a pure function of plain numbers.
"""

from __future__ import annotations


def annealed_beta(start: float, final: float | None, steps: int, calls: int) -> float:
    """``beta`` after ``calls`` sample calls: ``start`` moved linearly to ``final`` over
    ``steps`` calls, then held at ``final``; ``start`` throughout when ``final`` is
    ``None`` or ``steps`` is 0. Floats in [0, 1], ``steps`` and ``calls`` ints >= 0."""
    if final is None or steps == 0:
        return start
    frac = min(1.0, calls / steps)
    return start + frac * (final - start)
