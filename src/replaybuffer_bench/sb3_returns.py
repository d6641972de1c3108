"""Returns of SB3's DQN with SB3's own replay buffer and with ours, over several seeds
(``python -m replaybuffer_bench.sb3_returns`` or ``replaybuffer bench --sb3-returns``;
needs the ``sb3`` extra).

For each seed, DQN trains on CartPole-v1 with RL-Zoo's hyperparameters (:data:`ZOO`)
for ``--steps`` environment steps twice, once with
``stable_baselines3.common.buffers.ReplayBuffer`` and once with
:class:`replaybuffer.integrations.sb3.ReplayBuffer`, everything else equal (same
``seed=``, CPU, one torch thread). Each trained policy is then scored greedily
(``deterministic=True``) over ``--episodes`` episodes of a fresh CartPole-v1 seeded with
``10_000 + seed``. The two buffers' runs of one seed alternate, so that a machine shared
with other work slows both alike.

Reported: a per-seed table, each buffer's mean and standard deviation (ddof 1) of the
per-seed mean returns, and a 95% bootstrap confidence interval of ``ours - SB3``'s
difference of means (the seeds resampled with replacement within each buffer,
``--resamples`` times, a seeded numpy generator). An interval that holds 0 says the two
are not told apart by these seeds; one wholly below 0 says ours is worse beyond noise.
``--json FILE`` keeps every run's figures (written after each run, so a stopped run
keeps what it finished).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

ZOO: dict[str, Any] = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
    gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
    exploration_fraction=0.16, exploration_final_eps=0.04,
    policy_kwargs=dict(net_arch=[256, 256]))
"""RL-Zoo's DQN hyperparameters for CartPole-v1 (rl-baselines3-zoo, hyperparams/dqn.yml)."""

BUFFERS = ("sb3", "ours")
CONTROL = "sb3-shifted"
"""A control arm: SB3's buffer after one extra draw from numpy's global generator when
it is built, as ours makes to seed itself. It differs from ``"sb3"`` in the random
stream alone, so how far its returns move from ``"sb3"``'s is what noise alone does."""
OWN_STREAM = "sb3-own-stream"
"""A control arm: SB3's buffer drawing its indices as ours does (its own PCG64 generator,
seeded by one draw from numpy's global generator when built, each index a raw 64-bit
draw modulo the stored count) and reading them with SB3's ``_get_samples``. With one env
and a buffer that has not wrapped, its runs equal ours bit for bit, so a gap between
``"ours"`` and ``"sb3"`` that it shares is the index stream's, not the stored data's."""
CONTROLS = (CONTROL, OWN_STREAM)
DIFFERENCE_KEYS = {CONTROL: ("control_difference", "shifted_minus_sb3"),
                   OWN_STREAM: ("own_stream_difference", "own_stream_minus_sb3")}
"""Where the summary keeps each control arm's difference of means from ``"sb3"``."""


@dataclass
class Run:
    """One training run: which buffer, its seed, the greedy return (mean and std over
    the evaluation episodes) and the wall time of training, in seconds."""

    buffer: str
    seed: int
    mean_return: float
    std_return: float
    train_seconds: float


def train_and_score(buffer: str, seed: int, steps: int, episodes: int) -> Run:
    """Train DQN on CartPole-v1 with ``buffer`` (``"sb3"`` or ``"ours"``) and score it."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    from replaybuffer.integrations.sb3 import ReplayBuffer

    torch.set_num_threads(1)
    kwargs = dict(ZOO)
    if buffer == "ours":
        kwargs["replay_buffer_class"] = ReplayBuffer
    elif buffer == CONTROL:
        kwargs["replay_buffer_class"] = shifted_sb3_buffer()
    elif buffer == OWN_STREAM:
        kwargs["replay_buffer_class"] = own_stream_sb3_buffer()
    model = DQN("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", **kwargs)
    start = time.perf_counter()
    model.learn(steps)
    seconds = time.perf_counter() - start
    env = Monitor(gym.make("CartPole-v1"))
    env.reset(seed=10_000 + seed)
    mean, std = cast(tuple[float, float], evaluate_policy(
        model, env, n_eval_episodes=episodes, deterministic=True))  # not per-episode lists
    env.close()
    return Run(buffer, seed, float(mean), float(std), seconds)


def shifted_sb3_buffer() -> type:
    """SB3's ``ReplayBuffer`` that draws once from numpy's global generator when built."""
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    class ShiftedReplayBuffer(SB3ReplayBuffer):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            np.random.randint(2**31 - 1)  # the draw ours seeds itself with

    return ShiftedReplayBuffer


def own_stream_sb3_buffer() -> type:
    """SB3's ``ReplayBuffer`` (one env) drawing its indices the way ours draws them."""
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    class OwnStreamReplayBuffer(SB3ReplayBuffer):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            if self.n_envs != 1:
                raise ValueError(f"n_envs: expected 1, got {self.n_envs}")
            seed = int(np.random.randint(2**31 - 1))  # as ours seeds itself
            self.rng = np.random.Generator(np.random.PCG64(seed))

        def sample(self, batch_size: int, env: Any = None) -> Any:
            held = self.buffer_size if self.full else self.pos
            raw = self.rng.bit_generator.random_raw(batch_size)
            steps = (raw % np.uint64(held)).astype(np.int64)  # ages: 0 the oldest held
            first = self.pos if self.full else 0
            return self._get_samples((steps + first) % self.buffer_size, env=env)

    return OwnStreamReplayBuffer


def bootstrap_difference(ours: np.ndarray, theirs: np.ndarray, resamples: int,
                         seed: int = 0) -> tuple[float, float, float]:
    """``(difference, low, high)``: ``mean(ours) - mean(theirs)`` and its 95% percentile
    bootstrap interval, each sample resampled with replacement on its own.

    Args:
        ours, theirs: float ``[n]`` and ``[m]``, one value per seed.
        resamples: how many bootstrap draws.
        seed: seeds the resampling generator.
    """
    rng = np.random.default_rng(seed)
    a = rng.choice(ours, (resamples, len(ours))).mean(axis=1)
    b = rng.choice(theirs, (resamples, len(theirs))).mean(axis=1)
    low, high = np.percentile(a - b, [2.5, 97.5])
    return float(ours.mean() - theirs.mean()), float(low), float(high)


def summary(runs: list[Run], resamples: int) -> dict[str, Any]:
    """Per-buffer mean and std (ddof 1) over seeds, and the bootstrap interval of the
    difference of means, from the runs of seeds that both buffers finished."""
    by = {b: {r.seed: r.mean_return for r in runs if r.buffer == b} for b in BUFFERS}
    seeds = sorted(set(by["sb3"]) & set(by["ours"]))  # others: the table of the runs
    out: dict[str, Any] = {"seeds": seeds}
    if not seeds:
        return out
    values = {b: np.array([by[b][s] for s in seeds]) for b in BUFFERS}
    for b in BUFFERS:
        out[b] = {"mean": float(values[b].mean()),
                  "std": float(values[b].std(ddof=1)) if len(seeds) > 1 else 0.0}
    diff, low, high = bootstrap_difference(values["ours"], values["sb3"], resamples)
    out["difference"] = {"ours_minus_sb3": diff, "ci95": [low, high]}
    for arm, (key, field) in DIFFERENCE_KEYS.items():
        control = {r.seed: r.mean_return for r in runs if r.buffer == arm}
        if control and set(seeds) <= set(control):
            arm_values = np.array([control[s] for s in seeds])
            out[arm] = {"mean": float(arm_values.mean()),
                        "std": float(arm_values.std(ddof=1)) if len(seeds) > 1 else 0.0}
            diff, low, high = bootstrap_difference(arm_values, values["sb3"], resamples)
            out[key] = {field: diff, "ci95": [low, high]}
    return out


def table(runs: list[Run], stats: dict[str, Any]) -> str:
    """A markdown table: one row per seed, then the mean, std and the interval."""
    by = {(r.buffer, r.seed): r for r in runs}
    arms = [*BUFFERS, *(a for a in CONTROLS if a in stats)]
    names = {"sb3": "SB3's buffer", "ours": "ours", CONTROL: "SB3's, stream shifted",
             OWN_STREAM: "SB3's, ours' index stream"}
    lines = ["| seed | " + " | ".join(names[a] for a in arms) + " |",
             "|---:|" + "---:|" * len(arms)]
    for s in stats["seeds"]:
        lines.append(f"| {s} | " + " | ".join(f"{by[a, s].mean_return:.1f}" for a in arms)
                     + " |")
    if stats["seeds"]:
        for row in ("mean", "std"):
            lines.append(f"| {row} | " + " | ".join(f"{stats[a][row]:.1f}" for a in arms)
                         + " |")
        diff = stats["difference"]
        low, high = diff["ci95"]
        lines.append(f"\nours - SB3: {diff['ours_minus_sb3']:+.1f}, 95% bootstrap CI "
                     f"[{low:+.1f}, {high:+.1f}]")
        for arm in (a for a in CONTROLS if a in stats):
            key, field = DIFFERENCE_KEYS[arm]
            low, high = stats[key]["ci95"]
            lines.append(f"{names[arm]} - SB3: {stats[key][field]:+.1f}, 95% bootstrap CI "
                         f"[{low:+.1f}, {high:+.1f}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m replaybuffer_bench.sb3_returns",
        description="SB3 DQN on CartPole-v1 (RL-Zoo settings) with SB3's buffer and with "
                    "ours over several seeds: greedy returns, mean, spread and a bootstrap "
                    "95% CI of the difference",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed")
    parser.add_argument("--steps", type=int, default=20_000, help="training steps per run")
    parser.add_argument("--episodes", type=int, default=10,
                        help="greedy evaluation episodes per run")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap draws")
    parser.add_argument("--arms", default="sb3,ours",
                        help=f"which buffers to train, comma-separated, of sb3, ours, "
                             f"{CONTROL} (SB3's buffer with the random stream shifted by one "
                             f"draw: what noise alone does) and {OWN_STREAM} (SB3's buffer "
                             "drawing indices as ours does)")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="write every run and the summary here (after each run)")
    args = parser.parse_args(argv)
    for name in ("seeds", "steps", "episodes", "resamples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive int, got {getattr(args, name)}")
    arms = args.arms.split(",")
    if not arms or any(a not in (*BUFFERS, *CONTROLS) for a in arms):
        parser.error(f"--arms: expected names of {[*BUFFERS, *CONTROLS]}, got {args.arms!r}")
    if args.first_seed < 0:
        parser.error(f"--first-seed: expected an int >= 0, got {args.first_seed}")
    runs: list[Run] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        # Alternate which buffer goes first, so that neither always meets a colder cache.
        order = [a for a in (BUFFERS if seed % 2 == 0 else BUFFERS[::-1]) if a in arms]
        order += [a for a in CONTROLS if a in arms]
        for buffer in order:
            run = train_and_score(buffer, seed, args.steps, args.episodes)
            runs.append(run)
            print(f"seed {seed} {buffer:>4}: return {run.mean_return:6.1f} "
                  f"(+- {run.std_return:.1f}), trained in {run.train_seconds:.0f} s",
                  flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(
                    {"steps": args.steps, "episodes": args.episodes, "hyperparameters": ZOO,
                     "runs": [asdict(r) for r in runs],
                     "summary": summary(runs, args.resamples)}, indent=1))
    print(table(runs, summary(runs, args.resamples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
