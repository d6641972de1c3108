"""A prioritized DQN-like train step on a GPU, timed with priority updates checked on
the device (no host sync) and on the host (two syncs per update):

    python benchmarks/gpu_train_loop.py [--steps 1500] [--hidden 256]

Each step samples 256 transitions on the device, runs a small MLP's forward and
backward pass and an Adam step on them, and sets the batch's priorities to its absolute
TD errors. The isolated op timings of ``replaybuffer bench --gpu`` leave the GPU idle
between calls, so a host sync costs little there; here the sync waits for the queued
train step, which is what a learner meets. Prints us per step for both modes, and the
ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import replaybuffer as rb
from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler


def run(device_updates: bool, steps: int, hidden: int, device: torch.device,
        capacity: int = 1 << 20, seed: int = 0) -> float:
    """us per train step with ``device_updates`` as given."""
    torch.manual_seed(seed)
    spec = {"obs": rb.ArraySpec((17,), np.float32), "reward": rb.ArraySpec((), np.float32)}
    buf = rb.PrioritizedReplayBuffer(spec, 1, capacity, storage="torch", device=device,
                                     seed=seed, sample_on_device=True, alpha=0.6)
    sampler = buf.sampler
    assert isinstance(sampler, TorchPrioritizedSampler)
    sampler.device_updates = device_updates
    chunk = 4096
    for _ in range(capacity // chunk):
        buf.extend({"obs": torch.randn(1, chunk, 17, device=device),
                    "reward": torch.randn(1, chunk, device=device)})
    net = torch.nn.Sequential(torch.nn.Linear(17, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, 1)).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)

    def step() -> None:
        batch, info = buf.get_next(256, 2)
        obs, reward = batch["obs"], batch["reward"]
        q = net(obs[:, 0]).squeeze(-1)
        with torch.no_grad():
            target = reward[:, 0] + 0.99 * net(obs[:, 1]).squeeze(-1)
        td = target - q
        loss = (torch.as_tensor(info.weights, device=device) * td.pow(2)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        buf.update_priorities(info.ids, td.detach().abs().double() + 1e-3)

    for _ in range(50):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - start) / steps * 1e6


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--capacity", type=int, default=1 << 20)
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"# {name}, torch {torch.__version__}, capacity {args.capacity}")
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(3):  # interleaved rounds
        for mode in (True, False):
            times[mode].append(run(mode, args.steps, args.hidden, device, args.capacity))
    for mode, label in ((True, "checked on the device"), (False, "checked on the host")):
        print(f"train step, priorities {label}: {min(times[mode]):.1f} us "
              f"(rounds: {', '.join(f'{t:.1f}' for t in times[mode])})")
    print(f"host-checked / device-checked: {min(times[False]) / min(times[True]):.2f}x")


if __name__ == "__main__":
    main()
