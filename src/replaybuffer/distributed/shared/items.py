"""Items coming into a shared buffer: checked against the spec, converted to the
storage's arrays, in the writing process before anything is written."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from replaybuffer import nest
from replaybuffer.errors import SpecError
from replaybuffer.storage.leaf_checker import LeafChecker


class ItemChecker:
    """Checks a nest of items against ``data_spec`` and converts its leaves to numpy
    arrays of the spec's dtype and shape (a stacked-frame leaf as stacked: the frame
    ring encodes it, :mod:`.frame_ring`).

    Args:
        data_spec: the buffer's nest of :class:`~replaybuffer.ArraySpec`.
    """

    def __init__(self, data_spec: Any):
        specs, self._structure = nest.flatten(data_spec)
        self._first_shape = list(specs[0].shape)
        self._paths = nest.leaf_paths(data_spec)
        self._fast_flatten = nest.fast_flattener(data_spec)
        self._checker = LeafChecker(specs)
        # Per outer shape, the full shape and dtype each leaf must have to be stored as
        # it is (the usual case, checked here without building the error's names).
        self._exact: dict[tuple[int, ...], tuple[list[tuple[int, ...]], list[np.dtype]]] = {}

    def arrays(self, items: Any, method: str, axes: int
               ) -> tuple[Sequence[Any], tuple[int, ...]]:
        """The leaves of ``items`` as storage arrays ``[B, *shape]`` (``axes=1``) or
        ``[B, T, *shape]`` (``axes=2``), and that outer shape.

        Raises:
            SpecError: wrong structure, shape or dtype (naming the leaf, for ``method``).
        """
        leaves = None if self._fast_flatten is None else self._fast_flatten(items)
        if leaves is None:
            leaves, structure = nest.flatten(items)
            if structure != self._structure:
                raise SpecError(f"{method}: items do not match the data_spec structure: "
                                f"expected {nest.describe(self._structure)}, got "
                                f"{nest.describe(structure)}")
        shape = np.shape(leaves[0])
        if len(shape) != axes + len(self._first_shape):
            raise SpecError(f"{method}: {self._paths[0]} has shape {shape}; expected "
                            f"{'[B, T]' if axes == 2 else '[B]'} + {self._first_shape}")
        outer = tuple(shape[:axes])
        exact = self._exact.get(outer)
        if exact is None:
            if len(self._exact) > 64:  # extends of many lengths: keep it small
                self._exact.clear()
            checker = self._checker
            exact = self._exact[outer] = (checker.full_shapes(outer), checker.dtypes)
        for leaf, full, dtype in zip(leaves, *exact):
            if type(leaf) is not np.ndarray or leaf.dtype is not dtype or leaf.shape != full:
                break
        else:
            return leaves, outer
        names = f"[batch={outer[0]}]" if axes == 1 else \
            f"[batch={outer[0]}, steps={outer[1]}]"
        check, shapes = self._checker.numpy_leaf, exact[0]
        return [check(i, leaf, shape, self._paths[i], outer, names)
                for i, (leaf, shape) in enumerate(zip(leaves, shapes))], outer
