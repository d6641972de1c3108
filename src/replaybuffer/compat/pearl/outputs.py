"""Pearl's outputs: core transitions (or the core's flat reads) as Pearl's
:class:`~replaybuffer.compat.pearl.Trajectories` of arrays or tensors."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from replaybuffer import nest
from replaybuffer.compat.pearl.trajectories import (DictTrajectories, Tensor, Trajectories,
                                                    TrajectoryType, kind_of,
                                                    trajectory_type)
from replaybuffer.storage.base import to_numpy

if TYPE_CHECKING:
    from replaybuffer.buffers.flat_reads import Fields, FlatReads
    from replaybuffer.buffers.transitions import TransitionReplayBuffer


class PearlOutputs:
    """Pearl's trajectories of core transitions (a part of
    :class:`~replaybuffer.compat.pearl.BaseBuffer`, which sets the state declared
    here)."""

    core: TransitionReplayBuffer
    vector: bool  # outputs carry an env axis
    _output_keys: tuple[str, ...] | None

    if TYPE_CHECKING:
        @property
        def device(self) -> Any:
            """The torch device of ``dtype="torch"`` outputs (BaseBuffer's)."""

    def _output(self, batch: Any, flatten_env: bool, dtype: Any, env_axis: bool = True,
                keep: int | None = None) -> Any:
        """A core batch as Pearl's trajectories.

        Args:
            batch: core transitions with leading dims ``[num_envs, K]`` (``[K]`` for a
                single env) when ``env_axis``, else ``[K]``.
            flatten_env: flatten ``[num_envs, K]`` to ``[K * num_envs]``, time-major.
            keep: with flattening, keep the last ``-keep`` (or first ``keep``) rows.
        """
        kind = trajectory_type(dtype)
        outer = 2 if env_axis and self.vector else 1
        flatten = flatten_env and outer == 2

        def pearl(leaf: Any) -> Tensor:  # a numpy array or a torch tensor
            arr = to_numpy(leaf)
            if arr.ndim == outer:  # Pearl's scalar fields have a trailing axis of 1
                arr = arr[..., None]
            if flatten:
                arr = self._flatten_env_axis(np.swapaxes(arr, 0, 1))
                if keep is not None:
                    arr = arr[keep:] if keep < 0 else arr[:keep]
            if kind is TrajectoryType.TORCH:
                import torch

                return torch.as_tensor(np.ascontiguousarray(arr)).to(self.device)
            return arr

        fields = (batch.observations, batch.actions,
                  to_numpy(batch.rewards).astype(np.float32),
                  batch.next_observations, to_numpy(batch.terminated).astype(np.float32))
        o, a, r, no, d = (nest.map_structure(pearl, f) for f in fields)
        if self._output_keys is not None:
            pick = self._output_keys
            return DictTrajectories({k: o[k] for k in pick}, a, r, {k: no[k] for k in pick}, d)
        return Trajectories(o, a, r, no, d)

    def _flatten_env_axis(self, data: np.ndarray) -> np.ndarray:
        """``[T, num_envs, ...]`` as ``[T * num_envs, ...]``, time-major, nothing dropped
        (Pearl kept the last ``T // num_envs`` rows); unchanged without an env axis."""
        if not self.vector:
            return data
        return data.reshape((-1,) + data.shape[2:])


class FastPaths:
    """The adapters' reads for the common case, each giving exactly what the general
    path gives (tests/test_compat_pearl_fast.py compares them on random scripts).

    Served where the core serves flat reads
    (:meth:`~replaybuffer.TransitionReplayBuffer.flat_reads`: a
    :class:`~replaybuffer.TransitionReplayBuffer` or :class:`~replaybuffer.RolloutBuffer`
    core in numpy storage, one-step transitions, one array observation, one array
    action, no frame stacking). Pearl's own reads cost a few numpy operations each; the
    general path's nest walks, per-leaf closures and conversions cost several times
    that, so here the core's flat reads gather the fields Pearl returns as plain arrays
    (random samples), or hand out views of its cache of recent steps (``last``, ``all``,
    ``RolloutBuffer.sample``), and this class only shapes them as Pearl's trajectories.

    Adds need no shortcut here: ``add_trajectory`` is the core's one-call adder
    (``TransitionReplayBuffer.step_adder``; see :mod:`replaybuffer.compat.pearl.inputs`).
    """

    @classmethod
    def of(cls, buffer: PearlOutputs, action_path: str) -> "FastPaths | None":
        """The shortcuts of the adapter ``buffer`` whose action is the stored leaf at
        ``action_path``; ``None`` where its core does not serve them."""
        reads = buffer.core.flat_reads(action_path, buffer.vector)
        return None if reads is None else cls(buffer, reads)

    def __init__(self, buffer: PearlOutputs, reads: FlatReads):
        # The adapter holds these paths: a weak reference back, so that a deleted
        # adapter is freed at once, not by the garbage collector (a cycle).
        self.buffer, self.reads = weakref.ref(buffer), reads
        self.vector = buffer.vector
        self.B = buffer.core.num_envs
        self.recent = reads.recent  # the cache of recent steps behind run()
        # The core's reads as they are (bound here: a call through a method of this
        # class would cost one more call per read).
        # sample(batch_size): the core's sample as fields [batch_size, ...]; None where
        # the core must do it (a rate limiter, or nothing stored).
        self.sample: Callable[[int], Fields | None] = reads.sample
        # steps(ids): steps ids ([K]) of every env, [num_envs, K] strided views, as
        # Pearl's swapaxes made them.
        self.steps: Callable[[np.ndarray], Fields] = reads.steps
        self.run_views = reads.run  # (see run)
        self.obs_scalar, self.act_scalar = reads.obs_scalar, reads.act_scalar
        self.torch: Any = None  # the module and the device, at the first torch read
        self.device: Any = None

    def run(self, first: int | None, steps: int | None, flat: bool, keep: int | None,
            dtype: Any, window: int) -> Trajectories:
        """Pearl's trajectories of ``steps`` consecutive steps (``None``: every one
        stored) from ``first`` (``None``: the newest ``steps``, as the core's ``last``)
        of every env: ``[num_envs, steps]``,
        ``[steps]`` for one env, or with ``flat`` ``[steps * num_envs]`` time-major, of
        which ``keep`` keeps the first ``keep`` (negative: the last ``-keep``).

        Views of the core's cache of recent steps
        (:class:`~replaybuffer.buffers.recent_steps.RecentSteps`), which keeps the newest
        ``window`` steps (or more) from now on. Numpy outputs are read-only; tensors
        share its memory."""
        torch = (kind_of(dtype) or trajectory_type(dtype)) is TrajectoryType.TORCH
        fields = self.run_views(first, steps, window, torch)
        if self.vector:
            if not flat:  # [num_envs, steps] views, as Pearl's swapaxes gave
                fields = tuple(x.swapaxes(0, 1) for x in fields)
            else:  # time-major, as stored
                fields = tuple(x.reshape((-1,) + x.shape[2:]) for x in fields)
                if keep is not None:
                    part = slice(keep, None) if keep < 0 else slice(None, keep)
                    fields = tuple(x[part] for x in fields)
        return self._tensors(fields) if torch else Trajectories(*fields)

    def output(self, fields: tuple[np.ndarray, ...], dtype: Any, strided: bool = False
               ) -> Trajectories:
        """Pearl's trajectories of gathered fields (observations, actions, rewards, next
        observations, terminated), as ``BaseBuffer._output`` makes them: tensors
        C-contiguous, or with ``strided`` (a vector env's ``[num_envs, K]``, strided
        in Pearl too) whatever strides ``torch.from_numpy`` takes as they are."""
        kind = kind_of(dtype) or trajectory_type(dtype)
        obs, act, rew, nxt, term = fields
        if self.obs_scalar:  # Pearl's scalar fields have a trailing axis of 1
            obs, nxt = obs[..., None], nxt[..., None]
        if self.act_scalar:
            act = act[..., None]
        rew = rew[..., None]
        done = term.astype(np.float32, order="C")[..., None]
        if kind is TrajectoryType.TORCH:
            ready = strided_for_torch if strided else np.ascontiguousarray
            return self._tensors(tuple(ready(x) for x in (obs, act, rew, nxt, done)))
        return Trajectories(obs, act, rew, nxt, done)

    def _tensors(self, fields: tuple[np.ndarray, ...]) -> Trajectories:
        """Trajectories of tensors sharing the memory of ``fields`` (on the CPU), or
        copies on the buffer's device."""
        torch = self.torch
        if torch is None:
            import torch

            adapter = self.buffer()
            assert adapter is not None  # it is the caller
            device = adapter.device
            self.torch, self.device = torch, None if device.type == "cpu" else device
        tensor, device = torch.from_numpy, self.device
        if device is None:
            return Trajectories(*(tensor(x) for x in fields))
        return Trajectories(*(tensor(x).to(device) for x in fields))


def strided_for_torch(x: np.ndarray) -> np.ndarray:
    """``x`` where ``torch.from_numpy`` takes it as is (C-contiguous, or strides that
    are non-negative multiples of the item size: a packed record's field view, a
    ``swapaxes``), else a C-contiguous copy."""
    if x.flags.c_contiguous:
        return x
    size = x.itemsize
    if all(s >= 0 and s % size == 0 for s in x.strides):
        return x
    return np.ascontiguousarray(x)
