"""The peer table's rows for cpprb's replay buffers, imported lazily inside the run."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.specs import ArraySpec
from replaybuffer_bench.peers.measuring import MemoryGrowth, cycling, timed_rows
from replaybuffer_bench.peers.workloads_spec import (ALPHA, BETA, FRAME_SHAPE, Rows, Sizes,
                                                     control_transition_spec, fill_chunks,
                                                     frames_transition_spec, is_prioritized,
                                                     priority_pool, prioritized_transition_spec,
                                                     random_priorities, transitions)

def _cpprb_env(spec: dict[str, ArraySpec], next_of: bool) -> dict[str, dict[str, Any]]:
    env = {}
    for key, s in spec.items():
        if next_of and key == "next_obs":
            continue
        env[key] = {"shape": s.shape or 1, "dtype": s.dtype}
    return env


def _cpprb_fill(rb: Any, chunk: dict[str, np.ndarray], capacity: int) -> None:
    for n in fill_chunks(capacity, len(chunk["obs"])):
        rb.add(**{k: v[:n] for k, v in chunk.items()})


def cpprb_rows(workload: str, sizes: Sizes, layout: str = "next_of") -> Rows:
    """cpprb ReplayBuffer / PrioritizedReplayBuffer, next_obs via ``next_of='obs'``.

    ``layout``: ``next_of`` (default), ``stack`` (next_of + stack_compress='obs'; cpprb
    wants the stack as the last dimension, so obs is [84, 84, 4]) or ``plain`` (next_obs
    stored as its own array; memory only).
    """
    import cpprb

    next_of = layout != "plain"
    kwargs: dict[str, Any] = {"next_of": "obs"} if next_of else {}
    if is_prioritized(workload):
        capacity = sizes.prioritized
        spec = prioritized_transition_spec()
        data = transitions(spec, capacity)
        rb = cpprb.PrioritizedReplayBuffer(capacity, _cpprb_env(spec, True), alpha=ALPHA,
                                           **kwargs)
        _cpprb_fill(rb, data["chunk"], capacity)
        rng = np.random.default_rng(1)
        for start in range(0, capacity, 100_000):
            idx = np.arange(start, min(capacity, start + 100_000))
            rb.update_priorities(idx, random_priorities(workload, rng, len(idx)))
        prios = priority_pool(workload)
        next_prio = cycling(prios)
        indexes = [rb.sample(256, beta=BETA)["indexes"] for _ in range(len(prios))]
        pairs = cycling(list(zip(indexes, prios)))

        def sample_update() -> None:
            s = rb.sample(256, beta=BETA)
            rb.update_priorities(s["indexes"], next_prio())

        yield from timed_rows({
            "sample(256)+weights": (lambda: rb.sample(256, beta=BETA), 256),
            "update(256)": (lambda: rb.update_priorities(*pairs()), 256),
            "sample+update(256)": (sample_update, 256)}, sizes)
        return

    if workload == "control":
        capacity = sizes.control
        spec = control_transition_spec()
        data = transitions(spec, capacity)
        rb = cpprb.ReplayBuffer(capacity, _cpprb_env(spec, next_of), **kwargs)
        _cpprb_fill(rb, data["chunk"], capacity)
        one, batch = data["one"], data["batch"]
        yield from timed_rows({"add(1)": (lambda: rb.add(**one), 1),
                           "add(256)": (lambda: rb.add(**batch), 256),
                           "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)
        return

    # frames
    memory_only = layout == "plain"
    capacity = sizes.frames_memory_only if memory_only else sizes.frames
    shape = (84, 84, 4) if layout == "stack" else FRAME_SHAPE
    spec = frames_transition_spec(shape)
    data = transitions(spec, capacity)
    if layout == "stack":
        kwargs["stack_compress"] = "obs"
    mem = MemoryGrowth(capacity)
    rb = cpprb.ReplayBuffer(capacity, _cpprb_env(spec, next_of), **kwargs)
    _cpprb_fill(rb, data["chunk"], capacity)
    yield mem.row(None, {"next_of": "obs and next_obs share one array (+1 slot)",
                         "stack": "next_of + stack_compress: frames shared along the stack",
                         "plain": "obs and next_obs stored separately"}[layout])
    if memory_only:
        return
    one = data["one"]
    yield from timed_rows({"add(1)": (lambda: rb.add(**one), 1),
                       "sample(32)+next": (lambda: rb.sample(32), 32),
                       "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)


