"""Sampling probabilities and importance-weight ratios of a prioritized batch.

For a batch of drawn values ``v`` (``priority ** alpha``, float64 ``[K]``, all > 0)
out of a valid mass ``M``, :func:`probabilities_and_ratios` gives, as float32:

- ``probabilities = v / M``, each divided in float64 and rounded once to float32;
- ``ratios = floor / v``, the same way, where ``floor`` is the batch's smallest value
  (``normalize="batch"``) or the smallest stored one (``normalize="buffer"``).

The caller raises the ratios to ``beta`` (``np.power`` in float32), which makes them
the importance weights (:mod:`replaybuffer.sampling.prioritized`). The numpy version
is a handful of calls whose fixed costs are most of their time on a batch of 256; the
compiled one (numba, the ``fast`` extra, as :mod:`~replaybuffer.sampling.tree_kernels`)
does it in one loop and gives the same bits (the same float64 divisions, rounded to
float32 the same way, and the minimum is exact).
"""

from __future__ import annotations

import math

import numpy as np

from replaybuffer.sampling import tree_kernels


def probabilities_and_ratios(values: np.ndarray, valid_mass: float, floor: float = math.nan
                             ) -> tuple[np.ndarray, np.ndarray]:
    """``(v / valid_mass, floor / v)``, float32 ``[K]`` each, for float64 ``values``
    ``[K]`` (``K >= 1``, all > 0); a NaN ``floor`` (the default) is ``values.min()``."""
    if tree_kernels.AVAILABLE:
        result: tuple[np.ndarray, np.ndarray] = _compiled(values, valid_mass, floor)
        return result
    return _numpy(values, valid_mass, floor)


def _numpy(values: np.ndarray, valid_mass: float, floor: float
           ) -> tuple[np.ndarray, np.ndarray]:
    """The reference: numpy divisions into float32 outputs (computed in float64)."""
    probabilities = np.empty(len(values), np.float32)
    np.divide(values, valid_mass, out=probabilities)
    ratios = np.empty(len(values), np.float32)
    np.divide(values.min() if math.isnan(floor) else floor, values, out=ratios)
    return probabilities, ratios


@tree_kernels.compile_kernel
def weigh_into(values: np.ndarray, count: int, valid_mass: float, floor: float,
               weighed: np.ndarray) -> None:
    """The compiled loop: the first ``count`` of ``values`` (float64) weighed into
    ``weighed`` (float32 ``[2, >= count]``: probabilities, then ratios); a kernel that
    drew the values calls it before it returns (one call into compiled code)."""
    low = values[0]
    for k in range(count):
        v = values[k]
        weighed[0, k] = v / valid_mass
        low = v if v < low else low  # values are > 0 (never NaN): the exact minimum
    if not math.isnan(floor):
        low = floor
    for k in range(count):
        weighed[1, k] = low / values[k]


@tree_kernels.compile_kernel
def _compiled(values: np.ndarray, valid_mass: float, floor: float
              ) -> tuple[np.ndarray, np.ndarray]:
    count = values.shape[0]
    weighed = np.empty((2, count), np.float32)
    weigh_into(values, count, valid_mass, floor, weighed)
    return weighed[0], weighed[1]
