"""SB3's spaces as the specs of replaybuffer's transition buffers, shaped as SB3 stores
them (``get_obs_shape``, ``get_action_dim``): for :mod:`replaybuffer.integrations.sb3`."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.preprocessing import get_action_dim

from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec, BoundedArraySpec


def observation_spec(space: spaces.Space[Any]) -> tuple[Any, frozenset[str] | bool]:
    """The core's observation spec for ``space`` and which leaves are Discrete (a set of
    Dict keys, or a bool)."""
    if isinstance(space, spaces.Dict):
        specs = {key: space_spec(sub, f"observation_space[{key!r}]", observation=True)
                 for key, sub in space.spaces.items()}
        return specs, frozenset(k for k, s in space.spaces.items()
                                if isinstance(s, spaces.Discrete))
    spec = space_spec(space, "observation_space", observation=True)
    return spec, isinstance(space, spaces.Discrete)


def action_spec(space: spaces.Space[Any]) -> ArraySpec:
    """``[action_dim]`` as SB3 stores actions: float64 kept as float32; Box unbounded
    (the scaled actions SB3 stores are not in the env's bounds)."""
    spec = space_spec(space, "action_space", observation=False)
    shape = (get_action_dim(space),)
    if isinstance(spec, BoundedArraySpec):
        return BoundedArraySpec(shape, spec.dtype, spec.minimum.reshape(-1),
                                spec.maximum.reshape(-1))
    return ArraySpec(shape, np.float32 if spec.dtype == np.float64 else spec.dtype)


def space_spec(space: spaces.Space[Any], where: str, observation: bool) -> ArraySpec:
    """One leaf's spec with SB3's shape (``get_obs_shape``: ``(1,)`` for Discrete)."""
    if isinstance(space, spaces.Box):
        return ArraySpec(space.shape, space.dtype)
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return BoundedArraySpec((1,), space.dtype, start, start + int(space.n) - 1)
    if isinstance(space, spaces.MultiDiscrete) and np.ndim(space.nvec) == 1:
        first = np.asarray(space.start)
        return BoundedArraySpec(space.shape, space.dtype, first, first + space.nvec - 1)
    if isinstance(space, spaces.MultiBinary) and (observation or np.ndim(space.n) == 0):
        return BoundedArraySpec(space.shape, space.dtype, 0, 1)
    kinds = "Box, Discrete, MultiDiscrete (1-D), MultiBinary" + \
        (" or a Dict of them" if observation else " (1-D)")
    raise SpecError(f"{where}: expected {kinds}, got {space!r}")
