"""Save and restore buffers without pickle.

A save is a directory holding ``manifest.json`` (format version, buffer class,
layout, data spec, write position, sampler state, and per leaf: file, shape,
dtype and CRC-32) and one ``leaf_NNN.npy`` per leaf with the filled positions.
Files are written to a temporary sibling directory that replaces the target only
once complete, so an interrupted save never leaves a half-written checkpoint
behind under the target's name.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from replaybuffer import nest
from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.errors import CheckpointError
from replaybuffer.sampling.ring import items_per_row
from replaybuffer.specs import ArraySpec, spec_from_dict

FORMAT = "replaybuffer"
VERSION = 1
MANIFEST = "manifest.json"


# ------------------------------------------------------------------ spec nests
def encode_spec(spec: Any) -> Any:
    """A JSON-friendly encoding of a nest of :class:`ArraySpec`."""
    if isinstance(spec, ArraySpec):
        return {"spec": spec.to_dict()}
    if spec is None:
        return {"none": True}
    if isinstance(spec, tuple) and hasattr(spec, "_fields"):
        cls = type(spec)
        return {"namedtuple": cls.__qualname__, "module": cls.__module__,
                "fields": list(spec._fields), "values": [encode_spec(v) for v in spec]}
    if type(spec) is tuple:
        return {"tuple": [encode_spec(v) for v in spec]}
    if type(spec) is list:
        return {"list": [encode_spec(v) for v in spec]}
    if type(spec) is dict:
        for key in spec:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise CheckpointError(f"cannot save a data_spec dict key {key!r}: only str "
                                      "and int keys are supported")
        return {"dict": [[k, encode_spec(v)] for k, v in spec.items()]}
    raise CheckpointError(f"cannot save a data_spec containing {type(spec).__name__}")


def decode_spec(obj: Any) -> Any:
    """Inverse of :func:`encode_spec`.

    A namedtuple comes back as its original class when that class is already
    imported (nothing is imported to find it); otherwise as an equivalent
    namedtuple with the same name and fields.
    """
    if not isinstance(obj, dict) or len(obj) == 0:
        raise CheckpointError(f"malformed data_spec entry {obj!r}")
    if "spec" in obj:
        return spec_from_dict(obj["spec"])
    if "none" in obj:
        return None
    if "tuple" in obj:
        return tuple(decode_spec(v) for v in obj["tuple"])
    if "list" in obj:
        return [decode_spec(v) for v in obj["list"]]
    if "dict" in obj:
        return {k: decode_spec(v) for k, v in obj["dict"]}
    if "namedtuple" in obj:
        cls = _namedtuple_class(obj["module"], obj["namedtuple"], obj["fields"])
        return cls(*(decode_spec(v) for v in obj["values"]))
    raise CheckpointError(f"malformed data_spec entry {obj!r}")


def _namedtuple_class(module: str, qualname: str, fields: list[str]) -> type:
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, tuple) and \
            list(getattr(found, "_fields", ())) == fields:
        return found
    return collections.namedtuple(qualname.split(".")[-1], fields)


# --------------------------------------------------------------------- save/load
def save(buffer: ReplayBuffer, directory: str | os.PathLike) -> None:
    """Write ``buffer`` to ``directory`` (see the module docstring for the format)."""
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"cannot save to {target}: it is a file")
    if target.is_dir() and any(target.iterdir()) and not (target / MANIFEST).exists():
        raise CheckpointError(f"refusing to save into {target}: it is a non-empty directory "
                              "that holds no replaybuffer save")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with buffer._lock:
            state, arrays = buffer._snapshot()
            leaves = []
            for i, (arr, path) in enumerate(zip(arrays, buffer._paths)):
                arr = np.ascontiguousarray(arr)
                name = f"leaf_{i:03d}.npy"
                with open(tmp / name, "wb") as fh:
                    np.save(fh, arr, allow_pickle=False)
                    _sync(fh)
                leaves.append({"file": name, "path": path, "shape": list(arr.shape),
                               "dtype": arr.dtype.str, "crc32": zlib.crc32(arr.data)})
        state = _externalise_arrays(state, tmp)
        manifest = {
            "format": FORMAT, "version": VERSION, "buffer": type(buffer).__name__,
            "batch_size": buffer.batch_size, "max_length": buffer.max_length,
            "storage": buffer.storage, "config": buffer._config(),
            "data_spec": encode_spec(buffer.data_spec), "state": state, "leaves": leaves,
        }
        manifest["checksum"] = _manifest_checksum(manifest)
        with open(tmp / MANIFEST, "w") as fh:
            fh.write(json.dumps(manifest, indent=1))
            _sync(fh)
        _replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _externalise_arrays(state: Any, directory: Path, prefix: str = "state") -> Any:
    """Replace numpy arrays in a state nest (a sampler's priorities, say) by references
    to ``.npy`` files written beside the manifest, each with its CRC-32."""
    if isinstance(state, np.ndarray):
        name = f"{prefix}.npy"
        arr = np.ascontiguousarray(state)
        with open(directory / name, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
            _sync(fh)
        return {"__npy__": name, "shape": list(arr.shape), "dtype": arr.dtype.str,
                "crc32": zlib.crc32(arr.data)}
    if isinstance(state, dict):
        return {k: _externalise_arrays(v, directory, f"{prefix}.{k}") for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_externalise_arrays(v, directory, f"{prefix}.{i}") for i, v in enumerate(state)]
    return state


def _internalise_arrays(state: Any, directory: Path) -> Any:
    """Inverse of :func:`_externalise_arrays`, checking every file."""
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
        return {k: _internalise_arrays(v, directory) for k, v in state.items()}
    if isinstance(state, list):
        return [_internalise_arrays(v, directory) for v in state]
    return state


def _sync(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _replace(new: Path, target: Path) -> None:
    """Move the complete save ``new`` to ``target``; an old save there survives failures."""
    if not target.exists():
        new.rename(target)
        return
    old = target.with_name(new.name + ".old")
    target.rename(old)
    try:
        new.rename(target)
    except BaseException:
        old.rename(target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _manifest_checksum(manifest: dict[str, Any]) -> int:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def _require(condition: bool, path: Path, message: str) -> None:
    if not condition:
        raise CheckpointError(f"{path}: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The parsed, checked manifest of a save. Raises :class:`CheckpointError`."""
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise CheckpointError(f"{directory} is not a directory")
    if not path.is_file():
        raise CheckpointError(f"{directory} holds no {MANIFEST}: not a replaybuffer save, or "
                              "an incomplete one")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    _require(isinstance(manifest, dict) and manifest.get("format") == FORMAT, path,
             "not a replaybuffer manifest")
    _require(manifest.get("version") == VERSION, path,
             f"format version {manifest.get('version')!r}; this replaybuffer reads "
             f"version {VERSION}")
    for key in ("buffer", "batch_size", "max_length", "storage", "config", "data_spec",
                "state", "leaves", "checksum"):
        _require(key in manifest, path, f"lacks the field {key!r}")
    _require(manifest["checksum"] == _manifest_checksum(manifest), path,
             "the manifest is corrupt: its checksum does not match its contents")
    # The checksum catches accidents; these checks catch hand edits with a new checksum.
    for key in ("batch_size", "max_length"):
        _require(_is_int(manifest[key]) and manifest[key] >= 1, path,
                 f"{key} must be a positive int, found {manifest[key]!r}")
    state, leaves = manifest["state"], manifest["leaves"]
    _require(isinstance(state, dict) and _is_int(state.get("last_id"))
             and state["last_id"] >= -1 and isinstance(state.get("sampler"), dict), path,
             f"malformed state {state!r:.200}")
    _require(isinstance(manifest["config"], dict), path, "config must be an object")
    _require(isinstance(leaves, list) and all(
        isinstance(e, dict) and isinstance(e.get("file"), str) and _is_int(e.get("crc32"))
        for e in leaves), path, "leaves must be a list of {file, crc32, ...} objects")
    return manifest


def load(directory: str | os.PathLike, *, storage: str | None = None, device: Any = None,
         data_spec: Any = None) -> ReplayBuffer:
    """Restore a buffer saved with ``buffer.save(directory)``.

    Args:
        directory: the save.
        storage, device: override the saved storage backend (e.g. restore a numpy
            buffer into torch tensors on ``"cuda"``).
        data_spec: the spec you expect; it must equal the saved one, and its
            container types (your own namedtuple classes) are used for the result.

    Raises:
        CheckpointError: missing or malformed manifest, missing, truncated or corrupt
            data files, or a ``data_spec`` that differs from the saved one. Nothing is
            created in that case.
    """
    manifest = read_manifest(directory)
    cls = ReplayBuffer._registry.get(manifest["buffer"])
    if cls is None:
        raise CheckpointError(f"unknown buffer class {manifest['buffer']!r} in {directory}")
    try:
        saved_spec = decode_spec(manifest["data_spec"])
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{directory}: malformed data_spec: {exc}") from exc
    if data_spec is not None:
        saved_spec = _matching_spec(saved_spec, data_spec, directory)
    specs, _ = nest.flatten(saved_spec)
    entries = manifest["leaves"]
    if len(entries) != len(specs):
        raise CheckpointError(f"{directory}: manifest lists {len(entries)} leaf files for a "
                              f"spec of {len(specs)} leaves")
    state = manifest["state"]
    count = items_per_row(state["last_id"], manifest["max_length"]) * manifest["batch_size"]
    try:
        buffer = cls._construct(saved_spec, manifest["batch_size"], manifest["max_length"],
                                storage or manifest["storage"], device, manifest["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild the buffer: {exc}") from exc
    # Stored leaves follow the storage's specs (deduplicated frames are references).
    arrays = [_read_leaf(Path(directory), entry, spec, count)
              for entry, spec in zip(entries, buffer._storage.specs)]
    state = _internalise_arrays(state, Path(directory))
    try:
        buffer._restore(state, arrays)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild the buffer: {exc}") from exc
    return buffer


def _matching_spec(saved: Any, wanted: Any, directory: Any) -> Any:
    from replaybuffer.specs import as_data_spec

    wanted = as_data_spec(wanted)
    saved_leaves, saved_structure = nest.flatten(saved)
    wanted_leaves, wanted_structure = nest.flatten(wanted)
    if saved_leaves != wanted_leaves or \
            nest.describe(saved_structure) != nest.describe(wanted_structure):
        raise CheckpointError(f"data_spec does not match the save in {directory}: saved "
                              f"{saved!r}, given {wanted!r}")
    return wanted


def _read_leaf(directory: Path, entry: dict[str, Any], spec: ArraySpec,
               count: int) -> np.ndarray:
    path = directory / str(entry.get("file"))
    where = f"leaf {entry.get('path')} ({path.name})"
    if not path.is_file():
        raise CheckpointError(f"{where} is missing from {directory}")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CheckpointError(f"{where} is not a readable .npy file: {exc}") from exc
    expected_shape = (count,) + spec.shape
    if arr.shape != expected_shape or arr.dtype != spec.dtype:
        raise CheckpointError(f"{where}: expected shape {expected_shape} dtype "
                              f"{spec.dtype.name}, found shape {arr.shape} dtype "
                              f"{arr.dtype.name}")
    if zlib.crc32(np.ascontiguousarray(arr).data) != entry.get("crc32"):
        raise CheckpointError(f"{where} is corrupt: its checksum does not match the manifest")
    return arr
