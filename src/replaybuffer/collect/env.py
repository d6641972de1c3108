"""A gymnasium environment seen as a batch of environments with next-step autoreset.

Drivers need one view of single and vector environments: ``reset()`` returns
observations with a leading env axis, and ``step(actions)`` follows gymnasium's
``NEXT_STEP`` autoreset: the step after an episode ends resets that environment,
ignores its action and reports reward 0, not terminated, not truncated. A single
``gymnasium.Env`` is adapted to behave the same way with an env axis of 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer import nest


class BatchedEnv:
    """Wraps ``env`` (a ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv``).

    Attributes:
        num_envs: size of the env axis (1 for a single env).
        observation_space, action_space: the spaces of one environment.
    """

    def __init__(self, env: Any):
        import gymnasium as gym

        self.env = env
        if isinstance(env, gym.vector.VectorEnv):
            from gymnasium.vector import AutoresetMode

            mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
            if mode != AutoresetMode.NEXT_STEP:
                raise ValueError(f"vector env autoreset_mode is {mode}; drivers need "
                                 "AutoresetMode.NEXT_STEP (gymnasium's default), which keeps "
                                 "each episode's final observation as a step of its own")
            self.vector = True
            self.num_envs = int(env.num_envs)
            self.observation_space = env.single_observation_space
            self.action_space = env.single_action_space
        elif isinstance(env, gym.Env):
            self.vector = False
            self.num_envs = 1
            self.observation_space = env.observation_space
            self.action_space = env.action_space
            self._ended = False
        else:
            raise TypeError(f"expected a gymnasium Env or VectorEnv, got {type(env).__name__}")

    def reset(self, seed: int | None = None) -> Any:
        """Reset every environment; observations with a leading env axis."""
        obs, _ = self.env.reset(seed=seed)
        if self.vector:
            return obs
        self._ended = False
        return _batch1(obs)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """``(observations, rewards, terminated, truncated)``, each with the env axis."""
        if self.vector:
            obs, reward, terminated, truncated, _ = self.env.step(actions)
            return obs, np.asarray(reward), np.asarray(terminated), np.asarray(truncated)
        if self._ended:  # next-step autoreset, as vector envs do
            obs, _ = self.env.reset()
            self._ended = False
            return _batch1(obs), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool)
        obs, reward, terminated, truncated, _ = self.env.step(
            nest.map_structure(lambda a: a[0], actions))
        self._ended = bool(terminated or truncated)
        return (_batch1(obs), np.asarray([reward]), np.asarray([terminated]),
                np.asarray([truncated]))


def _batch1(obs: Any) -> Any:
    return nest.map_structure(lambda x: np.asarray(x)[None], obs)
