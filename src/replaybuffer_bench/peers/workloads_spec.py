"""The peer benchmark's workloads: their names and ops, the sizes of a full and a quick
run, the transition specs, and the data and priorities every peer is fed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Iterator

import numpy as np

from replaybuffer.specs import ArraySpec
from replaybuffer_bench import pearl_seed, seed_venv, tf_agents_seed
from replaybuffer_bench.workloads import random_items

Rows = Generator[dict[str, Any], None, None]
"""What a peer's run function yields: one result row per op."""

BUFFER_WORKLOADS = ("control", "frames", "prioritized", "prioritized-skewed")
WORKLOADS = BUFFER_WORKLOADS + ("pearl", "tf-agents")

OPS = {
    "control": ("add(1)", "add(256)", "sample(256)+next"),
    "frames": ("add(1)", "sample(32)+next", "sample(256)+next", "bytes/transition"),
    "prioritized": ("sample(256)+weights", "update(256)", "sample+update(256)"),
}
OPS["prioritized-skewed"] = OPS["prioritized"]
OPS["pearl"] = pearl_seed.peer_ops()
OPS["tf-agents"] = tf_agents_seed.peer_ops()
MEMORY_ONLY = ("bytes/transition",)

ALPHA, BETA = 0.6, 0.4
FRAME_SHAPE = (4, 84, 84)
FILL_CHUNK = 1000


@dataclass(frozen=True)
class Sizes:
    """Capacities and timing effort of a run (:data:`FULL` or :data:`QUICK`)."""

    control: int
    frames: int
    prioritized: int
    frames_memory_only: int  # layouts measured for bytes/transition alone
    min_time: float
    repeats: int


FULL = Sizes(control=1_000_000, frames=200_000, prioritized=1_000_000,
             frames_memory_only=20_000, min_time=0.25, repeats=7)
QUICK = Sizes(control=20_000, frames=2_000, prioritized=20_000,
              frames_memory_only=2_000, min_time=0.02, repeats=3)


class Unsupported(Exception):
    """The peer has no API for this workload (reported as ``unsupported: ...``)."""


NotInstalled = seed_venv.NotInstalled
"""The peer lives in a venv of its own that is missing (``not installed (...)``)."""



def random_data(spec: dict[str, ArraySpec], outer: tuple[int, ...], seed: int = 0
          ) -> dict[str, np.ndarray]:
    """Random items of ``spec`` with leading dims ``outer`` (``[*outer, *shape]`` per key)."""
    items: dict[str, np.ndarray] = random_items(spec, outer, np.random.default_rng(seed))
    return items


def control_transition_spec() -> dict[str, ArraySpec]:
    """The control workload's transition: float32 obs[17], act[6], rew, next_obs[17], done."""
    return {"obs": ArraySpec((17,), np.float32), "act": ArraySpec((6,), np.float32),
            "rew": ArraySpec((), np.float32), "next_obs": ArraySpec((17,), np.float32),
            "done": ArraySpec((), np.float32)}


def frames_transition_spec(obs_shape: tuple[int, ...] = FRAME_SHAPE) -> dict[str, ArraySpec]:
    """The frames workload's transition: uint8 obs and next_obs ``obs_shape``, int64 act,
    float32 rew and done."""
    return {"obs": ArraySpec(obs_shape, np.uint8), "act": ArraySpec((), np.int64),
            "rew": ArraySpec((), np.float32), "next_obs": ArraySpec(obs_shape, np.uint8),
            "done": ArraySpec((), np.float32)}


def prioritized_transition_spec() -> dict[str, ArraySpec]:
    """The prioritized workloads' transition: float32 obs[4], next_obs[4], rew, done; int64
    act."""
    return {"obs": ArraySpec((4,), np.float32), "act": ArraySpec((), np.int64),
            "rew": ArraySpec((), np.float32), "next_obs": ArraySpec((4,), np.float32),
            "done": ArraySpec((), np.float32)}


def transitions(spec: dict[str, ArraySpec], capacity: int) -> dict[str, Any]:
    """One transition, a batch of 256 and a fill chunk, all done=0."""
    chunk = min(FILL_CHUNK, capacity)
    out = {"one": random_data(spec, (), 1), "batch": random_data(spec, (256,), 2),
           "chunk": random_data(spec, (chunk,), 3)}
    for d in out.values():
        d["done"] = np.zeros_like(d["done"])
    return out


def fill_chunks(capacity: int, chunk: int) -> Iterator[int]:
    """Sizes of the fill calls that add exactly ``capacity`` items."""
    remaining = capacity
    while remaining > 0:
        n = min(chunk, remaining)
        yield n
        remaining -= n


def is_prioritized(workload: str) -> bool:
    """Whether ``workload`` samples by priority."""
    return workload in ("prioritized", "prioritized-skewed")


def random_priorities(workload: str, rng: np.random.Generator, size: int) -> np.ndarray:
    """float32 priorities: uniform in [1e-3, 1 + 1e-3) for ``prioritized``; log-normal
    (sigma 2, so after alpha = 0.6 the largest of 1M is ~300x the mean) for
    ``prioritized-skewed``, the heavy tail of real TD errors, where rejection from the
    largest priority rarely accepts and samplers must search their tree."""
    if workload == "prioritized-skewed":
        return rng.lognormal(0.0, 2.0, size).astype(np.float32)
    return (rng.random(size) + 1e-3).astype(np.float32)


def priority_pool(workload: str, n: int = 64, size: int = 256) -> list[np.ndarray]:
    """``n`` float32 ``[size]`` priority batches of ``workload`` (seeded), cycled by updates."""
    rng = np.random.default_rng(7)
    return [random_priorities(workload, rng, size) for _ in range(n)]

