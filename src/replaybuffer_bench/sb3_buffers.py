"""Our on-policy and hindsight buffers against Stable-Baselines3's on the same data
(``replaybuffer bench --sb3``; needs the ``sb3`` extra).

* ``rollout``: PPO's buffer. 8 envs, 256 steps (2,048 transitions), float32
  observation[17] and action[6] (MuJoCo sizes). Timed: one step's ``add`` for the 8
  envs (value and log-prob from the critic, as tensors); GAE over the full rollout
  (``compute_returns_and_advantage`` / ``compute_returns_and_advantages``); one epoch
  of minibatches of 64 as torch tensors (SB3's ``get(64)``, ours ``minibatches(64)``
  on torch storage); ``reset``. Both buffers are fed the same stream; after GAE their
  advantages and returns are compared (they must agree: same formula, no
  truncations in this stream).
* ``her``: goal-conditioned replay. A dict observation (observation[10],
  achieved_goal[3], desired_goal[3], float32), action[4], 1 env, episodes of 50
  steps, capacity 100,000, full; "future" strategy, 4 sampled goals per real one, a
  vectorised ``compute_reward`` (negative distance > 0.05). Timed: ``add`` of one step
  and ``sample(256)`` (with relabelling and rewards), as torch tensors.

Medians of interleaved rounds (:func:`replaybuffer_bench.timing.compare`), SB3 and
ours alternating. Torch runs with one thread.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from replaybuffer_bench.timing import compare


@dataclass
class Row:
    workload: str
    op: str
    sb3_us: float
    ours_us: float

    @property
    def ratio(self) -> float:
        return self.ours_us / self.sb3_us


def _gym_spaces() -> Any:
    from gymnasium import spaces
    return spaces


def rollout_rows(min_time: float) -> list[Row]:
    import torch
    from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer

    from replaybuffer.buffers import RolloutBuffer

    spaces = _gym_spaces()
    envs, steps, batch = 8, 256, 64
    obs_space = spaces.Box(-np.inf, np.inf, (17,), np.float32)
    act_space = spaces.Box(-1.0, 1.0, (6,), np.float32)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((steps + 1, envs, 17), dtype=np.float32)
    act = rng.uniform(-1, 1, (steps, envs, 6)).astype(np.float32)
    rew = rng.standard_normal((steps, envs), dtype=np.float32)
    term = rng.random((steps, envs)) < 0.01
    values = torch.from_numpy(rng.standard_normal((steps, envs, 1), dtype=np.float32))
    logp = torch.from_numpy(rng.standard_normal((steps, envs), dtype=np.float32))
    last_values = torch.from_numpy(rng.standard_normal((envs, 1), dtype=np.float32))
    gamma, lam = 0.99, 0.95

    theirs = SB3RolloutBuffer(steps, obs_space, act_space, "cpu", gae_lambda=lam,
                              gamma=gamma, n_envs=envs)
    ours = RolloutBuffer(obs_space, act_space, steps * envs, num_envs=envs, storage="torch")

    # SB3 marks an episode start on the step after an end; ours takes the end itself.
    starts = np.vstack([np.ones((1, envs), bool), term[:-1]]).astype(np.float32)

    def fill_theirs() -> None:
        theirs.reset()
        for t in range(steps):
            theirs.add(obs[t], act[t], rew[t], starts[t], values[t], logp[t])

    def fill_ours() -> None:
        ours.reset()
        for t in range(steps):
            ours.add(obs[t], act[t], rew[t], obs[t + 1], term[t], value=values[t],
                     log_prob=logp[t])

    fill_theirs()
    fill_ours()
    theirs.compute_returns_and_advantage(last_values, term[-1])
    _, advantages = ours.compute_returns_and_advantages(last_values, gamma, lam)
    # Same stream, same formula: the same advantages (SB3 keeps [steps, envs]).
    np.testing.assert_allclose(np.asarray(advantages).reshape(envs, steps).T,
                               theirs.advantages, rtol=2e-4, atol=2e-4)

    step = {"t": 0}

    def add_theirs() -> None:
        t = step["t"] % steps
        if theirs.full:
            theirs.reset()
        theirs.add(obs[t], act[t], rew[t], starts[t], values[t], logp[t])
        step["t"] += 1

    def add_ours() -> None:
        t = step["t"] % steps
        if len(ours) == ours.capacity:
            ours.reset()
        ours.add(obs[t], act[t], rew[t], obs[t + 1], term[t], value=values[t],
                 log_prob=logp[t])
        step["t"] += 1

    rows = []
    timed = compare({"sb3": add_theirs, "ours": add_ours}, min_time=min_time)
    rows.append(Row("rollout", f"add ({envs} envs)", timed["sb3"] * 1e6, timed["ours"] * 1e6))
    fill_theirs()
    fill_ours()

    def gae_theirs() -> None:
        theirs.compute_returns_and_advantage(last_values, term[-1])

    def gae_ours() -> None:
        ours.compute_returns_and_advantages(last_values, gamma, lam)

    timed = compare({"sb3": gae_theirs, "ours": gae_ours}, min_time=min_time)
    rows.append(Row("rollout", f"GAE ({steps * envs} steps)", timed["sb3"] * 1e6,
                    timed["ours"] * 1e6))
    gae_theirs()
    gae_ours()

    def epoch_theirs() -> None:
        for _ in theirs.get(batch):
            pass

    def epoch_ours() -> None:
        for _ in ours.minibatches(batch):
            pass

    timed = compare({"sb3": epoch_theirs, "ours": epoch_ours}, min_time=min_time)
    rows.append(Row("rollout", f"one epoch of minibatches({batch})", timed["sb3"] * 1e6,
                    timed["ours"] * 1e6))
    return rows


def her_rows(min_time: float, capacity: int = 100_000) -> list[Row]:
    import torch
    from stable_baselines3.common.vec_env import DummyVecEnv
    from stable_baselines3.her.her_replay_buffer import HerReplayBuffer as SB3Her

    from replaybuffer.buffers import HERBuffer

    spaces = _gym_spaces()
    length, batch = 50, 256
    goal = spaces.Box(-1.0, 1.0, (3,), np.float32)
    obs_space = spaces.Dict({"observation": spaces.Box(-np.inf, np.inf, (10,), np.float32),
                             "achieved_goal": goal, "desired_goal": goal})
    act_space = spaces.Box(-1.0, 1.0, (4,), np.float32)

    def compute_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
        far: np.ndarray = np.linalg.norm(achieved - desired, axis=-1) > 0.05
        return -far.astype(np.float32)

    env = DummyVecEnv([lambda: _goal_env(obs_space, act_space, compute_reward)])
    theirs = SB3Her(capacity, obs_space, act_space, env, "cpu", n_envs=1,
                    n_sampled_goal=4, goal_selection_strategy="future")
    ours = HERBuffer(obs_space, act_space, capacity, compute_reward=compute_reward,
                     goal_selection_strategy="future", n_sampled_goal=4, storage="torch")
    rng = np.random.default_rng(0)
    period = 20 * length

    def obs_at(t: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(t % period)
        return {"observation": r.standard_normal((1, 10), dtype=np.float32),
                "achieved_goal": r.uniform(-1, 1, (1, 3)).astype(np.float32),
                "desired_goal": r.uniform(-1, 1, (1, 3)).astype(np.float32)}

    stream = [obs_at(t) for t in range(period + 1)]
    actions = rng.uniform(-1, 1, (period, 1, 4)).astype(np.float32)
    rewards = rng.standard_normal((period, 1), dtype=np.float32)
    state = {"sb3": 0, "ours": 0}

    def add(which: str) -> Callable[[], None]:
        def step() -> None:
            t = state[which]
            i = t % period
            end = (t + 1) % length == 0
            done = np.array([end])
            nxt = stream[i + 1]
            if which == "sb3":
                infos = [{"TimeLimit.truncated": False, "terminal_observation":
                          {k: v[0] for k, v in nxt.items()}}] if end else [{}]
                theirs.add(stream[i], nxt, actions[i], rewards[i], done, infos)
            else:
                ours.add(stream[i], actions[i], rewards[i], nxt, done)
            state[which] = t + 1
        return step

    add_theirs, add_ours = add("sb3"), add("ours")
    for _ in range(capacity):
        add_theirs()
        add_ours()
    rows = []
    timed = compare({"sb3": add_theirs, "ours": add_ours}, min_time=min_time)
    rows.append(Row("her", "add (1 env)", timed["sb3"] * 1e6, timed["ours"] * 1e6))
    timed = compare({"sb3": lambda: theirs.sample(batch), "ours": lambda: ours.sample(batch)},
                    min_time=min_time)
    rows.append(Row("her", f"sample({batch}) + relabel", timed["sb3"] * 1e6,
                    timed["ours"] * 1e6))
    del torch
    return rows


def _goal_env(obs_space: Any, act_space: Any,
              compute_reward: Callable[[np.ndarray, np.ndarray, Any], np.ndarray]) -> Any:
    """Just enough of a goal env for SB3's HerReplayBuffer: its spaces and
    ``compute_reward`` (called through ``env_method``)."""
    import gymnasium as gym

    class GoalEnv(gym.Env):
        def __init__(self) -> None:
            self.observation_space, self.action_space = obs_space, act_space
            self.compute_reward = compute_reward

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            return self.observation_space.sample(), {}

        def step(self, action: Any) -> Any:
            return self.observation_space.sample(), 0.0, False, False, {}

    return GoalEnv()


def format_table(rows: list[Row]) -> str:
    lines = ["| workload | op | SB3 us | ours us | ours / SB3 |", "|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.workload} | {r.op} | {r.sb3_us:,.1f} | {r.ours_us:,.1f} | "
                     f"{r.ratio:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replaybuffer bench --sb3")
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--her-capacity", type=int, default=100_000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import stable_baselines3
    import torch

    torch.set_num_threads(1)
    print(f"# on-policy and HER buffers against Stable-Baselines3 "
          f"{stable_baselines3.__version__} (torch {torch.__version__}, 1 thread)")
    rows = rollout_rows(args.min_time) + her_rows(args.min_time, args.her_capacity)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(r) | {"ratio": r.ratio} for r in rows], fh, indent=1)
    return 0
