"""The storage protocol: where the bytes of a buffer live.

A storage holds one array per leaf spec, each of shape ``[capacity, *spec.shape]``.
It validates and converts incoming leaves, writes a block of consecutive
positions, and gathers arbitrary positions. It knows nothing of rows, rings,
randomness or episodes: positions are plain integers in ``[0, capacity)``.

A user may pass a storage object of their own as a buffer's ``storage=`` (a subclass of
:class:`~replaybuffer.storage.numpy_storage.NumpyStorage`, say): it must have every
member of :class:`Storage` (:data:`STORAGE_ATTRIBUTES`, :data:`STORAGE_METHODS`) and
hold the buffer's specs and capacity (checked by
:func:`~replaybuffer.storage.conformance.checked_storage`).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from replaybuffer.protocols import Checkpointable
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.exact_writer import ExactWriter
from replaybuffer.storage.leaf_checker import LeafChecker

__all__ = ["LeafChecker", "STORAGE_ATTRIBUTES", "STORAGE_METHODS", "Storage",
           "checked_leaves", "identity", "leaf_nbytes", "leaves_state", "to_numpy"]


class Storage(Checkpointable, Protocol):
    """What a buffer needs of the place its steps live (see the module docstring): the
    attributes and methods below, and :class:`~replaybuffer.protocols.Checkpointable`."""

    kind: str
    """Backend name: ``"numpy"``, ``"torch"``, ... (a checkpoint records it)."""
    specs: tuple[ArraySpec, ...]
    """One spec per leaf, in nest flatten order."""
    capacity: int
    """Number of positions."""
    checker: LeafChecker
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

    def state_dict(self) -> dict[str, Any]:
        """The stored data: ``capacity`` and ``leaves``, a numpy copy of every leaf's
        array ``[capacity, *spec.shape]`` (plus what a backend keeps beside them). A
        checkpoint streams the arrays in chunks instead (:mod:`replaybuffer.persist`);
        this copies the whole storage at once."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned. Raises ``ValueError`` (a capacity,
        leaf count, shape or dtype other than this storage's) before writing anything."""


STORAGE_ATTRIBUTES = ("kind", "specs", "capacity", "checker", "arrays", "nbytes")
"""The data members of :class:`Storage`, which a storage object must have."""
STORAGE_METHODS = ("convert", "write", "exact_writer", "gather", "from_numpy", "zero",
                   "load", "state_dict", "load_state_dict")
"""The methods of :class:`Storage`, which a storage object must have."""


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


def leaves_state(storage: Storage) -> dict[str, Any]:
    """A storage's ``state_dict``: ``capacity`` and a numpy copy of every leaf's array."""
    return {"capacity": storage.capacity,
            "leaves": [np.array(to_numpy(a), copy=True) for a in storage.arrays]}


def checked_leaves(storage: Storage, state: dict[str, Any]) -> list[np.ndarray]:
    """The ``leaves`` of a storage state, once they are checked to fit ``storage``.

    Raises:
        ValueError: another capacity, leaf count, or a leaf of another shape or dtype
            than ``[capacity, *spec.shape]`` in the spec's dtype.
    """
    capacity, leaves = int(state["capacity"]), [np.asarray(a) for a in state["leaves"]]
    if capacity != storage.capacity or len(leaves) != len(storage.specs):
        raise ValueError(f"a storage state of capacity {capacity} with {len(leaves)} leaves "
                         f"for a storage of capacity {storage.capacity} with "
                         f"{len(storage.specs)} leaves")
    for i, (leaf, spec) in enumerate(zip(leaves, storage.specs)):
        shape = (storage.capacity,) + spec.shape
        if leaf.shape != shape or leaf.dtype != spec.dtype:
            raise ValueError(f"storage state leaf {i}: expected shape {shape} dtype "
                             f"{spec.dtype.name}, got shape {leaf.shape} dtype "
                             f"{leaf.dtype.name}")
    return leaves
