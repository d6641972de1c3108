"""Torch storage on the CPU against numpy storage: ``get_next(256)`` in CPU time.

Buffers of the control workload (float32 observation[17], action[6], reward,
discount; int32 step type), one row of 100,000 steps each, filled alike and seeded
alike, in one process:

- ``uniform``: a :class:`~replaybuffer.UniformReplayBuffer` on numpy storage and one
  on torch storage (``device="cpu"``);
- ``prioritized``: a :class:`~replaybuffer.PrioritizedReplayBuffer` on numpy storage,
  one on torch storage (its short ``get_next``), and one on torch storage with that
  short path switched off on the instance (the general read path it took before).

Each round times ``CALLS`` calls of every buffer in turn (``time.thread_time``: the
machine may be shared with other jobs), the order of the buffers a different
permutation each round (the one timed right after another buffer's reads runs colder,
so a fixed order would favour a slot); it prints the median per call over the rounds
and each ratio to numpy storage. Torch runs on one thread (``torch.set_num_threads``).

Run: ``PYTHONPATH=src python benchmarks/torch_cpu_reads.py [ROUNDS] [CALLS]``
(defaults 60 and 200: about a minute).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

from replaybuffer import PrioritizedReplayBuffer, UniformReplayBuffer
from replaybuffer_bench.workloads import control_spec, fill

CAPACITY = 100_000
BATCH = 256


def filled(kind: type, storage: str) -> Any:
    buffer = kind(control_spec(), 1, CAPACITY, storage=storage, seed=0)
    fill(buffer, np.random.default_rng(0))
    return buffer


def medians(buffers: dict[str, Any], rounds: int, calls: int) -> dict[str, float]:
    """The median microseconds of CPU time per ``get_next(BATCH)`` of each buffer."""
    orders = list(itertools.permutations(buffers))
    times: dict[str, list[float]] = {name: [] for name in buffers}
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            get_next = buffers[name].get_next
            start = time.thread_time_ns()
            for _ in range(calls):
                get_next(BATCH)
            times[name].append((time.thread_time_ns() - start) / calls / 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def report(title: str, result: dict[str, float]) -> None:
    base = result["numpy"]
    print(title + ": " + ", ".join(f"{name} {us:.2f} us ({us / base:.2f}x)"
                                   for name, us in result.items()))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    torch.set_num_threads(1)
    uniform = {"numpy": filled(UniformReplayBuffer, "numpy"),
               "torch": filled(UniformReplayBuffer, "torch")}
    report("uniform get_next(256)", medians(uniform, rounds, calls))
    general = filled(PrioritizedReplayBuffer, "torch")
    general._direct_backend = None  # the general read path, as before the short one
    prioritized = {"numpy": filled(PrioritizedReplayBuffer, "numpy"),
                   "torch": filled(PrioritizedReplayBuffer, "torch"),
                   "torch general path": general}
    report("prioritized get_next(256)", medians(prioritized, rounds, calls))


if __name__ == "__main__":
    main()
