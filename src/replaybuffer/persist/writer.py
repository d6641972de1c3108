"""Writing one checkpoint of a buffer into a series, while the buffer stays in use.

The state and copy-on-write views of the data are taken under the buffer's lock
(:meth:`~replaybuffer.persist.savable.SavableBuffer.snapshot`); the data is then
streamed out in chunks, the lock held for one chunk at a time, while a write to a
position not saved yet first copies the old contents aside
(:mod:`replaybuffer.storage.frozen`). The checkpoint is exactly the buffer at the
moment the save began. Every file is written under a temporary name in the series
and ``fsync``-ed, the manifest last; the directory is then renamed to ``ckpt-N``
(:func:`~replaybuffer.persist.series.publish`) and older checkpoints pruned.

The series and durability functions are called through their modules
(``series.publish``, ``durable.sync``), so that ``benchmarks/save_stalls.py`` can time
each phase by replacing them there.
"""

from __future__ import annotations

import json
import threading
import weakref
from pathlib import Path
from typing import Any, Callable

from replaybuffer.crash_points import ARMED, crash_point
import replaybuffer.persist.durable as durable
import replaybuffer.persist.series as series
from replaybuffer.persist.layout import FORMAT, MANIFEST, VERSION
from replaybuffer.persist.manifest import manifest_checksum
from replaybuffer.persist.savable import SavableBuffer
from replaybuffer.persist.spec_codec import encode_spec
from replaybuffer.persist.state_files import externalise_arrays
from replaybuffer.persist.streams import write_stream
from replaybuffer.storage.frozen import static_rows

_SAVING: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_SAVING_LOCK = threading.Lock()


def save_series(buffer: SavableBuffer, root: Path, keep: int, metadata: dict[str, Any],
                chunk_bytes: int, state_only: Callable[[], dict[str, Any]] | None = None
                ) -> Path:
    """Write, publish and prune one checkpoint of a series (see
    :func:`replaybuffer.persist.save`), streaming chunks of about ``chunk_bytes``;
    ``state_only`` marks a checkpoint without data, its result joining the metadata.
    The new checkpoint's directory.

    Raises:
        CheckpointError: a write failed (the message names the file); the series and
            the buffer are as they were.
    """
    with _SAVING_LOCK:  # one save of a buffer at a time: each holds a snapshot open
        saving = _SAVING.setdefault(buffer, threading.Lock())
    with saving:
        return series.save_into(root, keep, lambda tmp: _write_checkpoint(
            buffer, tmp, metadata, chunk_bytes, state_only))


def _write_checkpoint(buffer: SavableBuffer, directory: Path, metadata: dict[str, Any],
                      chunk_bytes: int,
                      state_only: Callable[[], dict[str, Any]] | None = None) -> None:
    """Every file of one checkpoint, manifest last (no data files with ``state_only``)."""
    lock = buffer.lock
    with lock:
        if state_only is not None:
            metadata = {**metadata, **state_only()}
        state, streams = buffer.snapshot()
        if state_only is not None:
            buffer.release_snapshot()
            streams = {"leaves": static_rows([], (), ())}
    try:
        entries = {name: write_stream(directory, name, rows, lock, chunk_bytes)
                   for name, rows in streams.items()}
    finally:
        with lock:
            buffer.release_snapshot()
    state = externalise_arrays(state, directory)
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
    manifest["checksum"] = manifest_checksum(manifest)
    if ARMED is not None:
        crash_point("checkpoint.write.manifest")
    with durable.naming(directory / MANIFEST), open(directory / MANIFEST, "w") as fh:
        fh.write(json.dumps(manifest, indent=1))
        durable.sync(fh)
    durable.sync_directory(directory)
