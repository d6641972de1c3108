"""The peer table's rows for TorchRL's replay buffers, imported lazily inside the run."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from replaybuffer_bench.peers.measuring import MemoryGrowth, cycling, timed_rows, torch_module
from replaybuffer_bench.peers.workloads_spec import (ALPHA, BETA, Rows, Sizes,
                                                     control_transition_spec, fill_chunks,
                                                     frames_transition_spec, is_prioritized,
                                                     priority_pool, prioritized_transition_spec,
                                                     random_priorities, transitions)

def torchrl_rows(workload: str, sizes: Sizes, layout: str = "td") -> Rows:
    """TorchRL replay buffers over LazyTensorStorage (PrioritizedSampler for PER).

    ``layout``: ``td`` is TensorDictReplayBuffer with TorchRL's transition layout
    (observation, action, ("next", observation/reward/done)); ``pytree`` is ReplayBuffer
    over a plain tuple of tensors. TorchRL stores next observations as their own tensor.
    """
    torch = torch_module()
    from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    spec = {"control": control_transition_spec, "frames": frames_transition_spec,
            "prioritized": prioritized_transition_spec,
            "prioritized-skewed": prioritized_transition_spec}[workload]()
    capacity = sizes.prioritized if is_prioritized(workload) else getattr(sizes, workload)
    data = transitions(spec, capacity)

    if layout == "td":
        from tensordict import TensorDict

        def pack(d: dict[str, np.ndarray]) -> Any:
            batch = list(d["rew"].shape)
            t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in d.items()}
            return TensorDict({"observation": t["obs"], "action": t["act"],
                               "next": {"observation": t["next_obs"], "reward": t["rew"],
                                        "done": t["done"].bool()}}, batch)
        cls = TensorDictReplayBuffer
    else:
        def pack(d: dict[str, np.ndarray]) -> Any:
            return tuple(torch.from_numpy(np.ascontiguousarray(d[k]))
                         for k in ("obs", "act", "rew", "next_obs", "done"))
        cls = ReplayBuffer

    sampler = {}
    if is_prioritized(workload):
        sampler = {"sampler": PrioritizedSampler(capacity, alpha=ALPHA, beta=BETA)}
    if workload == "frames":
        mem = MemoryGrowth(capacity)
    rb = cls(storage=LazyTensorStorage(capacity), **sampler)
    chunk = data["chunk"]
    packed = pack(chunk)
    for n in fill_chunks(capacity, len(chunk["rew"])):
        rb.extend(packed if n == len(chunk["rew"]) else pack({k: v[:n] for k, v in chunk.items()}))
    if workload == "frames":
        obs_bytes = None
        with contextlib.suppress(Exception):
            # The storage's tensors, whole: the buffer is full, so get(slice(None)) is a
            # view of every slot (basic slicing, no copy).
            st = rb.storage.get(slice(None))
            obs_bytes = st["observation"].nbytes + st["next", "observation"].nbytes
        yield mem.row(obs_bytes, "observation and (next, observation) tensors")
    one, batch = pack(data["one"]), pack(data["batch"])

    if is_prioritized(workload):
        rng = np.random.default_rng(1)
        for start in range(0, capacity, 100_000):
            idx = torch.arange(start, min(capacity, start + 100_000))
            rb.update_priority(idx, torch.from_numpy(random_priorities(workload, rng, len(idx))))
        prios = [torch.from_numpy(p) for p in priority_pool(workload)]
        next_prio = cycling(prios)
        if layout == "td":
            def sample() -> Any:
                return rb.sample(256)  # carries "index" and "priority_weight"

            def index_of(s: Any) -> Any:
                return s["index"]
        else:
            def sample() -> Any:
                return rb.sample(256, return_info=True)  # (data, {"index", "priority_weight"})

            def index_of(s: Any) -> Any:
                return s[1]["index"]
        indexes = [index_of(sample()) for _ in range(len(prios))]
        pairs = cycling(list(zip(indexes, prios)))

        def sample_update() -> None:
            rb.update_priority(index_of(sample()), next_prio())

        yield from timed_rows({"sample(256)+weights": (sample, 256),
                           "update(256)": (lambda: rb.update_priority(*pairs()), 256),
                           "sample+update(256)": (sample_update, 256)}, sizes)
        return
    if workload == "control":
        yield from timed_rows({"add(1)": (lambda: rb.add(one), 1),
                           "add(256)": (lambda: rb.extend(batch), 256),
                           "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)
        return
    yield from timed_rows({"add(1)": (lambda: rb.add(one), 1),
                       "sample(32)+next": (lambda: rb.sample(32), 32),
                       "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)


