"""The arrays of a buffer's state (a sampler's priorities, cursors, ...) as ``.npy``
files beside the manifest, each referenced from the manifest with its CRC-32.

A state is a nest of dicts, lists, scalars and numpy arrays
(:meth:`~replaybuffer.protocols.Checkpointable.state_dict`); an array at key path
``a.b`` is written to ``state.a.b.npy`` and replaced in the manifest by
``{"__npy__": file, "shape", "dtype", "crc32"}``.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np

from replaybuffer.errors import CheckpointError
import replaybuffer.persist.durable as durable


def externalise_arrays(state: Any, directory: Path, prefix: str = "state") -> Any:
    """Replace numpy arrays in a state nest (a sampler's priorities, say) by references
    to ``.npy`` files written beside the manifest, each with its CRC-32."""
    if isinstance(state, np.ndarray):
        name = f"{prefix}.npy"
        arr = np.ascontiguousarray(state)
        with durable.naming(directory / name), open(directory / name, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
            durable.sync(fh)
        return {"__npy__": name, "shape": list(arr.shape), "dtype": arr.dtype.str,
                "crc32": zlib.crc32(arr.data)}
    if isinstance(state, dict):
        return {k: externalise_arrays(v, directory, f"{prefix}.{k}") for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [externalise_arrays(v, directory, f"{prefix}.{i}") for i, v in enumerate(state)]
    return state


def internalise_arrays(state: Any, directory: Path) -> Any:
    """Inverse of :func:`externalise_arrays`, checking every file.

    Raises:
        CheckpointError: a file is missing, unreadable, or of another shape, dtype or
            checksum than the manifest says.
    """
    if isinstance(state, dict) and "__npy__" in state:
        path = directory / str(state["__npy__"])
        where = f"state array {path.name}"
        if not path.is_file():
            raise CheckpointError(f"{where} is missing from {directory}")
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise CheckpointError(f"{where} is not a readable .npy file: {exc}") from exc
        if list(arr.shape) != state.get("shape") or arr.dtype.str != state.get("dtype") or \
                zlib.crc32(np.ascontiguousarray(arr).data) != state.get("crc32"):
            raise CheckpointError(f"{where} is corrupt: its shape, dtype or checksum does not "
                                  "match the manifest")
        return arr
    if isinstance(state, dict):
        return {k: internalise_arrays(v, directory) for k, v in state.items()}
    if isinstance(state, list):
        return [internalise_arrays(v, directory) for v in state]
    return state
