"""The collectors' policy in the actor-process and Ray demos: an epsilon-greedy numpy copy
of the learner's Q-network, refreshed from wherever the learner publishes its parameters."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from replaybuffer_demos.dqn_learner import DQNConfig


class EpsilonGreedyMLP:
    """An actor's policy: ``argmax`` of a numpy ReLU MLP (``torch.nn.Linear`` layers'
    ``[weight, bias]`` pairs, from ``weights.read()``, which gives a newer list or
    None), random actions with the epsilon of the run's ``steps()`` so far.

    Observations ``[num_envs, obs_dim]`` float32 to int64 actions ``[num_envs]``.
    """

    def __init__(self, weights: Any, steps: Callable[[], int], config: DQNConfig,
                 num_actions: int, index: int):
        self.weights, self.steps, self.config = weights, steps, config
        self.num_actions = num_actions
        self.rng = np.random.default_rng([config.seed, index])
        self.layers: list[np.ndarray] = []
        while not self.layers:  # the learner publishes before starting actors
            self.layers = weights.read() or []

    def epsilon(self) -> float:
        config = self.config
        frac = min(1.0, self.steps() / max(1, int(config.epsilon_fraction * config.steps)))
        return config.epsilon_start + frac * (config.epsilon_end - config.epsilon_start)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """float32 ``[N, num_actions]`` Q-values of observations ``[N, obs_dim]`` under the
        parameters this policy acts with now."""
        h = np.asarray(obs, np.float32)
        for k in range(0, len(self.layers), 2):
            h = h @ self.layers[k].T + self.layers[k + 1]
            if k + 2 < len(self.layers):
                np.maximum(h, 0, out=h)
        return h

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        fresh = self.weights.read()
        if fresh is not None:
            self.layers = fresh
        h = self.q_values(obs)
        greedy = h.argmax(1)
        explore = self.rng.random(len(h)) < self.epsilon()
        return np.where(explore, self.rng.integers(0, self.num_actions, len(h)), greedy)
