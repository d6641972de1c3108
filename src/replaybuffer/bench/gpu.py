"""``replaybuffer bench --gpu``: the torch storage on a GPU against TorchRL and the device.

On one CUDA device (or ``--device cpu`` for a smoke run) it times, for the control and
frames workloads (:mod:`replaybuffer.bench.workloads`' specs):

- ours: ``extend`` of 256 steps given as device tensors, and ``get_next(256, 2)``
  (each step with its next one) drawn by uniform and by prioritized sampling on the
  device, plus ``update_priorities(256)`` with device tensors;
- TorchRL: a ``TensorDictReplayBuffer`` over ``LazyTensorStorage(device=...)`` holding
  the same steps with a stored next observation (TorchRL's layout), ``extend(256)``,
  ``sample(256)`` with its random and its prioritized sampler, ``update_priority``;
- the limit: the device's memory bandwidth from a large device-to-device copy, and
  for each op the time its bytes (read and written once) take at that bandwidth.

Every timed loop ends with ``torch.cuda.synchronize`` (CUDA events time it), so the
figures are device time, not launch time. Speed is measured here, never asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from replaybuffer import nest
from replaybuffer.bench.workloads import control_spec, frames_spec, random_items
from replaybuffer.buffers import PrioritizedReplayBuffer, UniformReplayBuffer

BATCH = 256


@dataclass
class Row:
    workload: str
    library: str
    op: str
    seconds: float
    items: int
    limit_seconds: float | None
    status: str = "ok"  # or why the library could not run the op (a row all the same)

    @property
    def items_per_second(self) -> float:
        return self.items / self.seconds


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(torch: Any, device: Any, fn: Callable[[], object], min_time: float,
            repeats: int = 5) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` loops of about ``min_time``
    each, the device synchronized around every loop (CUDA events on a GPU)."""
    for _ in range(3):
        fn()
    _sync(torch, device)
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < min_time / 4 or n < 2:
        fn()
        n += 1
        _sync(torch, device)
    per = (time.perf_counter() - start) / n
    calls = max(2, int(min_time / max(per, 1e-9)))
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            begin.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) / calls)
    return float(statistics.median(samples))


def bandwidth(torch: Any, device: Any, nbytes: int, min_time: float) -> float:
    """Bytes per second moved by a device-to-device copy of ``nbytes`` (read + write)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_op(torch, device, lambda: dst.copy_(src), min_time)
    return 2 * nbytes / seconds


def _step_bytes(spec: Any) -> int:
    return sum(s.nbytes for s in nest.flatten(spec)[0])


def _ours(torch: Any, device: Any, workload: str, spec: Any, capacity: int,
          min_time: float, limit: Callable[[int], float]) -> list[Row]:
    rng = np.random.default_rng(0)
    chunk = min(capacity, 10_000)
    host = random_items(spec, (1, chunk), rng)
    on_device = nest.map_structure(lambda a: torch.from_numpy(a).to(device), host)
    batch = nest.map_structure(lambda t: t[:, :BATCH].contiguous(), on_device)
    step = _step_bytes(spec)
    rows = []
    for name, cls in (("uniform", UniformReplayBuffer), ("prioritized",
                                                         PrioritizedReplayBuffer)):
        buf = cls(spec, 1, capacity, storage="torch", device=device, seed=0,
                  sample_on_device=True)
        for _ in range(0, capacity, chunk):
            buf.extend(on_device)
        if name == "uniform":
            seconds = time_op(torch, device, partial(buf.extend, batch), min_time)
            rows.append(Row(workload, "replaybuffer", f"add({BATCH})", seconds, BATCH,
                            limit(BATCH * step)))
        seconds = time_op(torch, device, partial(buf.get_next, BATCH, 2), min_time)
        rows.append(Row(workload, "replaybuffer", f"{name} sample({BATCH})+next", seconds,
                        BATCH, limit(2 * BATCH * step)))
        if name == "prioritized":
            pbuf: Any = buf
            ids = pbuf.get_next(BATCH, 2)[1].ids[:, 0]
            priorities = torch.rand(BATCH, device=device, dtype=torch.float64) + 0.1
            seconds = time_op(torch, device,
                              partial(pbuf.update_priorities, ids, priorities), min_time)
            rows.append(Row(workload, "replaybuffer", f"update({BATCH})", seconds, BATCH,
                            None))
    return rows


def _torchrl(torch: Any, device: Any, workload: str, spec: Any, capacity: int,
             min_time: float, limit: Callable[[int], float]) -> list[Row]:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    rng = np.random.default_rng(0)
    chunk = min(capacity, 10_000)
    host = random_items(spec, (chunk,), rng)

    def pack(n: int) -> Any:
        t = {k: torch.from_numpy(np.ascontiguousarray(v[:n])).to(device)
             for k, v in host.items()}
        return TensorDict({"observation": t["observation"], "action": t["action"],
                           "next": {"observation": t["observation"], "reward": t["reward"],
                                    "done": t["step_type"].bool()}}, [n], device=device)
    data, batch = pack(chunk), pack(BATCH)
    step = _step_bytes(spec) + spec["observation"].nbytes  # a stored next observation
    rows: list[Row] = []
    for name in ("uniform", "prioritized"):
        sampler = {}
        if name == "prioritized":
            try:  # its sum tree is a compiled extension, missing from some builds
                sampler = {"sampler": PrioritizedSampler(capacity, alpha=0.6, beta=0.4)}
            except RuntimeError as exc:  # reported in the table, never dropped
                rows.extend(Row(workload, "torchrl", op, math.nan, BATCH, None,
                                f"cannot run: {exc}")
                            for op in (f"{name} sample({BATCH})+next", f"update({BATCH})"))
                break
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, device=device),
                                    batch_size=BATCH, **sampler)
        for _ in range(0, capacity, chunk):
            rb.extend(data)
        if name == "uniform":
            seconds = time_op(torch, device, partial(rb.extend, batch), min_time)
            rows.append(Row(workload, "torchrl", f"add({BATCH})", seconds, BATCH,
                            limit(BATCH * step)))
        seconds = time_op(torch, device, rb.sample, min_time)
        rows.append(Row(workload, "torchrl", f"{name} sample({BATCH})+next", seconds, BATCH,
                        limit(BATCH * step)))
        if name == "prioritized":
            index = rb.sample()["index"]
            priorities = torch.rand(BATCH, device=device) + 0.1
            seconds = time_op(torch, device, partial(rb.update_priority, index, priorities),
                              min_time)
            rows.append(Row(workload, "torchrl", f"update({BATCH})", seconds, BATCH, None))
    return rows


def format_table(rows: list[Row], device_name: str, gbps: float) -> str:
    lines = [f"# device: {device_name}; copy bandwidth {gbps:.1f} GB/s (read + write)",
             "| workload | library | op | us/call | items/s | limit us | x limit | status |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.workload} | {r.library} | {r.op} |  |  |  |  | {r.status} |")
            continue
        limit = "" if r.limit_seconds is None else f"{r.limit_seconds * 1e6:.2f}"
        ratio = "" if r.limit_seconds is None else f"{r.seconds / r.limit_seconds:.1f}"
        lines.append(f"| {r.workload} | {r.library} | {r.op} | {r.seconds * 1e6:,.1f} | "
                     f"{r.items_per_second:,.0f} | {limit} | {ratio} | ok |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replaybuffer bench --gpu")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda; "
                        "cpu for a smoke run)")
    parser.add_argument("--workloads", default="control,frames")
    parser.add_argument("--quick", action="store_true", help="small buffers, short loops")
    parser.add_argument("--no-torchrl", action="store_true", help="ours and the limit only")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench --gpu needs torch (pip install 'replaybuffer[torch]')", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("bench --gpu: no CUDA device is available to this process (torch "
                  f"{torch.__version__}, CUDA build {torch.version.cuda}); run it on a "
                  "machine with a GPU, or pass --device cpu for a smoke run",
                  file=sys.stderr)
            return 2
        device = torch.device("cuda", device.index if device.index is not None
                              else torch.cuda.current_device())
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = f"{device} (smoke run)"
    min_time = 0.02 if args.quick else 0.3
    capacities = {"control": 10_000 if args.quick else 1_000_000,
                  "frames": 1_000 if args.quick else 100_000}
    specs = {"control": control_spec, "frames": frames_spec}
    gbps_bytes = bandwidth(torch, device, (16 << 20) if args.quick else (1 << 30), min_time)

    def limit(nbytes: int) -> float:
        return 2 * nbytes / gbps_bytes  # read once, written once

    rows: list[Row] = []
    for workload in [w for w in args.workloads.split(",") if w]:
        spec, capacity = specs[workload](), capacities[workload]
        first = len(rows)
        rows += _ours(torch, device, workload, spec, capacity, min_time, limit)
        if not args.no_torchrl:
            try:
                rows += _torchrl(torch, device, workload, spec, capacity, min_time, limit)
            except ImportError as exc:
                print(f"torchrl rows skipped: {exc}", file=sys.stderr)
        for row in rows[first:]:
            print(f"  {row.workload:<8} {row.library:<13} {row.op:<30} "
                  f"{row.seconds * 1e6:10.1f} us", flush=True)
    print()
    print(format_table(rows, device_name, gbps_bytes / 1e9))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": device_name, "bandwidth_bytes_per_s": gbps_bytes,
                       "rows": [asdict(r) for r in rows]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
