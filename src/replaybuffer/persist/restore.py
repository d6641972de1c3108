"""Reading a checkpoint back: into a new buffer (:func:`load_checkpoint`), or only
checked (:func:`verify_checkpoint`).

Nothing is returned unless every file checked out: the header, size and CRC-32 of
every data file and the manifest's checksum; a mismatch is a
:class:`~replaybuffer.errors.CheckpointError` naming the file. Data files are read in
chunks straight into the new buffer's storage (no second copy of the buffer; where the
storage keeps a leaf in a block of its own, into that block without an intermediate
buffer: :mod:`replaybuffer.persist.in_place`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from replaybuffer import nest, registry
from replaybuffer.errors import CheckpointError
from replaybuffer.persist.manifest import read_manifest
from replaybuffer.persist.series import read_newest
from replaybuffer.persist.savable import SavableBuffer
from replaybuffer.persist.spec_codec import decode_spec, matching_spec
from replaybuffer.persist.state_files import internalise_arrays
from replaybuffer.persist.streams import read_stream, where
from replaybuffer.sampling.ring import items_per_row
from replaybuffer.specs import ArraySpec


def load_checkpoint(path: str | os.PathLike[str], storage: str | None, device: Any,
                    data_spec: Any, buffer_class: type | None, chunk_bytes: int
                    ) -> SavableBuffer:
    """:func:`replaybuffer.persist.load` (see there), reading chunks of about
    ``chunk_bytes``; the newest checkpoint at the time, should a save into the series
    prune the one chosen first (:func:`~replaybuffer.persist.series.read_newest`)."""
    return read_newest(path, lambda directory: _load_from(
        directory, storage, device, data_spec, buffer_class, chunk_bytes))


def _load_from(directory: Path, storage: str | None, device: Any, data_spec: Any,
               buffer_class: type | None, chunk_bytes: int) -> SavableBuffer:
    """:func:`load_checkpoint` of one checkpoint directory."""
    manifest = read_manifest(directory)
    directory = Path(manifest["directory"])
    if manifest.get("state_only"):
        raise CheckpointError(f"{directory} holds the state of a buffer on mmap storage, "
                              f"whose data are its files: reopen it with "
                              f"replaybuffer.reopen({str(directory.parent.parent)!r})")
    # A checkpoint of a buffer on files is not tied to their path: it loads into RAM
    # unless told otherwise.
    saved_storage = "numpy" if manifest["storage"] == "mmap" else manifest["storage"]
    cls: type[SavableBuffer] | None = registry.buffer_class(manifest["buffer"],
                                                            storage or saved_storage)
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
        saved_spec = matching_spec(saved_spec, data_spec, directory)
    state = manifest["state"]
    saved_device = manifest.get("device")  # absent from checkpoints written before it
    hint = ""
    if device is None and storage in (None, manifest["storage"]) and saved_device:
        device = saved_device
        hint = (f" (it was saved on {saved_device}; pass device=... to load it onto "
                f"another device)")
    try:
        buffer: SavableBuffer = cls.rebuild(saved_spec, manifest["batch_size"],
                                            manifest["max_length"], storage or saved_storage,
                                            device, manifest["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild the buffer: {exc}{hint}") \
            from exc
    targets = buffer.stream_targets(state)
    streams = {"leaves": manifest["leaves"], **manifest["streams"]}
    for name, entries in streams.items():
        if name not in targets:
            raise CheckpointError(f"{directory}: the manifest has a stream {name!r} that a "
                                  f"{manifest['buffer']} does not keep")
        target = targets[name]
        read_stream(directory, entries, target.specs, target.positions, target.write,
                    chunk_bytes, target.in_place)
    state = internalise_arrays(state, directory)
    try:
        buffer.restore_state(state, None)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot rebuild the buffer: {exc}") from exc
    return buffer


def verify_checkpoint(path: str | os.PathLike[str], chunk_bytes: int) -> dict[str, Any]:
    """:func:`replaybuffer.persist.verify` (see there), reading chunks of about
    ``chunk_bytes``, of the newest checkpoint as :func:`load_checkpoint` finds it."""
    return read_newest(path, lambda directory: _verify(directory, chunk_bytes))


def _verify(directory: Path, chunk_bytes: int) -> dict[str, Any]:
    """:func:`verify_checkpoint` of one checkpoint directory."""
    manifest = read_manifest(directory)
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
                raise CheckpointError(f"{where(entry, directory)}: malformed entry") from exc
            expected = count if name == "leaves" else entry["shape"][0]
            read_stream(directory, [entry], [spec], expected, None, chunk_bytes)
    if len(manifest["leaves"]) != len(specs) and not manifest.get("state_only"):
        raise CheckpointError(f"{directory}: manifest lists {len(manifest['leaves'])} leaf "
                              f"files for a spec of {len(specs)} leaves")
    internalise_arrays(manifest["state"], directory)
    return manifest
