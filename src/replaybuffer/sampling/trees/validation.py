"""Checks of the indices and values given to a tree's public calls, with clear errors.

Pure functions over the caller's arguments: they return int64 or float64 arrays, or
raise ``ValueError`` naming the call (``where``), the first bad entry and its position.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import numpy.typing as npt


def as_indices(indices: Any, where: str, upper: int) -> npt.NDArray[np.int64]:
    """``indices`` as int64 (their shape kept), after checking they are ints in
    ``[0, upper)``."""
    idx = np.asarray(indices)
    if idx.size == 0:  # np.asarray([]) is float64; an empty batch is still fine
        return idx.astype(np.int64)
    if idx.dtype.kind not in "iu":
        raise ValueError(f"{where}: expected integer indices, got dtype {idx.dtype}")
    if idx.min() < 0 or idx.max() >= upper:
        flat = idx.reshape(-1)
        k = int(np.flatnonzero((flat < 0) | (flat >= upper))[0])
        raise ValueError(f"{where}: expected indices in [0, {upper}), "
                         f"got {flat[k].item()} at position {k}")
    return idx.astype(np.int64, copy=False)


def as_values(values: Any, shape: tuple[int, ...], where: str,
              check: Callable[[np.ndarray, str, str], None], name: str = "values",
              allow_scalar: bool = True) -> np.ndarray:
    """``values`` as float64 of ``shape`` (a scalar broadcast to it when
    ``allow_scalar``), after checking dtype and shape; ``check(values, where, name)``
    then checks the range (the tree variant's rule) of a non-empty array."""
    vals = np.asarray(values)
    if vals.dtype.kind not in "fiu":
        raise ValueError(f"{where}: expected real-number {name}, got dtype {vals.dtype}")
    if vals.shape != shape:
        if not (allow_scalar and vals.ndim == 0):
            scalar = " or a scalar" if allow_scalar else ""
            raise ValueError(f"{where}: expected {name} of shape {shape}{scalar}, "
                             f"got shape {vals.shape}")
        vals = np.broadcast_to(vals, shape)
    vals = vals.astype(np.float64, copy=False)
    if vals.size:
        check(vals, where, name)
    return vals
