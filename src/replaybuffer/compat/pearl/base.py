"""Pearl's abstract buffer (:class:`BaseBuffer`): the core buffer it holds, Pearl's
state (``pos``, ``full``, the stored arrays), saves, and the helpers its subclasses
read and write with."""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Union, overload

import numpy as np

from replaybuffer import nest
from replaybuffer.buffers.transitions import TransitionReplayBuffer
from replaybuffer.compat.pearl.inputs import PearlInputs
from replaybuffer.compat.pearl.outputs import FastPaths, PearlOutputs
from replaybuffer.compat.pearl.trajectories import TrajectoryType, get_space_shape
from replaybuffer.errors import CheckpointError, EmptyBufferError
from replaybuffer.specs import spec_from_space
from replaybuffer.storage.base import to_numpy


class BaseBuffer(PearlInputs, PearlOutputs, ABC):
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
                 _rng_state: Any = None, **core_kwargs: Any):
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
        if _rng_state is not None:  # restored by load(): the generator continues
            self._rng.bit_generator.state = _rng_state
        if _core is not None:  # restored by load(): the core comes from the save
            self.core = _core
        else:
            self.core = self._make_core(spec_from_space(observation_space),
                                        spec_from_space(action_space),
                                        self.buffer_size * num_envs, num_envs=num_envs,
                                        seed=seed, memory=memory, **core_kwargs)
        # Steps each env holds (the core's ring: fixed for its life).
        self._max_length = self.core.max_length
        # The core's stored leaves, by path (the spec's nest flattened).
        data_spec = self.core.data_spec
        self._paths = nest.leaf_paths(data_spec)
        self._specs = list(nest.flatten(data_spec)[0])
        # The common case's shortcuts (None where the core is not one they serve).
        self._fast = FastPaths.of(self, self._action_path)
        # Whether _add may hand the core an env's arrays as they come: one array leaf
        # each for observation and action, neither a scalar (Pearl gave those a
        # trailing 1, which _batched drops).
        paths, specs, obs = self._paths, self._specs, "['observation']"
        self._direct = obs in paths and self._action_path in paths and \
            specs[paths.index(self._action_path)].shape != () and \
            specs[paths.index(obs)].shape != ()
        # The core's shortcuts that add_trajectory hands the usual step to (inputs.py).
        direct = self._direct
        self._add_single = self.core.add_single if direct and not vector else None
        self._add_usual = self.core.add_usual if direct and vector else None
        # add_trajectory as the core's one-call adder of the usual step (inputs.py).
        self._step_add = self._compile_add() if direct else None
        if self._step_add is not None:
            self.add_trajectory = self._step_add  # type: ignore[method-assign]

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
        if path not in self._paths:
            raise TypeError(f"{path} is not one stored array in {type(self).__name__} (the "
                            "space is a nest): read core.all() instead")
        array = to_numpy(self.core.store.arrays[self._paths.index(path)])
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
            self.add_trajectory(index_of(observations, i), actions[i], rewards[i],
                                index_of(next_observations, i), dones[i], truncated[i])

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
                     _core=core, _rng_state=rng, **kwargs)
        saved_obs, saved_act = core.observation_spec, core.action_spec
        if (buffer.num_envs, buffer.vector) != (num_envs, vector) or \
                spec_from_space(buffer.observation_space) != saved_obs or \
                spec_from_space(buffer.action_space) != saved_act:
            raise CheckpointError(f"the spaces given do not match the save in {directory}: "
                                  f"saved observation {saved_obs!r}, action "
                                  f"{saved_act!r}, num_envs={num_envs}")
        return buffer

    # ------------------------------------------------------------- helpers
    def _empty_error(self) -> EmptyBufferError:
        """The error for sampling with nothing stored, naming this class (the user's),
        not the core buffer under it."""
        return EmptyBufferError(
            f"{type(self).__name__} of replaybuffer.compat.pearl is empty. Add transitions "
            f"(add_trajectory or add_batch_trajectories) before sampling.")

    def _core_sample(self, batch_size: int) -> Any:
        """The core's ``sample(batch_size)``, its error for an empty buffer replaced by
        :meth:`_empty_error` (it would name the core's class). The core decides (under its
        lock, after its rate limiter) whether it is empty."""
        try:
            return self.core.sample(batch_size)
        except EmptyBufferError:
            if self.core.last_id < 0:
                raise self._empty_error() from None
            raise

    def _read_steps(self, ids: np.ndarray) -> Any:
        """The transitions of steps ``ids`` (``[K]``) of every env: ``[num_envs, K]``."""
        return self.core.read_steps(ids)

    def _draw_steps(self, batch_size: int) -> np.ndarray:
        """``batch_size`` step ids drawn uniformly (with replacement) from those stored."""
        core = self.core
        last_id = core.last_id
        if last_id < 0:
            raise self._empty_error()
        oldest = max(0, last_id + 1 - self._max_length)
        return oldest + draw(self._rng, last_id + 1 - oldest, count_of(batch_size, "batch_size"))

    def _last(self, batch_size: int, flatten_env: bool, dtype: Any, read: Any = None) -> Any:
        """The ``batch_size`` most recent transitions of each env (``read(k)`` reads
        ``k`` per env; default the core's ``last``)."""
        fast = self._fast if read is None and (self.num_envs > 1 or not self.vector) else None
        read = read or self.core.last
        count = count_of(batch_size, "batch_size")
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
        core = self.core
        if core.last_id < 0:  # after reset(): on-policy loops call all() regardless
            return self._output(self._nothing(), flatten_env, dtype)
        fast = self._fast
        if fast is not None and (self.num_envs > 1 or not self.vector):
            return fast.run(None, None, flatten_env and self.vector, None, dtype,
                            self._max_length)
        return self._output(self.core.all(), flatten_env, dtype)

    def _nothing(self) -> Any:
        """The core's transitions of no step, shaped as its ``last`` gives them: leaves
        ``[num_envs, 0, ...]`` (``[0, ...]`` for one env)."""
        core = self.core
        batch = core.read_steps(np.zeros(0, np.int64))
        return batch if core.num_envs > 1 else nest.map_structure(lambda x: x[0], batch)


def count_of(value: Any, name: str) -> int:
    """``value`` as a positive int; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


@overload
def draw(rng: np.random.Generator, n: int, size: None = None) -> int: ...


@overload
def draw(rng: np.random.Generator, n: int, size: int) -> np.ndarray: ...


def draw(rng: np.random.Generator, n: int, size: int | None = None) -> int | np.ndarray:
    """Uniform draws from ``range(n)``: an int, or int64 ``[size]``.

    Raw 64-bit draws reduced modulo ``n``, as the core's samplers draw (a quarter of the
    cost of ``Generator.integers`` for one number), with a bias below ``n / 2**64``."""
    if size is None:
        return rng.bit_generator.random_raw() % n
    draws: np.ndarray = (rng.bit_generator.random_raw(size) % np.uint64(n)).view(np.int64)
    return draws  # (numpy's stubs type the uint64 modulo as Any)


def index_of(value: Any, i: int) -> Any:
    """Row ``i`` of ``value`` (of each value of a dict)."""
    if isinstance(value, dict):
        return {key: v[i] for key, v in value.items()}
    return value[i]
