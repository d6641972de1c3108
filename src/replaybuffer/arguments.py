"""Checks of the arguments that many public methods share."""

from __future__ import annotations

from typing import Any

import numpy as np


def positive_or_none(value: Any, name: str) -> int | None:
    """``value`` as a Python int when it is a positive integer, ``None`` as it is.

    Raises:
        ValueError: anything else (zero, negative, a bool, a float, a string); the
            message names the argument ``name`` and the value given.
    """
    if value is None or (type(value) is int and value > 0):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return int(value)


def check_timeout(timeout: Any, name: str = "timeout") -> float | None:
    """``timeout`` (seconds to wait) as a float, ``None`` (wait as long as it takes) as
    it is.

    A NaN compares false with every deadline, so a wait on it never ends; a negative
    one is a mistake. Both are refused here, at the public entry points, before any
    rate limiter counts the call or anything is written.

    Raises:
        ValueError: NaN, negative, or not a real number (a bool, a string); the message
            names the argument ``name`` and the value given.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer,
                                                             np.floating)) \
            or not timeout >= 0:  # false for NaN as for negatives
        raise ValueError(f"{name} must be None or a number of seconds >= 0, got "
                         f"{timeout!r}")
    return float(timeout)
