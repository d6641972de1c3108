"""Checkpoints of buffers: streamed to disk while the buffer stays in use, no pickle.

Layout. ``buffer.save(path)`` treats ``path`` as a series of checkpoints::

    path/ckpt-000001/   manifest.json, leaf_000.npy, leaf_001.npy, ..., state.*.npy
    path/ckpt-000002/   ...
    path/.tmp-PID-XXXX/ a save under way (or abandoned by a killed process)

``manifest.json`` holds the format version, buffer class, layout, data spec, the
state (write position, sampler state and generator, priorities, cursors: small
arrays in ``state.*.npy`` beside it), and per data file its shape, dtype and CRC-32.
A ``leaf_NNN.npy`` holds the filled positions of one storage leaf; other large arrays
(the frame ring of deduplicated stacks) are streams of their own (``frames_000.npy``).

What is guaranteed:

- **Atomic**: a checkpoint is written under a temporary name in ``path`` and renamed to
  ``ckpt-N`` once every file is written and fsynced; a directory named ``ckpt-N``
  is always complete. A process killed at any moment of a save leaves the earlier
  checkpoints as they were and a ``.tmp-*`` directory that :func:`load` ignores and
  the next save removes. ``keep=N`` then removes older checkpoints (renamed aside
  first, so a kill mid-removal never leaves a half-deleted ``ckpt-N``).
- **Consistent while in use**: the state and a copy-on-write view of the data are
  taken under the buffer's lock; the data is then read in chunks of
  :data:`CHUNK_BYTES` (the lock held for one chunk at a time), while a write to a
  position not saved yet first copies the old contents aside
  (:mod:`replaybuffer.storage.frozen`). The checkpoint is exactly the buffer at the
  moment the save began.
- **Bounded memory**: save and load move data in chunks; neither makes a second copy
  of the buffer. Load reads files with ``readinto`` (no memory maps, whose pages would
  count in the process's resident memory) straight into the new buffer's storage.
- **Checked**: every data file's header, size and CRC-32 and the manifest's checksum
  are verified on load; any mismatch is a :class:`CheckpointError` naming the file.

Format 1 (a single save with ``manifest.json`` directly in the directory) still loads.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import weakref
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, cast

import numpy as np

from replaybuffer import nest, registry
from replaybuffer.errors import CheckpointError
from replaybuffer.sampling.ring import items_per_row
from replaybuffer.specs import ArraySpec, spec_from_dict
from replaybuffer.storage.frozen import FrozenRows, static_rows

if TYPE_CHECKING:
    from replaybuffer.buffers.base import ReplayBuffer
    from replaybuffer.storage.mmap_storage import MmapStorage

FORMAT = "replaybuffer"
VERSION = 2
READS = (1, 2)
"""Format versions this code loads: 1 kept a single save in the directory itself."""
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
CHECKPOINT = "ckpt-"
TMP, TRASH = ".tmp-", ".trash-"
CHUNK_BYTES = 1 << 20
"""Bytes read from a buffer (under its lock) or from a file at a time: a save holds the
lock for one chunk's copy, so adds wait at most that long. 1 MiB takes 0.2-2 ms here;
4 MiB took 1-5 ms, fresh memory's page faults included, and saved and loaded no faster
(``benchmarks/save_stalls.py``)."""

_SAVING: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_SAVING_LOCK = threading.Lock()


def save(buffer: ReplayBuffer, path: str | os.PathLike[str], keep: int = 1,
         metadata: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint of ``buffer`` under ``path`` (see the module docstring) and
    keep the newest ``keep``; return the new checkpoint's directory. ``metadata`` (a
    JSON-able dict: a training step, an adapter's state) is kept in the manifest, under
    its checksum; :func:`read_manifest` gives it back.

    Raises:
        CheckpointError: ``path`` is a file or a non-empty directory that holds no
            checkpoints, or writing failed (disk full, read-only, ...): the message
            names the file; earlier checkpoints and the buffer are unchanged.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a positive int (checkpoints to keep), got {keep!r}")
    metadata = {} if metadata is None else metadata
    try:
        if not isinstance(metadata, dict):
            raise TypeError(f"a {type(metadata).__name__}")
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be a JSON-able dict: {exc}") from exc
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"cannot save to {root}: it is a file")
    if root.is_dir() and not _is_checkpoint_root(root):
        raise CheckpointError(f"refusing to save into {root}: it is a non-empty directory "
                              "that holds no replaybuffer checkpoints")
    return _save_series(buffer, root, keep, metadata)


def save_state(buffer: ReplayBuffer) -> Path:
    """The state of a buffer on mmap storage (no data: the files are the data), saved
    as a one-checkpoint series under ``path/state`` after the files are ``msync``-ed,
    both under the buffer's lock (see :meth:`ReplayBuffer.flush`)."""
    storage = cast("MmapStorage", buffer._storage)  # or a copy-on-write wrapper of one
    # The bulk of the msync first, without the lock (adds go on); under the lock it then
    # only writes what those adds dirtied, and the state matches the files exactly.
    storage.flush()

    def flushed() -> dict[str, Any]:  # under the lock, just before the snapshot
        storage.flush()
        return {"mmap_epoch": storage.epoch}

    return _save_series(buffer, storage.path / "state", 1, {}, flushed)


def _save_series(buffer: ReplayBuffer, root: Path, keep: int, metadata: dict[str, Any],
                 state_only: Callable[[], dict[str, Any]] | None = None) -> Path:
    """Write, publish and prune one checkpoint of a series (see :func:`save`);
    ``state_only`` marks a checkpoint without data, its result joining the metadata."""
    with _SAVING_LOCK:  # one save of a buffer at a time: each holds a snapshot open
        saving = _SAVING.setdefault(buffer, threading.Lock())
    with saving:
        tmp = None
        try:
            root.mkdir(parents=True, exist_ok=True)
            _remove_abandoned(root)
            tmp = Path(tempfile.mkdtemp(prefix=f"{TMP}{os.getpid()}-", dir=root))
            _write_checkpoint(buffer, tmp, metadata, state_only)
            final = _publish(tmp, root)
            tmp = None
            _prune(root, keep)
        except OSError as exc:
            raise CheckpointError(f"cannot save to {root}: {exc}") from exc
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_checkpoint(buffer: ReplayBuffer, directory: Path, metadata: dict[str, Any],
                      state_only: Callable[[], dict[str, Any]] | None = None) -> None:
    """Every file of one checkpoint, manifest last (no data files with ``state_only``)."""
    with buffer._lock:
        if state_only is not None:
            metadata = {**metadata, **state_only()}
        state, streams = buffer.snapshot()
        if state_only is not None:
            buffer.release_snapshot()
            streams = {"leaves": static_rows([], (), ())}
    try:
        entries = {name: _write_stream(directory, name, rows, buffer._lock)
                   for name, rows in streams.items()}
    finally:
        with buffer._lock:
            buffer.release_snapshot()
    state = _externalise_arrays(state, directory)
    manifest = {
        "format": FORMAT, "version": VERSION, "buffer": type(buffer).__name__,
        "batch_size": buffer.batch_size, "max_length": buffer.max_length,
        "storage": buffer.storage, "config": buffer.constructor_config(),
        # Torch storage comes back on the device it was saved from (as torch.load does).
        "device": str(buffer.device) if buffer.storage == "torch" else None,
        "data_spec": encode_spec(buffer.data_spec), "state": state,
        "leaves": entries.pop("leaves"), "streams": entries, "metadata": metadata,
        "state_only": state_only is not None,
    }
    manifest["checksum"] = _manifest_checksum(manifest)
    with _naming(directory / MANIFEST), open(directory / MANIFEST, "w") as fh:
        fh.write(json.dumps(manifest, indent=1))
        _sync(fh)
    _sync_directory(directory)


def _stream_files(name: str, count: int) -> list[str]:
    prefix = "leaf" if name == "leaves" else name
    return [f"{prefix}_{i:03d}.npy" for i in range(count)]


def _write_stream(directory: Path, name: str, rows: FrozenRows, lock: Any
                  ) -> list[dict[str, Any]]:
    """Write frozen rows to one ``.npy`` file per array, chunk by chunk, each chunk read
    under ``lock``; their manifest entries."""
    files = _stream_files(name, len(rows.specs))
    shapes = [(rows.count,) + spec.shape for spec in rows.specs]
    crcs = [0] * len(files)
    step = max(1, CHUNK_BYTES // max(1, sum(spec.nbytes for spec in rows.specs)))
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(directory / f, "wb")) for f in files]
        for fh, spec, shape in zip(handles, rows.specs, shapes):
            np.lib.format.write_array_header_1_0(fh, {
                "descr": np.lib.format.dtype_to_descr(spec.dtype), "fortran_order": False,
                "shape": shape})
        for start in range(0, rows.count, step):
            with lock:
                chunk = rows.read(start, min(rows.count, start + step))
            for k, (fh, arr) in enumerate(zip(handles, chunk)):
                data = _bytes_of(arr, rows.specs[k].dtype)
                crcs[k] = zlib.crc32(data, crcs[k])
                with _naming(fh.name):
                    fh.write(data)
        for fh in handles:
            with _naming(fh.name):
                _sync(fh)
    return [{"file": f, "path": path, "shape": list(shape), "dtype": spec.dtype.str,
             "crc32": crc}
            for f, path, shape, spec, crc in zip(files, rows.names, shapes, rows.specs, crcs)]


@contextlib.contextmanager
def _naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Give an ``OSError`` raised while writing ``path`` the file's name (a failed
    ``write`` or ``fsync`` names none), so the error says which file failed."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def _bytes_of(array: np.ndarray, dtype: np.dtype) -> memoryview:
    """The bytes of ``array`` in ``dtype``, C order, without a copy where it already is."""
    array = np.ascontiguousarray(array, dtype=dtype)
    return array.reshape(-1).view(np.uint8).data


def _publish(tmp: Path, root: Path) -> Path:
    """Rename a complete checkpoint to the next free ``ckpt-N`` (atomic)."""
    while True:
        seq = max((_sequence(p) for p in root.iterdir()), default=0) + 1
        final = root / f"{CHECKPOINT}{seq:06d}"
        try:
            os.rename(tmp, final)  # a checkpoint is never empty, so this never replaces one
        except OSError:
            if final.exists():  # another process published the same number first
                continue
            raise
        _sync_directory(root)
        return final


def _prune(root: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` checkpoints, each renamed aside first."""
    done = checkpoints(root)
    legacy = (root / MANIFEST).is_file()
    excess = len(done) + legacy - keep
    if excess > 0 and legacy:  # a format-1 save at the top: the oldest
        _remove_legacy(root)
        excess -= 1
    for old in done[:max(0, excess)]:
        trash = root / f"{TRASH}{os.getpid()}-{old.name}"
        try:
            os.rename(old, trash)
        except FileNotFoundError:  # another process saving here pruned it first
            continue
        shutil.rmtree(trash, ignore_errors=True)


def _remove_legacy(root: Path) -> None:
    """Remove a format-1 save's files from ``root``, its manifest first (so that a
    kill midway leaves no manifest pointing at missing files)."""
    manifest = json.loads((root / MANIFEST).read_text())
    (root / MANIFEST).unlink()
    names = [e.get("file") for e in manifest.get("leaves", []) if isinstance(e, dict)]
    names += [p.name for p in root.glob("state*.npy")]
    for name in names:
        if isinstance(name, str) and "/" not in name and (root / name).is_file():
            (root / name).unlink()


def _remove_abandoned(root: Path) -> None:
    """Remove temporary and trash directories of processes that no longer run."""
    for entry in root.iterdir():
        if entry.is_dir() and entry.name.startswith((TMP, TRASH)):
            pid = entry.name.split("-")[1]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _sequence(entry: Path) -> int:
    """The number of a ``ckpt-N`` directory name, 0 for any other name."""
    name = entry.name
    if name.startswith(CHECKPOINT) and name[len(CHECKPOINT):].isdigit():
        return int(name[len(CHECKPOINT):])
    return 0


def checkpoints(path: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints under ``path``, oldest first (``[]`` if there are none)."""
    root = Path(path)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _sequence(p) > 0 and (p / MANIFEST).is_file()]
    return sorted(found, key=_sequence)


def _is_checkpoint_root(root: Path) -> bool:
    """Empty, or holding checkpoints, saves under way, or a format-1 save."""
    return all(_sequence(p) > 0 or p.name.startswith((TMP, TRASH)) for p in root.iterdir()) \
        or (root / MANIFEST).is_file()


def resolve(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory that ``path`` names: the newest complete checkpoint of a
    series, or ``path`` itself when it holds a manifest (one checkpoint, or a format-1
    save). Raises :class:`CheckpointError` when there is none."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a directory")
    done = checkpoints(root)
    if done:
        return done[-1]
    if (root / MANIFEST).is_file():
        return root
    partial = [p.name for p in root.iterdir() if p.name.startswith(TMP)]
    raise CheckpointError(f"{root} holds no {MANIFEST}: not a replaybuffer save, or an "
                          "incomplete one" + (f" ({len(partial)} incomplete save(s) ignored: "
                                               f"{', '.join(sorted(partial))})"
                                               if partial else ""))


def _externalise_arrays(state: Any, directory: Path, prefix: str = "state") -> Any:
    """Replace numpy arrays in a state nest (a sampler's priorities, say) by references
    to ``.npy`` files written beside the manifest, each with its CRC-32."""
    if isinstance(state, np.ndarray):
        name = f"{prefix}.npy"
        arr = np.ascontiguousarray(state)
        with _naming(directory / name), open(directory / name, "wb") as fh:
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


def _sync_directory(directory: Path) -> None:
    """fsync a directory, so the names of files and renames in it are durable too."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest_checksum(manifest: dict[str, Any]) -> int:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def _require(condition: bool, path: Path, message: str) -> None:
    if not condition:
        raise CheckpointError(f"{path}: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entries_ok(entries: Any) -> bool:
    return isinstance(entries, list) and all(
        isinstance(e, dict) and isinstance(e.get("file"), str) and _is_int(e.get("crc32"))
        for e in entries)


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed, checked manifest of a checkpoint (``path`` as :func:`resolve` takes it).

    Raises:
        CheckpointError: no checkpoint, or a malformed, corrupt or newer manifest.
    """
    directory = resolve(path)
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    _require(isinstance(manifest, dict) and manifest.get("format") == FORMAT, path,
             "not a replaybuffer manifest")
    version = manifest.get("version")
    _require(version in READS, path,
             f"format version {version!r}; this replaybuffer reads versions "
             f"{', '.join(map(str, READS))}" + (": load it with a newer replaybuffer"
                                               if _is_int(version) and version > VERSION
                                               else ""))
    for key in ("buffer", "batch_size", "max_length", "storage", "config", "data_spec",
                "state", "leaves", "checksum"):
        _require(key in manifest, path, f"lacks the field {key!r}")
    _require(manifest["checksum"] == _manifest_checksum(manifest), path,
             "the manifest is corrupt: its checksum does not match its contents")
    # The checksum catches accidents; these checks catch hand edits with a new checksum.
    for key in ("batch_size", "max_length"):
        _require(_is_int(manifest[key]) and manifest[key] >= 1, path,
                 f"{key} must be a positive int, found {manifest[key]!r}")
    state, streams = manifest["state"], manifest.setdefault("streams", {})
    _require(isinstance(manifest.setdefault("metadata", {}), dict), path,
             "metadata must be an object")
    _require(isinstance(state, dict) and _is_int(state.get("last_id"))
             and state["last_id"] >= -1 and isinstance(state.get("sampler"), dict), path,
             f"malformed state {state!r:.200}")
    _require(isinstance(manifest["config"], dict), path, "config must be an object")
    _require(_entries_ok(manifest["leaves"]), path,
             "leaves must be a list of {file, crc32, ...} objects")
    _require(isinstance(streams, dict) and all(_entries_ok(e) for e in streams.values()),
             path, "streams must map names to lists of {file, crc32, ...} objects")
    manifest["directory"] = str(directory)
    checked: dict[str, Any] = manifest
    return checked


def load(path: str | os.PathLike[str], *, storage: str | None = None, device: Any = None,
         data_spec: Any = None, buffer_class: type | None = None) -> ReplayBuffer:
    """Restore a buffer from ``buffer.save(path)``: the newest checkpoint under ``path``
    (or the checkpoint directory ``path`` names).

    Args:
        path: the checkpoint series, or one checkpoint directory.
        storage, device: override the saved storage backend (e.g. restore a numpy
            buffer into torch tensors on ``"cuda"``). Torch storage comes back on the
            device it was saved from unless ``device`` names another. A checkpoint of
            a buffer on mmap storage loads into numpy storage (``storage="mmap"``
            would need a path).
        data_spec: the spec you expect; it must equal the saved one, and its
            container types (your own namedtuple classes) are used for the result.
        buffer_class: the class you expect (a subclass of it is accepted).

    Raises:
        CheckpointError: no checkpoint, a missing or malformed manifest, missing,
            truncated or corrupt data files, or a ``data_spec`` or ``buffer_class``
            other than the saved one; the message names the file. Nothing is returned
            in that case (no buffer of yours is touched).
    """
    manifest = read_manifest(path)
    directory = Path(manifest["directory"])
    if manifest.get("state_only"):
        raise CheckpointError(f"{directory} holds the state of a buffer on mmap storage, "
                              f"whose data are its files: reopen it with "
                              f"replaybuffer.reopen({str(directory.parent.parent)!r})")
    # A checkpoint of a buffer on files is not tied to their path: it loads into RAM
    # unless told otherwise.
    saved_storage = "numpy" if manifest["storage"] == "mmap" else manifest["storage"]
    cls: type[ReplayBuffer] | None = registry.buffer_class(manifest["buffer"], storage or saved_storage)
    if cls is None:
        raise CheckpointError(f"unknown buffer class {manifest['buffer']!r} in {directory}")
    if buffer_class is not None and not issubclass(cls, buffer_class):
        raise CheckpointError(f"{directory} holds a {manifest['buffer']}, not a "
                              f"{buffer_class.__name__}")
    try:
        saved_spec = decode_spec(manifest["data_spec"])
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{directory}: malformed data_spec: {exc}") from exc
    if data_spec is not None:
        saved_spec = _matching_spec(saved_spec, data_spec, directory)
    state = manifest["state"]
    saved_device = manifest.get("device")  # absent from checkpoints written before it
    hint = ""
    if device is None and storage in (None, manifest["storage"]) and saved_device:
        device = saved_device
        hint = (f" (it was saved on {saved_device}; pass device=... to load it onto "
                f"another device)")
    try:
        buffer = cls.rebuild(saved_spec, manifest["batch_size"], manifest["max_length"],
                                storage or saved_storage, device, manifest["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild the buffer: {exc}{hint}") \
            from exc
    targets = buffer.stream_targets(state)
    streams = {"leaves": manifest["leaves"], **manifest["streams"]}
    for name, entries in streams.items():
        if name not in targets:
            raise CheckpointError(f"{directory}: the manifest has a stream {name!r} that a "
                                  f"{manifest['buffer']} does not keep")
        specs, count, write = targets[name]
        _read_stream(directory, entries, specs, count, write)
    state = _internalise_arrays(state, directory)
    try:
        buffer.restore_state(state, None)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild the buffer: {exc}") from exc
    return buffer


def reopen(path: str | os.PathLike[str]) -> ReplayBuffer:
    """The buffer on mmap storage at ``path`` (``storage="mmap", path=path``), as it was:
    the state of its last :meth:`~ReplayBuffer.flush` (or ``close``), then every step
    its files committed after that (a step a crash interrupted is kept if its commit
    point was reached, dropped otherwise; see :mod:`replaybuffer.storage.mmap_storage`).

    Steps committed after the last flush come back as adds would bring them: with the
    maximum priority in prioritized buffers, unread in FIFO ones. The sampler's generator
    is the flush's, so draws after a crash differ from those the lost process would have
    made; after a clean ``close`` they are exactly the same.

    Raises:
        CheckpointError: ``path`` holds no mmap buffer, or its files do not match its
            state; nothing is written.
    """
    from replaybuffer.storage.mmap_storage import Reopening

    root = Path(path)
    if not (root / "state").is_dir() or not (root / "data").is_dir():
        raise CheckpointError(f"{root} holds no buffer on mmap storage (it needs a state and "
                              "a data directory)")
    manifest = read_manifest(root / "state")
    directory = Path(manifest["directory"])
    if not manifest.get("state_only") or manifest["storage"] != "mmap":
        raise CheckpointError(f"{directory} is not the state of a buffer on mmap storage")
    cls: type[ReplayBuffer] | None = registry.buffer_class(manifest["buffer"], "mmap")
    if cls is None:
        raise CheckpointError(f"unknown buffer class {manifest['buffer']!r} in {directory}")
    try:
        spec = decode_spec(manifest["data_spec"])
        buffer = cls.rebuild(spec, manifest["batch_size"], manifest["max_length"], "mmap",
                                None, {**manifest["config"], "path": Reopening(root)})
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild the buffer: {exc}") from exc
    storage = cast("MmapStorage", buffer._storage)
    last_id = storage.recover()
    buffer.restore_state(_internalise_arrays(manifest["state"], directory), None)
    stale = manifest["metadata"].get("mmap_epoch") != storage.epoch
    buffer.catch_up(last_id, stale)
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


def _read_stream(directory: Path, entries: list[dict[str, Any]], specs: Sequence[ArraySpec],
                 count: int, write: Callable[[int, list[np.ndarray]], None] | None) -> None:
    """Check the files of one stream and, chunk by chunk, hand their data to ``write``
    (``None``: only check). The checksums are compared once all is read."""
    if len(entries) != len(specs):
        raise CheckpointError(f"{directory}: manifest lists {len(entries)} files for a "
                              f"stream of {len(specs)} arrays")
    step = max(1, CHUNK_BYTES // max(1, sum(spec.nbytes for spec in specs)))
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(_open_npy(directory, entry, spec, count))
                   for entry, spec in zip(entries, specs)]
        buffers = [np.empty((min(step, count),) + spec.shape, spec.dtype) for spec in specs]
        crcs = [0] * len(specs)
        for start in range(0, count, step):
            n = min(step, count - start)
            chunk = [b[:n] for b in buffers]
            for k, (fh, arr) in enumerate(zip(handles, chunk)):
                data = arr.reshape(-1).view(np.uint8).data
                if fh.readinto(data) != len(data):  # the size was checked: a file changed
                    raise CheckpointError(f"{_where(entries[k], directory)} is truncated")
                crcs[k] = zlib.crc32(data, crcs[k])
            if write is not None:
                write(start, chunk)
    for entry, crc in zip(entries, crcs):
        if crc != entry.get("crc32"):
            raise CheckpointError(f"{_where(entry, directory)} is corrupt: its checksum does "
                                  "not match the manifest")


def _where(entry: dict[str, Any], directory: Path) -> str:
    name = Path(str(entry.get("file"))).name
    return f"leaf {entry['path']} ({name})" if entry.get("path") else f"file {name}"


@contextlib.contextmanager
def _open_npy(directory: Path, entry: dict[str, Any], spec: ArraySpec, count: int
              ) -> Iterator[Any]:
    """A data file opened at its first byte of data, after checking its header and size
    against ``spec`` and ``count`` positions."""
    path = directory / str(entry.get("file"))
    where = _where(entry, directory)
    if path.parent != directory or not path.is_file():
        raise CheckpointError(f"{where} is missing from {directory}")
    with open(path, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(fh)
        except (ValueError, OSError, EOFError, SyntaxError) as exc:
            raise CheckpointError(f"{where} is not a readable .npy file: {exc}") from exc
        if dtype.hasobject or fortran:
            raise CheckpointError(f"{where} is not a readable .npy file: it holds "
                                  f"{'Python objects' if dtype.hasobject else 'Fortran order'}"
                                  ", which replaybuffer never writes")
        expected_shape = (count,) + spec.shape
        if shape != expected_shape or dtype != spec.dtype:
            raise CheckpointError(f"{where}: expected shape {expected_shape} dtype "
                                  f"{spec.dtype.name}, found shape {shape} dtype "
                                  f"{dtype.name}")
        size = os.fstat(fh.fileno()).st_size - fh.tell()
        expected = count * spec.nbytes
        if size != expected:
            raise CheckpointError(f"{where} is not a readable .npy file: it holds {size} "
                                  f"bytes of data where its header says {expected} (truncated "
                                  "or extended)")
        yield fh


def verify(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file of a checkpoint without building a buffer; its manifest.

    Raises:
        CheckpointError: what :func:`load` would raise for the files.
    """
    manifest = read_manifest(path)
    directory = Path(manifest["directory"])
    if not registry.known(manifest["buffer"]):
        raise CheckpointError(f"unknown buffer class {manifest['buffer']!r} in {directory}")
    try:
        specs, _ = nest.flatten(decode_spec(manifest["data_spec"]))
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{directory}: malformed data_spec: {exc}") from exc
    count = items_per_row(manifest["state"]["last_id"], manifest["max_length"]) * \
        manifest["batch_size"]
    for name, entries in {"leaves": manifest["leaves"], **manifest["streams"]}.items():
        for entry in entries:
            try:
                spec = ArraySpec(tuple(entry["shape"][1:]), np.dtype(entry["dtype"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"{_where(entry, directory)}: malformed entry") from exc
            expected = count if name == "leaves" else entry["shape"][0]
            _read_stream(directory, [entry], [spec], expected, None)
    if len(manifest["leaves"]) != len(specs) and not manifest.get("state_only"):
        raise CheckpointError(f"{directory}: manifest lists {len(manifest['leaves'])} leaf "
                              f"files for a spec of {len(specs)} leaves")
    _internalise_arrays(manifest["state"], directory)
    return manifest
