"""Checkpoints of a shared buffer with frame dedup, in the local buffers' format.

A local buffer with ``frame_stack`` saves its stacked leaf as the references of its
:class:`~replaybuffer.storage.frames.FrameStackCodec`, the codec's state (``state
["frames"]``) and its frame ring (the stream ``frames``). A shared buffer's rows do
not advance together and its references name shared step ids, so a save rebuilds the
stacks it copied (inside the version check, :mod:`.snapshot`) and encodes them with a
local codec of the checkpoint's shape, step by step as a local buffer fed the same
stacks would (:func:`local_frames`). A restore decodes the checkpoint's stacks with a
local codec and encodes them into the shared ring at the shared ids, row by row, oldest
first (:func:`restore_frames`); a checkpoint with more side frames in a row than the
buffer's ``side_frames`` raises :class:`~.frame_ring.SideFramesFullError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import replaybuffer.persist as persist
from replaybuffer.distributed.shared.frame_ring import SharedFrameRing
from replaybuffer.persist.streams import read_stream, write_stream
from replaybuffer.storage.frames import FrameStackCodec
from replaybuffer.storage.shared_storage import SharedStorage


def local_codec(ring: SharedFrameRing, batch_size: int, max_length: int) -> FrameStackCodec:
    """An empty local codec of ``ring``'s leaf for a local ring of that shape."""
    return FrameStackCodec(ring.spec, ring.axis, batch_size, max_length, ring.path)


def local_frames(ring: SharedFrameRing, stacks: np.ndarray, batch_size: int,
                 max_length: int, directory: Path, lock: Any
                 ) -> tuple[np.ndarray, dict[str, Any], list[dict[str, Any]]]:
    """The local references int64 ``[kept * B, K]``, codec state and frame stream
    entries (written to ``directory``) of stacks ``[kept * B, *spec.shape]`` at local
    positions ``k * B + row`` (local step ``k``, ``kept <= max_length``)."""
    codec = local_codec(ring, batch_size, max_length)
    kept = len(stacks) // batch_size
    refs = np.empty((len(stacks), ring.stack), np.int64)
    for k in range(kept):
        block = slice(k * batch_size, (k + 1) * batch_size)
        step_refs, writes = codec.encode(k, stacks[block])
        refs[block] = step_refs  # a copy: the codec may reuse its buffer
        codec.commit(writes, k, 1)
    entries = write_stream(directory, "frames", codec.frozen_frames(), lock,
                           persist.CHUNK_BYTES)
    return refs, codec.state_dict(), entries


def restore_frames(ring: SharedFrameRing, storage: SharedStorage, directory: Path,
                   manifest: dict[str, Any], state: dict[str, Any], positions: np.ndarray,
                   ids: np.ndarray, shared_rows: np.ndarray, local_rows: np.ndarray) -> None:
    """Turn the local references just restored at shared ``positions`` (steps ``ids``
    of ``shared_rows``, local rows ``local_rows``, each ``[n]``) into shared ones,
    writing their frames into ``ring``. Versions are published afterwards by the caller.

    Raises:
        CheckpointError: the frame stream is missing, truncated or corrupt.
        SideFramesFullError: a row needs more side frames than the ring has.
    """
    batch, length = int(manifest["batch_size"]), int(manifest["max_length"])
    codec = local_codec(ring, batch, length)
    codec.load_state_dict(state["frames"])
    read_stream(directory, manifest["streams"]["frames"], [codec.frame_spec],
                len(codec.frames) - 1, lambda start, arrays: codec.load_frames(start, arrays[0]),
                persist.CHUNK_BYTES)
    leaf = storage.arrays[ring.leaf]
    stacks = codec.decode(np.asarray(leaf[positions]), local_rows)
    for j in np.lexsort((ids, shared_rows)):  # row by row, oldest first
        step, row = int(ids[j]), int(shared_rows[j])
        plan = ring.plan(step, row, 1)
        plan.method = "load"
        refs, writes = ring.encode(step, row, stacks[j:j + 1], plan)
        ring.commit(writes)
        leaf[positions[j]] = refs[0]
