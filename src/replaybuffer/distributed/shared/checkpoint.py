"""Checkpoints of a shared buffer, in the local buffers' format:
:class:`SharedCheckpoints`, the ``save()`` and ``load()`` of
:class:`~replaybuffer.distributed.SharedReplayBuffer`.

``save(path, keep)`` takes a consistent snapshot while writers go on
(:mod:`.snapshot`) and writes it as a checkpoint of a
:class:`~replaybuffer.UniformReplayBuffer` (or
:class:`~replaybuffer.PrioritizedReplayBuffer`) of the kept rows, into the series
``path`` as :func:`replaybuffer.persist.save` writes one (a temporary directory renamed
to ``ckpt-N`` once every file is written and fsynced, then all but the newest ``keep``
removed; CRC-checked ``.npy`` files and a JSON manifest). So ``replaybuffer.load(path)``
restores it into a local buffer, and :meth:`SharedCheckpoints.load` into a new shared
buffer. The manifest's state carries, beside a local buffer's state, what only a shared
buffer uses (``state["shared"]``, which a local restore ignores): the shared rows kept
and every row's head (so step ids go on where they were), read cursors, the rate
limiter's counters. Priorities are the local sampler's (``priority ** alpha`` per
position). A save holds one copy of the held steps in memory while it writes.
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

import replaybuffer.persist.durable as durable
import replaybuffer.persist.series as series
from replaybuffer import nest
from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.distributed.shared.config import SharedConfig
from replaybuffer.distributed.shared.counters import ADMITTED_INSERTS, ADMITTED_SAMPLES
from replaybuffer.distributed.shared.frame_checkpoint import local_frames, restore_frames
from replaybuffer.distributed.shared.frame_ring import SharedFrameRing
from replaybuffer.distributed.shared.layout import (
    INSERT_BLOCKED_NS, INSERTS, INSERTS_BLOCKED, LARGEST_INSERT, LARGEST_SAMPLE,
    SAMPLE_BLOCKED_NS, SAMPLES, SAMPLES_BLOCKED, SharedLayout)
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.row_marks import CLEARS, DROPPED, RowMarks
from replaybuffer.distributed.shared.snapshot import RowSnapshot, take_snapshot
from replaybuffer.errors import CheckpointError
from replaybuffer.persist.layout import FORMAT, MANIFEST, VERSION
from replaybuffer.persist.manifest import manifest_checksum
from replaybuffer.persist.manifest import read_manifest
from replaybuffer.persist.series import checked_save_arguments
from replaybuffer.persist.spec_codec import decode_spec
from replaybuffer.persist.state_files import internalise_arrays
from replaybuffer.persist.streams import read_stream
from replaybuffer.rate_limiter import RateLimiter
from replaybuffer.persist.spec_codec import encode_spec
from replaybuffer.persist.state_files import externalise_arrays
from replaybuffer.persist.streams import write_stream
from replaybuffer.sampling import flat_tree
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.uniform import UniformSampler
import replaybuffer.persist as persist
from replaybuffer.storage.frozen import static_rows
from replaybuffer.storage.shared_storage import SharedStorage

EPISODE_KEY = 1 << 40
"""A local checkpoint's episode starts are keys ``row * 2**40 + id``
(:meth:`replaybuffer.sampling.episodes.EpisodeIndex.state`)."""

LIMITER_FIELDS = {"inserts": INSERTS, "samples": SAMPLES, "inserts_blocked": INSERTS_BLOCKED,
                  "samples_blocked": SAMPLES_BLOCKED, "largest_insert": LARGEST_INSERT,
                  "largest_sample": LARGEST_SAMPLE, "insert_blocked_ns": INSERT_BLOCKED_NS,
                  "sample_blocked_ns": SAMPLE_BLOCKED_NS}
"""The rate limiter's counters a checkpoint keeps: name -> field of ``control``."""

ADMITTED = {"inserts": ADMITTED_INSERTS, "samples": ADMITTED_SAMPLES}
"""The counters kept per process (:mod:`.counters`): a restore puts them in the
overflow row (row 0), which every total includes."""


class SharedCheckpoints:
    """``save()`` and the ``load()`` constructor of a shared buffer (see the module
    docstring)."""

    _config: SharedConfig
    _layout: SharedLayout
    _marks: RowMarks
    _storage: SharedStorage
    _lock: ProcessLock
    _episode_leaf: int | None
    _frames: SharedFrameRing | None

    def _check_open(self) -> None: ...

    def close(self) -> None: ...

    def save(self, path: str | os.PathLike[str], keep: int = 1, *,
             metadata: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint of the steps held now under ``path`` while writers go on;
        return its directory (``path/ckpt-N``). See the module docstring: restore it
        with ``replaybuffer.load(path)`` (a local buffer) or
        :meth:`SharedReplayBuffer.load` (a shared one).

        Raises:
            ValueError: ``keep`` is not a positive int, ``metadata`` not a JSON-able dict.
            CheckpointError: ``path`` is a file or a directory of something else, or
                writing failed (the message names it); earlier checkpoints are kept.
            BufferClosedError: the buffer was closed.
        """
        self._check_open()
        root, metadata = checked_save_arguments(path, keep, metadata)
        config = self._config
        snap = take_snapshot(self._layout, self._marks, self._storage, self._lock,
                             config.num_rows, config.max_length, self._frames)

        def write(tmp: Path) -> None:
            self._write_checkpoint(tmp, snap, metadata)
            if ARMED is not None:
                crash_point("shared.save.publish")

        return series.save_into(root, keep, write)

    @classmethod
    def load(cls, checkpoint: str | os.PathLike[str], *,
             path: str | os.PathLike[str] | None = None,
             rate_limiter: RateLimiter | None = None, seed: int | None = None,
             num_rows: int | None = None, side_frames: int | None = None) -> Any:
        """A new shared buffer holding the newest checkpoint under ``checkpoint`` (one
        of :meth:`save`, or of a ``UniformReplayBuffer``/``PrioritizedReplayBuffer``):
        the same rows and step ids, priorities, read cursors and rate-limiter counters,
        and the checkpoint's ``frame_stack``. ``rate_limiter`` paces it (a checkpoint
        keeps a limiter's counters, not the limiter); ``path``, ``seed``,
        ``side_frames``: as the constructor's, except that ``side_frames`` defaults to
        16 + K(K - 1) / 2 for stacks of K frames: the oldest steps of a restored row
        reference frames from before them, which come back as side frames
        (1 + ... + K - 1 of them per row), beside those the saved buffer used;
        ``num_rows``: more rows than saved, for more writers.

        Raises:
            CheckpointError: no checkpoint, missing or corrupt files, or a kind a shared
                buffer cannot hold.
            ValueError: ``num_rows`` fewer than the checkpoint's.
            SideFramesFullError: (``frame_stack``) a row holds more side frames than
                ``side_frames``.
        """
        directory, manifest, state, spec = read_checkpoint(checkpoint)
        rows = saved_rows(manifest, state)
        if num_rows is not None and num_rows < rows:
            raise ValueError(f"num_rows={num_rows}: the checkpoint holds {rows} rows")
        config = manifest["config"]
        frame_stack, axis = config.get("frame_stack"), config.get("stack_axis", 0)
        if side_frames is None:
            k = int(spec[frame_stack].shape[axis]) if frame_stack is not None else 1
            side_frames = 16 + k * (k - 1) // 2
        buffer = cls(spec, rows if num_rows is None else num_rows,  # type: ignore[call-arg]
                     manifest["max_length"],
                     prioritized=manifest["buffer"] == "PrioritizedReplayBuffer",
                     alpha=config.get("alpha", 0.6), beta=config.get("beta", 0.4),
                     rate_limiter=rate_limiter, path=path, seed=seed,
                     track_episodes=bool(config.get("track_episodes")),
                     frame_stack=frame_stack, stack_axis=axis, side_frames=side_frames)
        try:
            buffer.restore_checkpoint(directory, manifest, state)
        except BaseException:
            buffer.close()
            raise
        return buffer

    def restore_checkpoint(self, directory: Path, manifest: dict[str, Any],
                           state: dict[str, Any]) -> None:
        """Fill this new, empty buffer with a checkpoint read by :func:`read_checkpoint`
        (what :meth:`load` does after building the buffer).

        Raises:
            ValueError: the buffer has held steps, or its rows are shorter or fewer.
            CheckpointError: a data file is missing, truncated or corrupt.
        """
        config = self._config
        if (self._layout.next_id != 0).any():
            raise ValueError("restore_checkpoint: the buffer has held steps; restore into "
                             "a new one (SharedReplayBuffer.load)")
        if config.max_length != manifest["max_length"] or \
                config.num_rows < saved_rows(manifest, state):
            raise ValueError(f"restore_checkpoint: the checkpoint holds "
                             f"{saved_rows(manifest, state)} rows of "
                             f"{manifest['max_length']} steps; this buffer has "
                             f"{config.num_rows} of {config.max_length}")
        restore_rows(self._layout, self._marks, self._storage, self._lock, directory,
                     manifest, state, self._frames)

    def _write_checkpoint(self, directory: Path, snap: RowSnapshot,
                          metadata: dict[str, Any]) -> None:
        """Every file of one checkpoint of ``snap``, the manifest last."""
        config = self._config
        specs, _ = nest.flatten(config.data_spec)
        local_state, streams, leaves = self._local_state(snap), {}, list(snap.leaves)
        if self._frames is not None:  # the local codec's references, state and ring
            leaf = self._frames.leaf
            leaves[leaf], local_state["frames"], streams["frames"] = local_frames(
                self._frames, leaves[leaf], max(1, len(snap.rows)), config.max_length,
                directory, nullcontext())
        rows = static_rows(leaves, self._storage.specs, nest.leaf_paths(config.data_spec))
        entries = write_stream(directory, "leaves", rows, nullcontext(), persist.CHUNK_BYTES)
        state = externalise_arrays(local_state, directory)
        manifest = {
            "format": FORMAT, "version": VERSION,
            "buffer": "PrioritizedReplayBuffer" if config.prioritized else "UniformReplayBuffer",
            "batch_size": max(1, len(snap.rows)), "max_length": config.max_length,
            "storage": "numpy", "config": self._local_config(), "device": None,
            "data_spec": encode_spec(config.data_spec), "state": state, "leaves": entries,
            "streams": streams, "metadata": metadata, "state_only": False}
        manifest["checksum"] = manifest_checksum(manifest)
        with durable.naming(directory / MANIFEST), open(directory / MANIFEST, "w") as fh:
            fh.write(json.dumps(manifest, indent=1))
            durable.sync(fh)
        durable.sync_directory(directory)

    def _local_config(self) -> dict[str, Any]:
        """The constructor keywords of the local buffer class the checkpoint names."""
        config = self._config
        local: dict[str, Any] = {"seed": config.seed,
                                 "track_episodes": self._episode_leaf is not None,
                                 "frame_stack": None, "stack_axis": 0}
        if config.frames is not None:
            local.update(frame_stack=config.frames.name, stack_axis=config.frames.stack_axis)
        if config.prioritized:
            local.update(alpha=config.alpha, beta=config.beta, beta_final=None,
                         beta_steps=0, normalize="batch")
        return local

    def _local_state(self, snap: RowSnapshot) -> dict[str, Any]:
        """A local buffer's state for ``snap`` (ring, sampler, episode starts) and,
        under ``"shared"``, what only a shared buffer restores."""
        config = self._config
        batch = max(1, len(snap.rows))
        sampler: dict[str, Any]
        if config.prioritized:
            assert snap.priorities is not None
            sampler = PrioritizedSampler(batch * config.max_length, config.alpha,
                                         min(config.beta, 1.0), seed=config.seed).state_dict()
            priorities = np.zeros(batch * config.max_length)
            priorities[:len(snap.priorities)] = snap.priorities
            sampler.update(priorities=priorities, max_priority=snap.max_priority)
        else:
            sampler = UniformSampler(config.seed).state_dict()
        state: dict[str, Any] = {"last_id": snap.kept - 1, "sampler": sampler}
        if self._episode_leaf is not None:
            firsts = np.nonzero(snap.leaves[self._episode_leaf] == 0)[0]  # FIRST steps
            step, row = np.divmod(firsts.astype(np.int64), batch)
            state["episode_starts"] = np.sort(row * EPISODE_KEY + step)
        state["shared"] = {
            "num_rows": config.num_rows, "rows": snap.rows, "heads": snap.heads,
            "floors": snap.floors, "cursors": snap.cursors, "dropped": snap.dropped,
            "limiter": {name: int(snap.control[field])
                        for name, field in LIMITER_FIELDS.items()}}
        return state


def restore_rows(layout: SharedLayout, marks: RowMarks, storage: SharedStorage,
                 lock: ProcessLock, directory: Path, manifest: dict[str, Any],
                 state: dict[str, Any], frames: SharedFrameRing | None = None) -> None:
    """Write a checkpoint's steps (``manifest``, ``state`` read from ``directory``)
    into an empty shared buffer of the same row length and at least its rows: each
    kept row's steps at their ids, versions published, heads, floors and cursors,
    priorities and the rate limiter's counters as saved. ``frames``: the buffer's frame
    ring, into which a frame-stacked checkpoint's stacks are encoded
    (:func:`~.frame_checkpoint.restore_frames`).

    Raises:
        CheckpointError: a data file is missing, truncated or corrupt.
    """
    num_rows, length = len(layout.next_id), int(manifest["max_length"])
    batch = int(manifest["batch_size"])
    kept = min(int(state["last_id"]) + 1, length)
    shared = state.get("shared")
    if shared is None:  # a local buffer's checkpoint: its rows advanced together
        rows = np.arange(batch, dtype=np.int64)
        heads = np.zeros(num_rows, np.int64)
        heads[:batch] = int(state["last_id"]) + 1
        cursors, dropped, limiter = heads.copy(), 0, {}
    else:
        rows = np.asarray(shared["rows"], np.int64).reshape(-1)
        saved = np.asarray(shared["heads"], np.int64)
        heads, cursors = np.zeros(num_rows, np.int64), np.zeros(num_rows, np.int64)
        heads[:len(saved)] = saved  # rows beyond the saved ones (num_rows=) are new
        cursors[:len(saved)] = np.asarray(shared["cursors"], np.int64)
        dropped = int(shared["dropped"])
        limiter = shared["limiter"]
        batch = max(1, len(rows))
    if not len(rows):
        kept = 0
    # Stream position j is a local ring position: slot j // batch of row j % batch,
    # holding the local id of that slot among the kept ones (oldest first: age).
    local = np.arange(kept * len(rows), dtype=np.int64)
    slot, row_index = np.divmod(local, max(1, len(rows)))
    oldest_local = int(state["last_id"]) + 1 - kept
    age = (slot - oldest_local) % length
    ids = heads[rows[row_index]] - kept + age
    positions = (ids % length) * num_rows + rows[row_index]

    def write(start: int, arrays: list[np.ndarray]) -> None:
        where = positions[start:start + len(arrays[0])]
        for leaf, values in zip(storage.arrays, arrays):
            leaf[where] = values

    read_stream(directory, manifest["leaves"], storage.specs, kept * len(rows), write,
                persist.CHUNK_BYTES)
    if frames is not None:
        restore_frames(frames, storage, directory, manifest, state, positions, ids,
                       rows[row_index], row_index)
    with lock:
        layout.version[positions] = 2 * ids + 2
        layout.next_id[:] = heads
        floors = heads.copy()
        floors[rows] = heads[rows] - kept
        marks.floor[:] = floors
        marks.cursor[:] = np.maximum(cursors, floors)
        marks.counts[DROPPED] = dropped
        # Floors above a row's oldest step narrow what it holds (see RowMarks.cleared).
        marks.counts[CLEARS] = int((floors > np.maximum(heads - length, 0)).any())
        layout.held[:] = 0
        layout.held[rows] = kept
        for name, value in limiter.items():
            if name in ADMITTED:  # counted per process: into the overflow row
                layout.counters[0, ADMITTED[name]] = int(value)
            else:
                layout.control[LIMITER_FIELDS[name]] = int(value)
        sampler = state["sampler"]
        if layout.prioritized and "priorities" in sampler:
            leaves = np.asarray(sampler["priorities"], np.float64)
            flat_tree.update(layout.tree, positions, leaves[local])
            layout.max_priority[0] = float(sampler["max_priority"])
        elif layout.prioritized:  # a uniform buffer's checkpoint: every step at 1
            flat_tree.update(layout.tree, positions, np.ones(len(positions)))


def read_checkpoint(path: str | os.PathLike[str]
                    ) -> tuple[Path, dict[str, Any], dict[str, Any], Any]:
    """The newest checkpoint under ``path`` (or the one it names): its directory,
    checked manifest, state (arrays read and checked) and data spec.

    Raises:
        CheckpointError: no checkpoint, a malformed or corrupt manifest or state file,
            or one a shared buffer cannot hold (another buffer kind, a state-only one).
    """
    manifest = read_manifest(path)
    directory = Path(manifest["directory"])
    streams = set(manifest["streams"])
    if manifest["buffer"] not in ("UniformReplayBuffer", "PrioritizedReplayBuffer") or \
            streams != ({"frames"} if manifest["config"].get("frame_stack") else set()) \
            or manifest.get("state_only"):
        raise CheckpointError(f"{directory} holds a {manifest['buffer']} checkpoint a "
                              "SharedReplayBuffer cannot hold (it restores those of "
                              "UniformReplayBuffer and PrioritizedReplayBuffer, and its "
                              "own)")
    try:
        spec = decode_spec(manifest["data_spec"])
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{directory}: malformed data_spec: {exc}") from exc
    return directory, manifest, internalise_arrays(manifest["state"], directory), spec


def saved_rows(manifest: dict[str, Any], state: dict[str, Any]) -> int:
    """How many rows the buffer a checkpoint was saved from had."""
    shared = state.get("shared")
    return int(manifest["batch_size"]) if shared is None else int(shared["num_rows"])

