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
