"""TorchRL's Ray-backed replay buffer as a peer of ``replaybuffer bench --ray``.

    bash benchmarks/setup_peers.sh                 # .venv-bench: torch, torchrl, ray, ...
    .venv-bench/bin/python benchmarks/torchrl_ray.py [--seconds 5] [--workload control,frames]

Standalone (no replaybuffer import). The same workload as our Ray bench: a local
cluster with num_cpus=2, ``torchrl.data.RayReplayBuffer`` (one remote actor holding a
ReplayBuffer on a LazyTensorStorage of 100k control / 20k frames items, prefilled
with 1000), 4 collector tasks each extending it with TensorDicts of 32 steps through
the buffer's picklable ``client()`` (its ``extend`` waits for the actor), while this
process calls ``sample(256)``. One JSON line per workload.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial

import ray
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RayReplayBuffer

CAPACITY = {"control": 100_000, "frames": 20_000}


def make_steps(workload: str, n: int) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    obs = (torch.rand(n, 17, generator=g) if workload == "control"
           else torch.randint(0, 255, (n, 84, 84, 4), dtype=torch.uint8, generator=g))
    action = (torch.rand(n, 6, generator=g) if workload == "control"
              else torch.randint(0, 6, (n,), dtype=torch.int32, generator=g))
    return TensorDict({"observation": obs, "action": action, "reward": torch.rand(n),
                       "discount": torch.ones(n),
                       "step_type": torch.ones(n, dtype=torch.int32)}, batch_size=[n])


def collect(client, workload: str, seconds: float) -> int:
    chunk = make_steps(workload, 32)
    deadline = time.perf_counter() + seconds
    steps = 0
    while time.perf_counter() < deadline:
        client.extend(chunk)
        steps += 32
    return steps


def run(workload: str, seconds: float, collectors: int) -> dict:
    buffer = RayReplayBuffer(storage=partial(LazyTensorStorage, CAPACITY[workload]),
                             batch_size=256, remote_config={"num_cpus": 0})
    buffer.extend(make_steps(workload, 1000))
    buffer.sample()
    task = ray.remote(num_cpus=0)(collect)
    start = time.perf_counter()
    runs = [task.remote(buffer.client(), workload, seconds) for _ in range(collectors)]
    sampled = 0
    while time.perf_counter() - start < seconds:
        buffer.sample()
        sampled += 256
    sample_seconds = time.perf_counter() - start
    inserted = sum(ray.get(runs, timeout=seconds + 120))
    insert_seconds = time.perf_counter() - start
    buffer.close() if hasattr(buffer, "close") else None
    return {"peer": "torchrl[ray]", "workload": workload, "collectors": collectors,
            "inserts_per_s": inserted / insert_seconds,
            "samples_per_s": sampled / sample_seconds, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workload", default="control,frames")
    parser.add_argument("--collectors", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for workload in args.workload.split(","):
            print(json.dumps(run(workload, args.seconds, args.collectors)), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
