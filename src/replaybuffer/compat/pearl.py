"""Pearl's (``pearll.buffers`` v0.4.1) buffer names over replaybuffer's buffers.

Code written for Pearl ports by changing its imports and moving to gymnasium's API::

    from replaybuffer.compat.pearl import ReplayBuffer, Trajectories

    buffer = ReplayBuffer(env=env, buffer_size=10_000)         # env: gymnasium (vector) env
    obs, _ = env.reset()
    next_obs, reward, terminated, truncated, _ = env.step(action)
    buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
    batch = buffer.sample(batch_size=64)                       # Trajectories of tensors

Every class here is a thin adapter: it holds a replaybuffer buffer (``.core``: a
:class:`~replaybuffer.TransitionReplayBuffer`, :class:`~replaybuffer.RolloutBuffer` or
:class:`~replaybuffer.HERBuffer`), shapes its inputs and outputs the way Pearl did, and
stores nothing itself. ``buffer_size`` counts Pearl's rows: the core holds
``buffer_size * num_envs`` transitions, and the memory it needs is checked when it is
built. Outputs keep Pearl's shapes: a leading env axis for vector envs
(``[num_envs, batch, ...]``), and a trailing axis of 1 for scalar fields (rewards, dones,
discrete actions). ``dtype`` defaults to ``"torch"`` as in Pearl (tensors on ``device``,
``"auto"``: CUDA when available), so ported agents keep receiving tensors; pass
``dtype="numpy"`` for arrays.

Differences from Pearl, each on purpose:

* gymnasium's API. ``add_trajectory(obs, action, reward, next_obs, done, truncated=False)``
  takes gymnasium's ``terminated`` as ``done`` and an optional ``truncated``. In outputs,
  ``dones`` is 1 where the episode *terminated* only: a time-limit truncation keeps
  ``done=0`` so that ``r + gamma * (1 - done) * V(next_obs)`` bootstraps, and its
  ``next_observations`` is the true final observation. Passing
  ``done=terminated or truncated`` gives Pearl's behaviour.
* Exact next observations. Pearl's ``ReplayBuffer`` and ``HERBuffer`` returned the next
  episode's first observation as the next observation of a terminal transition (and
  any earlier ``next_obs`` of non-sequential adds was silently replaced); here every
  ``next_observations`` is the one that was added, with observations still stored once.
* The newest ``next_obs`` does not overwrite the oldest observation. Pearl's
  ``ReplayBuffer`` lost its oldest slot once full (its raw ``observations`` became
  ``[next_obs[4], next_obs[0..3]]`` after 5 adds into 5 slots) and never sampled it; here
  ``observations`` holds each step's own observation, all ``buffer_size`` transitions
  are sampled, and ``last(buffer_size)`` works.
* ``last(k)`` returns the ``k`` most recent transitions, oldest first, for any ``k`` up
  to what is stored. Asking for more raises ``EmptyBufferError`` (a ``ValueError``)
  instead of ``AssertionError`` (Pearl refused ``k >= buffer_size`` for the replay buffer
  and returned rows of zeros for ``k > pos`` on a buffer that had not wrapped).
* ``all()`` returns every stored transition, oldest first, every field the same length,
  also after the ring wrapped (Pearl's ``next_observations`` was one longer than the
  rest, empty when ``pos + 1 == buffer_size``, and a wrapped buffer returned only what
  was written since the wrap). On an empty buffer (after ``reset()``, say) ``all()``
  and ``last(k)`` return no rows with the right trailing shapes and dtypes, as Pearl's
  slices of an empty range did.
* Runs of consecutive steps (``last``, ``all``, ``RolloutBuffer.sample``) are views, as
  Pearl's were, but of a cache of the recent steps laid out as Pearl returns them (each
  step copied in once, with its exact next observation, when a read first needs it),
  not of the ring: what a read returned never changes, also when later adds wrap the
  ring or end episodes (Pearl's views did). Numpy outputs are read-only; tensors
  share the cache's memory, so clone one before changing it in place (later reads
  return the same rows). Vector envs' ``[num_envs, k, ...]`` outputs are strided
  (not contiguous), as Pearl's ``swapaxes`` made them. The cache holds about 1.25
  times the longest run asked for (``all`` and ``RolloutBuffer.sample``: the whole
  buffer) with two observations per transition. ``ReplayBuffer.sample`` gathers
  fresh contiguous copies.
* ``flatten_env=True`` counts transitions: ``sample(b, flatten_env=True)`` draws exactly
  ``b`` transitions over every (step, env) pair, ``last(k, flatten_env=True)`` gives
  the ``k`` most recent in time-major order, ``all`` keeps everything.
  ``_flatten_env_axis`` reshapes ``[T, num_envs, ...]`` to ``[T * num_envs, ...]``
  without dropping rows (Pearl kept only the last ``T // num_envs`` rows).
* ``RolloutBuffer.sample(k)`` returns ``k`` consecutive transitions in chronological
  order, never straddling the write head (Pearl's block was in storage order once full),
  and raises ``EmptyBufferError`` rather than ``AssertionError`` when ``k`` exceeds what
  is stored. ``add_trajectory`` also takes ``value=`` and ``log_prob=``, and
  ``buffer.core`` computes GAE and minibatches.
* Sampling an empty buffer raises ``EmptyBufferError`` (a ``ValueError``, as Pearl's
  numpy error was) with a message that says so. Bad input (an action outside its
  space, a wrong shape, a batch that is not ``num_envs`` long) raises ``SpecError``
  and writes nothing.
* ``reset()`` empties the buffer and zeroes its arrays (as Pearl's), and keeps HER's
  bookkeeping in int64: Pearl's ``HERBuffer.reset`` reallocated it as int8, which
  overflowed beyond 127 slots or episodes.
* Random draws use the buffer's own generator (``seed=``), not numpy's global state.
* Buffers save and load (Pearl's did not): ``buffer.save(dir)`` and
  ``ReplayBuffer.load(dir, env)`` (likewise ``RolloutBuffer``, ``HERBuffer``), no pickle;
  the restored buffer continues exactly as the saved one would have.
* The memory check warns (``ResourceWarning``) as Pearl's did; ``memory="strict"``
  raises ``InsufficientMemoryError`` instead.
* HER: vector envs work (each env's episodes are tracked separately); goals are shaped
  by the ``achieved_goal``/``desired_goal`` spaces (Pearl assumed the observation's
  shape); the ``"episode"`` strategy is implemented (Pearl raised at sample time); an
  unknown strategy raises ``ValueError`` at construction; only transitions of completed
  episodes are sampled, also once the buffer is full (Pearl then sampled in-progress
  transitions and the stale slot ``pos``); a relabelled goal always comes from the
  transition's own episode (Pearl's "future" fell back to "final" for the whole batch
  when any episode wrapped the buffer's end). As in Pearl, the first
  ``int(batch_size * her_ratio)`` samples are relabelled, their rewards are
  ``compute_reward(next_achieved_goal, goal, {})`` in one call, dones are not
  recomputed, and observations are dicts of ``observation`` and ``desired_goal``.
  ``sample`` ignores ``flatten_env`` (samples are ``[batch_size, ...]`` over all envs).
  ``last(k)`` returns the last ``k`` transitions of each env's last completed episode
  *as stored* (Pearl relabelled part of them with random goals), and ``last``/``all``
  honour ``dtype`` (Pearl's always returned numpy).
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Dict, Union, overload

import numpy as np

from replaybuffer import nest
from replaybuffer.buffers.her import HERBuffer as _HERCore
from replaybuffer.buffers.her import compute_reward_of, parse_goal_selection_strategy
from replaybuffer.buffers.rollout import RolloutBuffer as _RolloutCore
from replaybuffer.buffers.transitions import SINGLE_FLAGS, TransitionReplayBuffer
from replaybuffer.errors import CheckpointError, EmptyBufferError
from replaybuffer.specs import spec_from_space
from replaybuffer.storage.base import to_numpy
from replaybuffer.storage.numpy_storage import NumpyStorage

__all__ = ["BaseBuffer", "DictTrajectories", "GoalSelectionStrategy", "HERBuffer",
           "Observation", "ReplayBuffer", "RolloutBuffer", "Tensor", "Trajectories",
           "TrajectoryType", "get_space_shape"]

# Pearl's type aliases (pearll.common.type_aliases), for annotations in ported code.
Tensor = Any
"""A numpy array or a torch tensor."""
Observation = Any
"""One observation: an array, a tensor, or a dict of them (goal envs)."""


class TrajectoryType(str, Enum):
    """What reads return: ``"numpy"`` arrays or ``"torch"`` tensors."""

    NUMPY = "numpy"
    TORCH = "torch"


class GoalSelectionStrategy(str, Enum):
    """HER's goal selection strategies (all three implemented)."""

    FINAL = "final"
    FUTURE = "future"
    EPISODE = "episode"


@dataclass
class Trajectories:
    """A batch of transitions (Pearl's field names).

    Shapes, with ``B`` the batch and ``D`` an observation's shape: ``[B, D]`` (a vector
    env unflattened: ``[num_envs, B, D]``); ``actions`` ``[B, *action_shape]`` (discrete:
    ``[B, 1]``); ``rewards`` and ``dones`` float32 ``[B, 1]``.
    """

    observations: Tensor
    actions: Tensor
    rewards: Tensor
    next_observations: Tensor
    dones: Tensor


@dataclass
class DictTrajectories:
    """As :class:`Trajectories`, with ``observations`` and ``next_observations`` dicts of
    ``"observation"`` and ``"desired_goal"``."""

    observations: Dict[str, Tensor]
    actions: Tensor
    rewards: Tensor
    next_observations: Dict[str, Tensor]
    dones: Tensor


def get_space_shape(space: Any) -> tuple[int, ...]:
    """Pearl's shape of one element of a gymnasium space: ``Box`` its shape,
    ``Discrete`` ``(1,)``, ``MultiDiscrete`` ``(len(nvec),)``, ``MultiBinary`` ``(n,)``,
    ``Tuple`` ``(len,) + shape(first)``, ``Dict`` the ``"observation"`` subspace's."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return tuple(space.shape)
    if isinstance(space, spaces.Discrete):
        return (1,)
    if isinstance(space, spaces.MultiDiscrete):
        return (len(space.nvec),)
    if isinstance(space, spaces.MultiBinary):
        return tuple(int(n) for n in np.atleast_1d(space.n))
    if isinstance(space, spaces.Tuple):
        return (len(space.spaces),) + get_space_shape(space.spaces[0])
    if isinstance(space, spaces.Dict):
        return get_space_shape(space["observation"])
    raise NotImplementedError(f"{type(space).__name__} spaces are not supported")


def _trajectory_type(dtype: Union[str, TrajectoryType]) -> TrajectoryType:
    if isinstance(dtype, TrajectoryType):
        return dtype
    if isinstance(dtype, str):
        return TrajectoryType(dtype.lower())  # ValueError for anything else
    raise ValueError(f"dtype must be 'numpy' or 'torch', got {dtype!r}")


class BaseBuffer(ABC):
    """Pearl's abstract buffer, to extend with ``reset``, ``add_trajectory``, ``sample``,
    ``last`` and ``all``.

    The constructor builds the core buffer (``.core``) from a gymnasium env, vector env,
    or spaces; subclasses implement the abstract methods with the helpers ``_add``,
    ``_read_steps``, ``_last``, ``_all`` and ``_output``.

    Args:
        env: a ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv`` (``None`` when the
            spaces are given).
        buffer_size: Pearl's rows; ``buffer_size * num_envs`` transitions are kept.
        device: where ``dtype="torch"`` outputs go; ``"auto"``: CUDA when available.
        observation_space, action_space: one env's spaces, instead of ``env``.
        num_envs: with spaces: environments per add (inputs then have an env axis).
        seed: seeds every random draw.
        memory: ``"warn"`` (Pearl's) or ``"strict"`` when the buffer exceeds free RAM.

    Attributes:
        observations, actions, rewards, dones: the stored data as Pearl's arrays,
            ``[buffer_size, (num_envs,) ...]`` (read-only views where the core stores
            them as such; ``dones`` is a float32 copy).
    """

    _core_class: type[TransitionReplayBuffer] = TransitionReplayBuffer
    core: TransitionReplayBuffer
    _observation_path = "['observation']"
    _action_path = "['action']"
    _output_keys: tuple[str, ...] | None = None  # HER: Pearl's keys of dict observations

    def __init__(self, env: Any = None, buffer_size: int = 1_000_000,
                 device: Any = "auto", *, observation_space: Any = None,
                 action_space: Any = None, num_envs: int | None = None,
                 seed: int | None = None, memory: str = "warn", _core: Any = None,
                 **core_kwargs: Any):
        if env is not None:
            import gymnasium as gym

            vector = isinstance(env, gym.vector.VectorEnv)
            observation_space = env.single_observation_space if vector else \
                env.observation_space
            action_space = env.single_action_space if vector else env.action_space
            num_envs = int(env.num_envs) if vector else 1
        elif observation_space is None or action_space is None:
            raise ValueError("pass env, or observation_space and action_space")
        else:
            vector = num_envs is not None
            num_envs = 1 if num_envs is None else int(num_envs)
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, (int, np.integer)) \
                or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int, got {buffer_size!r}")
        self.env = env
        self.buffer_size = int(buffer_size)
        self.num_envs = num_envs
        self.vector = vector  # inputs and outputs carry an env axis
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = get_space_shape(observation_space)
        self.action_shape = get_space_shape(action_space)
        self.batch_shape = (self.buffer_size, num_envs) if vector else (self.buffer_size,)
        self._device = device
        self._rng = np.random.default_rng(seed)
        if _core is not None:  # restored by load(): the core comes from the save
            self.core = _core
        else:
            self.core = self._make_core(spec_from_space(observation_space),
                                        spec_from_space(action_space),
                                        self.buffer_size * num_envs, num_envs=num_envs,
                                        seed=seed, memory=memory, **core_kwargs)
        # The common case's shortcuts (None where the core is not one they serve).
        self._fast = _FastPaths.of(self)
        # Whether _add may hand the core an env's arrays as they come: one array leaf
        # each for observation and action, neither a scalar (Pearl gave those a
        # trailing 1, which _batched drops).
        core = self.core
        self._direct = core._obs_is_leaf and self._action_path in core._paths and \
            core._specs[core._paths.index(self._action_path)].shape != () and \
            core._specs[core._obs_leaves[0]].shape != ()

    def _make_core(self, observation_spec: Any, action_spec: Any, capacity: int,
                   **kwargs: Any) -> TransitionReplayBuffer:
        """Build the buffer that stores everything (override to choose another)."""
        return self._core_class(observation_spec, action_spec, capacity, **kwargs)

    # ------------------------------------------------------------- Pearl's state
    @property
    def device(self) -> Any:
        """The torch device of ``dtype="torch"`` outputs."""
        import torch

        if self._device == "auto":
            self._device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.device(self._device)

    @property
    def pos(self) -> int:
        """The row the next add writes."""
        return (self.core.last_id + 1) % self.buffer_size

    @property
    def full(self) -> bool:
        """Whether every row has been written."""
        return self.core.last_id + 1 >= self.buffer_size

    def _leaf_view(self, path: str) -> np.ndarray:
        """The stored leaf at ``path`` as ``batch_shape + shape`` (scalars get a trailing
        1), a read-only view of numpy storage."""
        core = self.core
        if path not in core._paths:
            raise TypeError(f"{path} is not one stored array in {type(self).__name__} (the "
                            "space is a nest): read core.all() instead")
        array = to_numpy(core._storage.arrays[core._paths.index(path)])
        shape = array.shape[1:] or (1,)
        view = array.reshape(self.batch_shape + shape)
        view.flags.writeable = False  # the buffer's invariants (side store) live elsewhere
        return view

    @property
    def observations(self) -> np.ndarray:
        return self._leaf_view(self._observation_path)

    @property
    def actions(self) -> np.ndarray:
        return self._leaf_view(self._action_path)

    @property
    def rewards(self) -> np.ndarray:
        return self._leaf_view("['reward']")

    @property
    def dones(self) -> np.ndarray:
        return self._leaf_view("['terminated']").astype(np.float32)

    # ------------------------------------------------------------- Pearl's API
    @abstractmethod
    def reset(self) -> None:
        """Empty the buffer: ``pos = 0``, ``full = False``, every array zero."""
        self.core.clear(zero_storage=True)

    @abstractmethod
    def add_trajectory(self, observation: Any, action: Any, reward: Any,
                       next_observation: Any, done: Any, truncated: Any = None) -> None:
        """Add one transition (per env of a vector env)."""

    def add_batch_trajectories(self, observations: Any, actions: Any, rewards: Any,
                               next_observations: Any, dones: Any,
                               truncated: Any = None) -> None:
        """Add transitions one after the other, along the first axis of every argument."""
        count = len(rewards)
        truncated = [None] * count if truncated is None else truncated
        for i in range(count):
            self.add_trajectory(_index(observations, i), actions[i], rewards[i],
                                _index(next_observations, i), dones[i], truncated[i])

    @abstractmethod
    def sample(self, batch_size: int, flatten_env: bool = False,
               dtype: Union[str, TrajectoryType] = "torch") -> Any:
        """A random batch of transitions."""

    @abstractmethod
    def last(self, batch_size: int, flatten_env: bool = False,
             dtype: Union[str, TrajectoryType] = "torch") -> Any:
        """The most recent transitions."""

    @abstractmethod
    def all(self, flatten_env: bool = False,
            dtype: Union[str, TrajectoryType] = "torch") -> Any:
        """Every stored transition."""

    # ------------------------------------------------------------- persistence
    def save(self, directory: str | os.PathLike[str], keep: int = 1) -> Path:
        """Write the buffer to ``directory`` (Pearl had no saves); return the checkpoint.

        The core's save (:meth:`replaybuffer.ReplayBuffer.save`: a series of checkpoints,
        JSON manifest and ``.npy`` files, no pickle) with this adapter's own state in the
        manifest's ``metadata["pearl"]``: its class, ``buffer_size``, ``num_envs``,
        whether inputs carry an env axis, and the generator of its own draws. Restore
        with :meth:`load` of the same class.
        """
        state = {"adapter": type(self).__name__, "buffer_size": self.buffer_size,
                 "num_envs": self.num_envs, "vector": self.vector,
                 "rng": self._rng.bit_generator.state}
        return self.core.save(directory, keep, metadata={"pearl": state})

    @classmethod
    def load(cls, directory: str | os.PathLike[str], env: Any = None, device: Any = "auto", *,
             observation_space: Any = None, action_space: Any = None,
             **kwargs: Any) -> "BaseBuffer":
        """The buffer saved in ``directory`` by :meth:`save` (its newest checkpoint, or
        the checkpoint ``directory`` names), continuing exactly where it stopped (data,
        episode bookkeeping, every generator).

        Spaces are not saved: pass the ``env`` (or ``observation_space`` and
        ``action_space``) as to the constructor; they must give the saved specs.
        ``HERBuffer.load`` also takes ``compute_reward=`` (else the env's), since a
        function is not saved either.

        Raises:
            CheckpointError: not a save of this class (no compat.pearl state in its
                manifest), or spaces that do not match the save.
        """
        from replaybuffer.persist import load, read_manifest, resolve

        checkpoint = resolve(directory)  # one checkpoint for both reads
        state = read_manifest(checkpoint)["metadata"].get("pearl")
        try:
            buffer_size, num_envs = int(state["buffer_size"]), int(state["num_envs"])
            vector, rng = bool(state["vector"]), state["rng"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{checkpoint} holds no compat.pearl buffer state (its "
                                  f"manifest's metadata['pearl']): {exc!r}") from exc
        if state.get("adapter") != cls.__name__:
            raise CheckpointError(f"{checkpoint} holds a {state.get('adapter')!r}, not a "
                                  f"{cls.__name__}")
        core = load(checkpoint)
        if type(core) is not cls._core_class:
            raise CheckpointError(f"{directory} holds a {type(core).__name__} core, not the "
                                  f"{cls._core_class.__name__} of a {cls.__name__}")
        buffer = cls(env, buffer_size, device=device, observation_space=observation_space,
                     action_space=action_space, num_envs=num_envs if vector else None,
                     _core=core, **kwargs)
        saved = buffer.core._config_values  # core itself
        if (buffer.num_envs, buffer.vector) != (num_envs, vector) or \
                spec_from_space(buffer.observation_space) != saved["observation_spec"] or \
                spec_from_space(buffer.action_space) != saved["action_spec"]:
            raise CheckpointError(f"the spaces given do not match the save in {directory}: "
                                  f"saved observation {saved['observation_spec']!r}, action "
                                  f"{saved['action_spec']!r}, num_envs={num_envs}")
        buffer._rng.bit_generator.state = rng
        return buffer

    # ------------------------------------------------------------- helpers
    def _add(self, observation: Any, action: Any, reward: Any, next_observation: Any,
             done: Any, truncated: Any = None, *policy: Any) -> None:
        """Give the core one transition per env; ``policy``: the rollout's ``value`` and
        ``log_prob``, passed on positionally (keywords would cost a dict per add).

        A vector env's step goes to the core's shortcut as it came (the usual step:
        arrays of the stored dtypes, float64 rewards included, checked once by the
        fused writer) and is converted (:meth:`_core_leaves`) only when the shortcut did
        not take it; one env's step to the core's ``_add_single``
        (:meth:`_single_leaves`)."""
        core = self.core
        if self.vector:
            if not (self._direct and core.add_usual(observation, action, reward,
                                                    next_observation, done, truncated,
                                                     *policy)):
                core.add(*self._core_leaves(observation, action, reward, next_observation,
                                            done, truncated), *policy)
            return
        single = self._single_leaves(observation, action, reward, next_observation, done,
                                     truncated)
        if single is not None:
            core.add_single(*single, *policy)
        else:
            core.add(*self._core_leaves(observation, action, reward, next_observation,
                                        done, truncated), *policy)

    def _single_leaves(self, observation: Any, action: Any, reward: Any,
                       next_observation: Any, done: Any, truncated: Any
                       ) -> tuple[Any, Any, Any, Any, Any, Any] | None:
        """One env's inputs as the core's ``_add_single`` takes them (no env axis:
        arrays as they come, the reward a Python float, the flags bool 0-d arrays), when
        they are what an env gives (array observations and actions, a float reward,
        bool flags); ``None`` otherwise (and for a vector env), for
        :meth:`_core_leaves`. The core then takes its shortcut for the usual step
        without the views of an added axis, or adds the axis and checks everything."""
        ndarray = np.ndarray
        if self._direct and not self.vector and type(observation) is ndarray and \
                type(action) is ndarray and type(next_observation) is ndarray and \
                type(reward) in _FLOATS and type(done) in _FLAGS and \
                (truncated is None or type(truncated) in _FLAGS):
            flags = SINGLE_FLAGS
            # A float64 scalar as the float it holds; a float32 one as it is (exactly
            # its bytes, where a round trip through float could change a NaN's).
            return (observation, action,
                    float(reward) if type(reward) is np.float64 else reward,
                    next_observation, flags[1 if done else 0],
                    None if truncated is None else flags[1 if truncated else 0])
        return None

    def _core_leaves(self, observation: Any, action: Any, reward: Any, next_observation: Any,
                     done: Any, truncated: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
        """Pearl's inputs of one add as the core's ``add`` takes them (observation,
        action, reward, next observation, terminated, truncated; each ``[num_envs, ...]``).

        For a step the core's shortcut did not take (:meth:`_add`). What a vector env
        gives passes as it came (arrays; float rewards of any width, cast by the core):
        the core's ``add`` checks and converts them on its general path (an episode's
        first observation after a reset is not the previous next observation). Other
        inputs (lists, tensors, dicts, Pearl's trailing 1 of scalar fields) are
        converted leaf by leaf (``_batched``).
        """
        ndarray = np.ndarray
        if self._direct and self.vector and type(observation) is ndarray and \
                type(action) is ndarray and type(next_observation) is ndarray and \
                type(reward) is ndarray and reward.dtype.kind == "f" and reward.ndim == 1 \
                and type(done) is ndarray and done.ndim == 1 and \
                (truncated is None or type(truncated) is ndarray and truncated.ndim == 1):
            return observation, action, reward, next_observation, done, truncated
        return (self._batched(observation), self._batched(action, self._action_path),
                self._batched(reward, "scalar"), self._batched(next_observation),
                self._batched(done, "scalar"),
                None if truncated is None else self._batched(truncated, "scalar"))

    def _batched(self, value: Any, scalar: str | None = None) -> Any:
        """``value`` with a leading env axis; Pearl's trailing 1 of scalar fields dropped."""
        def one(leaf: Any) -> Any:
            arr = to_numpy(leaf)
            if not self.vector:
                arr = arr[None]
            if scalar is not None and arr.ndim == 2 and arr.shape[1] == 1 and \
                    self._scalar(scalar):
                arr = arr[:, 0]
            return arr
        if isinstance(value, dict):
            return {key: one(v) for key, v in value.items()}
        return one(value)

    def _scalar(self, which: str) -> bool:
        if which == "scalar":
            return True
        index = self.core._paths.index(which) if which in self.core._paths else None
        return index is not None and self.core._specs[index].shape == ()

    def _read_steps(self, ids: np.ndarray) -> Any:
        """The transitions of steps ``ids`` (``[K]``) of every env: ``[num_envs, K]``."""
        core = self.core
        with core._lock:
            ring = core._ring
            if ring.last_id < 0:
                raise core.empty_error()
            if ids.min() < ring.oldest_id or ids.max() > ring.last_id:
                raise EmptyBufferError(f"steps {ids.min()}..{ids.max()} are not stored "
                                       f"(held: {ring.oldest_id}..{ring.last_id})")
            rows = np.arange(self.num_envs, dtype=np.int64)[:, None]
            return core._read(np.broadcast_to(ids, (self.num_envs, len(ids))),
                              ring.positions(ids[None, :], rows))

    def _draw_steps(self, batch_size: int) -> np.ndarray:
        """``batch_size`` step ids drawn uniformly (with replacement) from those stored."""
        ring = self.core._ring
        last_id = ring.last_id
        if last_id < 0:
            raise self.core.empty_error()
        oldest = max(0, last_id + 1 - ring.max_length)
        return oldest + _draw(self._rng, last_id + 1 - oldest, _count(batch_size, "batch_size"))

    def _last(self, batch_size: int, flatten_env: bool, dtype: Any, read: Any = None) -> Any:
        """The ``batch_size`` most recent transitions of each env (``read(k)`` reads
        ``k`` per env; default the core's ``last``)."""
        fast = self._fast if read is None and (self.num_envs > 1 or not self.vector) else None
        read = read or self.core.last
        count = _count(batch_size, "batch_size")
        if len(self.core) == 0:  # Pearl sliced an empty range: no rows, right shapes
            return self._output(self._nothing(), flatten_env, dtype)
        if fast is not None:
            if flatten_env and self.vector:
                steps = math.ceil(count / self.num_envs)
                return fast.run(None, steps, True, -count, dtype, steps)
            return fast.run(None, count, False, None, dtype, count)
        if flatten_env and self.vector:  # count transitions: enough steps, then trim
            steps = math.ceil(count / self.num_envs)
            return self._output(read(steps), flatten_env, dtype, keep=-count)
        return self._output(read(count), flatten_env, dtype)

    def _all(self, flatten_env: bool, dtype: Any) -> Any:
        ring = self.core._ring
        if ring.last_id < 0:  # after reset(): on-policy loops call all() regardless
            return self._output(self._nothing(), flatten_env, dtype)
        fast = self._fast
        if fast is not None and (self.num_envs > 1 or not self.vector):
            return fast.run(None, None, flatten_env and self.vector, None, dtype,
                            ring.max_length)
        return self._output(self.core.all(), flatten_env, dtype)

    def _nothing(self) -> Any:
        """The core's transitions of no step, shaped as its ``last`` gives them: leaves
        ``[num_envs, 0, ...]`` (``[0, ...]`` for one env)."""
        core = self.core
        none = np.zeros((core.num_envs, 0), np.int64)
        with core._lock:
            batch = core._read(none, none)
        return batch if core.num_envs > 1 else nest.map_structure(lambda x: x[0], batch)

    def _output(self, batch: Any, flatten_env: bool, dtype: Any, env_axis: bool = True,
                keep: int | None = None) -> Any:
        """A core batch as Pearl's trajectories.

        Args:
            batch: core transitions with leading dims ``[num_envs, K]`` (``[K]`` for a
                single env) when ``env_axis``, else ``[K]``.
            flatten_env: flatten ``[num_envs, K]`` to ``[K * num_envs]``, time-major.
            keep: with flattening, keep the last ``-keep`` (or first ``keep``) rows.
        """
        kind = _trajectory_type(dtype)
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


class ReplayBuffer(BaseBuffer):
    """Pearl's off-policy buffer: uniform replay over a
    :class:`~replaybuffer.TransitionReplayBuffer` (observations stored once, exact next
    observations)."""

    def reset(self) -> None:
        super().reset()

    def add_trajectory(self, observation: Any, action: Any, reward: Any,
                       next_observation: Any, done: Any, truncated: Any = None) -> None:
        """Add one transition; with a vector env every argument has the env axis first.

        ``done`` is gymnasium's ``terminated``; ``truncated`` marks time limits.
        """
        self._add(observation, action, reward, next_observation, done, truncated)

    def sample(self, batch_size: int, flatten_env: bool = False,
               dtype: Union[str, TrajectoryType] = "torch") -> Trajectories:
        """``batch_size`` transitions drawn uniformly with replacement.

        Single env: ``[batch_size, ...]``. Vector env: ``[num_envs, batch_size, ...]``
        (each draw a step, all envs), or ``[batch_size, ...]`` over every (step, env)
        pair with ``flatten_env=True``.
        """
        fast = self._fast
        if self.vector and not flatten_env:
            ids = self._draw_steps(batch_size)
            if fast is not None:
                return fast.output(fast.steps(ids), dtype, strided=True)
            out: Trajectories = self._output(self._read_steps(ids), False, dtype)
            return out
        if fast is not None:
            fields = fast.sample(_count(batch_size, "batch_size"))
            if fields is not None:
                return fast.output(fields, dtype)
        batch, _ = self.core.sample(batch_size)
        out = self._output(batch, flatten_env, dtype, env_axis=False)
        return out

    def last(self, batch_size: int, flatten_env: bool = False,
             dtype: Union[str, TrajectoryType] = "torch") -> Trajectories:
        """The ``batch_size`` most recent transitions (of each env), oldest first."""
        out: Trajectories = self._last(batch_size, flatten_env, dtype)
        return out

    def all(self, flatten_env: bool = False,
            dtype: Union[str, TrajectoryType] = "torch") -> Trajectories:
        """Every stored transition, oldest first."""
        out: Trajectories = self._all(flatten_env, dtype)
        return out


class RolloutBuffer(BaseBuffer):
    """Pearl's on-policy buffer over a :class:`~replaybuffer.RolloutBuffer`.

    ``core.compute_returns_and_advantages(...)`` and ``core.minibatches(...)`` add GAE
    and shuffled minibatches, which Pearl left to its agents.
    """

    _core_class = _RolloutCore
    core: _RolloutCore
    _action_path = "['action']['action']"

    def reset(self) -> None:
        super().reset()

    def add_trajectory(self, observation: Any, action: Any, reward: Any,
                       next_observation: Any, done: Any, truncated: Any = None,
                       value: Any = None, log_prob: Any = None) -> None:
        """Add one transition (per env), optionally with the policy's value and
        log-probability."""
        self._add(observation, action, reward, next_observation, done, truncated, value,
                  log_prob)

    def sample(self, batch_size: int, flatten_env: bool = False,
               dtype: Union[str, TrajectoryType] = "torch") -> Trajectories:
        """``batch_size`` consecutive transitions (of each env), chronological, starting
        at a uniformly drawn step; ``sample(stored)`` returns everything in order."""
        count = _count(batch_size, "batch_size")
        steps = math.ceil(count / self.num_envs) if flatten_env and self.vector else count
        ring = self.core._ring
        held = ring.items_per_row
        if held == 0:
            raise self.core.empty_error()
        if steps > held:
            raise EmptyBufferError(f"Requesting {count} samples when only "
                                   f"{held * (self.num_envs if flatten_env else 1)} samples "
                                   "have been collected")
        start = ring.oldest_id + _draw(self._rng, held - steps + 1)
        fast = self._fast
        if fast is not None:
            flat = flatten_env and self.vector
            return fast.run(start, steps, flat, count if flat else None, dtype, ring.max_length)
        batch = self._read_steps(np.arange(start, start + steps, dtype=np.int64))
        if not self.vector:
            batch = nest.map_structure(lambda x: x[0], batch)
        out: Trajectories = self._output(batch, flatten_env, dtype, keep=count)
        return out

    def last(self, batch_size: int, flatten_env: bool = False,
             dtype: Union[str, TrajectoryType] = "torch") -> Trajectories:
        """The ``batch_size`` most recent transitions (of each env), oldest first."""
        out: Trajectories = self._last(batch_size, flatten_env, dtype)
        return out

    def all(self, flatten_env: bool = False,
            dtype: Union[str, TrajectoryType] = "torch") -> Trajectories:
        """Every stored transition, oldest first."""
        out: Trajectories = self._all(flatten_env, dtype)
        return out


class HERBuffer(BaseBuffer):
    """Pearl's hindsight experience replay over a :class:`~replaybuffer.HERBuffer`.

    Args:
        env: a goal-conditioned gymnasium env or synchronous vector env (its
            ``compute_reward`` relabels rewards; pass ``compute_reward=`` otherwise).
        buffer_size: rows, as for :class:`BaseBuffer`.
        goal_selection_strategy: ``"final"``, ``"future"`` or ``"episode"`` (any case,
            or :class:`GoalSelectionStrategy`).
        n_sampled_goal: relabelled goals per real one (``her_ratio = 1 - 1/(n + 1)``).
        device, seed, memory, observation_space, action_space, num_envs: as for
            :class:`BaseBuffer`.
    """

    _core_class = _HERCore
    core: _HERCore
    _observation_path = "['observation']['observation']"
    _output_keys = ("observation", "desired_goal")

    def __init__(self, env: Any = None, buffer_size: int = 1_000_000,
                 goal_selection_strategy: Union[str, GoalSelectionStrategy] = "future",
                 n_sampled_goal: int = 4, device: Any = "auto", *,
                 compute_reward: Any = None, **kwargs: Any):
        strategy = parse_goal_selection_strategy(goal_selection_strategy)
        if compute_reward is None and env is not None:
            compute_reward = compute_reward_of(env)
        super().__init__(env, buffer_size, device, compute_reward=compute_reward,
                         goal_selection_strategy=strategy, n_sampled_goal=n_sampled_goal,
                         **kwargs)
        if compute_reward is not None:  # a restored core has none (load())
            self.core.compute_reward = compute_reward
        # The core's, which a restored core brings from its save.
        self.goal_selection_strategy = GoalSelectionStrategy(self.core.goal_selection_strategy)
        self.n_sampled_goal = self.core.n_sampled_goal
        self.her_ratio = self.core.her_ratio

    @property
    def goal_section_strategy(self) -> GoalSelectionStrategy:
        """Pearl's (misspelt) attribute name for :attr:`goal_selection_strategy`."""
        return self.goal_selection_strategy

    @property
    def desired_goals(self) -> np.ndarray:
        """Stored desired goals, ``batch_shape + goal_shape`` (read-only view)."""
        return self._leaf_view("['observation']['desired_goal']")

    @property
    def next_achieved_goals(self) -> np.ndarray:
        """The achieved goal of each stored step's next observation (a copy; zeros
        where nothing is stored)."""
        core = self.core
        out = np.zeros(self.desired_goals.shape, self.desired_goals.dtype)
        with core._lock:
            ring = core._ring
            if ring.last_id >= 0:
                ids = np.arange(ring.oldest_id, ring.last_id + 1, dtype=np.int64)
                positions = ring.positions(ids[:, None], np.arange(self.num_envs)[None, :])
                goals = core._next_observations(positions.ravel(),
                                                np.repeat(ids, self.num_envs))[core._achieved]
                flat = out.reshape((-1,) + out.shape[1 + self.vector:])
                flat[positions.ravel()] = to_numpy(goals)
        return out

    def reset(self) -> None:
        super().reset()

    def add_trajectory(self, observation: Any, action: Any, reward: Any,
                       next_observation: Any, done: Any, truncated: Any = None) -> None:
        """Add one transition of dict observations (per env)."""
        self._add(observation, action, reward, next_observation, done, truncated)

    def sample(self, batch_size: int, flatten_env: bool = False,
               dtype: Union[str, TrajectoryType] = "torch") -> DictTrajectories:
        """``batch_size`` transitions of completed episodes, the first
        ``int(batch_size * her_ratio)`` with relabelled goals and rewards:
        ``[batch_size, ...]`` over every env (``flatten_env`` is ignored, as in Pearl)."""
        batch, _ = self.core.sample(_count(batch_size, "batch_size"))
        out: DictTrajectories = self._output(batch, False, dtype, env_axis=False)
        return out

    def last(self, batch_size: int, flatten_env: bool = False,
             dtype: Union[str, TrajectoryType] = "torch") -> DictTrajectories:
        """The last ``batch_size`` transitions of each env's most recent completed
        episodes, as stored."""
        out: DictTrajectories = self._last(batch_size, flatten_env, dtype,
                                           read=self.core.last_completed)
        return out

    def all(self, flatten_env: bool = False,
            dtype: Union[str, TrajectoryType] = "torch") -> DictTrajectories:
        """Every stored transition, oldest first, as stored."""
        out: DictTrajectories = self._all(flatten_env, dtype)
        return out


@overload
def _draw(rng: np.random.Generator, n: int, size: None = None) -> int: ...


@overload
def _draw(rng: np.random.Generator, n: int, size: int) -> np.ndarray: ...


def _draw(rng: np.random.Generator, n: int, size: int | None = None) -> int | np.ndarray:
    """Uniform draws from ``range(n)``: an int, or int64 ``[size]``.

    Raw 64-bit draws reduced modulo ``n``, as the core's samplers draw (a quarter of the
    cost of ``Generator.integers`` for one number), with a bias below ``n / 2**64``."""
    if size is None:
        return rng.bit_generator.random_raw() % n
    draws: np.ndarray = (rng.bit_generator.random_raw(size) % np.uint64(n)).view(np.int64)
    return draws  # (numpy's stubs type the uint64 modulo as Any)


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _index(value: Any, i: int) -> Any:
    if isinstance(value, dict):
        return {key: v[i] for key, v in value.items()}
    return value[i]


_KINDS = {"numpy": TrajectoryType.NUMPY, "torch": TrajectoryType.TORCH}
_FLOATS = (float, np.float64, np.float32)  # Python and numpy scalars a reward comes as
_FLAGS = (bool, np.bool_)


class _FastPaths:
    """The adapters' reads for the common case, each giving exactly what the general
    path gives (tests/test_compat_pearl_fast.py compares them on random scripts).

    Served: a :class:`~replaybuffer.TransitionReplayBuffer` or
    :class:`~replaybuffer.RolloutBuffer` core (those classes exactly) in numpy storage,
    one-step transitions, one array observation, one array action, no frame stacking.
    Pearl's own reads cost a few numpy operations each; the general path's nest walks,
    per-leaf closures and conversions cost several times that, so here:

    * random samples (:meth:`sample`, :meth:`steps`) compute the storage positions of
      the steps asked for, gather the leaves Pearl returns (one ``take`` of the packed
      records) and the next observations, and patch those that the side store or the
      newest step's own keep (as the core's ``_next_observations`` does);
    * runs of consecutive steps (``last``, ``all``, ``RolloutBuffer.sample``) are views
      of :class:`_Recent`, the newest steps already laid out as Pearl returns them.

    Adds need no shortcut here: ``add_trajectory`` hands the core arrays its own
    shortcut (``TransitionReplayBuffer._add_exact``) takes, one env's without the env
    axis (``_add_single``).
    """

    @classmethod
    def of(cls, buffer: BaseBuffer) -> "_FastPaths | None":
        core, storage = buffer.core, buffer.core._storage
        if type(core) not in (TransitionReplayBuffer, _RolloutCore) or \
                type(storage) is not NumpyStorage or core._codec is not None or \
                getattr(core, "n_step", 1) != 1 or core._episodes is not None or \
                not core._obs_is_leaf or len(core._obs_leaves) != 1 or \
                buffer._action_path not in core._paths:
            return None
        return cls(buffer, storage)

    def __init__(self, buffer: BaseBuffer, storage: NumpyStorage):
        """``storage``: the core's, exactly a NumpyStorage (:meth:`of` checks)."""
        core = self.core = buffer.core
        self.buffer = buffer
        self.ring = core._ring
        self.lock = core._lock
        self.storage = storage
        self.B = self.ring.batch_size
        self.vector = buffer.vector
        self.rows = np.arange(self.B, dtype=np.int64)
        obs, act = core._obs_leaves[0], core._paths.index(buffer._action_path)
        self.obs_only = [obs]
        self.read = [obs, act, core._reward, core._terminated]
        self.obs_scalar = core._specs[obs].shape == ()
        self.act_scalar = core._specs[act].shape == ()
        self.torch: Any = None  # the module and the device, at the first torch read
        self.device: Any = None
        self.recent = _Recent(core, storage, self.read, self.vector)

    # ------------------------------------------------------------------ reading
    def _gather(self, ids: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Observations, actions, rewards, next observations and terminated flags of the
        steps ``ids`` at ``positions`` (``[K]``, or ``[K, num_envs]`` with ``ids``
        ``[K]``; the lock held)."""
        core = self.core
        obs, act, rew, term = self.storage.gather(positions, self.read)
        # (a fresh gather: patched in place)
        nxt = self.storage.gather(positions + self.B, self.obs_only)[0]  # gather wraps
        side = core._side_ref.take(positions)
        from_side = side >= 0
        newest = ids == self.ring.last_id
        if np.count_nonzero(newest):
            if newest.shape != positions.shape:  # every env of the newest step
                newest = np.broadcast_to(newest[:, None], positions.shape)
            own = newest & ~from_side
            nxt[own] = core._head_next[0][positions[own] % self.B]
        if np.count_nonzero(from_side):
            nxt[from_side] = core._side.take(side[from_side])[0]
        return obs, act, rew, nxt, term

    def sample(self, batch_size: int) -> tuple[np.ndarray, ...] | None:
        """The core's ``sample(batch_size)`` (its sampler, drawing as it does); ``None``
        where the core must do it (a rate limiter, or nothing stored)."""
        core, ring = self.core, self.ring
        with self.lock:
            if core._limiter is not None or ring.last_id < 0:
                return None
            (ids, positions), _ = core._sampler.sample(ring, batch_size, 1)
            return self._gather(ids, positions)

    def steps(self, ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """Steps ``ids`` (``[K]``) of every env: ``[num_envs, K]`` (``_read_steps``),
        gathered time-major (a step's envs are neighbours in storage) and seen
        env-major through ``swapaxes``, as Pearl's were: strided views."""
        ring = self.ring
        positions = (ids % ring.max_length * self.B)[:, None] + self.rows[None, :]
        with self.lock:
            _check_held(self.core, int(ids.min()), int(ids.max()))
            fields = self._gather(ids, positions)
        return tuple(x.swapaxes(0, 1) for x in fields)

    def run(self, first: int | None, steps: int | None, flat: bool, keep: int | None,
            dtype: Any, window: int) -> Trajectories:
        """Pearl's trajectories of ``steps`` consecutive steps (``None``: every one
        stored) from ``first`` (``None``: the newest ``steps``, as the core's ``last``)
        of every env: ``[num_envs, steps]``,
        ``[steps]`` for one env, or with ``flat`` ``[steps * num_envs]`` time-major, of
        which ``keep`` keeps the first ``keep`` (negative: the last ``-keep``).

        Views of :class:`_Recent`, which keeps the newest ``window`` steps (or more)
        from now on. Numpy outputs are read-only; tensors share its memory (see
        :meth:`_Recent.view`)."""
        ring, B = self.ring, self.B
        with self.lock:
            last_id = ring.last_id
            if first is None:
                held = min(last_id + 1, ring.max_length)
                if steps is None:
                    steps = held
                elif steps > held:
                    raise EmptyBufferError(f"last({steps}) asks for more transitions than "
                                           f"each env holds ({held})")
                first = last_id - steps + 1
            elif steps is None:
                raise ValueError("run: steps=None reads from the oldest step (first=None)")
            elif first < last_id + 1 - ring.max_length or first < 0 or \
                    first + steps - 1 > last_id:
                _check_held(self.core, first, first + steps - 1)
            torch = (_kind_of(dtype) or _trajectory_type(dtype)) is TrajectoryType.TORCH
            fields = self.recent.view(first, steps, window, torch)
        if self.vector:
            if not flat:  # [num_envs, steps] views, as Pearl's swapaxes gave
                fields = tuple(x.swapaxes(0, 1) for x in fields)
            else:  # time-major, as stored
                fields = tuple(x.reshape((steps * B,) + x.shape[2:]) for x in fields)
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
        kind = _kind_of(dtype) or _trajectory_type(dtype)
        obs, act, rew, nxt, term = fields
        if self.obs_scalar:  # Pearl's scalar fields have a trailing axis of 1
            obs, nxt = obs[..., None], nxt[..., None]
        if self.act_scalar:
            act = act[..., None]
        rew = rew[..., None]
        done = term.astype(np.float32, order="C")[..., None]
        if kind is TrajectoryType.TORCH:
            ready = _strided_for_torch if strided else np.ascontiguousarray
            return self._tensors(tuple(ready(x) for x in (obs, act, rew, nxt, done)))
        return Trajectories(obs, act, rew, nxt, done)

    def _tensors(self, fields: tuple[np.ndarray, ...]) -> Trajectories:
        """Trajectories of tensors sharing the memory of ``fields`` (on the CPU), or
        copies on the buffer's device."""
        torch = self.torch
        if torch is None:
            import torch

            device = self.buffer.device
            self.torch, self.device = torch, None if device.type == "cpu" else device
        tensor, device = torch.from_numpy, self.device
        if device is None:
            return Trajectories(*(tensor(x) for x in fields))
        return Trajectories(*(tensor(x).to(device) for x in fields))


class _Recent:
    """The newest steps' transitions, oldest first, laid out as Pearl returns them.

    Pearl's ``last``, ``all`` and ``RolloutBuffer.sample`` return runs of consecutive
    steps. Pearl sliced its own arrays, wrongly: the next observation of an episode's
    last step was the next episode's first, and slices of a wrapped ring were in
    storage order. Here each step's transition (observation, action, reward, its exact
    next observation, ``done`` as float32) is copied once, when first read after its
    add, into arrays in time order; a run is then a slice of them, whatever the ring.

    Layout: arrays of ``capacity * num_envs`` rows, time-major like storage (row
    ``(step - first) * num_envs + env``); observations and actions as Pearl's
    (scalars with a trailing 1), rewards and dones ``[rows, 1]`` float32. Rows
    ``[0, count * num_envs)`` hold steps ``first .. first + count - 1``. Reads see
    them as ``[capacity, num_envs, ...]`` (``[capacity, ...]`` without an env axis),
    through read-only views for numpy outputs and writable ones for tensors (torch
    warns about read-only arrays).

    Rows are written once: new steps go to rows past ``count``, and when those run out
    the newest ``window`` steps move into fresh arrays (amortised over
    ``capacity - window`` adds). Views handed out therefore never change, also when
    the ring wraps; a clear or restore (``core._generation``) starts afresh. Next
    observations are immutable too: a step's is the one that was added (the following
    step's observation, the side store's, or for the newest step its own), whatever
    is added later.

    Memory: ``window`` is the longest run asked for (``all`` and
    ``RolloutBuffer.sample`` ask for the whole ring), ``capacity`` 1.25 times that;
    per step two observations, an action and 8 bytes.
    """

    def __init__(self, core: TransitionReplayBuffer, storage: NumpyStorage,
                 read: list[int], vector: bool):
        self.core, self.ring = core, core._ring
        self.B = self.ring.batch_size
        self.per_step = (self.B,) if vector else ()  # a step's rows, as reads see them
        obs, act, rew, term = (storage.arrays[i] for i in read)
        self.sources = (obs, act, rew, obs, term)  # next observations: obs, shifted
        specs = core._specs
        # Pearl's trailing 1 of scalar observations and actions, rewards and dones.
        self.shapes = (specs[read[0]].shape or (1,), specs[read[1]].shape or (1,), (1,),
                       specs[read[0]].shape or (1,), (1,))
        self.dtypes = (obs.dtype, act.dtype, np.dtype(np.float32), obs.dtype,
                       np.dtype(np.float32))
        self.arrays: tuple[np.ndarray, ...] = ()
        self.targets: tuple[np.ndarray, ...] = ()  # the arrays in storage's shapes
        self.steps: tuple[tuple[np.ndarray, ...], ...] = ((), ())  # read-only, writable
        self.first = self.count = self.window = 0
        self.generation = -1

    def view(self, first: int, steps: int, window: int, writable: bool
             ) -> tuple[np.ndarray, ...]:
        """Observations, actions, rewards, next observations and dones of steps
        ``first .. first + steps - 1`` (stored, the lock held): ``[steps, num_envs,
        ...]`` views (``[steps, ...]`` without an env axis), read-only unless
        ``writable``. Keeps ``window`` steps from now on (or more).

        The views stay valid and unchanged for good: nothing ever writes those rows
        again. Callers must not write into them either (later reads return the same
        rows): numpy outputs are read-only; a tensor made of them must be cloned
        before an in-place change."""
        start = first - self.first
        # Steps added since the last catch-up are copied in when a read needs them (a
        # RolloutBuffer.sample of older steps does not).
        if start < 0 or start + steps > self.count or window > self.window or \
                self.core._generation != self.generation:
            self.catch_up(max(window, self.ring.last_id - first + 1))
            start = first - self.first
        stop = start + steps
        return tuple(x[start:stop] for x in self.steps[writable])

    def catch_up(self, window: int) -> None:
        """Copy in the steps added since the last read (the lock held); keep at least
        the newest ``window`` steps."""
        ring, core = self.ring, self.core
        window = min(window, ring.max_length)  # (older steps are not stored)
        last_id = ring.last_id
        synced = self.first + self.count - 1
        new = last_id - synced
        if core._generation != self.generation or window > self.window or new > self.window:
            self.window = max(window, self.window) if core._generation == self.generation \
                else window
            self.generation = core._generation
            held = min(self.window, ring.items_per_row)
            self._allocate()
            self.first, self.count = last_id - held + 1, 0
            self._fill(self.first, held)
            return
        if new <= 0:
            return
        if (self.count + new) * self.B > len(self.arrays[0]):  # full: move to fresh arrays
            keep = min(self.count, self.window - new)
            old = self.arrays
            self._allocate()
            rows = keep * self.B
            for dst, src in zip(self.arrays, old):
                dst[:rows] = src[(self.count - keep) * self.B:self.count * self.B]
            self.first, self.count = synced - keep + 1, keep
        self._fill(synced + 1, new)

    def _allocate(self) -> None:
        rows = (self.window + max(self.window // 4, 64)) * self.B
        self.arrays = tuple(np.empty((rows,) + shape, dtype)
                            for shape, dtype in zip(self.shapes, self.dtypes))
        # Written through views in storage's shapes (a scalar's trailing 1 dropped).
        self.targets = tuple(a.reshape((rows,) + src.shape[1:])
                             for a, src in zip(self.arrays, self.sources))
        outer = (rows // self.B,) + self.per_step
        writable = tuple(a.reshape(outer + a.shape[1:]) for a in self.arrays)
        read_only = tuple(a.view() for a in writable)
        for a in read_only:
            a.flags.writeable = False
        self.steps = (read_only, writable)

    def _fill(self, first: int, steps: int) -> None:
        """Copy steps ``first .. first + steps - 1`` (stored) to rows from ``count``."""
        if steps <= 0:
            return
        core, B, ring = self.core, self.B, self.ring
        capacity = ring.capacity
        row, n = self.count * B, steps * B
        end = row + n
        start = first % ring.max_length * B
        obs, act, rew, nxt, done = self.targets
        obs_s, act_s, rew_s, _, term_s = self.sources
        if start + n <= capacity:  # one run of storage (all but the wrap's)
            stop = start + n
            obs[row:end] = obs_s[start:stop]
            act[row:end] = act_s[start:stop]
            rew[row:end] = rew_s[start:stop]
            done[row:end] = term_s[start:stop]
            side = core._side_ref[start:stop]
        else:
            for dst, src in ((obs, obs_s), (act, act_s), (rew, rew_s), (done, term_s)):
                _copy_rows(dst, row, src, start, n, capacity)
            side = np.empty(n, np.int64)
            _copy_rows(side, 0, core._side_ref, start, n, capacity)
        self.count += steps
        # A step's next observation is the following step's observation (just copied,
        # but for the last step's), except where the side store keeps the one added
        # (episode ends, out-of-sequence adds); the newest step's is its own (head),
        # for every env (also where it ended: the side store holds the same).
        newest = end - B
        if steps > 1:
            nxt[row:newest] = obs[row + B:end]
        if first + steps - 1 == ring.last_id:
            nxt[newest:end] = core._head_next[0]
            side = side[:n - B]
        else:
            _copy_rows(nxt, newest, obs_s, start + n, B, capacity)
        if len(side):
            from_side = side >= 0
            if np.count_nonzero(from_side):
                nxt[row + np.flatnonzero(from_side)] = core._side.take(side[from_side])[0]


def _strided_for_torch(x: np.ndarray) -> np.ndarray:
    """``x`` where ``torch.from_numpy`` takes it as is (C-contiguous, or strides that
    are non-negative multiples of the item size: a packed record's field view, a
    ``swapaxes``), else a C-contiguous copy."""
    if x.flags.c_contiguous:
        return x
    size = x.itemsize
    if all(s >= 0 and s % size == 0 for s in x.strides):
        return x
    return np.ascontiguousarray(x)


def _copy_rows(dst: np.ndarray, at: int, src: np.ndarray, start: int, n: int,
               capacity: int) -> None:
    """``dst[at:at + n] = src[start:start + n]``, rows of ``src`` taken modulo
    ``capacity`` (``n <= capacity``): one copy, or two where they wrap."""
    start %= capacity
    if start + n <= capacity:
        dst[at:at + n] = src[start:start + n]
        return
    cut = capacity - start
    dst[at:at + cut] = src[start:]
    dst[at + cut:at + n] = src[:n - cut]


def _kind_of(dtype: Any) -> TrajectoryType | None:
    """What ``dtype`` asks for, cheaply; ``None`` where ``_trajectory_type`` decides (and
    raises for what it refuses)."""
    if type(dtype) is str:
        return _KINDS.get(dtype)
    return dtype if isinstance(dtype, TrajectoryType) else None


def _check_held(core: TransitionReplayBuffer, low: int, high: int) -> None:
    """``EmptyBufferError`` unless steps ``low..high`` are stored (``_read_steps``'s)."""
    ring = core._ring
    if ring.last_id < 0:
        raise core.empty_error()
    if low < ring.oldest_id or high > ring.last_id:
        raise EmptyBufferError(f"steps {low}..{high} are not stored "
                               f"(held: {ring.oldest_id}..{ring.last_id})")
