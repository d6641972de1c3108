"""``Trajectory``: the item a driver hands to observers, one per environment step.

A trajectory describes the transition from time step ``t`` to ``t + 1``:
``step_type``, ``observation``, ``action`` and ``policy_info`` belong to ``t``;
``next_step_type``, ``reward`` and ``discount`` to ``t + 1``. Reading a buffer of
trajectories with ``num_steps=2`` gives the next observation as the second step's
``observation``.

Episode ends follow TF-Agents' convention, with gymnasium's two kinds of end kept
apart by the discount:

* the step that ends an episode has ``next_step_type == LAST``; its discount is
  ``0.0`` when the episode *terminated* (no value after it) and ``1.0`` when it was
  *truncated* (a time limit: the value of the next state still counts);
* the following step is a *boundary* (``LAST -> FIRST``): its observation is the
  episode's true final observation, its reward 0 and discount 1, and its action is
  ignored by the environment, which resets. Learners skip boundary steps
  (``is_boundary``), and a ``num_steps=2`` window starting at the last real step
  sees the true final observation as its next observation.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import numpy as np

from replaybuffer import nest
from replaybuffer.specs import ArraySpec, BoundedArraySpec


class StepType(enum.IntEnum):
    """Where a time step sits in its episode (int32 in stored data)."""

    FIRST = 0
    MID = 1
    LAST = 2


class Trajectory(NamedTuple):
    """One environment step, as stored in a buffer (any leading batch/time dims).

    Attributes:
        step_type: int32, the :class:`StepType` of time step ``t``.
        observation: any nest, observed at ``t``.
        action: any nest, taken at ``t``.
        policy_info: any nest of auxiliary policy outputs at ``t`` (``()`` if none).
        next_step_type: int32, the :class:`StepType` of ``t + 1``.
        reward: float32, received on the transition to ``t + 1``.
        discount: float32, of ``t + 1``: 0 after termination, else 1.
    """

    step_type: Any
    observation: Any
    action: Any
    policy_info: Any
    next_step_type: Any
    reward: Any
    discount: Any

    def is_first(self) -> Any:
        """``step_type == FIRST``."""
        return self.step_type == StepType.FIRST

    def is_mid(self) -> Any:
        """``step_type == MID`` and ``next_step_type == MID``."""
        return (self.step_type == StepType.MID) & (self.next_step_type == StepType.MID)

    def is_last(self) -> Any:
        """``next_step_type == LAST``: this step ends its episode."""
        return self.next_step_type == StepType.LAST

    def is_boundary(self) -> Any:
        """``step_type == LAST``: the reset step between two episodes."""
        return self.step_type == StepType.LAST


def _make(step_type: int, next_step_type: int, observation: Any, action: Any,
          policy_info: Any, reward: Any, discount: Any) -> Trajectory:
    discount = np.asarray(discount, np.float32)
    outer = discount.shape
    return Trajectory(np.full(outer, step_type, np.int32), observation, action, policy_info,
                      np.full(outer, next_step_type, np.int32),
                      np.asarray(reward, np.float32), discount)


def first(observation: Any, action: Any, policy_info: Any, reward: Any,
          discount: Any) -> Trajectory:
    """A ``FIRST -> MID`` trajectory; the outer shape is ``discount``'s."""
    return _make(StepType.FIRST, StepType.MID, observation, action, policy_info, reward,
                 discount)


def mid(observation: Any, action: Any, policy_info: Any, reward: Any,
        discount: Any) -> Trajectory:
    """A ``MID -> MID`` trajectory."""
    return _make(StepType.MID, StepType.MID, observation, action, policy_info, reward, discount)


def last(observation: Any, action: Any, policy_info: Any, reward: Any,
         discount: Any) -> Trajectory:
    """A ``MID -> LAST`` trajectory."""
    return _make(StepType.MID, StepType.LAST, observation, action, policy_info, reward,
                 discount)


def single_step(observation: Any, action: Any, policy_info: Any, reward: Any,
                discount: Any) -> Trajectory:
    """A ``FIRST -> LAST`` trajectory (a one-step episode, as in bandits)."""
    return _make(StepType.FIRST, StepType.LAST, observation, action, policy_info, reward,
                 discount)


def boundary(observation: Any, action: Any, policy_info: Any, reward: Any,
             discount: Any) -> Trajectory:
    """A ``LAST -> FIRST`` trajectory: the reset between two episodes."""
    return _make(StepType.LAST, StepType.FIRST, observation, action, policy_info, reward,
                 discount)


def trajectory_spec(observation_spec: Any, action_spec: Any,
                    policy_info_spec: Any = ()) -> Trajectory:
    """The data spec of a :class:`Trajectory` (no batch dimension)."""
    step = BoundedArraySpec((), np.int32, StepType.FIRST, StepType.LAST)
    return Trajectory(step_type=step.replace(name="step_type"), observation=observation_spec,
                      action=action_spec, policy_info=policy_info_spec,
                      next_step_type=step.replace(name="next_step_type"),
                      reward=ArraySpec((), np.float32, "reward"),
                      discount=BoundedArraySpec((), np.float32, 0.0, 1.0, "discount"))


def to_transition(trajectory: Trajectory) -> tuple[Trajectory, Trajectory, Any]:
    """Split ``[B, T]`` trajectories into ``(current, next, valid)`` for 1-step learning.

    ``current`` is ``trajectory[:, :-1]`` and ``next`` is ``trajectory[:, 1:]`` on every
    leaf; ``valid`` (bool ``[B, T - 1]``) is false where the current step is a boundary,
    whose "transition" only resets the environment. The target of step ``t`` is
    ``current.reward + gamma * current.discount * V(next.observation)``.
    """
    current = nest.map_structure(lambda x: x[:, :-1], trajectory)
    following = nest.map_structure(lambda x: x[:, 1:], trajectory)
    return current, following, ~Trajectory(*current).is_boundary()
