"""The prioritized replay buffer: the uniform buffer's API plus priorities."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.buffers.captured_reads import CapturedReads
from replaybuffer.buffers.device_sampling import (captures_samples, device_choices,
                                                  device_prioritized_sampler,
                                                  device_search_for, samples_on_device)
from replaybuffer.protocols import BufferInfo
from replaybuffer.rate_limiter import RateLimiter
from replaybuffer.sampling import Ring, tree_kernels
from replaybuffer.sampling.fused_update import checked_largest
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.storage.base import identity, to_numpy


def checked_priorities(ids: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray, float | None]:
    """``update_priorities``' arguments checked: ``(ids [S] int64, priorities [S]
    float64, the largest priority or None when there are none)``; ids of windows
    (``[S, T]`` or a T-tuple) give their first step's.

    Raises:
        ValueError: mismatched shapes, or a NaN, infinite or negative priority (naming
            the first and its id).
    """
    unstacked = isinstance(ids, tuple) and len(ids) > 0 and np.ndim(ids[0]) == 1
    ids_arr, values = _as_numpy(ids[0] if unstacked else ids, np.int64), \
        _as_numpy(priorities, np.float64)
    if ids_arr.ndim == 2:
        ids_arr = ids_arr[:, 0]
    if ids_arr.ndim != 1 or values.shape != ids_arr.shape:
        raise ValueError(f"update_priorities: expected ids [S] (or [S, T]) and "
                         f"priorities [S] of the same S, got ids of shape "
                         f"{np.shape(ids)} and priorities of shape {values.shape}")
    largest = None
    if values.size:
        # One reduction checks the usual all-good batch and finds its largest value:
        # as unsigned integers, finite floats >= 0 are ordered as floats and lie below
        # the bits of inf, while NaN, inf and negative numbers (sign bit set) do not.
        top = np.maximum.reduce(values.view(np.uint64))  # (.max() adds a Python wrapper)
        if top < _INF_BITS:
            largest = float(top.view(np.float64))
        else:  # something is bad, or a -0.0 (allowed) is among them
            bad = ~np.isfinite(values) | (values < 0)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"update_priorities: priorities must be finite and >= 0; "
                    f"priorities[{i}] is {float(values[i])} (for id {int(ids_arr[i])}); "
                    f"{int(bad.sum())} bad value(s), nothing was updated")
    return ids_arr, values, largest


class PrioritizedMixin:
    """Priorities for a buffer whose sampler is a
    :class:`~replaybuffer.sampling.prioritized.PrioritizedSampler`: item ids in
    ``BufferInfo.ids``, :meth:`update_priorities` and the schedule's properties."""

    _sampler: PrioritizedSampler
    _ring: Ring
    _lock: Any
    # The device sampler's update_on_device (set by the constructors when sampling on a
    # device): updates with device tensors, without a host synchronization.
    _device_update: Any = None

    @property
    def alpha(self) -> float:
        return self._sampler.alpha

    @property
    def beta(self) -> float:
        """The importance-sampling exponent the next sample will use."""
        return self._sampler.beta

    @property
    def max_priority(self) -> float:
        """The largest priority seen; new steps enter with it. (With device updates
        in flight, this waits for their outcome.)"""
        if self._device_update is not None:
            with self._lock:
                self._sampler.settle()  # type: ignore[attr-defined]
        return self._sampler.max_priority

    def _info_ids(self, start_ids: np.ndarray, start_positions: np.ndarray) -> np.ndarray:
        return self._sampler.item_ids(self._ring, start_ids, start_positions)

    def update_priorities(self, ids: Any, priorities: Any) -> int:
        """Set the priorities of sampled items.

        Args:
            ids: ``BufferInfo.ids`` of a sample: ``[S]``, or ``[S, T]`` (or a T-tuple)
                for windows, whose first step carries the window's priority. Numpy
                arrays, tensors or sequences.
            priorities: ``[S]`` non-negative finite numbers (e.g. absolute TD errors).

        Returns:
            How many priorities were applied: ids of steps overwritten since they were
            sampled (stale ids) are ignored. With device sampling and both arguments
            tensors on the storage's device, the update is made and checked there
            without waiting for the device: the count is of the ids given, and a bad
            batch (which writes nothing) raises at the next call instead
            (:mod:`replaybuffer.sampling.torch_priority_updates`).

        Raises:
            ValueError: mismatched shapes, or a NaN, infinite or negative priority.
                Nothing is changed then.
        """
        if self._device_update is not None:
            with self._lock:
                applied = self._device_update(self._ring, ids, priorities)
            if applied is not None:
                return int(applied)
        if (type(ids) is np.ndarray and type(priorities) is np.ndarray
                and ids.dtype is _INT64 and ids.ndim == 1 and priorities.shape == ids.shape
                and priorities.dtype in _FLOATS and tree_kernels.AVAILABLE):
            # The usual update (BufferInfo.ids, float64 or float32 priorities), checked
            # in one compiled call; anything it refuses takes the general path below,
            # which raises its error there, before anything is written.
            values = priorities if priorities.dtype is _FLOAT64 else \
                priorities.astype(np.float64)
            largest = checked_largest(values)
            if largest >= 0.0:
                lock = self._lock
                lock.acquire()  # (not `with`: its exit costs 0.09 us more a call)
                try:
                    return self._sampler.update_priorities(self._ring, ids, values,
                                                           largest)
                finally:
                    lock.release()
        ids_arr, values, largest = checked_priorities(ids, priorities)
        with self._lock:
            return self._sampler.update_priorities(self._ring, ids_arr, values, largest)

    def priorities(self, ids: Any) -> np.ndarray:
        """``priority ** alpha`` currently stored for item ``ids`` (NaN if stale)."""
        ids_arr = _as_numpy(ids, np.int64, "priorities")
        with self._lock:
            return self._sampler.priorities(self._ring, ids_arr)


class PrioritizedReplayBuffer(PrioritizedMixin, CapturedReads, ReplayBuffer):
    """Samples windows in proportion to ``priority ** alpha`` (Schaul et al., 2016).

    Same layout and API as :class:`~replaybuffer.UniformReplayBuffer`, plus
    :meth:`update_priorities`. ``BufferInfo`` carries ``probabilities`` and importance
    ``weights`` (``(N * P(i)) ** -beta``, divided by the batch's largest, so each
    batch's largest weight is 1; ``normalize="buffer"`` divides by the largest weight
    any stored step could get instead). New steps enter at the largest priority seen.
    With ``num_steps > 1`` a window's priority is that of its first step.

    ``BufferInfo.ids`` are *item ids*, one per step and row and never reused (not even
    after ``clear()``): ``(adds before the last clear + add id) * batch_size + row``. With
    ``batch_size=1`` and no clear they are the add ids. Along a window they grow by
    ``batch_size``. Pass them back to :meth:`update_priorities`.

    Args:
        data_spec, batch_size, max_length, storage, device: as for the uniform buffer.
        alpha: prioritization exponent, >= 0 (0 samples uniformly).
        beta: importance-sampling exponent in [0, 1].
        beta_final, beta_steps: anneal ``beta`` linearly to ``beta_final`` over
            ``beta_steps`` sample calls (``get_next`` calls and dataset elements).
        seed: seeds sampling.
        track_episodes: allow ``within_episodes=True`` reads, which draw by priority
            among the windows that stay inside one episode.
        frame_stack, stack_axis: store the named stacked-frame leaf deduplicated.
        normalize: ``"batch"`` or ``"buffer"``: what importance weights are divided by
            (see :mod:`replaybuffer.sampling.prioritized`).
        sample_on_device: draw samples on the torch storage's device, from the
            priorities' running sums there
            (:mod:`replaybuffer.sampling.torch_prioritized`; ids, probabilities and
            weights come back as tensors there); default ``None``: for torch storage
            on a GPU (without ``track_episodes``).
        device_search: how device sampling searches the priorities: ``"prefix"``
            (their running sums), ``"tree"`` (a sum tree) or ``"auto"`` (the default
            when ``None``: by capacity, :func:`~replaybuffer.buffers.device_sampling.
            device_search_for`); see :mod:`replaybuffer.sampling.torch_prioritized`.
            Only with device sampling.
        rate_limiter: a :class:`~replaybuffer.RateLimiter` pacing inserts and samples
            (as setting :attr:`rate_limiter`).
        capture_samples: as for the uniform buffer: serve ``get_next`` on the device
            from a recorded draw and gather per ``(sample_batch_size, num_steps)``
            (:mod:`replaybuffer.sampling.captured_prioritized`), with the running sums;
            ``None`` (the default) and ``False`` keep every draw eager; ``True`` on the
            CPU records the CPU twin (tests); ``True`` with ``device_search="tree"`` is
            a ``ValueError``.
    """

    _sampler: PrioritizedSampler

    def __init__(self, data_spec: Any, batch_size: int = 1, max_length: int = 1000, *,
                 alpha: float = 0.6, beta: float = 0.4, beta_final: float | None = None,
                 beta_steps: int = 0, storage: str = "numpy", device: Any = None,
                 seed: int | None = None, track_episodes: bool = False,
                 frame_stack: str | None = None, stack_axis: int = 0,
                 normalize: str = "batch", path: str | os.PathLike[str] | None = None,
                 sample_on_device: bool | None = None, device_search: str | None = None,
                 rate_limiter: RateLimiter | None = None,
                 capture_samples: bool | None = None):
        capacity = Ring(batch_size, max_length).capacity  # validates the layout first
        sampler = PrioritizedSampler(capacity, alpha, beta, beta_final=beta_final,
                                     beta_steps=beta_steps, seed=seed, normalize=normalize)
        super().__init__(data_spec, batch_size, max_length, storage=storage, device=device,
                         sampler=sampler, track_episodes=track_episodes,
                         frame_stack=frame_stack, stack_axis=stack_axis, path=path,
                         rate_limiter=rate_limiter)
        on_device = samples_on_device(self.storage, device, sample_on_device, track_episodes)
        if on_device:
            self._sampler = device_prioritized_sampler(
                capacity, alpha, beta, beta_final=beta_final, beta_steps=beta_steps,
                seed=seed, normalize=normalize, device=self.device, search=device_search)
            self._device_update = self._sampler.update_on_device  # type: ignore[attr-defined]
        else:
            device_search_for(device_search, capacity, on_device=False)
        if captures_samples(capture_samples, on_device, self.device):
            self.record_samples(capture_samples is True)
        self._id_step = self._ring.batch_size
        self._config_values = {"alpha": alpha, "beta": beta, "beta_final": beta_final,
                               "beta_steps": beta_steps, "seed": seed,
                               "track_episodes": track_episodes, "frame_stack": frame_stack,
                               "stack_axis": stack_axis, "normalize": normalize,
                               **device_choices(sample_on_device, on_device, capture_samples,
                                                device_search)}
        self._files_ready()
        self._refresh_direct_reads()

    def constructor_config(self) -> dict[str, Any]:
        return dict(self._config_values)

    _direct_reads = False
    """Whether :meth:`get_next`'s short path may serve a read as far as the buffer's
    parts go: numpy storage (its ``from_numpy`` is ``identity``), no frame codec, no
    device sampling. Made by :meth:`_refresh_direct_reads`, the one place that decides
    it, at the end of construction and wherever a part it reads is replaced (a save's
    snapshot wraps the storage, :meth:`snapshot`, and unwraps it,
    :meth:`release_snapshot`): a read then tests one attribute instead of four.
    ``tests/test_prioritized_direct_calls.py`` fails if a new assignment of one of
    those parts does not refresh it."""

    _direct_backend: Callable[[np.ndarray], Any] | None = None
    """What wraps ids, probabilities and weights where the short path serves a storage
    of another backend (torch storage drawn on the host: its leaves come back as
    tensors): the storage's ``wraps_fresh`` where it has one (those arrays are fresh,
    as ``sample_steps`` promises: on the CPU plain ``torch.from_numpy``), else its
    ``from_numpy``: the same tensors as the general path's ``package`` makes. ``None``
    where :attr:`_direct_reads` is true or the parts allow no short path. Decided with
    it, by :meth:`_refresh_direct_reads`."""

    def _refresh_direct_reads(self) -> None:
        """Decide :attr:`_direct_reads` and :attr:`_direct_backend` anew from the parts
        as they are now."""
        parts = self._codec is None and self._device_update is None
        to_backend = self._storage.from_numpy
        self._direct_reads = parts and to_backend is identity
        # The short path's ids, probabilities and weights are fresh arrays (the contract
        # of sample_steps): a storage that says how it wraps such arrays (torch storage
        # on the CPU: plain torch.from_numpy) is spared its from_numpy's checks.
        fresh = getattr(self._storage, "wraps_fresh", to_backend)
        self._direct_backend = fresh if parts and to_backend is not identity else None

    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            return super().snapshot()
        finally:  # (the storage is wrapped: whatever it is now)
            self._refresh_direct_reads()

    def release_snapshot(self) -> None:
        try:
            super().release_snapshot()
        finally:
            self._refresh_direct_reads()

    def get_next(self, sample_batch_size: int | None = None,  # type: ignore[override]
                 num_steps: int | None = None, time_stacked: bool = True, *,
                 within_episodes: bool = False, timeout: float | None = None,
                 block: bool = True) -> tuple[Any, BufferInfo] | None:
        """As :meth:`ReplayBuffer.get_next <replaybuffer.UniformReplayBuffer.get_next>`;
        ``BufferInfo`` also carries the importance ``weights`` (float32 ``[S]``).

        The usual read (a batch of single steps, no rate limiter, frame stacks or
        device sampling) goes from here to the sampler and the storage's gather
        directly: the same draws, ids, probabilities, weights and items as the general
        read path (``ReadPath.draw``) gives, without its layers; on a storage of
        another backend (torch storage sampled on the host) the same tensors, ids,
        probabilities and weights wrapped by its ``from_numpy`` as that path wraps them.
        """
        if (type(sample_batch_size) is int and sample_batch_size > 0 and num_steps is None
                and not within_episodes and timeout is None):
            if self._direct_reads:
                lock = self._lock
                lock.acquire()  # (not `with`: its exit costs 0.09 us more a call)
                try:  # (a limiter is attached under the lock: asked under it)
                    if self._limiter is None and self._ring.last_id >= 0:
                        ids, positions, probabilities, weights = \
                            self._sampler.sample_steps(self._ring, sample_batch_size)
                        return self._structure.unflatten(self._storage.gather(positions)), \
                            _new_tuple(BufferInfo, (ids, probabilities, weights))
                finally:
                    lock.release()
            elif self._direct_backend is not None:
                read = self._backend_read(sample_batch_size)
                if read is not None:
                    return read
        return super().get_next(sample_batch_size, num_steps, time_stacked,
                                within_episodes=within_episodes, timeout=timeout,
                                block=block)

    def _backend_read(self, sample_batch_size: int) -> tuple[Any, BufferInfo] | None:
        """The short path for a storage of another backend (:attr:`_direct_backend`):
        the numpy short path's draw and gather, then ids (int64 ``[S]``),
        probabilities and weights (float32 ``[S]``) wrapped by
        :attr:`_direct_backend` into the tensors ``package`` makes (weights first),
        outside the lock;
        ``None`` where the general path must serve the read (a limiter, nothing
        stored)."""
        lock = self._lock
        lock.acquire()
        try:
            if self._limiter is not None or self._ring.last_id < 0:
                return None
            to_backend = self._direct_backend
            assert to_backend is not None
            ids, positions, probabilities, weights = self._sampler.sample_steps(
                self._ring, sample_batch_size)
            leaves = self._storage.gather(positions)
        finally:
            lock.release()
        # (fresh arrays of this call alone: wrapped without the lock)
        weights = to_backend(weights)
        return self._structure.unflatten(leaves), _new_tuple(
            BufferInfo, (to_backend(ids), to_backend(probabilities), weights))


# BufferInfo made from a tuple without the named tuple's Python-level __new__ (as its
# _make does, less the length check: three fields given), on every short read.
_new_tuple = tuple.__new__
_INF_BITS = np.float64(np.inf).view(np.uint64)
_INT64, _FLOAT64 = np.dtype(np.int64), np.dtype(np.float64)
_FLOATS = (_FLOAT64, np.dtype(np.float32))


def _as_numpy(values: Any, dtype: type, caller: str = "update_priorities") -> np.ndarray:
    arr = values if type(values) is np.ndarray else to_numpy(values)
    # Booleans are refused as the device path refuses them: a mask passed as ids would
    # otherwise update items 0 and 1, and one passed as priorities set them to 0 or 1.
    if dtype is np.int64 and arr.dtype.kind in "fb":
        raise ValueError(f"{caller}: ids must be integers (pass BufferInfo.ids), "
                         f"got {arr.dtype}")
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{caller}: expected numbers, got {arr.dtype}")
    return arr.astype(dtype, copy=False)
