"""A buffer on mmap storage: its state saved beside its files, and the buffer reopened.

The data of a buffer on ``storage="mmap"`` are its files (``path/data``, see
:mod:`replaybuffer.storage.mmap_storage`); what is saved is its state only, as a
one-checkpoint series under ``path/state`` (no data files), after the files are
``msync``-ed. :func:`reopen_buffer` builds the buffer on the files again, restores that
state and takes in the steps the files committed after it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from replaybuffer import registry
from replaybuffer.errors import CheckpointError
from replaybuffer.persist.layout import MANIFEST, MMAP_DATA, MMAP_STATE
from replaybuffer.persist.manifest import read_manifest
from replaybuffer.persist.series import checkpoints, read_newest
from replaybuffer.persist.savable import SavableBuffer
from replaybuffer.persist.spec_codec import decode_spec
from replaybuffer.persist.state_files import internalise_arrays
from replaybuffer.persist.writer import save_series
from replaybuffer.storage.mmap_storage import MmapStorage, Reopening


def save_mmap_state(buffer: SavableBuffer, chunk_bytes: int) -> Path:
    """:func:`replaybuffer.persist.save_state` (see there)."""
    storage = cast(MmapStorage, buffer.store)  # or a copy-on-write wrapper of one
    # The bulk of the msync first, without the lock (adds go on); under the lock it then
    # only writes what those adds dirtied, and the state matches the files exactly.
    storage.flush()

    def flushed() -> dict[str, Any]:  # under the lock, just before the snapshot
        storage.flush()
        return {"mmap_epoch": storage.epoch}

    return save_series(buffer, storage.path / MMAP_STATE, 1, {}, chunk_bytes, flushed)


def reopen_buffer(path: str | os.PathLike[str]) -> SavableBuffer:
    """:func:`replaybuffer.persist.reopen` (see there)."""
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"no buffer at {root}: the path does not exist (pass the path= "
                              "a buffer on mmap storage was built with)")
    if not (root / MMAP_STATE).is_dir() or not (root / MMAP_DATA).is_dir():
        # The two ways to keep a buffer are easily swapped: point to the other one.
        saved = root.is_dir() and (bool(checkpoints(root)) or (root / MANIFEST).is_file())
        raise CheckpointError(f"{root} holds no buffer on mmap storage (it needs a state and "
                              "a data directory)" + (
                                  f"; it holds a checkpoint: load it with "
                                  f"replaybuffer.load({str(root)!r})" if saved else ""))
    manifest = read_newest(root / MMAP_STATE, read_manifest)
    directory = Path(manifest["directory"])
    if not manifest.get("state_only") or manifest["storage"] != "mmap":
        raise CheckpointError(f"{directory} is not the state of a buffer on mmap storage")
    cls: type[SavableBuffer] | None = registry.buffer_class(manifest["buffer"], "mmap")
    if cls is None:
        raise CheckpointError(f"unknown buffer class {manifest['buffer']!r} in {directory}")
    try:
        spec = decode_spec(manifest["data_spec"])
        buffer: SavableBuffer = cls.rebuild(spec, manifest["batch_size"],
                                            manifest["max_length"], "mmap", None,
                                            {**manifest["config"], "path": Reopening(root)})
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild the buffer: {exc}") from exc
    storage = cast(MmapStorage, buffer.store)
    last_id = storage.recover()
    buffer.restore_state(internalise_arrays(manifest["state"], directory), None)
    stale = manifest["metadata"].get("mmap_epoch") != storage.epoch
    buffer.catch_up(last_id, stale)
    return buffer
