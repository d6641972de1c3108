"""Storage in numpy arrays in RAM."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.base import LeafChecker, identity, leaf_nbytes


class NumpyStorage:
    """One ``np.zeros([capacity, *spec.shape], spec.dtype)`` array per leaf.

    ``np.zeros`` maps fresh pages lazily, so RAM fills as the buffer does.

    Args:
        specs: leaf specs, in nest flatten order.
        capacity: number of positions.
    """

    kind = "numpy"

    def __init__(self, specs: Sequence[ArraySpec], capacity: int):
        self.specs = tuple(specs)
        self.capacity = int(capacity)
        self.arrays = [np.zeros((self.capacity,) + s.shape, s.dtype) for s in self.specs]
        self._checker = LeafChecker(self.specs)

    @property
    def nbytes(self) -> int:
        return leaf_nbytes(self.specs, self.capacity)

    def convert(self, leaves: Sequence[Any], paths: Sequence[str],
                outer_shape: tuple[int, ...], outer_names: str) -> Sequence[np.ndarray]:
        shapes = self._checker.full_shapes(outer_shape)
        # Fast path: arrays of exactly the stored dtype and shape need no conversion.
        for leaf, shape, dtype in zip(leaves, shapes, self._checker.dtypes):
            if type(leaf) is not np.ndarray or leaf.dtype is not dtype or leaf.shape != shape:
                break
        else:
            return leaves
        check = self._checker.numpy_leaf
        return [check(i, leaf, shape, paths[i], outer_shape, outer_names)
                for i, (leaf, shape) in enumerate(zip(leaves, shapes))]

    def write(self, start: int, leaves: Sequence[np.ndarray]) -> None:
        stop = start + len(leaves[0])
        for dst, src in zip(self.arrays, leaves):
            dst[start:stop] = src

    def gather(self, positions: np.ndarray, which: Sequence[int] | None = None
               ) -> list[np.ndarray]:
        # Positions come from ring arithmetic and are always in range; mode="clip" skips
        # the bounds-error bookkeeping of the default mode (about 10% of a small gather).
        arrays = self.arrays if which is None else [self.arrays[i] for i in which]
        return [arr.take(positions, 0, mode="clip") for arr in arrays]

    from_numpy = staticmethod(identity)

    def zero(self) -> None:
        for arr in self.arrays:
            arr[...] = 0

    def export(self, count: int) -> list[np.ndarray]:
        return [arr[:count] for arr in self.arrays]

    def load(self, arrays: Sequence[np.ndarray]) -> None:
        for dst, src in zip(self.arrays, arrays):
            dst[:len(src)] = src
