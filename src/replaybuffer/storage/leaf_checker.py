"""Validation of incoming leaves against their specs, shared by every backend."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from replaybuffer.specs import ArraySpec, as_leaf_array, check_leaf


class LeafChecker:
    """Validates incoming leaves against specs, with the expected shapes cached.

    Shared by the backends: numpy arrays are checked the same way whatever the
    storage, and the fast path (an ndarray of exactly the leaf's dtype and shape)
    costs two comparisons.
    """

    def __init__(self, specs: Sequence[ArraySpec]):
        self.specs = tuple(specs)
        self.dtypes = [s.dtype for s in self.specs]
        self._full_shapes: dict[tuple[int, ...], list[tuple[int, ...]]] = {}

    def full_shapes(self, outer_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """``outer_shape + spec.shape`` for every leaf."""
        shapes = self._full_shapes.get(outer_shape)
        if shapes is None:
            shapes = self._full_shapes[outer_shape] = [outer_shape + s.shape for s in self.specs]
        return shapes

    def numpy_leaf(self, i: int, leaf: Any, full_shape: tuple[int | None, ...], path: str,
                   outer_shape: tuple[int | None, ...], outer_names: str) -> np.ndarray:
        """Leaf ``i`` as a validated numpy array; ``SpecError`` naming ``path`` if it is not.

        A ``None`` dimension (not known to the caller) matches no array."""
        arr = leaf if type(leaf) is np.ndarray else as_leaf_array(leaf, path)
        if arr.dtype is not self.dtypes[i] or arr.shape != full_shape:
            check_leaf(path, arr.shape, arr.dtype, self.specs[i], outer_shape, outer_names)
        return arr
