"""DQN on CartPole-v1, in the TF-Agents tutorial's flow, with torch.

A :class:`~replaybuffer.collect.StepDriver` steps the environment with an
epsilon-greedy policy and hands every trajectory to its observers: the replay
buffer's ``add_batch`` and the metrics. The learner reads
``buffer.as_dataset(sample_batch_size, num_steps=2)``: each element is a pair of
consecutive steps, the second giving the next observation (the true final
observation at an episode's end, thanks to boundary steps). Targets use double
DQN with a Huber loss; a terminated step has discount 0, a truncated one (the
500-step limit) bootstraps.

DQN on CartPole is famously unstable late in training: a network that balances the
pole for 500 steps can forget it a few thousand steps later. Two things keep the
*last* network good, which is the one a user reads as the learner's result:

- the learning rate decays linearly to ``lr_final_fraction`` of its start over the
  run, so late updates are small;
- training stops once the greedy policy (evaluated every ``eval_every`` steps on its
  own seeds) scores at least ``stop_at`` in ``stop_after`` evaluations in a row, as
  Stable-Baselines3's ``StopTrainingOnRewardThreshold`` does.

The final evaluation, on other seeds, reports the last network and, beside it, the best
snapshot seen during training.

Run it with ``replaybuffer demo`` (``--steps``, ``--seed``, ``--out``, ``--prioritized``,
``--compare``).
With ``--prioritized`` the buffer is a :class:`~replaybuffer.PrioritizedReplayBuffer`:
the loss is weighted by the importance weights and priorities are set to
``|TD error| + epsilon`` (0 + epsilon for boundary starts) after every step.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

import replaybuffer as rb
from replaybuffer.collect import AverageEpisodeLength, AverageReturn, EnvironmentSteps, StepDriver
from replaybuffer_demos.curve_plot import plot
from replaybuffer_demos.dqn_actors import train_actors
from replaybuffer_demos.dqn_learner import (ENV_ID, DQNConfig, DQNResult, Selection,
                                            build_q_network, decay_learning_rate,
                                            gradient_step, progress_bar)
from replaybuffer_demos.dqn_ray import train_ray

# The names the demo's users import from here (benchmarks/dqn_seeds.py, tests): the
# configuration and result live in dqn_learner, which every DQN demo shares.
__all__ = ["DQNConfig", "DQNResult", "main", "plot", "train"]



def train(config: DQNConfig, progress: bool = True,
          on_eval: Callable[[int, float], None] | None = None) -> tuple[DQNResult, Any]:
    """Train a DQN; returns the result and the selected Q-network."""
    import gymnasium as gym
    import torch

    torch.manual_seed(config.seed)
    torch.set_num_threads(1)  # small networks: threads cost more than they give
    rng = np.random.default_rng(config.seed)
    env = gym.make_vec(ENV_ID, num_envs=config.num_envs, vectorization_mode="sync")
    env.action_space.seed(config.seed)
    action_space, observation_space = env.single_action_space, env.single_observation_space
    assert isinstance(action_space, gym.spaces.Discrete)  # CartPole's spaces
    assert isinstance(observation_space, gym.spaces.Box)
    num_actions = int(action_space.n)
    q_net = build_q_network(observation_space.shape[0], num_actions, config.hidden)
    target_net = copy.deepcopy(q_net)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=config.learning_rate)

    def set_learning_rate() -> None:
        decay_learning_rate(optimizer, config, env_steps.result())

    env_steps = EnvironmentSteps()
    epsilon_steps = max(1, int(config.epsilon_fraction * config.steps))

    def epsilon() -> float:
        frac = min(1.0, env_steps.result() / epsilon_steps)
        return config.epsilon_start + frac * (config.epsilon_end - config.epsilon_start)

    def collect_policy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            greedy = q_net(torch.as_tensor(obs, dtype=torch.float32)).argmax(1).numpy()
        explore = rng.random(len(obs)) < epsilon()
        return np.where(explore, rng.integers(0, num_actions, len(obs)), greedy)

    # The tutorial's flow: a driver whose observers include the buffer's add_batch.
    probe = StepDriver(env, collect_policy)
    buffer: rb.ReplayBuffer
    prioritized: rb.PrioritizedReplayBuffer | None = None
    if config.prioritized:
        gradient_total = (config.steps // config.collect_steps) * config.gradient_steps
        buffer = prioritized = rb.PrioritizedReplayBuffer(
            probe.data_spec, batch_size=config.num_envs, max_length=config.buffer_length,
            alpha=config.alpha, beta=config.beta, beta_final=1.0, beta_steps=gradient_total,
            storage=config.storage, seed=config.seed)
    else:
        buffer = rb.UniformReplayBuffer(probe.data_spec, batch_size=config.num_envs,
                                        max_length=config.buffer_length,
                                        storage=config.storage, seed=config.seed)
    average_return, episode_length = AverageReturn(window=20), AverageEpisodeLength(window=20)
    driver = StepDriver(env, collect_policy,
                        [buffer.add_batch, average_return, episode_length, env_steps],
                        num_steps=config.collect_steps, seed=config.seed)
    iterator = iter(buffer.as_dataset(sample_batch_size=config.sample_batch_size, num_steps=2))

    def train_step() -> None:
        trajectories, info = next(iterator)
        td = gradient_step(q_net, target_net, optimizer, trajectories, info, config.gamma)
        if prioritized is not None:  # config.prioritized
            prioritized.update_priorities(info.ids, td + config.priority_epsilon)

    bar = progress_bar(config.steps, progress)
    start = time.perf_counter()
    curve: list[tuple[int, float]] = []
    selection = Selection(config, on_eval)
    gradient_steps = 0
    while env_steps.result() < config.steps and not selection.stopped_early:
        before = env_steps.result()
        driver.run()
        bar.update(env_steps.result() - before)
        if env_steps.result() >= config.learning_starts:
            set_learning_rate()
            for _ in range(config.gradient_steps):
                train_step()
                gradient_steps += 1
                if gradient_steps % config.target_update == 0:
                    target_net.load_state_dict(q_net.state_dict())
        if not np.isnan(average_return.result()):
            curve.append((env_steps.result(), average_return.result()))
        selection.after(q_net, env_steps.result())
        bar.set_postfix(ret=f"{average_return.result():6.1f}", eps=f"{epsilon():.2f}",
                        best=f"{selection.best[0]:.0f}")
    bar.close()
    env.close()
    return selection.result(q_net, env_steps.result(), time.perf_counter() - start, curve,
                            gradient_steps)


def read_result(path: str) -> dict[str, Any]:
    """A demo run's ``result.json`` (for ``--compare``).

    Raises:
        ValueError: the file is not JSON, or not an object with ``config``,
            ``last_network_return`` and ``evaluations``, naming the file.
        OSError: the file cannot be read.
    """
    expected = "an object with config, last_network_return and evaluations"
    try:
        result = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"compare: {path} is not a demo's result.json (expected "
                         f"{expected}; it is not JSON: {exc})") from None
    if not isinstance(result, dict) or \
            not {"config", "last_network_return", "evaluations"} <= set(result):
        got = sorted(result) if isinstance(result, dict) else type(result).__name__
        raise ValueError(f"compare: {path} is not a demo's result.json (expected "
                         f"{expected}, got {got})")
    return result


def main(steps: int | None = None, seed: int = 0, out: str = "demo-out",
         progress: bool = True, prioritized: bool = False, actors: int = 0,
         ray: bool = False, echo: Callable[[str], None] = print,
         compare: str | None = None) -> DQNResult:
    """Train, evaluate, and write ``learning_curve.png`` and ``result.json`` to ``out``.
    With ``actors``, collect with that many processes into a shared buffer
    (:mod:`replaybuffer_demos.dqn_actors`); with ``ray``, with that many (default 2)
    Ray collector actors into as many shards (:mod:`replaybuffer_demos.dqn_ray`;
    with ``prioritized``, Ape-X style). ``compare``: another run's result.json, whose
    curves the plot draws beside this run's (:mod:`replaybuffer_demos.curve_plot`)."""
    config = DQNConfig(seed=seed, prioritized=prioritized)
    if steps is not None:
        config.steps = steps
    other = None if compare is None else read_result(compare)  # before the training
    if ray:
        result, _ = train_ray(config, actors or 2, progress=progress)
        run = f"{actors or 2} Ray actors"
    elif actors:
        result, _ = train_actors(config, actors, progress=progress)
        run = f"{actors} actor processes"
    else:
        result, _ = train(config, progress=progress)
        run = "single process"
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = asdict(result)
    summary["run"] = run
    plot(summary, out_dir / "learning_curve.png", other)
    (out_dir / "result.json").write_text(json.dumps(summary, indent=1))
    echo(f"greedy evaluation over {config.final_eval_episodes} episodes: the last network "
         f"scores {result.last_network_return:.1f} (the best snapshot, from step "
         f"{result.best_step}: {result.final_return:.1f})")
    stopped = (f", stopped early: {config.stop_after} evaluations in a row at "
               f">= {config.stop_at:g}" if result.stopped_early else "")
    echo(f"trained {result.steps_trained} steps in {result.wall_seconds:.0f} s{stopped}; "
         f"wrote {out_dir / 'learning_curve.png'} and {out_dir / 'result.json'}")
    return result


if __name__ == "__main__":
    main()
