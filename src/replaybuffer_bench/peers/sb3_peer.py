"""The peer table's rows for Stable-Baselines3's replay buffers, imported lazily inside the run."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from replaybuffer_bench.peers.measuring import (MemoryGrowth, release_memory, timed_rows,
                                                torch_module)
from replaybuffer_bench.peers.workloads_spec import (FRAME_SHAPE, Rows, Sizes, Unsupported,
                                                     control_transition_spec,
                                                     frames_transition_spec, is_prioritized,
                                                     transitions)

def sb3_rows(workload: str, sizes: Sizes, layout: str = "default") -> Rows:
    """stable_baselines3.common.buffers.ReplayBuffer (samples come back as torch tensors).

    ``layout``: ``default`` (next observations in their own array) or ``optimize_memory``
    (``optimize_memory_usage=True``: next obs is the next slot). Both with
    ``handle_timeout_termination=False`` (required by optimize_memory_usage; saves a
    per-env list comprehension over infos). ``add(256)`` goes through a buffer with
    ``n_envs=256``: SB3 adds one step of every env per call.
    """
    if is_prioritized(workload):
        raise Unsupported("SB3 has no prioritized replay buffer")
    torch_module()
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    optimize = layout == "optimize_memory"
    obs_space: Any
    if workload == "control":
        obs_space = spaces.Box(-np.inf, np.inf, (17,), np.float32)
        act_space: Any = spaces.Box(-1.0, 1.0, (6,), np.float32)
    else:
        obs_space = spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
        act_space = spaces.Discrete(6)

    def make(capacity: int, n_envs: int = 1) -> Any:
        return ReplayBuffer(capacity, obs_space, act_space, device="cpu", n_envs=n_envs,
                            optimize_memory_usage=optimize, handle_timeout_termination=False)

    def adder(rb: Any, d: dict[str, np.ndarray], n_envs: int) -> Callable[[], None]:
        obs = d["obs"].reshape((n_envs,) + obs_space.shape)
        nxt = d["next_obs"].reshape(obs.shape)
        act = d["act"].reshape(n_envs, -1)
        rew, done = d["rew"].reshape(n_envs), d["done"].reshape(n_envs)
        infos: list[dict[str, Any]] = [{} for _ in range(n_envs)]
        return lambda: rb.add(obs, nxt, act, rew, done, infos)

    def fill_sb3(rb: Any, chunk: dict[str, np.ndarray], capacity: int, n_envs: int) -> None:
        adds = [adder(rb, {k: v[i:i + n_envs] for k, v in chunk.items()}, n_envs)
                for i in range(0, len(chunk["obs"]) - n_envs + 1, n_envs)]
        for i in range(capacity // n_envs):
            adds[i % len(adds)]()

    if workload == "control":
        capacity = sizes.control
        spec = control_transition_spec()
        data = transitions(spec, capacity)
        rb = make(capacity)
        fill_sb3(rb, data["chunk"], capacity, 1)
        add1 = adder(rb, {k: v[None] for k, v in data["one"].items()}, 1)
        yield from timed_rows({"add(1)": (add1, 1),
                           "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)
        del rb, add1  # freed before the next buffer is built
        release_memory()
        wide = make(capacity, n_envs=256)
        fill_sb3(wide, data["chunk"], capacity, 256)
        yield from timed_rows({"add(256)": (adder(wide, data["batch"], 256), 256)}, sizes)
        return

    memory_only = not optimize
    capacity = sizes.frames_memory_only if memory_only else sizes.frames
    spec = frames_transition_spec()
    data = transitions(spec, capacity)
    mem = MemoryGrowth(capacity)
    rb = make(capacity)
    fill_sb3(rb, data["chunk"], capacity, 1)
    obs_bytes = rb.observations.nbytes + (0 if optimize else rb.next_observations.nbytes)
    yield mem.row(obs_bytes, "next obs is the next slot" if optimize
                  else "observations and next_observations arrays")
    if memory_only:
        return
    add1 = adder(rb, {k: v[None] for k, v in data["one"].items()}, 1)
    yield from timed_rows({"add(1)": (add1, 1),
                       "sample(32)+next": (lambda: rb.sample(32), 32),
                       "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)


