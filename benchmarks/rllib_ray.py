"""RLlib's replay buffers as Ray actors, a peer of ``replaybuffer bench --ray``.

    bash benchmarks/setup_rllib.sh                 # ../.venv-rllib: torch, ray[rllib]
    ../.venv-rllib/bin/python benchmarks/rllib_ray.py [--shards 1,2,4,8] [--seconds 5]

Standalone (no replaybuffer import: RLlib's gymnasium pin keeps it out of our venvs).
The same workload as our Ray bench, sharded the way RLlib's Ape-X shards replay: N
replay actors, each an RLlib buffer (``ReplayBuffer`` by default; ``--buffer
prioritized`` or ``multi_agent`` for ``PrioritizedReplayBuffer`` / ``MultiAgentReplayBuffer``)
made a Ray actor with ``ray.remote(num_cpus=0)(BufferClass)``, storing timesteps
(``storage_unit="timesteps"``, the default), holding 100k control / 20k frames steps
between them and prefilled with 1000 steps each. A local cluster (``num_cpus=2``);
4 collector tasks, collector ``k`` adding ``SampleBatch``es of 32 steps to actor
``k % N`` (``actor.add.remote(batch)``, at most ``--in-flight`` adds unacknowledged)
for ``--seconds``, while this process, the learner, calls ``sample.remote(256)`` on an
actor chosen at random per batch, with ``--prefetch`` requests in flight. The clock
starts when all collectors have loaded RLlib (a gate actor holds them until then:
that import takes a fresh worker seconds on a shared machine).
Inserts/s: steps the collectors sent and had acknowledged, over the time until the
last collector returned. Samples/s: steps the learner received within ``--seconds``.
Then, with the collectors done, the idle latency of one synchronous ``sample(256)``
(median of 50). One JSON line per row, a markdown table at the end, ``--json FILE``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import time
from typing import Any

import numpy as np
import ray

SAMPLE = 256
CHUNK = 32
PREFILL = 1000
CAPACITY = {"control": 100_000, "frames": 20_000}
BETA = 0.4  # PrioritizedReplayBuffer.sample's importance-sampling exponent
ALPHA = 0.6


def make_steps(workload: str, n: int, seed: int) -> Any:
    """A ``SampleBatch`` of ``n`` steps with the leaves of our control / frames specs:
    obs float32[n, 17] (frames: uint8[n, 84, 84, 4]), actions float32[n, 6] (frames:
    int32[n]), rewards and discount float32[n], step_type int32[n]."""
    from ray.rllib.policy.sample_batch import SampleBatch

    rng = np.random.default_rng(seed)
    if workload == "control":
        obs = rng.standard_normal((n, 17), dtype=np.float32)
        actions = rng.standard_normal((n, 6), dtype=np.float32)
    else:
        obs = rng.integers(0, 100, size=(n, 84, 84, 4)).astype(np.uint8)
        actions = rng.integers(0, 100, size=n).astype(np.int32)
    return SampleBatch({"obs": obs, "actions": actions,
                        "rewards": rng.standard_normal(n, dtype=np.float32),
                        "discount": np.ones(n, np.float32),
                        "step_type": rng.integers(0, 100, size=n).astype(np.int32)})


def buffer_class(name: str) -> tuple[type, dict[str, Any], dict[str, Any]]:
    """RLlib's class for ``--buffer``, its extra constructor and ``sample`` arguments."""
    from ray.rllib.utils.replay_buffers import (
        MultiAgentReplayBuffer,
        PrioritizedReplayBuffer,
        ReplayBuffer,
    )

    if name == "replay":
        return ReplayBuffer, {}, {}
    if name == "prioritized":
        return PrioritizedReplayBuffer, {"alpha": ALPHA}, {"beta": BETA}
    if name == "multi_agent":
        return MultiAgentReplayBuffer, {}, {}
    raise SystemExit(f"--buffer: expected replay, prioritized or multi_agent, got {name!r}")


def collect(actor: Any, gate: Any, workload: str, seconds: float, seed: int,
            in_flight: int) -> tuple[int, float]:
    """Once ``gate`` opens, add ``SampleBatch``es of :data:`CHUNK` steps to ``actor`` for
    ``seconds``, at most ``in_flight`` unacknowledged; the steps acknowledged and the
    wall-clock time (``time.time()``) at which the first add was sent."""
    chunks = [make_steps(workload, CHUNK, seed * 4 + i) for i in range(4)]
    ray.get(gate.arrive.remote())
    while not ray.get(gate.is_open.remote()):
        time.sleep(0.005)
    began = time.time()
    pending: collections.deque[Any] = collections.deque()
    deadline = time.perf_counter() + seconds
    sent = 0
    while time.perf_counter() < deadline:
        if len(pending) >= in_flight:
            ray.get(pending.popleft())
        pending.append(actor.add.remote(chunks[sent % 4]))
        sent += 1
    ray.get(list(pending))
    return sent * CHUNK, began


class Gate:
    """Holds the collectors until all of them are ready: importing RLlib (and the torch
    it loads) takes a worker process seconds on a shared machine, and a collector that
    started seconds late would leave the timed window without its writes."""

    def __init__(self) -> None:
        self.ready = 0
        self.open = False

    def arrive(self) -> None:
        self.ready += 1

    def count(self) -> int:
        return self.ready

    def release(self) -> None:
        self.open = True

    def is_open(self) -> bool:
        return self.open


def stored_entries(stats: dict[str, Any]) -> int:
    """The ``num_entries`` in a buffer's ``stats()``; a multi-agent buffer nests one
    underlying buffer's stats per policy."""
    if "num_entries" in stats:
        return int(stats["num_entries"])
    return sum(stored_entries(v) for v in stats.values() if isinstance(v, dict))


def run(workload: str, buffer: str, shards: int, collectors: int, seconds: float,
        prefetch: int, in_flight: int) -> dict[str, Any]:
    cls, ctor_args, sample_args = buffer_class(buffer)
    actor_cls = ray.remote(num_cpus=0)(cls)
    actors = [actor_cls.remote(capacity=CAPACITY[workload] // shards,
                               storage_unit="timesteps", **ctor_args)
              for _ in range(shards)]
    prefill = make_steps(workload, PREFILL, 10_000)
    ray.get([a.add.remote(prefill) for a in actors])
    rng = random.Random(0)

    def request() -> Any:
        return rng.choice(actors).sample.remote(SAMPLE, **sample_args)

    first = ray.get(request())  # warm up (and the batch's bytes)
    batch_bytes = int(first.size_bytes())
    gate = ray.remote(num_cpus=0)(Gate).remote()
    task = ray.remote(num_cpus=0)(collect)
    runs = [task.remote(actors[k % shards], gate, workload, seconds, k, in_flight)
            for k in range(collectors)]
    while ray.get(gate.count.remote()) < collectors:
        time.sleep(0.01)
    start, wall_start = time.perf_counter(), time.time()
    ray.get(gate.release.remote())
    sampled = 0
    pending = collections.deque(request() for _ in range(prefetch))
    while time.perf_counter() - start < seconds:
        sampled += ray.get(pending.popleft()).count
        pending.append(request())
    sample_seconds = time.perf_counter() - start
    done = ray.get(runs, timeout=seconds + 300)
    inserted = sum(steps for steps, _ in done)
    insert_seconds = time.perf_counter() - start
    ray.get(list(pending))
    idle = []
    for _ in range(50):
        t0 = time.perf_counter()
        ray.get(request())
        idle.append(time.perf_counter() - t0)
    stored = sum(map(stored_entries, ray.get([a.stats.remote() for a in actors])))
    for a in [*actors, gate]:
        ray.kill(a)
    return {"peer": f"rllib[ray] {cls.__name__}", "workload": workload, "shards": shards,
            "collectors": collectors, "prefetch": prefetch, "in_flight": in_flight,
            "inserts_per_s": inserted / insert_seconds,
            "samples_per_s": sampled / sample_seconds,
            "idle_sample_ms": float(np.median(idle)) * 1e3, "batch_bytes": batch_bytes,
            "stored_steps": stored, "seconds": seconds,
            # How long after the gate opened the last collector sent its first add.
            "collector_start_lag_s": max(began for _, began in done) - wall_start}


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | buffer | shards | inserts/s | samples/s | idle sample(256) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['peer']} | {r['shards']} | "
                     f"{r['inserts_per_s']:,.0f} | {r['samples_per_s']:,.0f} | "
                     f"{r['idle_sample_ms']:.2f} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="control,frames")
    parser.add_argument("--shards", default="1,2,4,8")
    parser.add_argument("--buffer", default="replay",
                        help="replay (ReplayBuffer), prioritized, multi_agent")
    parser.add_argument("--collectors", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--prefetch", type=int, default=4,
                        help="sample requests the learner keeps in flight")
    parser.add_argument("--in-flight", type=int, default=16,
                        help="unacknowledged adds per collector")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.prefetch < 1 or args.in_flight < 1:
        raise SystemExit("--prefetch and --in-flight: expected at least 1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for workload in [w for w in args.workloads.split(",") if w]:
            if workload not in CAPACITY:
                raise SystemExit(f"--workloads: expected control or frames, got {workload!r}")
            for shards in [int(s) for s in args.shards.split(",") if s]:
                rows.append(run(workload, args.buffer, shards, args.collectors,
                                args.seconds, args.prefetch, args.in_flight))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
    print()
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
