"""What every DQN demo's learner shares: the configuration and result, the Q-network, the
double-DQN gradient step, the learning-rate decay, the greedy evaluations that select the
network (:class:`Selection`), and the start of a learner whose collectors run elsewhere
(:func:`learner`).

The single-process demo (:mod:`replaybuffer_demos.dqn`), the actor-process demo
(:mod:`replaybuffer_demos.dqn_actors`) and the Ray demo (:mod:`replaybuffer_demos.dqn_ray`)
import it; it imports none of them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

import replaybuffer as rb
from replaybuffer.collect import StepDriver, to_transition

ENV_ID = "CartPole-v1"
FINAL_EVAL_SEED = 10_000  # the final evaluation never reuses a selection seed


@dataclass
class DQNConfig:
    """Hyper-parameters; the defaults solve CartPole-v1 in about a minute on 2 cores."""

    steps: int = 50_000
    seed: int = 0
    num_envs: int = 1
    buffer_length: int = 50_000
    sample_batch_size: int = 64
    learning_starts: int = 1_000
    collect_steps: int = 256          # environment steps per driver run
    gradient_steps: int = 128         # gradient steps after each run
    learning_rate: float = 2.3e-3
    gamma: float = 0.99
    target_update: int = 128          # gradient steps between target-network copies
    epsilon_start: float = 1.0
    epsilon_end: float = 0.04
    epsilon_fraction: float = 0.16    # of all steps, to decay epsilon linearly
    hidden: tuple[int, ...] = (256, 256)
    lr_final_fraction: float = 0.0    # the learning rate decays linearly to this share
    eval_every: int = 2_500
    eval_episodes: int = 5
    final_eval_episodes: int = 10
    stop_at: float = 475.0            # stop once the greedy return reaches this ...
    stop_after: int = 3               # ... in this many evaluations in a row (0: never)
    storage: str = "torch"
    prioritized: bool = False         # proportional prioritized replay instead of uniform
    alpha: float = 0.6
    beta: float = 0.4                 # annealed to 1 over the run
    priority_epsilon: float = 1e-3    # added to |TD error| so no step is starved


@dataclass
class DQNResult:
    """What a DQN run returns: the selected network's score, the run's curve and evaluations."""

    config: DQNConfig
    final_return: float               # greedy return of the selected network
    last_network_return: float        # greedy return of the network at the end
    best_step: int
    wall_seconds: float
    steps_trained: int                # environment steps taken (fewer if stopped early)
    stopped_early: bool
    curve: list[tuple[int, float]] = field(default_factory=list)        # (step, avg return)
    evaluations: list[tuple[int, float]] = field(default_factory=list)  # (step, greedy)
    gradient_steps: int = 0           # the learner's updates (replay ratio: * batch / steps)


def build_q_network(obs_dim: int, num_actions: int, hidden: tuple[int, ...]) -> Any:
    """An MLP ``[N, obs_dim]`` float32 -> ``[N, num_actions]`` Q-values (ReLU between layers)."""
    import torch.nn as nn

    layers: list[Any] = []
    width = obs_dim
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_actions))
    return nn.Sequential(*layers)


def greedy_return(q_network: Any, episodes: int, seed: int) -> float:
    """Average undiscounted return of the greedy policy over ``episodes`` episodes."""
    import gymnasium as gym
    import torch

    env = gym.make(ENV_ID)
    total = 0.0
    with torch.no_grad():
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            done = False
            while not done:
                q = q_network(torch.as_tensor(obs, dtype=torch.float32)[None])
                obs, reward, terminated, truncated, _ = env.step(int(q.argmax(1)))
                total += float(reward)
                done = terminated or truncated
    env.close()
    return total / episodes


def decay_learning_rate(optimizer: Any, config: DQNConfig, steps: int) -> None:
    """Set the learning rate for ``steps`` of ``config.steps`` done: linear from
    ``learning_rate`` to ``lr_final_fraction`` of it, then flat."""
    done = min(1.0, steps / config.steps)
    for group in optimizer.param_groups:
        group["lr"] = config.learning_rate * (1 - done * (1 - config.lr_final_fraction))


def gradient_step(q_net: Any, target_net: Any, optimizer: Any, trajectories: Any,
                  info: rb.BufferInfo, gamma: float) -> np.ndarray:
    """One double-DQN update (Huber loss, gradients clipped at norm 10) on a sample of
    two-step windows; importance ``weights`` scale the loss when the sample has them.
    Returns float32 ``[S]`` |TD errors|, 0 for windows that start at a boundary."""
    import torch
    import torch.nn.functional as F

    current, following, valid = to_transition(trajectories)
    obs = torch.as_tensor(current.observation[:, 0], dtype=torch.float32)
    action = torch.as_tensor(current.action[:, 0], dtype=torch.int64)
    reward = torch.as_tensor(current.reward[:, 0])
    discount = torch.as_tensor(current.discount[:, 0])
    next_obs = torch.as_tensor(following.observation[:, 0], dtype=torch.float32)
    mask = torch.as_tensor(valid[:, 0], dtype=torch.float32)
    with torch.no_grad():  # double DQN: the online net picks, the target net values
        next_action = q_net(next_obs).argmax(1, keepdim=True)
        next_value = target_net(next_obs).gather(1, next_action).squeeze(1)
        target = reward + gamma * discount * next_value
    q = q_net(obs).gather(1, action[:, None]).squeeze(1)
    if info.weights is not None:  # prioritized: correct the sampling bias
        mask = mask * torch.as_tensor(info.weights)
    loss = (F.smooth_l1_loss(q, target, reduction="none") * mask).sum() / mask.sum().clamp(min=1)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(q_net.parameters(), 10.0)
    optimizer.step()
    td: np.ndarray = ((q - target).detach().abs() * torch.as_tensor(valid[:, 0])).numpy()
    return td


class Selection:
    """Greedy evaluations every ``eval_every`` steps, the best snapshot, and the early
    stop (``stop_after`` evaluations in a row at ``stop_at`` or more)."""

    def __init__(self, config: DQNConfig, on_eval: Callable[[int, float], None] | None):
        self.config, self.on_eval = config, on_eval
        self.evaluations: list[tuple[int, float]] = []
        self.best: tuple[float, int, Any] = (-np.inf, 0, None)
        self.next_eval = config.eval_every
        self.in_a_row = 0
        self.stopped_early = False

    def after(self, q_net: Any, steps: int) -> None:
        """Evaluate ``q_net`` if ``steps`` reached the next evaluation (or the end)."""
        config = self.config
        if steps < self.next_eval and steps < config.steps:
            return
        self.next_eval += config.eval_every
        score = greedy_return(q_net, config.eval_episodes, seed=config.seed * 1000)
        self.evaluations.append((steps, score))
        if self.on_eval is not None:
            self.on_eval(steps, score)
        if score >= self.best[0]:
            self.best = (score, steps, copy.deepcopy(q_net.state_dict()))
        self.in_a_row = self.in_a_row + 1 if score >= config.stop_at else 0
        self.stopped_early = config.stop_after > 0 and self.in_a_row >= config.stop_after

    def finish(self, q_net: Any, steps: int) -> None:
        """Evaluate at ``steps`` unless the last evaluation was there (a run that ended
        between evaluations)."""
        if not self.evaluations or self.evaluations[-1][0] != steps:
            self.next_eval = steps
            self.after(q_net, steps)

    def result(self, q_net: Any, steps: int, seconds: float,
               curve: list[tuple[int, float]], gradient_steps: int = 0
               ) -> tuple[DQNResult, Any]:
        """Final evaluations of the last network and of the best snapshot (which
        ``q_net`` holds afterwards)."""
        config = self.config
        last_return = greedy_return(q_net, config.final_eval_episodes, FINAL_EVAL_SEED)
        if self.best[2] is not None:
            q_net.load_state_dict(self.best[2])
        final_return = greedy_return(q_net, config.final_eval_episodes, FINAL_EVAL_SEED)
        return DQNResult(config, final_return, last_return, self.best[1], seconds, steps,
                         self.stopped_early, curve, self.evaluations, gradient_steps), q_net


def progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar over ``total`` environment steps (disabled: a no-op bar)."""
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, unit="step", dynamic_ncols=True,
                desc="DQN CartPole-v1")



def make_env() -> Any:
    """One CartPole-v1 in a synchronous vector env (``[1, 4]`` float32 observations)."""
    import gymnasium as gym

    return gym.make_vec(ENV_ID, num_envs=1, vectorization_mode="sync")


class Learner(NamedTuple):
    """What a learner fed by collectors elsewhere starts from (:func:`learner`)."""

    data_spec: Any
    num_actions: int
    q_net: Any
    target_net: Any
    optimizer: Any
    ratio: float
    """Samples per inserted step, as in the single-process demo (for the rate limiter)."""


def learner(config: DQNConfig) -> Learner:
    """The Q-network, its target and optimizer and the collectors' data spec, with
    torch seeded and on one thread: the start of
    :func:`~replaybuffer_demos.dqn_actors.train_actors` and
    :func:`~replaybuffer_demos.dqn_ray.train_ray`."""
    import torch

    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    probe_env = make_env()
    spec = StepDriver(probe_env, lambda obs: np.zeros(len(obs), np.int64)).data_spec
    num_actions = int(probe_env.single_action_space.n)
    obs_dim = probe_env.single_observation_space.shape[0]
    probe_env.close()
    q_net = build_q_network(obs_dim, num_actions, config.hidden)
    target_net = copy.deepcopy(q_net)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=config.learning_rate)
    ratio = config.gradient_steps * config.sample_batch_size / config.collect_steps
    return Learner(spec, num_actions, q_net, target_net, optimizer, ratio)
