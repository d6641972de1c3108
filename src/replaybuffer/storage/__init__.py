"""Where the bytes live: one module per backend behind :class:`Storage`.

A buffer's ``storage=`` is a backend's name (``"numpy"``, ``"torch"``, ``"mmap"``,
``"tensorflow"``, or one added with :func:`register_storage`) or a storage object of
the caller's (checked by :func:`~replaybuffer.storage.conformance.checked_storage`).
"""

from __future__ import annotations

from typing import Any, Sequence

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.base import Storage
from replaybuffer.storage.conformance import checked_storage
from replaybuffer.storage.numpy_storage import NumpyStorage
from replaybuffer.storage.registry import register_storage, storage_class, storage_names

__all__ = ["NumpyStorage", "Storage", "make_storage", "register_storage", "STORAGE_KINDS"]

STORAGE_KINDS = ("numpy", "torch", "tensorflow", "mmap")
"""The built-in backends' names."""


def make_storage(kind: str | Storage, specs: Sequence[ArraySpec], capacity: int,
                 device: Any = None, path: Any = None) -> Storage:
    """Build the storage backend named ``kind`` (``"numpy"``, ``"torch"``,
    ``"tensorflow"``, or ``"mmap"`` on files under ``path``), or take ``kind``, a
    storage object, once it is checked to satisfy :class:`Storage` and to hold
    ``specs`` and ``capacity`` positions (``device`` and ``path`` are then the
    object's own business and must be ``None``).

    Backends with optional dependencies are imported only when asked for.

    Raises:
        ValueError: an unknown name, a ``path`` or ``device`` the backend does not take,
            or an object of another capacity.
        TypeError: an object that lacks a member of :class:`Storage`.
        SpecError: an object that holds other specs.
        ImportError: the backend's dependency is not installed.
    """
    if not isinstance(kind, str):
        if path is not None or device is not None:
            raise ValueError(f"storage={type(kind).__name__}(...) is a storage object, built "
                             f"already: it takes no device= or path= (got device={device!r}, "
                             f"path={path!r})")
        return checked_storage(kind, specs, capacity)
    if (path is None) != (kind != "mmap"):
        raise ValueError(f"storage='mmap' needs path= (a new or empty directory), and only it "
                         f"takes one: got storage={kind!r}, path={path!r}")
    if kind == "mmap":
        if device not in (None, "cpu"):
            raise ValueError(f"mmap storage lives in host memory; device={device!r} needs "
                             "storage='torch'")
        built: Storage = storage_class("mmap")(specs, capacity, path)
        return built
    if kind == "numpy":
        if device not in (None, "cpu"):
            raise ValueError(f"numpy storage lives in host RAM; device={device!r} needs "
                             "storage='torch'")
        return NumpyStorage(specs, capacity)
    if kind == "torch":
        try:
            backend = storage_class("torch")
        except ImportError as exc:
            raise ImportError("storage='torch' needs PyTorch: pip install "
                              "'replaybuffer[torch]'") from exc
    elif kind == "tensorflow":
        try:
            backend = storage_class("tensorflow")
        except ImportError as exc:
            raise ImportError("storage='tensorflow' needs TensorFlow: pip install "
                              "'replaybuffer[tensorflow]'") from exc
    elif kind in storage_names():
        backend = storage_class(kind)
    else:
        raise ValueError(f"unknown storage {kind!r}; expected one of {STORAGE_KINDS}")
    built = backend(specs, capacity, device)
    return built
