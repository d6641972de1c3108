"""Pearl's types: what compat.pearl's reads return (:class:`Trajectories`), the
``dtype`` they take (:class:`TrajectoryType`), HER's strategies, and Pearl's shape of a
gymnasium space."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, Union

import numpy as np

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


def trajectory_type(dtype: Union[str, TrajectoryType]) -> TrajectoryType:
    """``dtype`` (``"numpy"``, ``"torch"`` in any case, or a :class:`TrajectoryType`) as a
    :class:`TrajectoryType`; ``ValueError`` for anything else."""
    if isinstance(dtype, TrajectoryType):
        return dtype
    if isinstance(dtype, str):
        return TrajectoryType(dtype.lower())  # ValueError for anything else
    raise ValueError(f"dtype must be 'numpy' or 'torch', got {dtype!r}")


def kind_of(dtype: Any) -> TrajectoryType | None:
    """What ``dtype`` asks for, cheaply; ``None`` where :func:`trajectory_type` decides
    (and raises for what it refuses)."""
    if type(dtype) is str:
        return _KINDS.get(dtype)
    return dtype if isinstance(dtype, TrajectoryType) else None


_KINDS = {"numpy": TrajectoryType.NUMPY, "torch": TrajectoryType.TORCH}
