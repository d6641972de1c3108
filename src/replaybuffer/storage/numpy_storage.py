"""Storage in numpy arrays in RAM."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec, check_leaf
from replaybuffer.storage.base import leaf_nbytes


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
        # Precomputed per-leaf (spec, full shape) to keep convert() free of tuple building.
        self._shapes = [s.shape for s in self.specs]
        self._dtypes = [s.dtype for s in self.specs]

    @property
    def nbytes(self) -> int:
        return leaf_nbytes(self.specs, self.capacity)

    def convert(self, leaves: Sequence[Any], paths: Sequence[str],
                outer_shape: tuple[int, ...], outer_names: str) -> list[np.ndarray]:
        out = []
        for leaf, spec, shape, dtype, path in zip(leaves, self.specs, self._shapes,
                                                   self._dtypes, paths):
            arr = leaf if type(leaf) is np.ndarray else _as_array(leaf, path)
            if arr.dtype is not dtype or arr.shape != outer_shape + shape:
                check_leaf(path, arr.shape, arr.dtype, spec, outer_shape, outer_names)
            out.append(arr)
        return out

    def write(self, start: int, leaves: Sequence[np.ndarray]) -> None:
        for dst, src in zip(self.arrays, leaves):
            dst[start:start + len(src)] = src

    def gather(self, positions: np.ndarray) -> list[np.ndarray]:
        return [arr.take(positions, axis=0) for arr in self.arrays]

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        return array

    def zero(self) -> None:
        for arr in self.arrays:
            arr[...] = 0

    def export(self, count: int) -> list[np.ndarray]:
        return [arr[:count] for arr in self.arrays]

    def load(self, arrays: Sequence[np.ndarray]) -> None:
        for dst, src in zip(self.arrays, arrays):
            dst[:len(src)] = src


def _as_array(leaf: Any, path: str) -> np.ndarray:
    try:
        arr = np.asarray(leaf)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"leaf {path}: cannot convert {type(leaf).__name__} to an array") from exc
    if arr.dtype.hasobject:
        raise SpecError(f"leaf {path}: expected a numeric array, got {type(leaf).__name__} "
                        f"{leaf!r:.80}")
    return arr
