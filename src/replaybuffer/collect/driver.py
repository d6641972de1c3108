"""Drivers: step an environment with a policy and hand each step to observers.

An observer is any callable taking one batched :class:`Trajectory` (every leaf has a
leading env axis, 1 for a single environment), so a buffer's ``add_batch`` is an
observer as it stands. Boundary steps (the reset between episodes) reach the
observers but do not count as environment steps.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from replaybuffer import nest
from replaybuffer.collect.env import BatchedEnv
from replaybuffer.collect.trajectory import StepType, Trajectory, trajectory_spec
from replaybuffer.errors import SpecError
from replaybuffer.specs import (ArraySpec, BoundedArraySpec, as_leaf_array, can_store,
                                check_leaf, spec_from_space)

Observer = Callable[[Trajectory], Any]


class PolicyStep(NamedTuple):
    """What a policy may return instead of bare actions: actions plus auxiliary info."""

    action: Any
    info: Any = ()


Policy = Callable[[Any], Any]
"""Maps a batch of observations (leading env axis) to a batch of actions or a PolicyStep."""


class Driver:
    """The shared stepping logic of :class:`StepDriver` and :class:`EpisodeDriver`.

    Args:
        env: a ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv`` (next-step autoreset).
        policy: batch of observations -> batch of actions (or a :class:`PolicyStep`).
        observers: callables receiving each batched :class:`Trajectory`.
        policy_info_spec: spec of the policy's ``PolicyStep.info`` (default: none).
        seed: seeds the first environment reset.

    Raises:
        SpecError: at construction, when an observer is a buffer's ``add_batch`` whose
            data spec does not match the environment's trajectories.
    """

    def __init__(self, env: Any, policy: Policy, observers: Sequence[Observer] = (), *,
                 policy_info_spec: Any = (), seed: int | None = None):
        self.env = BatchedEnv(env)
        self.policy = policy
        self.observers = list(observers)
        self.data_spec = trajectory_spec(spec_from_space(self.env.observation_space),
                                         spec_from_space(self.env.action_space),
                                         policy_info_spec)
        self._action_specs, self._action_structure = nest.flatten(self.data_spec.action)
        self._action_paths = nest.leaf_paths(self.data_spec.action)
        self._seed = seed
        self._obs: Any = None
        self._step_type = np.full(self.env.num_envs, StepType.FIRST, np.int32)
        for observer in self.observers:
            _check_buffer_observer(observer, self.data_spec)

    @property
    def num_envs(self) -> int:
        return self.env.num_envs

    def reset(self, seed: int | None = None) -> None:
        """Start new episodes in every environment at the next step."""
        self._obs = self.env.reset(seed=seed)
        self._step_type = np.full(self.env.num_envs, StepType.FIRST, np.int32)

    def step(self) -> Trajectory:
        """Take one step in every environment and notify the observers."""
        if self._obs is None:
            self.reset(self._seed)
        out = self.policy(self._obs)
        action, info = (out.action, out.info) if isinstance(out, PolicyStep) else (out, ())
        action = self._check_action(action)
        next_obs, reward, terminated, truncated = self.env.step(action)
        boundary = self._step_type == StepType.LAST
        ended = (terminated | truncated) & ~boundary
        next_step_type = np.where(boundary, StepType.FIRST,
                                  np.where(ended, StepType.LAST, StepType.MID)).astype(np.int32)
        # Termination zeroes the discount; truncation keeps it, so targets bootstrap.
        discount = np.where(terminated & ~boundary, 0.0, 1.0).astype(np.float32)
        reward = np.where(boundary, 0.0, reward).astype(np.float32)
        trajectory = Trajectory(self._step_type, self._obs, action, info, next_step_type,
                                reward, discount)
        for observer in self.observers:
            observer(trajectory)
        self._obs, self._step_type = next_obs, next_step_type
        return trajectory

    def _check_action(self, action: Any) -> Any:
        leaves, structure = nest.flatten(action)
        if structure != self._action_structure:
            raise SpecError(f"policy returned actions of structure {nest.describe(structure)}; "
                            f"the action space needs {nest.describe(self._action_structure)}")
        outer = (self.env.num_envs,)
        checked = []
        for leaf, spec, path in zip(leaves, self._action_specs, self._action_paths):
            where = f"action{path if path != '<root>' else ''}"
            arr = as_leaf_array(leaf, where)
            try:
                check_leaf(where, arr.shape, arr.dtype, spec, outer, f"[num_envs={outer[0]}]")
            except SpecError as exc:
                # A single env is driven as a batch of one: the usual slip is a bare action.
                hint = ("; a single env is driven as a batch of one: the policy gets "
                        "observations [1, ...] and returns actions [1, ...]"
                        if not self.env.vector and arr.shape == spec.shape else "")
                raise SpecError(f"policy returned bad actions: {exc}{hint}") from None
            if isinstance(spec, BoundedArraySpec) and spec.dtype.kind in "iu" and arr.size and (
                    (arr < spec.minimum).any() or (arr > spec.maximum).any()):
                raise SpecError(f"policy returned actions outside [{spec.minimum.min()}, "
                                f"{spec.maximum.max()}] (the action space's bounds) in "
                                f"{where}: {arr.tolist()}")
            checked.append(arr.astype(spec.dtype, copy=False))
        return structure.unflatten(checked)


class StepDriver(Driver):
    """Collects ``num_steps`` environment steps per :meth:`run` (summed over envs).

    Boundary steps reach observers but are not counted; with several environments a
    run may overshoot by up to ``num_envs - 1`` steps, never stop short.
    """

    def __init__(self, env: Any, policy: Policy, observers: Sequence[Observer] = (),
                 num_steps: int = 1, **kwargs: Any):
        super().__init__(env, policy, observers, **kwargs)
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
        self.num_steps = num_steps

    def run(self) -> int:
        """Step until ``num_steps`` steps were taken; returns the steps counted."""
        counted = 0
        while counted < self.num_steps:
            counted += int((~self.step().is_boundary()).sum())
        return counted


class EpisodeDriver(Driver):
    """Collects ``num_episodes`` episodes per :meth:`run` (summed over envs).

    As TF-Agents' episode driver does, an episode counts at the step that ends it
    (``trajectory.is_last()``), and a run stops right after the step that brings the
    count to ``num_episodes``: with a vector env it may end more than one episode at
    once, so a run counts from ``num_episodes`` to ``num_episodes + num_envs - 1``.
    The boundary step that carries an ended episode's final observation is delivered
    first thing in the next run (the driver keeps its place), so consecutive runs hand
    the observers exactly the trajectories one long run would. ``max_steps`` bounds a
    run (default: no bound).
    """

    def __init__(self, env: Any, policy: Policy, observers: Sequence[Observer] = (),
                 num_episodes: int = 1, *, max_steps: int | None = None, **kwargs: Any):
        super().__init__(env, policy, observers, **kwargs)
        if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or \
                num_episodes < 1:
            raise ValueError(f"num_episodes must be a positive int, got {num_episodes!r}")
        self.num_episodes = num_episodes
        self.max_steps = max_steps

    def run(self) -> int:
        """Step until ``num_episodes`` episodes ended; returns the episodes counted."""
        episodes = steps = 0
        while episodes < self.num_episodes:
            trajectory = self.step()
            episodes += int(trajectory.is_last().sum())
            steps += int((~trajectory.is_boundary()).sum())
            if self.max_steps is not None and steps >= self.max_steps:
                break
        return episodes


def _check_buffer_observer(observer: Observer, data_spec: Trajectory) -> None:
    """A buffer's ``add_batch`` must accept the driver's trajectories; say so up front."""
    buffer = getattr(observer, "__self__", None)
    spec = getattr(buffer, "data_spec", None)
    if spec is None or getattr(observer, "__name__", "") not in ("add_batch", "extend"):
        return
    want, want_structure = nest.flatten(spec)
    have, have_structure = nest.flatten(data_spec)
    if want_structure != have_structure:
        raise SpecError(f"the buffer's data_spec has structure {nest.describe(want_structure)} "
                        f"but the environment gives trajectories of "
                        f"{nest.describe(have_structure)}: build the buffer from the "
                        "driver's spec, StepDriver(env, policy).data_spec")
    for path, w, h in zip(nest.leaf_paths(spec), want, have):
        if isinstance(w, ArraySpec) and (w.shape != h.shape or not can_store(h.dtype, w.dtype)):
            raise SpecError(f"the buffer's leaf {path} is {w.shape} {w.dtype.name} but the "
                            f"environment gives {h.shape} {h.dtype.name}")
