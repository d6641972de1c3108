"""Generalised advantage estimation (GAE, Schulman et al. 2016) over stored rollouts:
the arithmetic of :meth:`replaybuffer.RolloutBuffer.compute_returns_and_advantages`."""

from __future__ import annotations

import numpy as np


def generalized_advantages(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
                           terminated: np.ndarray, cut: np.ndarray, gamma: float,
                           gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """Returns and advantages of ``[num_envs, T]`` steps, oldest step first.

    Args:
        rewards, values: ``[num_envs, T]``: each step's reward and ``V(observation)``.
        next_values: float64 ``[num_envs, T]``: ``V`` of each step's next observation
            (changed in place: zero where ``terminated``).
        terminated: bool ``[num_envs, T]``: the step ended its episode by termination
            (no bootstrap).
        cut: bool ``[num_envs, T]``: the next stored step does not continue the step's
            trajectory (a truncation, an out-of-sequence add); the newest step never
            continues.
        gamma, gae_lambda: the discount and GAE's ``lambda``.

    Returns:
        ``(returns, advantages)``: float32 ``[num_envs, T]``::

            delta_t = reward_t + gamma * V(next_observation_t) * (1 - terminated_t) - value_t
            A_t     = delta_t + gamma * lambda * A_{t+1}   (only while the trajectory goes on)
            R_t     = A_t + value_t
    """
    next_values[terminated] = 0.0
    # The trace flows into the next stored step only if it continues this trajectory.
    continues = ~(cut | terminated)
    continues[:, -1] = False
    deltas = rewards + gamma * next_values - values
    advantages = np.empty(rewards.shape, np.float64)
    running = np.zeros(rewards.shape[0], np.float64)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = deltas[:, t] + gamma * gae_lambda * continues[:, t] * running
        advantages[:, t] = running
    returns = (advantages + values).astype(np.float32)
    return returns, advantages.astype(np.float32)
