"""Checkpoints of a buffer: its state out and back in.

Two ways out, one set of hooks. :meth:`Checkpoints.save` streams a checkpoint to disk
while the buffer stays in use (:mod:`replaybuffer.persist`); :meth:`Checkpoints.state_dict`
copies the same state into memory (the :class:`~replaybuffer.protocols.Checkpointable`
seam). Both go through the hooks subclasses extend: :meth:`Checkpoints.snapshot` (the
small state, and the large arrays frozen copy-on-write), :meth:`Checkpoints.release_snapshot`,
:meth:`Checkpoints.stream_targets` (where a restore writes each stream) and
:meth:`Checkpoints.restore_state`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from replaybuffer.buffers.wiring import BufferParts
from replaybuffer.persist import save
from replaybuffer.persist.in_place import in_place_leaves, load_rest
from replaybuffer.persist.savable import StreamTarget
from replaybuffer.sampling.ring import items_per_row
from replaybuffer.storage.frozen import CopyOnWriteStorage, FrozenRows, storage_rows

if TYPE_CHECKING:
    from replaybuffer.buffers.base import ReplayBuffer


class Checkpoints(BufferParts):
    """``save``, ``state_dict``/``load_state_dict``, and the hooks both use."""

    def save(self, path: str | os.PathLike[str], keep: int = 1, *,
             metadata: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint of the buffer (data, ids, write position, sampler state,
        everything a later call's result depends on) under ``path``; return its directory.

        ``path`` holds a series of checkpoints, ``ckpt-000001``, ``ckpt-000002``, ...: each
        is written to a temporary directory beside them and renamed into place once
        complete, then all but the newest ``keep`` are removed. No pickle: a JSON
        manifest and ``.npy`` files, each CRC-checked. The buffer stays in use: the
        snapshot is taken under the lock, then streamed to disk in chunks while adds go
        on (see :mod:`replaybuffer.persist`). Restore with :func:`replaybuffer.load`.
        ``metadata``, a JSON-able dict of yours, is kept in the manifest
        (``replaybuffer.persist.read_manifest(path)["metadata"]``).

        Raises:
            CheckpointError: ``path`` is a file or a directory of something else, or the
                write failed (disk full, read-only); earlier checkpoints are untouched.
        """
        return save(cast("ReplayBuffer", self), path, keep=keep, metadata=metadata)

    def constructor_config(self) -> dict[str, Any]:
        """Constructor keywords a restored buffer needs besides spec and layout."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The buffer's whole state, copied into memory: a checkpoint without files.

        Returns:
            ``{"batch_size": int, "max_length": int, "state": the small state (ids,
            sampler state, episode starts, ...: numpy arrays copied), "streams":
            {name: [one numpy array per stored array, [n, *spec.shape]]}}`` with
            ``"leaves"`` (the filled storage positions, ``slot * batch_size + row``) and
            the streams subclasses keep beside them (the frame ring of deduplicated
            stacks, ...). Nothing in it aliases the buffer's memory.

        Load it with :meth:`load_state_dict` into a buffer built with the same
        arguments; it then returns the same samples as this one would.
        """
        with self._lock:
            state, streams = self.snapshot()
            try:
                arrays = {name: rows.read(0, rows.count) for name, rows in streams.items()}
            finally:
                self.release_snapshot()
        return {"batch_size": self.batch_size, "max_length": self.max_length,
                "state": state, "streams": arrays}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this buffer what :meth:`state_dict` described (its arrays copied in).

        Use it on a buffer built with the same arguments as the one the state came
        from, which no other thread uses while it loads (as for a restore).

        Raises:
            ValueError: the state is of another layout, or has a stream (or a stream
                length) this buffer does not keep.
        """
        layout = (state["batch_size"], state["max_length"])
        if layout != (self.batch_size, self.max_length):
            raise ValueError(f"load_state_dict: the state is of a buffer with batch_size="
                             f"{layout[0]}, max_length={layout[1]}; this one has "
                             f"batch_size={self.batch_size}, max_length={self.max_length}")
        small = state["state"]
        targets = self.stream_targets(small)
        for name, arrays in state["streams"].items():
            if name not in targets:
                raise ValueError(f"load_state_dict: the state has a stream {name!r} that a "
                                 f"{type(self).__name__} does not keep")
            count, write = targets[name].positions, targets[name].write
            if any(len(a) != count for a in arrays):
                raise ValueError(f"load_state_dict: stream {name!r} holds "
                                 f"{[len(a) for a in arrays]} positions, expected {count}")
            if count:
                write(0, [np.asarray(a) for a in arrays])
        self.restore_state(small, None)

    def snapshot(self) -> tuple[dict[str, Any], dict[str, FrozenRows]]:
        """``(state, streams)`` for persistence; the caller holds the lock.

        ``state`` is a small nest (numpy arrays copied); ``streams`` are the large arrays
        frozen as they are now (``"leaves"``: the storage's filled positions, and the
        frame ring of deduplicated stacks), to be read in chunks while writers go on,
        until :meth:`release_snapshot`.
        """
        state = {"last_id": self._ring.last_id, "sampler": self._sampler.state_dict()}
        leaves = storage_rows(self._storage, self._ring.num_frames, self._paths)
        streams = {"leaves": leaves}
        if self._episodes is not None:
            state["episode_starts"] = self._episodes.state(self._ring)
        if self._codec is not None:
            state["frames"] = self._codec.state_dict()
            streams["frames"] = self._codec.frozen_frames()
        # Until released, writes preserve what they overwrite, and the fused writer
        # (which writes around the storage's methods) stands aside.
        self._storage = CopyOnWriteStorage(self._storage, leaves)
        self._paused_writer, self._write_exact = self._write_exact, None
        return state, streams

    def release_snapshot(self) -> None:
        """End what :meth:`snapshot` started (the caller holds the lock): writes go
        straight to storage again."""
        if isinstance(self._storage, CopyOnWriteStorage):
            self._storage = self._storage.wrapped
            self._write_exact = self._paused_writer
        if self._codec is not None:
            self._codec.guard = None

    def stream_targets(self, state: dict[str, Any]) -> dict[str, StreamTarget]:
        """Where a restore of ``state`` writes each stream of :meth:`snapshot`: its specs,
        its positions, a function writing arrays ``[n, *spec.shape]`` at positions
        ``[start, start + n)``, and the storage's leaf blocks that files are read into
        directly (:mod:`replaybuffer.persist.in_place`)."""
        count = items_per_row(int(state["last_id"]), self.max_length) * self.batch_size
        storage = self._storage
        targets = {"leaves": StreamTarget(storage.specs, count, load_rest(storage),
                                          in_place_leaves(storage, count))}
        if self._codec is not None:
            codec = self._codec
            targets["frames"] = StreamTarget(
                (codec.frame_spec,), len(codec.frames) - 1,
                lambda start, arrays: codec.load_frames(start, arrays[0]))
        return targets

    def restore_state(self, state: dict[str, Any], arrays: list[np.ndarray] | None) -> None:
        """Restore ``state``; ``arrays`` are the storage's leaves, or ``None`` where they
        were streamed in already (through :meth:`stream_targets`)."""
        with self._lock:
            if arrays is not None:
                self._storage.load(arrays)
            self._ring.last_id = int(state["last_id"])
            self._generation += 1
            self._sampler.load_state_dict(state["sampler"])
            if self._episodes is not None:
                self._episodes.load(np.asarray(state.get("episode_starts", []), np.int64))
            if self._codec is not None:
                self._codec.load_state_dict(state["frames"])
            self._restore_own_parts(state)

    def _restore_own_parts(self, state: dict[str, Any]) -> None:
        """A subclass's own parts of ``state`` (its overrides call this first), restored
        with the lock held in :meth:`restore_state`'s one section, so that no read sees
        the ring restored and these parts not yet. Check them before anything changes
        (in an override of :meth:`restore_state`, before calling it)."""

