"""A checkpoint's ``manifest.json``: its checksum, and reading it back checked.

The manifest holds the format version, buffer class, layout, data spec, the state
(small arrays in ``state.*.npy`` beside it, see :mod:`replaybuffer.persist.state_files`),
per data file its shape, dtype and CRC-32, the caller's metadata, and a CRC-32 of all
of that (``checksum``).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

from replaybuffer.errors import CheckpointError
from replaybuffer.persist.layout import FORMAT, MANIFEST, READS, VERSION
from replaybuffer.persist.series import resolve


def manifest_checksum(manifest: dict[str, Any]) -> int:
    """CRC-32 of the manifest's fields but ``checksum``, as sorted JSON."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed, checked manifest of a checkpoint (``path`` as
    :func:`~replaybuffer.persist.series.resolve` takes it), with ``directory`` added:
    the checkpoint's directory.

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
                                               if is_int(version) and version > VERSION
                                               else ""))
    for key in ("buffer", "batch_size", "max_length", "storage", "config", "data_spec",
                "state", "leaves", "checksum"):
        _require(key in manifest, path, f"lacks the field {key!r}")
    _require(manifest["checksum"] == manifest_checksum(manifest), path,
             "the manifest is corrupt: its checksum does not match its contents")
    # The checksum catches accidents; these checks catch hand edits with a new checksum.
    for key in ("batch_size", "max_length"):
        _require(is_int(manifest[key]) and manifest[key] >= 1, path,
                 f"{key} must be a positive int, found {manifest[key]!r}")
    state, streams = manifest["state"], manifest.setdefault("streams", {})
    _require(isinstance(manifest.setdefault("metadata", {}), dict), path,
             "metadata must be an object")
    _require(isinstance(state, dict) and is_int(state.get("last_id"))
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


def _require(condition: bool, path: Path, message: str) -> None:
    if not condition:
        raise CheckpointError(f"{path}: {message}")


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (JSON numbers as the manifest's checks want)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _entries_ok(entries: Any) -> bool:
    return isinstance(entries, list) and all(
        isinstance(e, dict) and isinstance(e.get("file"), str) and is_int(e.get("crc32"))
        for e in entries)
