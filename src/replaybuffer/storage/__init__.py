"""Where the bytes live: one module per backend behind :class:`Storage`."""

from __future__ import annotations

from typing import Any, Sequence

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.base import Storage
from replaybuffer.storage.numpy_storage import NumpyStorage

__all__ = ["NumpyStorage", "Storage", "make_storage", "STORAGE_KINDS"]

STORAGE_KINDS = ("numpy", "torch", "tensorflow", "mmap")


def make_storage(kind: str, specs: Sequence[ArraySpec], capacity: int,
                 device: Any = None, path: Any = None) -> Storage:
    """Build the storage backend named ``kind`` (``"numpy"``, ``"torch"``,
    ``"tensorflow"``, or ``"mmap"`` on files under ``path``).

    Backends with optional dependencies are imported only when asked for.
    """
    if (path is None) != (kind != "mmap"):
        raise ValueError(f"storage='mmap' needs path= (a new or empty directory), and only it "
                         f"takes one: got storage={kind!r}, path={path!r}")
    if kind == "mmap":
        if device not in (None, "cpu"):
            raise ValueError(f"mmap storage lives in host memory; device={device!r} needs "
                             "storage='torch'")
        from replaybuffer.storage.mmap_storage import MmapStorage

        return MmapStorage(specs, capacity, path)
    if kind == "numpy":
        if device not in (None, "cpu"):
            raise ValueError(f"numpy storage lives in host RAM; device={device!r} needs "
                             "storage='torch'")
        return NumpyStorage(specs, capacity)
    if kind == "torch":
        try:
            from replaybuffer.storage.torch_storage import TorchStorage
        except ImportError as exc:
            raise ImportError("storage='torch' needs PyTorch: pip install "
                              "'replaybuffer[torch]'") from exc
        return TorchStorage(specs, capacity, device)
    if kind == "tensorflow":
        try:
            from replaybuffer.tf.storage import TFStorage
        except ImportError as exc:
            raise ImportError("storage='tensorflow' needs TensorFlow: pip install "
                              "'replaybuffer[tensorflow]'") from exc
        return TFStorage(specs, capacity, device)
    raise ValueError(f"unknown storage {kind!r}; expected one of {STORAGE_KINDS}")
