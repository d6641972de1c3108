"""The peer table's rows for Tianshou's replay buffers, imported lazily inside the run."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from replaybuffer_bench.peers.measuring import (MemoryGrowth, cycling, release_memory, timed_rows,
                                                torch_module)
from replaybuffer_bench.peers.workloads_spec import (ALPHA, BETA, Rows, Sizes,
                                                     control_transition_spec,
                                                     frames_transition_spec, is_prioritized,
                                                     priority_pool, prioritized_transition_spec,
                                                     random_priorities, transitions)

def tianshou_rows(workload: str, sizes: Sizes, layout: str = "default"
              ) -> Rows:
    """Tianshou ReplayBuffer / VectorReplayBuffer / PrioritizedReplayBuffer (numpy Batch).

    ``layout`` (frames): ``default`` stores obs_next (memory only), ``ignore_obs_next``
    reads next obs from the next index, ``atari`` adds ``save_only_last_obs`` and
    ``stack_num=4`` (one frame stored, stacks rebuilt at sample time), the configuration
    of Tianshou's Atari examples. ``add(256)`` goes through ``VectorReplayBuffer`` with
    256 sub-buffers, Tianshou's way of adding a step from each of many envs. Buffers are
    filled through ``update()`` from a chunk-sized buffer (``add`` is one transition).
    """
    torch_module()
    from tianshou.data import Batch, PrioritizedReplayBuffer, ReplayBuffer, VectorReplayBuffer

    options: dict[str, Any] = {}
    if layout in ("ignore_obs_next", "atari"):
        options["ignore_obs_next"] = True
    if layout == "atari":
        options.update(save_only_last_obs=True, stack_num=4)

    def batch_of(d: dict[str, np.ndarray]) -> Any:
        return Batch(obs=d["obs"], act=d["act"], rew=d["rew"], terminated=d["done"] > 0,
                     truncated=np.zeros_like(d["done"], bool), obs_next=d["next_obs"])

    def rows(d: dict[str, np.ndarray]) -> list[Any]:
        return [batch_of({k: v[i] for k, v in d.items()}) for i in range(len(d["rew"]))]

    def source_of(chunk: dict[str, np.ndarray]) -> Any:
        source = ReplayBuffer(len(chunk["rew"]), **options)
        for b in rows(chunk):
            source.add(b)
        return source

    def fill_ts(buf: Any, source: Any, capacity: int) -> None:
        for _ in range(capacity // len(source)):
            buf.update(source)
        for i in range(capacity % len(source)):
            buf.add(source[i])

    spec = {"control": control_transition_spec, "frames": frames_transition_spec,
            "prioritized": prioritized_transition_spec,
            "prioritized-skewed": prioritized_transition_spec}[workload]()
    memory_only = workload == "frames" and layout == "default"
    capacity = sizes.frames_memory_only if memory_only else \
        sizes.prioritized if is_prioritized(workload) else getattr(sizes, workload)
    data = transitions(spec, capacity)
    one = batch_of(data["one"])
    source = source_of(data["chunk"])  # built before any memory baseline

    if is_prioritized(workload):
        buf = PrioritizedReplayBuffer(capacity, alpha=ALPHA, beta=BETA)
        fill_ts(buf, source, capacity)
        rng = np.random.default_rng(1)
        buf.update_weight(np.arange(capacity), random_priorities(workload, rng, capacity))
        prios = priority_pool(workload)
        next_prio = cycling(prios)
        indexes = [buf.sample(256)[1] for _ in range(len(prios))]
        pairs = cycling(list(zip(indexes, prios)))

        def sample_update() -> None:
            batch, idx = buf.sample(256)  # batch.weight: importance weights
            buf.update_weight(idx, next_prio())

        yield from timed_rows({"sample(256)+weights": (lambda: buf.sample(256), 256),
                           "update(256)": (lambda: buf.update_weight(*pairs()), 256),
                           "sample+update(256)": (sample_update, 256)}, sizes)
        return

    if workload == "control":
        buf = ReplayBuffer(capacity, **options)
        fill_ts(buf, source, capacity)
        yield from timed_rows({"add(1)": (lambda: buf.add(one), 1),
                           "sample(256)+next": (lambda: buf.sample(256), 256)}, sizes)
        buf = None  # freed before the next buffer is built
        release_memory()
        vec = VectorReplayBuffer(capacity, 256, **options)
        batch = batch_of(data["batch"])
        for _ in range(capacity // 256):
            vec.add(batch)
        yield from timed_rows({"add(256)": (lambda: vec.add(batch), 256)}, sizes)
        return

    mem = MemoryGrowth(capacity)
    buf = ReplayBuffer(capacity, **options)
    fill_ts(buf, source, capacity)
    obs_bytes = None
    with contextlib.suppress(Exception):
        obs_bytes = buf.obs.nbytes + (0 if options else buf.obs_next.nbytes)
    yield mem.row(obs_bytes, {"default": "obs and obs_next arrays",
                              "ignore_obs_next": "next obs is the next index",
                              "atari": "last frame only; stacks rebuilt per sample"}[layout])
    if memory_only:
        return
    yield from timed_rows({"add(1)": (lambda: buf.add(one), 1),
                       "sample(32)+next": (lambda: buf.sample(32), 32),
                       "sample(256)+next": (lambda: buf.sample(256), 256)}, sizes)


