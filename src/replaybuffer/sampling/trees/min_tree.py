"""The min tree: the smallest stored value, for the largest importance weight.

No wide root and no search: only the root value, the ``np.minimum.reduce`` of the
total level (:mod:`~replaybuffer.sampling.trees.segment`).
"""

from __future__ import annotations

import math

import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.trees.segment import SegmentTree


class MinTree(SegmentTree):
    """The minimum over slots, for the largest importance weight in prioritized replay.

    Slots hold any float64 but NaN and -inf; +inf marks an empty slot (the identity,
    and the value every slot starts at).

    Args:
        capacity: number of slots, a positive int.
        root_width: the wide root's most children (:class:`SegmentTree`).
    """

    _combine = np.minimum
    _identity = np.inf
    _assign_kernel = staticmethod(tree_kernels.assign_min)

    def _init_root(self) -> None:
        self._min = math.inf  # the minimum over the total level; no wide root

    def _reduce_level(self) -> None:
        self._min = float(np.minimum.reduce(self._total_level))

    def _root_value(self) -> float:
        return self._min

    def min(self) -> float:
        """The smallest slot value; ``inf`` when every slot is empty."""
        return self._min

    def _check_values(self, values: np.ndarray, where: str, name: str) -> None:
        if not values.min() > -np.inf:  # NaN fails the comparison too
            flat = values.reshape(-1)
            k = int(np.flatnonzero(np.isnan(flat) | (flat == -np.inf))[0])
            raise ValueError(f"{where}: expected {name} that are not NaN or -inf (+inf marks "
                             f"an empty slot), got {flat[k].item()!r} at position {k}")
