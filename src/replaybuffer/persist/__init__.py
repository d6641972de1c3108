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
- **Readable while another process saves**: a load (or verify) picks the newest
  complete checkpoint; should a save into the series prune it before every file is
  open, the load reads the checkpoint that is newest by then
  (:func:`~replaybuffer.persist.series.read_newest`, a bounded number of times), so
  ``load(path)`` never fails for a checkpoint pruned under it, even with ``keep=1``.
- **Consistent while in use**: the state and a copy-on-write view of the data are
  taken under the buffer's lock; the data is then read in chunks of
  :data:`CHUNK_BYTES` (the lock held for one chunk at a time), while a write to a
  position not saved yet first copies the old contents aside
  (:mod:`replaybuffer.storage.frozen`). The checkpoint is exactly the buffer at the
  moment the save began.
- **Bounded memory**: save and load move data in chunks; neither makes a second copy
  of the buffer. Load reads files with ``readinto`` (no memory maps, whose pages would
  count in the process's resident memory) straight into the new buffer's storage:
  into the numpy storage's own arrays where a leaf has one
  (:mod:`~replaybuffer.persist.in_place`), through a chunk buffer otherwise.
- **Checked**: every data file's header, size and CRC-32 (zlib-ng's where the ``fast``
  extra installs it: :mod:`~replaybuffer.persist.checksum`) and the manifest's checksum
  are verified on load; any mismatch is a :class:`CheckpointError` naming the file.

Format 1 (a single save with ``manifest.json`` directly in the directory) still loads.

The package, by concept: :mod:`~replaybuffer.persist.layout` (names on disk, format
version), :mod:`~replaybuffer.persist.manifest` (the manifest, checked),
:mod:`~replaybuffer.persist.spec_codec` (data specs as JSON),
:mod:`~replaybuffer.persist.streams` (large arrays in chunks),
:mod:`~replaybuffer.persist.state_files` (the state's small arrays),
:mod:`~replaybuffer.persist.series` (publish, prune, list),
:mod:`~replaybuffer.persist.writer` (one checkpoint of a buffer in use),
:mod:`~replaybuffer.persist.restore` (load and verify),
:mod:`~replaybuffer.persist.mmap_state` (buffers on mmap storage), and
:mod:`~replaybuffer.persist.savable`, the protocol a buffer meets to be saved. This
module holds the entry points and :data:`CHUNK_BYTES`, which they read at each call.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from replaybuffer.persist.layout import (CHECKPOINT, FORMAT, MANIFEST, READS, TMP, TRASH,
                                         VERSION)
from replaybuffer.persist.manifest import manifest_checksum, read_manifest
from replaybuffer.persist.mmap_state import reopen_buffer, save_mmap_state
from replaybuffer.persist.restore import load_checkpoint, verify_checkpoint
from replaybuffer.persist.savable import SavableBuffer
from replaybuffer.persist.series import checked_save_arguments, checkpoints, resolve
from replaybuffer.persist.spec_codec import decode_spec, encode_spec
from replaybuffer.persist.writer import save_series

if TYPE_CHECKING:  # for the annotations of what load and reopen return; not imported
    from replaybuffer.buffers.base import ReplayBuffer

__all__ = ["CHECKPOINT", "CHUNK_BYTES", "FORMAT", "MANIFEST", "READS", "TMP", "TRASH",
           "VERSION", "SavableBuffer", "checkpoints", "decode_spec", "encode_spec", "load",
           "manifest_checksum", "read_manifest", "reopen", "resolve", "save", "save_state",
           "verify"]

CHUNK_BYTES = 1 << 20
"""Bytes read from a buffer (under its lock) or from a file at a time: a save holds the
lock for one chunk's copy, so adds wait at most that long. 1 MiB takes 0.2-2 ms here;
4 MiB took 1-5 ms, fresh memory's page faults included, and saved and loaded no faster
(``benchmarks/save_stalls.py``). Read at each call, so ``persist.CHUNK_BYTES = n`` sets
the chunk of the saves and loads that follow."""


def save(buffer: SavableBuffer, path: str | os.PathLike[str], keep: int = 1,
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
    root, metadata = checked_save_arguments(path, keep, metadata)
    return save_series(buffer, root, keep, metadata, CHUNK_BYTES)


def save_state(buffer: SavableBuffer) -> Path:
    """The state of a buffer on mmap storage (no data: the files are the data), saved
    as a one-checkpoint series under ``path/state`` after the files are ``msync``-ed,
    both under the buffer's lock (see :meth:`ReplayBuffer.flush`)."""
    return save_mmap_state(buffer, CHUNK_BYTES)


def load(path: str | os.PathLike[str], *, storage: str | None = None, device: Any = None,
         data_spec: Any = None, buffer_class: type | None = None) -> ReplayBuffer:
    """Restore a buffer from ``buffer.save(path)``: the newest checkpoint under ``path``
    (or the checkpoint directory ``path`` names). The result is a buffer of the class
    the checkpoint names (a :class:`~replaybuffer.ReplayBuffer`).

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
        CheckpointError: no checkpoint (``path`` is a buffer on mmap storage: the
            message says to call :func:`reopen`), a missing or malformed manifest, missing,
            truncated or corrupt data files, or a ``data_spec`` or ``buffer_class``
            other than the saved one; the message names the file. Nothing is returned
            in that case (no buffer of yours is touched).
    """
    buffer = load_checkpoint(path, storage, device, data_spec, buffer_class, CHUNK_BYTES)
    return cast("ReplayBuffer", buffer)


def reopen(path: str | os.PathLike[str]) -> ReplayBuffer:
    """The buffer on mmap storage at ``path`` (``storage="mmap", path=path``), as it was:
    the state of its last :meth:`~ReplayBuffer.flush` (or ``close``), then every step
    its files committed after that (a step a crash interrupted is kept if its commit
    point was reached, dropped otherwise; see :mod:`replaybuffer.storage.mmap_storage`).

    Steps committed after the last flush come back as adds would bring them: with the
    maximum priority in prioritized buffers, unread in FIFO ones. The sampler's generator
    is the flush's, so draws after a crash differ from those the lost process would have
    made; after a clean ``close`` they are exactly the same.

    A journal file a crash left empty or partial (the process was recreating it, when
    it held nothing committed) counts as absent.

    Raises:
        CheckpointError: ``path`` holds no mmap buffer, or its files do not match its
            state; nothing is written.
        InsufficientSpaceError: the file system cannot hold the files (those written
            before space was reserved may be sparse); nothing is written.
    """
    return cast("ReplayBuffer", reopen_buffer(path))


def verify(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file of a checkpoint without building a buffer; its manifest.

    Raises:
        CheckpointError: what :func:`load` would raise for the files.
    """
    return verify_checkpoint(path, CHUNK_BYTES)
