"""The replay-buffer core: a ring of ``batch_size x max_length`` steps, a storage
and a sampler, joined under one lock.

:class:`ReplayBuffer` builds and holds the parts (the :class:`~replaybuffer.sampling.Ring`,
the storage, the sampler, the frame codec, the episode index, the rate limiter) and
combines the modules that work on them, one concern each:

- :mod:`~replaybuffer.buffers.write_path`: ``add_batch``, ``extend`` and the validating
  write steps subclasses reuse;
- :mod:`~replaybuffer.buffers.reads`: ``get_next``/``draw``, ``gather_all``;
- :mod:`~replaybuffer.buffers.datasets`: ``as_dataset`` and the deterministic pass's reads;
- :mod:`~replaybuffer.buffers.episodes`: episode starts recorded as steps arrive;
- :mod:`~replaybuffer.buffers.rate_limiting`: the rate limiter attached and consulted;
- :mod:`~replaybuffer.buffers.files`: the life cycle of storage on files (mmap);
- :mod:`~replaybuffer.buffers.checkpoints`: ``save``, ``state_dict`` and their hooks;
- :mod:`~replaybuffer.buffers.seeding`: ``reseed``.

Subclasses choose the sampler; :mod:`~replaybuffer.buffers.wiring` names the attributes
they and the modules share.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from replaybuffer import nest
from replaybuffer.buffers.checkpoints import Checkpoints
from replaybuffer.buffers.datasets import Datasets
from replaybuffer.buffers.device_sampling import for_storage
from replaybuffer.buffers.episodes import EpisodeRecording
from replaybuffer.buffers.files import FileLifeCycle
from replaybuffer.buffers.reads import ReadPath, package
from replaybuffer.buffers.seeding import Seeding
from replaybuffer.buffers.rate_limiting import RateLimiting
from replaybuffer.buffers.write_path import WritePath
from replaybuffer.errors import SpecError
from replaybuffer.protocols import BufferInfo
from replaybuffer.rate_limiter import RateLimiter
from replaybuffer.registry import register_buffer
from replaybuffer.sampling import Ring, Sampler
from replaybuffer.sampling.episodes import EpisodeIndex
from replaybuffer.specs import as_data_spec
from replaybuffer.storage import make_storage
from replaybuffer.storage.base import LeafChecker, Storage
from replaybuffer.storage.frames import FrameStackCodec

__all__ = ["BufferInfo", "ReplayBuffer", "package"]


class ReplayBuffer(WritePath, Datasets, ReadPath, EpisodeRecording, RateLimiting,
                   FileLifeCycle, Checkpoints, Seeding):
    """A fixed-capacity store of steps laid out as ``batch_size`` rows of ``max_length``.

    Each :meth:`add_batch` writes one step to every row at the same logical id; once
    a row is full the oldest step is overwritten. Reads never cross the write head.
    All methods are thread-safe: a collector may add while learners sample, and no
    sampled step mixes leaves from two different writes. A buffer is
    :class:`~replaybuffer.protocols.Checkpointable`: :meth:`state_dict` copies its whole
    state into memory, :meth:`load_state_dict` puts it into a buffer built alike.

    Args:
        data_spec: a nest of :class:`~replaybuffer.ArraySpec` (or gymnasium spaces,
            ``tf.TensorSpec`` s, anything with ``.shape`` and ``.dtype``).
        batch_size: rows; every ``add_batch`` item has this leading dimension.
        max_length: steps kept per row.
        storage: a registered name, ``"numpy"`` (host RAM), ``"torch"`` (tensors on
            ``device``), ``"mmap"`` (files under ``path``) or ``"tensorflow"``; or a
            storage object of your own that satisfies
            :class:`~replaybuffer.storage.Storage`, built for this buffer's stored specs
            and capacity (checked at construction: a missing method, other specs or
            another capacity is refused with an error that names it).
        device: torch device for ``storage="torch"`` (``"cuda"``, ``"cuda:1"``, ...).
        sampler: which windows reads draw.
        frame_stack: name of a top-level leaf holding stacked frames (e.g.
            ``"observation"`` of uint8 ``[4, 84, 84]``) to store deduplicated: one frame
            per step, stacks rebuilt on read (see :mod:`replaybuffer.storage.frames`).
            Numpy storage only.
        stack_axis: the axis of that leaf's shape that stacks frames.
        path: for ``storage="mmap"``: a new or empty directory for the data files (see
            :mod:`replaybuffer.storage.mmap_storage`); reopen it with
            :func:`replaybuffer.reopen`.
        track_episodes: record where episodes start (steps whose ``step_type`` leaf is
            ``FIRST``), so that reads with ``within_episodes=True`` never return a
            window that runs into the next episode. Needs a ``step_type`` leaf (a
            :class:`~replaybuffer.collect.Trajectory`, or a dict key).
        rate_limiter: a :class:`~replaybuffer.RateLimiter` to pace inserts and samples
            (the same as setting :attr:`rate_limiter` after construction).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_buffer(cls)  # restorable by name (replaybuffer.registry)

    def __init__(self, data_spec: Any, batch_size: int = 1, max_length: int = 1000, *,
                 storage: str | Storage = "numpy", device: Any = None, sampler: Sampler,
                 track_episodes: bool = False, frame_stack: str | None = None,
                 stack_axis: int = 0, path: str | os.PathLike[str] | None = None,
                 rate_limiter: RateLimiter | None = None):
        self._data_spec = as_data_spec(data_spec)
        specs, self._structure = nest.flatten(self._data_spec)
        self._specs = tuple(specs)
        self._paths = nest.leaf_paths(self._data_spec)
        self._fast_flatten = nest.fast_flattener(self._data_spec)
        self._ring = Ring(batch_size, max_length)
        self._codec = None
        names = self._paths_by_name()
        stored_specs = list(self._specs)
        if frame_stack is not None:
            if storage != "numpy":
                raise ValueError(f"frame_stack needs storage='numpy', got {storage!r}")
            index = names.get(frame_stack)
            if index is None:
                raise SpecError(f"frame_stack={frame_stack!r} names no top-level leaf; the "
                                f"data_spec's leaves are {self._paths}")
            self._codec = FrameStackCodec(self._specs[index], stack_axis, batch_size,
                                          max_length, self._paths[index])
            self._codec_leaf = index
            self._frame_checker = LeafChecker([self._specs[index]])
            stored_specs[index] = self._codec.ref_spec  # storage holds frame references
        self._storage = make_storage(storage, stored_specs, self._ring.capacity, device, path)
        # Storage on files stages each write and applies it at commit (crash safety).
        self._commit = getattr(self._storage, "commit", None)
        self._sampler = sampler
        self._episodes = None
        if track_episodes:
            if "step_type" not in names:
                raise SpecError(f"track_episodes needs a step_type leaf (a Trajectory, or a "
                                f"dict key 'step_type'); the data_spec's leaves are "
                                f"{self._paths}")
            self._step_type_leaf = names["step_type"]
            self._episodes = EpisodeIndex()
        self._lock = threading.Lock()
        # Bumped (lock held) by clear() and restores, after which step ids start over and
        # name other data: caches keyed by step id (compat.pearl's) check it.
        self._generation = 0
        self._outer = (self._ring.batch_size,)
        self._outer_names = f"[batch_size={self._ring.batch_size}]"
        if self._codec is not None:
            self._stack_shape = self._outer + self._specs[self._codec_leaf].shape
        # add_batch of arrays already in the stored dtype and shape: check and write in
        # one call (episode tracking takes the general path).
        self._write_exact = None
        if self._episodes is None and self._fast_flatten is not None:
            self._write_exact = self._storage.exact_writer(self._outer)
        if rate_limiter is not None:
            self.rate_limiter = rate_limiter

    def _paths_by_name(self) -> dict[str, int]:
        """Top-level leaves by field name or string key: ``{"step_type": 0, ...}``."""
        names = {}
        for i, path in enumerate(self._paths):
            for prefix, suffix in ((".", ""), ("['", "']")):
                if path.startswith(prefix) and path.endswith(suffix):
                    name = path[len(prefix):len(path) - len(suffix)]
                    if name.isidentifier():
                        names[name] = i
        return names

    # ----------------------------------------------------------------- properties
    @property
    def data_spec(self) -> Any:
        """The nest of :class:`ArraySpec` describing one item (no batch dimension)."""
        return self._data_spec

    @property
    def capacity(self) -> int:
        """Steps the buffer can hold: ``batch_size * max_length`` (a Python int)."""
        return self._ring.capacity

    @property
    def batch_size(self) -> int:
        return self._ring.batch_size

    @property
    def max_length(self) -> int:
        return self._ring.max_length

    @property
    def storage(self) -> str:
        """The storage backend's name."""
        return self._storage.kind

    @property
    def store(self) -> Any:
        """The storage object holding the steps (a
        :class:`~replaybuffer.storage.base.Storage`: its ``arrays`` are one array per
        stored leaf, ``[capacity, *spec.shape]``, position ``slot * batch_size + row``).
        During a save it is a copy-on-write view of that storage."""
        return self._storage

    @property
    def sampler(self) -> Sampler:
        """The sampler that chooses which windows reads return."""
        return self._sampler

    @property
    def lock(self) -> threading.Lock:
        """The lock every read and write of the buffer holds (a ``threading.Lock``, not
        re-entrant): a save takes it to begin its snapshot and for each chunk it
        reads, so adds go on between chunks."""
        return self._lock

    @property
    def device(self) -> Any:
        return getattr(self._storage, "device", None)

    @property
    def nbytes(self) -> int:
        """Bytes the storage takes at full capacity (allocated at construction)."""
        return self._storage.nbytes + (self._codec.nbytes if self._codec else 0)

    @property
    def generation(self) -> int:
        """A count of the clears and restores: what was read before it changed may no
        longer be what the buffer holds (caches of the data start afresh)."""
        return self._generation

    @property
    def last_id(self) -> int:
        """Id of the newest step (-1 when empty); ids count adds from 0."""
        return self._ring.last_id

    def num_frames(self) -> int:
        """Steps held: ``min(adds * batch_size, capacity)``."""
        return self._ring.num_frames

    def __len__(self) -> int:
        return self._ring.num_frames

    def __repr__(self) -> str:
        """``Class(batch_size=B, max_length=L, storage='numpy', steps=held/capacity)``;
        ``transitions=`` for the transition buffers, which hold one transition a slot."""
        return (f"{type(self).__name__}(batch_size={self.batch_size}, "
                f"max_length={self.max_length}, storage={self.storage!r}, "
                f"{held_unit(type(self))}={self.num_frames()}/{self.capacity})")

    def clear(self, zero_storage: bool = False) -> None:
        """Forget every step: ``last_id`` goes back to -1.

        An attached rate limiter keeps its counters (inserts, samples, the diff): it
        paces the whole run, so samples wait until ``min_size_to_sample`` items are in
        again and the diff goes on from where it was. Attach a new limiter to count
        afresh (docs/rate-limiters.md).

        Args:
            zero_storage: also overwrite the stored arrays with zeros (otherwise they
                are only unlinked, which is O(1)).
        """
        with self._lock:
            self._sampler.on_clear(self._ring)
            if self._episodes is not None:
                self._episodes.clear()
            if self._codec is not None:
                self._codec.clear()
            self._clear_state()
            self._ring.last_id = -1
            self._generation += 1
            if self._commit is not None:
                self._commit(-1)  # before zeroing: a crash midway shows an empty buffer
            if zero_storage:
                self._storage.zero()

    def _clear_state(self) -> None:
        """Forget what a subclass keeps beside the ring; called by :meth:`clear` under the
        same lock, so no add can slip in between."""

    @classmethod
    def rebuild(cls, data_spec: Any, batch_size: int, max_length: int, storage: str,
                device: Any, config: dict[str, Any]) -> "ReplayBuffer":
        """Build an empty buffer of this class for a restore (``config``: its
        :meth:`constructor_config`; its device keywords dropped where ``storage`` is
        not torch: such a restore samples on the host; ``capture_samples`` dropped
        where the torch storage cannot record: ``device_sampling.for_storage``)."""
        return cls(data_spec, batch_size, max_length, storage=storage, device=device,
                   **for_storage(config, storage, device))


TRANSITION_BUFFER = ("replaybuffer.buffers.transitions", "TransitionReplayBuffer")
"""The class whose kinds hold transitions (named, not imported: it subclasses this module's)."""


def held_unit(cls: type) -> str:
    """What one slot of a buffer of class ``cls`` holds, in the plural: ``"transitions"``
    for :class:`~replaybuffer.TransitionReplayBuffer` and its kinds (prioritized,
    rollouts, HER), ``"steps"`` for the others (a stacked-frame buffer's steps too)."""
    kinds = {(c.__module__, c.__qualname__) for c in cls.__mro__}
    return "transitions" if TRANSITION_BUFFER in kinds else "steps"
