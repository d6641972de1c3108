"""A transition buffer's ``sample(256)`` with ``sample_on_device=True`` against the host
path, and what a device sample costs in host syncs and kernels.

A :class:`~replaybuffer.TransitionReplayBuffer` (and its prioritized kind) of 100,000
transitions from 4 envs (an observation of 8 float32, an int64 action; episodes of
about 200 steps end by termination or truncation) on torch storage. Each round adds
one step of every env, then samples 256 transitions, as a learner's loop does; the
variants are interleaved round by round, so a machine shared with other jobs slows
them alike:

- ``host``: the host sampler and host reads (``sample_on_device=False``);
- ``device``: draws and reads on the device (``sample_on_device=True``).

On the CPU the device variant runs torch's device layout (``TorchStorage.numpy_views =
False``: the CPU twin of a GPU), where it is not meant to be faster: the figure is of
its launches; the time is the thread's CPU time of the samples (not the adds). On
CUDA it prints the wall time of the samples (the device's queue drained once per block
of calls, so the host runs ahead of the device as in training) and whether a device
sample synchronizes (``torch.cuda.set_sync_debug_mode("error")``).

Run: ``python benchmarks/transition_device_sample.py [DEVICE] [ROUNDS] [N_STEP]``
(default ``cpu 30 1``). Run it with each tree's ``src`` on ``PYTHONPATH`` in turn to
compare them.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

import replaybuffer as rb
from replaybuffer.storage.torch_storage import TorchStorage

ENVS, CAPACITY, BATCH, CALLS = 4, 100_000, 256, 50


def build(cls: Any, device: str, on_device: bool, n_step: int) -> Any:
    buf = cls(rb.ArraySpec((8,), np.float32), rb.ArraySpec((), np.int64), CAPACITY,
              num_envs=ENVS, storage="torch", device=device, sample_on_device=on_device,
              n_step=n_step, seed=0)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((ENVS, 8)).astype(np.float32)
    state = {"obs": obs, "t": 0, "rng": rng}
    for _ in range(CAPACITY // ENVS // 2):
        step(buf, state)
    return buf, state


def step(buf: Any, state: dict[str, Any]) -> None:
    rng, t = state["rng"], state["t"]
    nxt = state["obs"] + np.float32(1)
    ends = (t + np.arange(ENVS) * 37) % 200 == 199
    terminated, truncated = ends & (np.arange(ENVS) % 2 == 0), ends & (np.arange(ENVS) % 2 == 1)
    buf.add(state["obs"], np.full(ENVS, t), rng.standard_normal(ENVS).astype(np.float32), nxt,
            terminated, truncated)
    state["obs"] = np.where(ends[:, None], rng.standard_normal((ENVS, 8)), nxt
                            ).astype(np.float32)
    state["t"] = t + 1


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    n_step = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    cuda = device.startswith("cuda")
    if not cuda:
        TorchStorage.numpy_views = False  # the CPU twin of the device layout
    variants = {f"{cls.__name__} {name}": build(cls, device, name == "device", n_step)
                for cls in (rb.TransitionReplayBuffer, rb.PrioritizedTransitionReplayBuffer)
                for name in ("host", "device")}
    # On the CPU the thread's CPU time (other jobs on a shared machine do not count);
    # on CUDA wall time, the device's queue drained at the end of each block.
    clock = time.perf_counter if cuda else time.thread_time
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (buf, state) in variants.items():
            if cuda:
                torch.cuda.synchronize()
            spent = 0.0
            for _ in range(CALLS):
                step(buf, state)  # not timed
                start = clock()
                buf.sample(BATCH)
                spent += clock() - start
            if cuda:
                start = clock()
                torch.cuda.synchronize()
                spent += clock() - start
            times[name].append(spent / CALLS)
    print(f"sample({BATCH}) after each add of {ENVS} envs, n_step={n_step}, {device}, "
          f"{rounds} rounds of {CALLS}: median (best) us")
    for name, values in times.items():
        print(f"  {name:<44} {statistics.median(values) * 1e6:9.1f} "
              f"({min(values) * 1e6:.1f})")
    if cuda:
        for name, (buf, state) in variants.items():
            if "device" not in name:
                continue
            step(buf, state)
            torch.cuda.set_sync_debug_mode("error")
            try:
                buf.sample(BATCH)
                verdict = "no host sync"
            except RuntimeError as exc:
                verdict = f"synchronizes: {exc}"
            finally:
                torch.cuda.set_sync_debug_mode("default")
            print(f"  {name}: {verdict}")


if __name__ == "__main__":
    main()
