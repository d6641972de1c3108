"""The replay-buffer core: a ring of ``batch_size x max_length`` steps, a storage
and a sampler, joined under one lock.

Subclasses choose the sampler; everything else (validation, the write path, the
read path, datasets, persistence) lives here once.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Literal,
                    Sequence, cast, overload)

import numpy as np

from replaybuffer import nest
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.arguments import positive_or_none
from replaybuffer.protocols import BufferInfo
from replaybuffer.registry import register_buffer
from replaybuffer.rate_limiter import RateLimiter, RateLimiterStats
from replaybuffer.sampling import Ring, Sampler
from replaybuffer.sampling.episodes import EpisodeIndex
from replaybuffer.sampling.ring import items_per_row, table_rows, windows
from replaybuffer.specs import ArraySpec, as_data_spec
from replaybuffer.storage import make_storage
from replaybuffer.storage.base import LeafChecker, identity, to_numpy
from replaybuffer.storage.frames import FrameStackCodec
from replaybuffer.storage.frozen import CopyOnWriteStorage, FrozenRows, storage_rows

if TYPE_CHECKING:
    from replaybuffer.sampling.deterministic import Index
    from replaybuffer.storage.exact_writer import ExactWriter
    from replaybuffer.storage.mmap_storage import MmapStorage


class ReplayBuffer:
    """A fixed-capacity store of steps laid out as ``batch_size`` rows of ``max_length``.

    Each :meth:`add_batch` writes one step to every row at the same logical id; once
    a row is full the oldest step is overwritten. Reads never cross the write head.
    All methods are thread-safe: a collector may add while learners sample, and no
    sampled step mixes leaves from two different writes.

    Args:
        data_spec: a nest of :class:`~replaybuffer.ArraySpec` (or gymnasium spaces,
            ``tf.TensorSpec`` s, anything with ``.shape`` and ``.dtype``).
        batch_size: rows; every ``add_batch`` item has this leading dimension.
        max_length: steps kept per row.
        storage: ``"numpy"`` (host RAM) or ``"torch"`` (tensors on ``device``).
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
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_buffer(cls)  # restorable by name (replaybuffer.registry)

    def __init__(self, data_spec: Any, batch_size: int = 1, max_length: int = 1000, *,
                 storage: str = "numpy", device: Any = None, sampler: Sampler,
                 track_episodes: bool = False, frame_stack: str | None = None,
                 stack_axis: int = 0, path: str | os.PathLike[str] | None = None):
        self._data_spec = as_data_spec(data_spec)
        specs, self._structure = nest.flatten(self._data_spec)
        self._specs: tuple[ArraySpec, ...] = tuple(specs)
        self._paths = nest.leaf_paths(self._data_spec)
        self._fast_flatten = nest.fast_flattener(self._data_spec)
        self._ring = Ring(batch_size, max_length)
        self._codec: FrameStackCodec | None = None
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
        self._commit: Callable[[int], None] | None = getattr(self._storage, "commit", None)
        self._sampler = sampler
        self._episodes: EpisodeIndex | None = None
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
        self._write_exact: ExactWriter | None = None
        if self._episodes is None and self._fast_flatten is not None:
            self._write_exact = self._storage.exact_writer(self._outer)

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
    def device(self) -> Any:
        return getattr(self._storage, "device", None)

    @property
    def nbytes(self) -> int:
        """Bytes the storage takes at full capacity (allocated at construction)."""
        return self._storage.nbytes + (self._codec.nbytes if self._codec else 0)

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
        return (f"{type(self).__name__}(batch_size={self.batch_size}, "
                f"max_length={self.max_length}, storage={self.storage!r}, "
                f"frames={self.num_frames()}/{self.capacity})")

    # ----------------------------------------------------------------- write path
    def flatten_items(self, items: Any, method: str) -> Sequence[Any]:
        if self._fast_flatten is not None:
            leaves = self._fast_flatten(items)
            if leaves is not None:
                return leaves
        leaves, structure = nest.flatten(items)
        if structure != self._structure:
            raise SpecError(self._structure_mismatch(items, structure, method))
        return leaves

    def _structure_mismatch(self, items: Any, structure: Any, method: str) -> str:
        try:
            got = set(nest.leaf_paths(items))
        except Exception:  # an unflattenable object: report its structure only
            got = set()
        want = set(self._paths)
        detail = []
        if want - got:
            detail.append(f"missing leaves {sorted(want - got)}")
        if got - want:
            detail.append(f"unexpected leaves {sorted(got - want)}")
        return (f"{method}: items do not match the data_spec structure: expected "
                f"{nest.describe(self._structure)}, got {nest.describe(structure)}"
                + (f" ({'; '.join(detail)})" if detail else ""))

    def add_batch(self, items: Any, *, timeout: float | None = None,
                  block: bool = True) -> bool:
        """Append one step to every row.

        Args:
            items: a nest matching ``data_spec`` whose leaves have shape
                ``[batch_size, *spec.shape]``: numpy arrays, array-likes or (torch
                storage) tensors, of a dtype that casts to the leaf's within its kind.
            timeout, block: with a :attr:`rate_limiter` that holds the insert back: wait
                up to ``timeout`` seconds (``None``: as long as it takes), or with
                ``block=False`` return ``False`` at once.

        Returns:
            ``True`` once written; ``False`` only with ``block=False`` (nothing written).

        Raises:
            SpecError: wrong structure, shape, batch size or dtype; the message names
                the leaf. Nothing is written.
            RateLimitedError: ``timeout`` passed with the insert held back.
        """
        # Adding one small step is a hot path (about 3 us): every attribute lookup and
        # call saved here is measurable.
        flatten = self._fast_flatten
        leaves = None if flatten is None else flatten(items)
        if leaves is not None and self._write_exact is not None:
            ring = self._ring
            with self._lock:
                limiter = self._limiter
                if limiter is not None and not self._admit(ring.batch_size, timeout, block):
                    return False
                # Read again under the lock, after the limiter's wait (which lets go of
                # it): a save's snapshot may have paused the fused writer since, as it
                # writes around the snapshot's copy-on-write storage.
                write_exact = self._write_exact
                last_id = ring.last_id + 1
                position = (last_id % ring.max_length) * ring.batch_size
                codec = self._codec
                if write_exact is None:  # the general path below writes it
                    written = False
                elif codec is None:
                    written = write_exact(position, leaves)
                else:
                    written = self._write_exact_stacks(codec, write_exact, position, last_id,
                                                       leaves)
                if written:
                    ring.last_id = last_id
                    self._sampler.on_add(ring, last_id, 1)
                    if limiter is not None:
                        limiter.inserted(ring.batch_size)
                    return True
        if leaves is None:
            leaves = self.flatten_items(items, "add_batch")
        if self._codec is not None:  # one step in time-major layout is the batch itself
            return self.write_steps(self.convert_leaves(leaves, self._outer, self._outer_names), 1,
                                     timeout, block)
        arrays = self._storage.convert(leaves, self._paths, self._outer, self._outer_names)
        ring = self._ring
        with self._lock:
            if self._limiter is not None and not self._admit(ring.batch_size, timeout, block):
                return False
            last_id = ring.last_id + 1
            self._storage.write((last_id % ring.max_length) * ring.batch_size, arrays)
            ring.last_id = last_id
            if self._commit is not None:
                self._commit(last_id)
            self._sampler.on_add(ring, last_id, 1)
            if self._episodes is not None:
                self._record_episodes(last_id, arrays[self._step_type_leaf], 1)
            if self._limiter is not None:
                self._limiter.inserted(ring.batch_size)
        return True

    def _write_exact_stacks(self, codec: FrameStackCodec, write_exact: ExactWriter,
                            position: int, step_id: int, leaves: Sequence[Any]) -> bool:
        """``write_exact`` of one step whose stacked frames are deduplicated (by ``codec``,
        the buffer's): exact stacks become frame references, then every leaf is written
        (or nothing is)."""
        i = self._codec_leaf
        stacks = leaves[i]
        if type(stacks) is not np.ndarray or stacks.dtype is not self._specs[i].dtype \
                or stacks.shape != self._stack_shape:
            return False
        refs, frame_writes = codec.encode(step_id, stacks)  # changes nothing yet
        leaves = list(leaves)  # the caller's list stays as it was, for the general path
        leaves[i] = refs
        if not write_exact(position, leaves):
            return False
        codec.commit(frame_writes, step_id, 1)
        return True

    def extend(self, items: Any, *, timeout: float | None = None, block: bool = True
               ) -> bool:
        """Append ``num_steps`` consecutive steps to every row in one call.

        Args:
            items: a nest matching ``data_spec`` whose leaves have shape
                ``[batch_size, num_steps, *spec.shape]``, oldest step first.
            timeout, block: as for :meth:`add_batch` (``batch_size * num_steps`` items).

        Equivalent to ``num_steps`` calls of :meth:`add_batch` with ``items[:, t]``.
        """
        leaves = self.flatten_items(items, "extend")
        B = self.batch_size
        num_steps = self.leading_dim(leaves, 1, "extend", f"[batch_size={B}, num_steps]")
        arrays = self.convert_leaves(leaves, (B, num_steps), f"[batch_size={B}, num_steps={num_steps}]")
        # Slot-major layout: [B, T, ...] -> [T, B, ...] -> [T * B, ...].
        return self.write_steps([a.swapaxes(0, 1).reshape((-1,) + s.shape)
                                  for a, s in zip(arrays, self._specs)], num_steps, timeout,
                                 block)

    def convert_leaves(self, leaves: Sequence[Any], outer: tuple[int, ...], names: str) -> list[Any]:
        """Validate leaves for storage; a deduplicated frame leaf stays whole until written."""
        if self._codec is None:
            return list(self._storage.convert(leaves, self._paths, outer, names))
        i = self._codec_leaf
        frames = self._frame_checker.numpy_leaf(0, leaves[i], outer + self._specs[i].shape,
                                                self._paths[i], outer, names)
        leaves = list(leaves)
        leaves[i] = np.zeros(outer + (self._codec.stack,), np.int64)  # stands in for refs
        arrays = list(self._storage.convert(leaves, self._paths, outer, names))
        arrays[i] = frames
        return arrays

    def leading_dim(self, leaves: Sequence[Any], axis: int, method: str, names: str) -> int:
        """Size of dimension ``axis`` of the first leaf (the others are checked against it)."""
        shape = tuple(np.shape(leaves[0]))
        if len(shape) <= axis:
            raise SpecError(f"{method}: leaf {self._paths[0]}: expected leading dimensions "
                            f"{names} before the spec shape {self._specs[0].shape}, got shape "
                            f"{shape}")
        return int(shape[axis])

    def write_steps(self, time_major: list[Any], num_steps: int,
                     timeout: float | None = None, block: bool = True) -> bool:
        """Write ``num_steps`` validated steps given as ``[num_steps * batch_size, ...]``
        leaves, oldest step first, wrapping around the ring; ``False`` if a rate limiter
        held them back and ``block`` is false."""
        if num_steps == 0:
            return True
        ring = self._ring
        B, L = ring.batch_size, ring.max_length
        skip = max(0, num_steps - L)  # steps overwritten within this very call
        with self._lock:
            if self._limiter is not None and not self._admit(B * num_steps, timeout, block):
                return False
            first_id = ring.last_id + 1
            if self._codec is not None:  # may refuse the stacks: before anything is written
                time_major = list(time_major)
                time_major[self._codec_leaf], frame_writes = self._codec.encode(
                    first_id, time_major[self._codec_leaf])
            kept = num_steps - skip
            slot = (first_id + skip) % L
            head = min(kept, L - slot)
            if num_steps == 1:  # one step never wraps: no slicing (the frame-stack add path)
                self._storage.write(slot * B, time_major)
            else:
                self._storage.write(slot * B, [a[skip * B:(skip + head) * B]
                                               for a in time_major])
            if head < kept:
                self._storage.write(0, [a[(skip + head) * B:] for a in time_major])
            if self._codec is not None:
                self._codec.commit(frame_writes, first_id, num_steps)
            ring.last_id += num_steps
            if self._commit is not None:
                self._commit(ring.last_id)
            self._sampler.on_add(ring, first_id, num_steps)
            if self._episodes is not None:
                self._record_episodes(first_id, time_major[self._step_type_leaf], num_steps)
            if self._limiter is not None:
                self._limiter.inserted(B * num_steps)
        return True

    # --------------------------------------------------------------- rate limiting
    _limiter: RateLimiter | None = None

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The :class:`~replaybuffer.RateLimiter` pacing inserts and samples, or ``None``.

        Set it to attach one (its counters start from zero); ``None`` detaches it. Inserts
        (``add_batch``, ``extend``, ``add``) and samples (``get_next``, ``sample``, random
        datasets) then wait as it says, each with ``timeout=`` and ``block=``.

        Raises:
            ValueError: the limiter could never let a sample through in this buffer
                (``min_size_to_sample`` above the capacity), or serves another buffer.
        """
        return self._limiter

    @rate_limiter.setter
    def rate_limiter(self, limiter: RateLimiter | None) -> None:
        with self._lock:
            if limiter is not None:
                limiter.attach(self._lock, self.capacity)
            if self._limiter is not None:
                self._limiter.detach()
            self._limiter = limiter

    def stats(self) -> RateLimiterStats | None:
        """The rate limiter's counters (items inserted and sampled, seconds blocked), or
        ``None`` without a limiter."""
        with self._lock:
            return None if self._limiter is None else self._limiter.stats(len(self))

    def _admit(self, n: int, timeout: float | None, block: bool) -> bool:
        """Wait until the rate limiter lets ``n`` items in (the caller holds the lock)."""
        limiter = self._limiter
        assert limiter is not None  # callers check first
        return limiter.await_insert(n, self.__len__, timeout, block)

    def _admit_sample(self, n: int, timeout: float | None, block: bool) -> bool:
        """Wait until the rate limiter lets ``n`` items be sampled (lock held)."""
        limiter = self._limiter
        assert limiter is not None  # callers check first
        return limiter.await_sample(n, self.__len__, timeout, block)

    def untracked_error(self) -> ValueError:
        return ValueError(f"within_episodes=True needs a buffer built with "
                          f"track_episodes=True ({type(self).__name__} was not)")

    def _record_episodes(self, first_id: int, step_types: Any, num_steps: int) -> None:
        """Note the FIRST steps among ``num_steps`` new steps (``[num_steps * B]`` step types)."""
        episodes = self._episodes
        assert episodes is not None  # callers check first
        starts = to_numpy(step_types).reshape(num_steps, self.batch_size) == 0  # FIRST
        episodes.record(first_id, starts, self._ring.oldest_id)

    # ------------------------------------------------------------------ read path
    def empty_error(self, num_steps: int = 1, action: str = "sampling the buffer"
                     ) -> EmptyBufferError:
        """The error for a read that needs ``num_steps`` steps per row, which rows lack."""
        name = type(self).__name__
        if num_steps > self._ring.max_length:
            return EmptyBufferError(f"num_steps={num_steps} can never be read from {name}: it "
                                    f"exceeds max_length={self._ring.max_length}")
        if self._ring.last_id < 0:
            return EmptyBufferError(f"{name} is empty. Make sure to add items before {action}.")
        return EmptyBufferError(
            f"{name} has no window of num_steps={num_steps}: each row holds "
            f"{self._ring.items_per_row} steps (max_length={self._ring.max_length}). "
            f"Make sure to add items before {action}.")

    def _sample_arrays(self, sample_batch_size: int, num_steps: int | None,
                       rng: np.random.Generator | None = None, within_episodes: bool = False,
                       timeout: float | None = None, block: bool = True
                       ) -> tuple[list[Any], np.ndarray, dict[str, np.ndarray]] | None:
        """Draw and gather under the lock: ``(leaves, ids, info)``, batched; ``None`` if
        the rate limiter held the sample back and ``block`` is false."""
        ring = self._ring
        steps = num_steps or 1
        episodes = self._episodes if within_episodes else None
        if within_episodes and episodes is None:
            raise self.untracked_error()
        with self._lock:
            if self._limiter is not None and not self._admit_sample(sample_batch_size,
                                                                    timeout, block):
                return None
            if ring.last_id + 1 < steps or steps > ring.max_length:  # no window this long
                raise self.empty_error(steps)
            (ids, positions), info = self._sampler.sample(ring, sample_batch_size, steps, rng,
                                                          episodes)
            info_ids = self._info_ids(ids, positions)
            if num_steps is not None:
                id_windows = windows(info_ids, num_steps, self._id_step)
                if ring.batch_size == 1 and info_ids is ids and self._id_step == 1:
                    # One row: a step's position is its id modulo the capacity, which the
                    # storage takes as it reads, so the id windows serve as positions.
                    positions = id_windows
                else:  # unwrapped: a window past the last position is wrapped by the storage
                    positions = windows(positions, num_steps, ring.batch_size)
                info_ids = id_windows
            leaves = self._gather(positions)
            if self._limiter is not None:
                self._limiter.sampled(sample_batch_size)
        return leaves, info_ids, info

    def _gather(self, positions: np.ndarray) -> list[Any]:
        """Read ``positions`` from storage, rebuilding deduplicated frame stacks."""
        leaves = self._storage.gather(positions)
        if self._codec is not None:
            i = self._codec_leaf
            leaves[i] = self._codec.decode(leaves[i], positions % self._ring.batch_size)
        return leaves

    _id_step = 1
    """How much ``BufferInfo.ids`` grow from one step of a window to the next."""

    def _info_ids(self, start_ids: np.ndarray, start_positions: np.ndarray) -> np.ndarray:
        """The ``BufferInfo.ids`` of sampled window starts: their logical add ids."""
        return start_ids

    @overload
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None, block: Literal[True] = True
                 ) -> tuple[Any, BufferInfo]: ...

    @overload
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None, block: bool = True
                 ) -> tuple[Any, BufferInfo] | None: ...

    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None, block: bool = True
                 ) -> tuple[Any, BufferInfo] | None:
        """Sample items (with replacement) and return ``(items, BufferInfo)``.

        Shapes, with ``D`` the spec shape of a leaf:

        ==================  ============  =====================================
        sample_batch_size   num_steps     items leaf shape
        ==================  ============  =====================================
        None                None          ``[D]``
        S                   None          ``[S, D]``
        None                T             ``[T, D]`` (a T-tuple of ``[D]`` unstacked)
        S                   T             ``[S, T, D]`` (a T-tuple of ``[S, D]``)
        ==================  ============  =====================================

        Every step of one sample comes from the same row; a window never crosses the
        write head (it may wrap physically). ``BufferInfo.ids`` has the items' outer
        shape; ``probabilities`` is float32 ``[S]`` (a scalar without ``S``).

        With ``within_episodes=True`` (buffers built with ``track_episodes=True``) every
        window lies inside one episode, drawn from those windows only (uniformly, or by
        priority); ``probabilities`` are relative to them.

        With a :attr:`rate_limiter` that holds the sample back, wait up to ``timeout``
        seconds (``None``: as long as it takes), or with ``block=False`` return ``None``.

        Raises:
            EmptyBufferError: the buffer is empty, or holds fewer than ``num_steps``
                steps per row (or within one episode).
            RateLimitedError: ``timeout`` passed with the sample held back.
        """
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        return self.draw(sample_batch_size, num_steps, time_stacked,
                            within_episodes=within_episodes, timeout=timeout, block=block)

    @overload
    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: Literal[True] = True) -> tuple[Any, BufferInfo]: ...

    @overload
    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None: ...

    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None:
        """:meth:`get_next` after argument checks; ``rng`` overrides the sampler's."""
        drawn = self._sample_arrays(sample_batch_size or 1, num_steps, rng, within_episodes,
                                    timeout, block)
        if drawn is None:
            return None
        leaves, ids, info = drawn
        return self._package(leaves, ids, info, sample_batch_size, num_steps, time_stacked)

    def spawn_rng(self) -> np.random.Generator:
        """A new generator seeded from the sampler's (advancing its state): one per
        dataset stream or prefetch worker, so a seeded buffer's streams reproduce."""
        with self._lock:
            return self._sampler.spawn_rng()

    def window_mass(self, num_steps: int) -> float:
        """What this buffer weighs in a draw of windows of ``num_steps`` across several
        buffers (shards): its priority total over valid window starts (prioritized
        samplers), else the number of valid windows it holds."""
        with self._lock:
            ring, sampler = self._ring, self._sampler
            valid_mass = getattr(sampler, "valid_mass", None)
            if valid_mass is not None:
                return float(valid_mass(ring, num_steps))
            return float(ring.batch_size * max(0, ring.items_per_row - num_steps + 1))

    def _package(self, leaves: list[Any], ids: np.ndarray, info: dict[str, np.ndarray],
                 sample_batch_size: int | None, num_steps: int | None,
                 time_stacked: bool) -> tuple[Any, BufferInfo]:
        return package(self._structure, self._storage.from_numpy, leaves, ids, info,
                       sample_batch_size, num_steps, time_stacked)

    def gather_all(self) -> Any:
        """Every retained step, ``[batch_size, items_per_row, D]`` per leaf.

        Rows are in chronological order, oldest first; an empty buffer gives
        ``[batch_size, 0, D]``.
        """
        ring = self._ring
        with self._lock:
            first, n = ring.oldest_id, ring.items_per_row
            ids = np.arange(first, first + n, dtype=np.int64)
            rows = np.arange(ring.batch_size, dtype=np.int64)[:, None]
            leaves = self._gather(ring.positions(ids[None, :], rows))
        return self._structure.unflatten(leaves)

    def clear(self, zero_storage: bool = False) -> None:
        """Forget every step: ``last_id`` goes back to -1.

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

    # ------------------------------------------------------------------- datasets
    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None,
                   single_deterministic_pass: bool = False, *,
                   prefetch: int | None = None, drop_remainder: bool = False,
                   window_shift: int | None = None, within_episodes: bool = False
                   ) -> Iterable[tuple[Any, BufferInfo]]:
        """An iterable of ``(items, BufferInfo)`` elements.

        Random mode (default) is infinite: each element is a fresh :meth:`get_next`
        with ``time_stacked=True``. With ``num_parallel_calls=k`` that many worker
        threads sample ahead into a bounded queue of ``prefetch`` elements (default
        ``2 * k``); element order is still deterministic for a seeded buffer. Without
        workers every element is drawn when it is pulled, so it sees the buffer as it
        is at that moment.

        ``single_deterministic_pass=True`` visits every retained step once, row by
        row, oldest first (see :mod:`replaybuffer.sampling.deterministic` for the
        order with ``sample_batch_size``/``num_steps``). ``window_shift`` sets the
        steps between window starts (default ``num_steps``: disjoint windows);
        ``drop_remainder`` drops partial windows and a partial last row group.
        The index range is read when iteration starts.

        ``within_episodes=True`` (random mode, buffers built with ``track_episodes``)
        keeps every window inside one episode, as in :meth:`get_next`.

        Raises:
            ValueError: the data spec contains Python lists (use tuples), or
                ``drop_remainder`` would drop all data.
        """
        from replaybuffer.dataset import DeterministicPass, RandomStream

        if nest.contains_lists(self._data_spec):
            raise ValueError("as_dataset needs a data_spec without Python lists: convert "
                             f"them to tuples (data_spec={self._data_spec!r})")
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        if within_episodes and self._episodes is None:
            raise self.untracked_error()
        if single_deterministic_pass:
            if within_episodes:
                raise ValueError("within_episodes applies to random sampling; the "
                                 "deterministic pass reads every step in order")
            window_shift = positive_or_none(window_shift, "window_shift")
            return DeterministicPass(self, sample_batch_size, num_steps, window_shift,
                                     drop_remainder)
        num_parallel_calls = positive_or_none(num_parallel_calls, "num_parallel_calls")
        if getattr(self._sampler, "consumes", False) and (num_parallel_calls or prefetch):
            raise ValueError(f"{type(self).__name__} reads each window once, in order: its "
                             "dataset samples on pull (no num_parallel_calls or prefetch), "
                             "since prefetched windows would be reordered or lost")
        if num_steps is not None and num_steps > self._ring.max_length:
            raise self.empty_error(num_steps)
        return RandomStream(self, sample_batch_size, num_steps, num_parallel_calls, prefetch,
                            within_episodes)

    def _deterministic_plan(self, sample_batch_size: int | None, num_steps: int | None,
                            shift: int | None, drop_remainder: bool
                            ) -> Iterable[tuple[Index, Index]]:
        from replaybuffer.sampling.deterministic import plan

        ring = self._ring
        with self._lock:
            if ring.last_id < 0:
                raise self.empty_error(action="asking the buffer for data")
            first, n = ring.oldest_id, ring.items_per_row
        return plan(first, n, ring.batch_size, sample_batch_size, num_steps, shift,
                    drop_remainder)

    def _read_block(self, ids: Index, rows: Index) -> tuple[Any, BufferInfo]:
        """Gather one deterministic-pass element."""
        ring = self._ring
        # An element with neither a batch nor a time dimension has scalar ids and rows:
        # its position is a numpy integer, which storages index as a 0-d array.
        ids_array = cast(np.ndarray, ids)
        with self._lock:
            leaves = self._gather(ring.positions(ids_array, rows))
        physical = np.broadcast_to(table_rows(ids_array, rows, ring.max_length),
                                   np.broadcast_shapes(np.shape(ids), np.shape(rows)))
        info = BufferInfo(self._storage.from_numpy(np.array(physical)), ())
        return self._structure.unflatten(leaves), info

    # ---------------------------------------------------------- files (mmap storage)
    def flush(self) -> None:
        """With ``storage="mmap"``: ``msync`` the data files, then write the buffer's state
        (ids, sampler generator, priorities, cursors, episode index) to ``path/state``,
        atomically, so :func:`replaybuffer.reopen` resumes from here even after a power
        loss. Other storages keep nothing on disk: nothing to do.
        """
        if self._storage.kind == "mmap":
            from replaybuffer.persist import save_state

            save_state(self)

    def close(self) -> None:
        """With ``storage="mmap"``: :meth:`flush`, then give the files up (they stay
        mapped for reads until the buffer is garbage collected; writes are refused).
        Other storages: nothing to do."""
        self.flush()
        if self._storage.kind == "mmap":
            with self._lock:
                cast("MmapStorage", self._storage).release()

    def __enter__(self) -> "ReplayBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _files_ready(self) -> None:
        """The end of a constructor that takes ``path``: a new mmap buffer writes its
        state at once, so that even a process killed before any flush can be reopened."""
        if self._storage.kind == "mmap" and not cast("MmapStorage", self._storage).reopening:
            self.flush()

    def catch_up(self, last_id: int, stale: bool) -> None:
        """After a reopen restored the state of the last flush: take in the steps the
        files committed since (``last_id`` is the files'), as adds would have. ``stale``:
        the buffer was cleared after that flush, so its state describes other data."""
        ring = self._ring
        with self._lock:
            first = ring.last_id + 1
            if stale or last_id < ring.last_id:
                self._sampler.on_clear(ring)
                if self._episodes is not None:
                    self._episodes.clear()
                ring.last_id, first = -1, 0
            if last_id < first:
                return
            ring.last_id = last_id
            self._sampler.on_add(ring, first, last_id - first + 1)
            if self._episodes is not None:  # episode starts, read back from the step types
                first = max(first, ring.oldest_id)
                ids = np.arange(first, last_id + 1, dtype=np.int64)
                rows = np.arange(ring.batch_size, dtype=np.int64)
                positions = ring.positions(ids[:, None], rows[None, :]).ravel()
                step_types = self._storage.gather(positions, [self._step_type_leaf])[0]
                self._record_episodes(first, step_types, len(ids))

    # ---------------------------------------------------------------- persistence
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
        from replaybuffer.persist import save

        return save(self, path, keep=keep, metadata=metadata)

    def constructor_config(self) -> dict[str, Any]:
        """Constructor keywords a restored buffer needs besides spec and layout."""
        return {}

    @classmethod
    def rebuild(cls, data_spec: Any, batch_size: int, max_length: int, storage: str,
                   device: Any, config: dict[str, Any]) -> "ReplayBuffer":
        """Build an empty buffer of this class for a restore."""
        return cls(data_spec, batch_size, max_length, storage=storage, device=device, **config)

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

    def stream_targets(self, state: dict[str, Any]) -> dict[str, tuple[
            tuple[ArraySpec, ...], int, Callable[[int, list[np.ndarray]], None]]]:
        """Where a restore of ``state`` writes each stream of :meth:`snapshot`: its specs,
        its positions, and a function writing arrays ``[n, *spec.shape]`` at positions
        ``[start, start + n)``."""
        count = items_per_row(int(state["last_id"]), self.max_length) * self.batch_size
        targets = {"leaves": (self._storage.specs, count, lambda start, arrays:
                              self._storage.load(arrays, start))}
        if self._codec is not None:
            codec = self._codec
            targets["frames"] = ((codec.frame_spec,), len(codec.frames) - 1,
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

    # --- seams for persist (added by the persist helper)
    @property
    def lock(self) -> threading.Lock:
        """The lock every read and write of the buffer holds (a ``threading.Lock``, not
        reentrant): :mod:`replaybuffer.persist` holds it to take a snapshot and to read
        each chunk of one, so that a save sees one moment of the buffer."""
        return self._lock


def package(structure: Any, to_backend: Callable[[np.ndarray], Any], leaves: list[Any],
            ids: np.ndarray, info: dict[str, np.ndarray], sample_batch_size: int | None,
            num_steps: int | None, time_stacked: bool) -> tuple[Any, BufferInfo]:
    """Gathered leaves (``[S, ...]`` or ``[S, T, ...]``) and their ids and ``info``
    (``probabilities``, maybe ``weights``) as ``get_next`` returns them: the outer
    ``S`` dropped when ``sample_batch_size`` is None, a T-tuple of steps when not
    ``time_stacked``, arrays in the storage's backend (``to_backend``)."""
    probabilities, weights = info["probabilities"], info.get("weights")
    if sample_batch_size is None:
        leaves = [leaf[0] for leaf in leaves]
        ids, probabilities = ids[0], probabilities[0]
        weights = None if weights is None else weights[0]
    # Backends other than numpy take numpy scalars (and, the torch storage, tensors
    # from device-side sampling) as they are.
    host = to_backend is identity
    if weights is not None:
        weights = to_backend(np.asarray(weights) if host else weights)
    if num_steps is not None and not time_stacked:
        axis_t = 0 if sample_batch_size is None else 1
        items = tuple(structure.unflatten([_take_step(leaf, t, axis_t) for leaf in leaves])
                      for t in range(num_steps))
        ids_out: Any = tuple(to_backend(_copy(_take_step(ids, t, axis_t)))
                             for t in range(num_steps))
        return items, BufferInfo(ids_out, to_backend(np.asarray(probabilities) if host
                                                     else probabilities), weights)
    if host:
        return structure.unflatten(leaves), BufferInfo(ids, probabilities, weights)
    return structure.unflatten(leaves), BufferInfo(to_backend(ids), to_backend(probabilities),
                                                   weights)


def _copy(array: Any) -> Any:
    """A numpy array (or scalar) copied; a tensor as it is (a view of ids not returned)."""
    return np.array(array) if isinstance(array, (np.ndarray, np.generic)) else array


def _take_step(array: Any, t: int, axis: int) -> Any:
    return array[t] if axis == 0 else array[:, t]

