"""``replaybuffer bench --gpu``: the torch storage on a GPU against TorchRL and the device.

On one CUDA device (or ``--device cpu`` for a smoke run) it times, for the control and
frames workloads (:mod:`replaybuffer_bench.workloads`' specs):

- ours: ``extend`` of 256 steps given as device tensors, and ``get_next(256, 2)``
  (each step with its next one) drawn by uniform sampling on the device, eagerly
  (``uniform``) and from its recorded CUDA graph (``uniform[captured]``,
  ``capture_samples=True``), and by prioritized sampling, eagerly and recorded
  (``prioritized[captured]``), plus ``update_priorities(256)`` with device tensors;
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
from replaybuffer_bench.workloads import control_spec, frames_spec, random_items
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


def _device_items(torch: Any, device: Any, spec: Any, capacity: int
                  ) -> tuple[Any, Any, Any, int]:
    """What the buffers are filled and written with: ``(host, on_device, batch, chunk)``,
    ``chunk`` (at most 10k) random steps ``[1, chunk, ...]`` as numpy arrays and as
    tensors on ``device``, and the first ``BATCH`` of them on ``device``."""
    rng = np.random.default_rng(0)
    chunk = min(capacity, 10_000)
    host = random_items(spec, (1, chunk), rng)
    on_device = nest.map_structure(lambda a: torch.from_numpy(a).to(device), host)
    batch = nest.map_structure(lambda t: t[:, :BATCH].contiguous(), on_device)
    return host, on_device, batch, chunk


def _fill(buf: Any, data: Any, capacity: int, chunk: int) -> None:
    """Extend ``buf`` with ``data`` (``chunk`` steps) until ``capacity`` steps are in."""
    for _ in range(0, capacity, chunk):
        buf.extend(data)


def _cycle(buf: Any, ids: Any, priorities: Any) -> None:
    """One prioritized training step's replay work: new priorities, then a batch."""
    buf.update_priorities(ids, priorities)
    buf.get_next(BATCH, 2)


def _uniform(spec: Any, capacity: int, device: Any, name: str) -> Any:
    """A device-sampling uniform buffer: eager draws (``uniform``), or served by its
    recorded draw and gather (``uniform[captured]``: a CUDA graph)."""
    return UniformReplayBuffer(spec, 1, capacity, storage="torch", device=device, seed=0,
                               sample_on_device=True,
                               capture_samples=name == "uniform[captured]")


def _prioritized(spec: Any, capacity: int, device: Any, search: str | None,
                 captured: bool = False) -> Any:
    """A device-sampling prioritized buffer whose sampler searches by ``search`` (its
    default when None), eager unless ``captured`` (``capture_samples=True``)."""
    return PrioritizedReplayBuffer(spec, 1, capacity, storage="torch", device=device,
                                   seed=0, sample_on_device=True, device_search=search,
                                   capture_samples=captured)


def _ours(torch: Any, device: Any, workload: str, spec: Any, capacity: int,
          min_time: float, limit: Callable[[int], float]) -> list[Row]:
    """Rows for ``add``, uniform and prioritized ``get_next(256, 2)`` (the default search,
    its recorded draw as ``prioritized[captured]``, the running sums with updates
    checked on the host, then the sum tree as ``prioritized[tree]``), ``update(256)`` and the update-then-sample cycle of a
    prioritized training step."""
    _, on_device, batch, chunk = _device_items(torch, device, spec, capacity)
    step = _step_bytes(spec)
    rows = []
    # "[prefix,host-checked]": updates copied to the host and checked there (two
    # synchronizations each), the way before device updates, for comparison.
    variants: list[tuple[str, str | None]] = [("uniform", None), ("uniform[captured]", None),
                                              ("prioritized", None),
                                              ("prioritized[captured]", "prefix"),
                                              ("prioritized[prefix,host-checked]", "prefix"),
                                              ("prioritized[tree]", "tree")]
    for name, search in variants:
        if name.startswith("uniform"):
            try:
                buf: Any = _uniform(spec, capacity, device, name)
            except ValueError as exc:  # no recording on this device (the CPU)
                rows.append(Row(workload, "replaybuffer", f"{name} sample({BATCH})+next",
                                math.nan, BATCH, None, f"cannot run: {exc}"))
                continue
        else:
            try:
                buf = _prioritized(spec, capacity, device, search,
                                   captured=name == "prioritized[captured]")
            except ValueError as exc:  # no recording on this device (the CPU)
                rows.append(Row(workload, "replaybuffer", f"{name} sample({BATCH})+next",
                                math.nan, BATCH, None, f"cannot run: {exc}"))
                continue
            if search is None:  # named by the search it defaults to
                name = f"prioritized[{buf.sampler.search}]"
            # the buffer's default (device-checked updates on CUDA) and, named, the
            # host-checked ones
            buf.sampler.device_updates = False if "host-checked" in name else None
        _fill(buf, on_device, capacity, chunk)
        if name == "uniform":
            seconds = time_op(torch, device, partial(buf.extend, batch), min_time)
            rows.append(Row(workload, "replaybuffer", f"add({BATCH})", seconds, BATCH,
                            limit(BATCH * step)))
        seconds = time_op(torch, device, partial(buf.get_next, BATCH, 2), min_time)
        rows.append(Row(workload, "replaybuffer", f"{name} sample({BATCH})+next", seconds,
                        BATCH, limit(2 * BATCH * step)))
        if not name.startswith("uniform"):
            ids = buf.get_next(BATCH, 2)[1].ids[:, 0]
            priorities = torch.rand(BATCH, device=device, dtype=torch.float64) + 0.1
            seconds = time_op(torch, device,
                              partial(buf.update_priorities, ids, priorities), min_time)
            rows.append(Row(workload, "replaybuffer", f"{name} update({BATCH})", seconds,
                            BATCH, None))
            seconds = time_op(torch, device, partial(_cycle, buf, ids, priorities),
                              min_time)
            rows.append(Row(workload, "replaybuffer", f"{name} update+sample({BATCH})",
                            seconds, BATCH, limit(2 * BATCH * step)))
        del buf
    return rows


def search_scale(torch: Any, device: Any, capacities: list[int], min_time: float
                 ) -> list[Row]:
    """The update-then-sample cycle of both searches at each capacity, for one float32
    scalar per step (the search's own cost, next to nothing to gather)."""
    from replaybuffer.specs import ArraySpec

    spec = ArraySpec((), np.float32)
    rows = []
    for capacity in capacities:
        chunk = min(capacity, 1 << 20)
        data = torch.rand(1, chunk, device=device)
        for search in ("prefix", "tree"):
            buf = _prioritized(spec, capacity, device, search)
            _fill(buf, data, capacity, chunk)
            ids = buf.get_next(BATCH, 2)[1].ids[:, 0]
            priorities = torch.rand(BATCH, device=device, dtype=torch.float64) + 0.1
            seconds = time_op(torch, device, partial(_cycle, buf, ids, priorities),
                              min_time)
            rows.append(Row(f"scalar {capacity:,}", "replaybuffer",
                            f"prioritized[{search}] update+sample({BATCH})", seconds, BATCH,
                            None))
            print(f"  {rows[-1].workload:<18} {rows[-1].op:<42} {seconds * 1e6:10.1f} us",
                  flush=True)
            del buf
    return rows


def _torchrl(torch: Any, device: Any, workload: str, spec: Any, capacity: int,
             min_time: float, limit: Callable[[int], float]) -> list[Row]:
    from tensordict import TensorDict

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
        try:
            rows += _torchrl_sampler(torch, device, workload, name, capacity, data, batch,
                                     step, min_time, limit)
        except RuntimeError as exc:
            # Its sum trees are a compiled extension, missing from some builds (the CUDA
            # trees from every CPU wheel); it raises on the first extend. Reported in the
            # table, never dropped.
            reason = " ".join(str(exc).split())[:160]
            ops = [f"{name} sample({BATCH})+next"] + (
                [f"{name} update({BATCH})", f"{name} update+sample({BATCH})"]
                if name == "prioritized" else [])
            rows.extend(Row(workload, "torchrl", op, math.nan, BATCH, None,
                            f"cannot run: {reason}") for op in ops)
    return rows


def _torchrl_sampler(torch: Any, device: Any, workload: str, name: str, capacity: int,
                     data: Any, batch: Any, step: int, min_time: float,
                     limit: Callable[[int], float]) -> list[Row]:
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    sampler = {}
    if name == "prioritized":
        # On a CUDA storage it builds its CUDA sum tree (torchrl's extension built with
        # CUDA, benchmarks/torchrl_extension.py --cuda).
        sampler = {"sampler": PrioritizedSampler(capacity, alpha=0.6, beta=0.4)}
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, device=device),
                                batch_size=BATCH, **sampler)
    _fill(rb, data, capacity, data.batch_size[0])
    rows = []
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
        rows.append(Row(workload, "torchrl", f"{name} update({BATCH})", seconds, BATCH,
                        None))

        def cycle() -> None:
            rb.update_priority(index, priorities)
            rb.sample()
        seconds = time_op(torch, device, cycle, min_time)
        rows.append(Row(workload, "torchrl", f"{name} update+sample({BATCH})", seconds,
                        BATCH, limit(BATCH * step)))
    return rows


@dataclass
class Profile:
    """One op's profile, per call: host time, kernels launched, their device time
    (the profiler's CUDA kernel time: the device's busy time, without the gaps while
    it waits for the host), host-device copies and synchronizations."""
    host_us: float
    kernels: float
    device_us: float
    copies: float
    syncs: float


def profile_op(torch: Any, device: Any, fn: Callable[[], object], calls: int = 50) -> Profile:
    """:class:`Profile` of ``fn`` from torch's profiler over ``calls`` calls."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if device.type == "cuda" else [])
    for _ in range(5):
        fn()
    _sync(torch, device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        host_seconds = (time.perf_counter() - start) / calls
        _sync(torch, device)
    launches = copies = syncs = 0
    device_us = 0.0
    for event in prof.key_averages():
        key = event.key
        if key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                   "cuLaunchKernelEx", "cudaGraphLaunch"):
            launches += event.count
        elif key.startswith("cudaMemcpy"):
            copies += event.count
        elif key in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                     "cudaEventSynchronize"):
            syncs += event.count
        if getattr(event, "device_type", None) is not None and \
                str(event.device_type).endswith("CUDA"):
            device_us += getattr(event, "self_device_time_total", 0.0)
    # The loop's own closing synchronization is not the op's.
    syncs = max(0, syncs - (1 if device.type == "cuda" else 0))
    return Profile(host_seconds * 1e6, launches / calls, device_us / calls, copies / calls,
                   syncs / calls)


def profile_ops(torch: Any, device: Any, workload: str, spec: Any, capacity: int
                ) -> dict[str, Profile]:
    """Where our calls' time goes on ``workload``: add (device tensors and numpy),
    uniform and prioritized sample, priority update and the update-then-sample cycle,
    keyed by the op names of the timed rows."""
    host, on_device, batch, chunk = _device_items(torch, device, spec, capacity)
    host_batch = nest.map_structure(lambda a: np.ascontiguousarray(a[:, :BATCH]), host)
    uniform = _uniform(spec, capacity, device, "uniform")
    prioritized = _prioritized(spec, capacity, device, None)
    search = prioritized.sampler.search
    buffers = [uniform, prioritized]
    try:
        captured: Any = _uniform(spec, capacity, device, "uniform[captured]")
        recorded: Any = _prioritized(spec, capacity, device, "prefix", captured=True)
        buffers += [captured, recorded]
    except ValueError:  # no recording on this device (the CPU)
        captured = recorded = None
    for buf in buffers:
        _fill(buf, on_device, capacity, chunk)
    ids = prioritized.get_next(BATCH, 2)[1].ids[:, 0]
    priorities = torch.rand(BATCH, device=device, dtype=torch.float64) + 0.1
    ops: list[tuple[str, Callable[[], object]]] = [
        (f"add({BATCH})", partial(uniform.extend, batch)),
        (f"add({BATCH}) numpy", partial(uniform.extend, host_batch)),
        (f"uniform sample({BATCH})+next", partial(uniform.get_next, BATCH, 2)),
    ] + ([(f"uniform[captured] sample({BATCH})+next", partial(captured.get_next, BATCH, 2))]
         if captured is not None else []) + [
        (f"prioritized[{search}] sample({BATCH})+next",
         partial(prioritized.get_next, BATCH, 2)),
        (f"prioritized[{search}] update({BATCH})",
         partial(prioritized.update_priorities, ids, priorities)),
        (f"prioritized[{search}] update+sample({BATCH})",
         partial(_cycle, prioritized, ids, priorities)),
    ] + ([(f"prioritized[captured] sample({BATCH})+next",
           partial(recorded.get_next, BATCH, 2)),
          (f"prioritized[captured] update+sample({BATCH})",
           partial(_cycle, recorded, ids, priorities))] if recorded is not None else [])
    out = {}
    for name, fn in ops:
        out[name] = profile_op(torch, device, fn)
        p = out[name]
        print(f"  profile {workload:<8} {name:<40} host {p.host_us:8.1f} us, "
              f"{p.kernels:5.1f} kernels, device {p.device_us:7.1f} us, "
              f"{p.copies:.1f} copies, {p.syncs:.1f} syncs", flush=True)
    return out


# The goals of issue 26 per op (TorchRL's time over ours at least this much, and ours
# within this many times the op's device time).
GOALS = {f"uniform sample({BATCH})+next": (2.0, 2.0),
         f"update+sample({BATCH})": (2.5, None)}


def _torchrl_op(op: str) -> str:
    """TorchRL's row for our op: ``prioritized[prefix] x`` is its ``prioritized x``,
    ``uniform[captured] x`` its ``uniform x``."""
    if "[" in op:
        return op[:op.index("[")] + op[op.index("]") + 1:]
    return op


def goals_table(rows: list[Row], profiles: dict[str, dict[str, Profile]]) -> list[str]:
    """Per workload and op of ours: ours and TorchRL's us/call, TorchRL / ours, the
    op's kernels, copies and syncs per call and its device time (profiled), and
    whether the goal for the op (:data:`GOALS`) is met. Lines of a markdown table."""
    torchrl = {(r.workload, r.op): r for r in rows if r.library == "torchrl"}
    lines = ["| workload | op | ours us | TorchRL us | TorchRL / ours | kernels | copies "
             "| syncs | device us | ours / device | goal | met |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if r.library != "replaybuffer" or r.status != "ok" or r.workload not in profiles:
            continue
        peer = torchrl.get((r.workload, _torchrl_op(r.op)))
        peer_us = peer.seconds * 1e6 if peer is not None and peer.status == "ok" \
            else math.nan
        ratio = peer_us / (r.seconds * 1e6)
        p = profiles.get(r.workload, {}).get(r.op)
        goal = next((g for key, g in GOALS.items() if _torchrl_op(r.op).endswith(key)),
                    None)
        over_device = r.seconds * 1e6 / p.device_us if p is not None and p.device_us \
            else math.nan
        goal_text, met = "", ""
        if goal is not None:
            want_ratio, want_device = goal
            goal_text = f">= {want_ratio}x TorchRL" + (
                f", <= {want_device}x device" if want_device else "")
            ok = ratio >= want_ratio and (want_device is None or over_device <= want_device)
            met = "n/a (no TorchRL row)" if math.isnan(ratio) else "yes" if ok else "no"
        cells = [f"{v:.1f}" for v in (p.kernels, p.copies, p.syncs, p.device_us)] \
            if p is not None else ["", "", "", ""]
        lines.append(f"| {r.workload} | {r.op} | {r.seconds * 1e6:,.1f} | "
                     f"{'' if math.isnan(peer_us) else f'{peer_us:,.1f}'} | "
                     f"{'' if math.isnan(ratio) else f'{ratio:.2f}x'} | "
                     f"{' | '.join(cells)} | "
                     f"{'' if math.isnan(over_device) else f'{over_device:.1f}x'} | "
                     f"{goal_text} | {met} |")
    return lines


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
    parser.add_argument("--scale", metavar="CAPACITIES", default=None,
                        help="comma-separated capacities at which to time both prioritized "
                        "searches' update+sample cycle (default 2**17,2**20,2**23,2**26; "
                        "--quick: 2**10,2**14; '' for none)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile our ops (kernels, copies, syncs and device time "
                        "per call) and print the goals table")
    parser.add_argument("--min-time", type=float, default=None,
                        help="seconds per timing loop (default 0.3; --quick 0.02)")
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
    min_time = args.min_time or (0.02 if args.quick else 0.3)
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
            print(f"  {row.workload:<8} {row.library:<13} {row.op:<42} "
                  f"{row.seconds * 1e6:10.1f} us", flush=True)
    scale = args.scale
    if scale is None:
        scale = ",".join(str(1 << k) for k in ((10, 14) if args.quick else (17, 20, 23, 26)))
    rows += search_scale(torch, device, [int(c) for c in scale.split(",") if c], min_time)
    profiles: dict[str, dict[str, Profile]] = {}
    if args.profile:
        for workload in [w for w in args.workloads.split(",") if w]:
            profiles[workload] = profile_ops(torch, device, workload, specs[workload](),
                                             capacities[workload])
    print()
    print(format_table(rows, device_name, gbps_bytes / 1e9))
    if profiles:
        print(f"\n# goals ({device_name}): device us is the profiler's kernel time per "
              "call; syncs exclude the timing loop's own")
        print("\n".join(goals_table(rows, profiles)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": device_name, "bandwidth_bytes_per_s": gbps_bytes,
                       "rows": [asdict(r) for r in rows],
                       "profiles": {w: {op: asdict(p) for op, p in ops.items()}
                                    for w, ops in profiles.items()}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
