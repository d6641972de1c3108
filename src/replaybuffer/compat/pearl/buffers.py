"""Pearl's buffers: :class:`ReplayBuffer` (off-policy), :class:`RolloutBuffer`
(on-policy) and :class:`HERBuffer` (hindsight experience replay), each over its core
buffer (see :mod:`replaybuffer.compat.pearl`)."""

from __future__ import annotations

import math
from typing import Any, Union

import numpy as np

from replaybuffer import nest
from replaybuffer.buffers.her import HERBuffer as _HERCore
from replaybuffer.buffers.her import compute_reward_of, parse_goal_selection_strategy
from replaybuffer.buffers.rollout import RolloutBuffer as _RolloutCore
from replaybuffer.compat.pearl.base import BaseBuffer, count_of, draw
from replaybuffer.compat.pearl.trajectories import (DictTrajectories, GoalSelectionStrategy,
                                                    Trajectories, TrajectoryType)
from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling.ring import items_per_row, oldest_id


class TrajectoryReads(BaseBuffer):
    """A Pearl buffer whose ``last()`` and ``all()`` give :class:`Trajectories`."""

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


class ReplayBuffer(TrajectoryReads):
    """Pearl's off-policy buffer: uniform replay over a
    :class:`~replaybuffer.TransitionReplayBuffer` (observations stored once, exact next
    observations)."""

    _compiled_add = True  # add_trajectory: the core's one-call adder first (inputs.py)

    def reset(self) -> None:
        super().reset()

    def add_trajectory(self, observation: Any, action: Any, reward: Any,
                       next_observation: Any, done: Any, truncated: Any = None) -> None:
        """Add one transition; with a vector env every argument has the env axis first.

        ``done`` is gymnasium's ``terminated``; ``truncated`` marks time limits.
        """
        # The fallback of the core's one-call adder that stands in for this method on
        # each buffer (inputs.py).
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
            fields = fast.sample(count_of(batch_size, "batch_size"))
            if fields is not None:
                return fast.output(fields, dtype)
        batch, _ = self._core_sample(batch_size)
        out = self._output(batch, flatten_env, dtype, env_axis=False)
        return out


class RolloutBuffer(TrajectoryReads):
    """Pearl's on-policy buffer over a :class:`~replaybuffer.RolloutBuffer`.

    ``core.compute_returns_and_advantages(...)`` and ``core.minibatches(...)`` add GAE
    and shuffled minibatches, which Pearl left to its agents.
    """

    _core_class = _RolloutCore
    core: _RolloutCore
    _action_path = "['action']['action']"
    _compiled_add = True  # as ReplayBuffer's

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
        count = count_of(batch_size, "batch_size")
        steps = math.ceil(count / self.num_envs) if flatten_env and self.vector else count
        core = self.core
        last_id = core.last_id
        held = items_per_row(last_id, self._max_length)
        if held == 0:
            raise self._empty_error()
        if steps > held:
            raise EmptyBufferError(f"Requesting {count} samples when only "
                                   f"{held * (self.num_envs if flatten_env else 1)} samples "
                                   "have been collected")
        start = oldest_id(last_id, self._max_length) + draw(self._rng, held - steps + 1)
        fast = self._fast
        if fast is not None:
            flat = flatten_env and self.vector
            return fast.run(start, steps, flat, count if flat else None, dtype,
                            self._max_length)
        batch = self._read_steps(np.arange(start, start + steps, dtype=np.int64))
        if not self.vector:
            batch = nest.map_structure(lambda x: x[0], batch)
        out: Trajectories = self._output(batch, flatten_env, dtype, keep=count)
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
        out = np.zeros(self.desired_goals.shape, self.desired_goals.dtype)
        flat = out.reshape((-1,) + out.shape[1 + self.vector:])  # by storage position
        flat[...] = self.core.next_achieved_goals()
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
        batch, _ = self._core_sample(count_of(batch_size, "batch_size"))
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
