"""The storage protocol: where the bytes of a buffer live.

A storage holds one array per leaf spec, each of shape ``[capacity, *spec.shape]``.
It validates and converts incoming leaves, writes a block of consecutive
positions, and gathers arbitrary positions. It knows nothing of rows, rings,
randomness or episodes: positions are plain integers in ``[0, capacity)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from replaybuffer.specs import ArraySpec, as_leaf_array, check_leaf

if TYPE_CHECKING:
    from replaybuffer.storage.exact_writer import ExactWriter


class Storage(Protocol):
    kind: str
    """Backend name: ``"numpy"``, ``"torch"``."""
    specs: tuple[ArraySpec, ...]
    """One spec per leaf, in nest flatten order."""
    capacity: int
    """Number of positions."""
    _checker: LeafChecker
    """Validates numpy leaves against ``specs`` (buffers check related leaves with it)."""

    @property
    def arrays(self) -> Sequence[Any]:
        """The backend arrays, one per leaf, ``[capacity, *spec.shape]`` each."""

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (allocated up front)."""

    def convert(self, leaves: Sequence[Any], paths: Sequence[str],
                outer_shape: tuple[int, ...], outer_names: str) -> Sequence[Any]:
        """Validate leaves against the specs (with ``outer_shape`` leading dims) and
        return them as backend arrays. Raises ``SpecError`` naming the leaf path."""

    def write(self, start: int, leaves: Sequence[Any]) -> None:
        """Write ``leaves[i]`` (shape ``[n, *spec.shape]``) at positions ``start .. start+n-1``.

        The caller guarantees ``start + n <= capacity``."""

    def exact_writer(self, outer_shape: tuple[int, ...]) -> ExactWriter | None:
        """A fused check-and-write for the hot path of adding a block of
        ``outer_shape[0]`` positions (see :mod:`replaybuffer.storage.exact_writer`), or
        ``None`` where the backend has no such shortcut (the caller then uses
        :meth:`convert` and :meth:`write`)."""

    def gather(self, positions: np.ndarray, which: Sequence[int] | None = None) -> list[Any]:
        """Read ``positions`` (int64 >= 0, any shape P, taken modulo ``capacity``: a
        window may run past the last position, and a one-row buffer passes step ids);
        leaf ``i`` comes back ``[*P, *spec_i.shape]``.

        ``which`` restricts the read to those leaf indices (in that order)."""

    def from_numpy(self, array: np.ndarray) -> Any:
        """A numpy array as this backend's array type (used for ids and probabilities)."""

    def zero(self) -> None:
        """Set every stored value to zero."""

    def load(self, arrays: Sequence[np.ndarray], start: int = 0) -> None:
        """Write numpy arrays (``[n, *spec.shape]`` each, in the stored dtype) at positions
        ``[start, start + n)`` of every leaf (for restoring, chunk by chunk)."""


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


def to_numpy(array: Any) -> np.ndarray:
    """A backend array (numpy, torch on any device, TensorFlow) as a numpy array.

    Torch tensors are detached and copied to the host first.
    """
    if hasattr(array, "detach"):
        host: np.ndarray = array.detach().cpu().numpy()
        return host
    return np.asarray(array)


def identity(array: np.ndarray) -> np.ndarray:
    """``from_numpy`` of backends whose arrays are numpy arrays."""
    return array


def leaf_nbytes(specs: Sequence[ArraySpec], capacity: int) -> int:
    """Total bytes of ``capacity`` items of every spec."""
    return sum(s.nbytes for s in specs) * capacity
