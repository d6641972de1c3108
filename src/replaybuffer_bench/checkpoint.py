"""``replaybuffer bench --checkpoint``: saving and loading a large buffer while it is in use.

Measures, on a buffer of ``--size-gb`` of Atari-like frames (uint8 ``[84, 84, 4]`` per
step plus small leaves):

- **save**: seconds and GB/s of ``buffer.save`` while a collector thread adds steps at
  ``--add-rate`` per second; the longest ``add_batch`` during the save (the stall) beside
  the median add; the peak extra resident memory (``VmHWM`` over the resident size
  before the save; the kernel's peak counter is reset first);
- **load**: seconds, GB/s and peak extra resident memory of ``replaybuffer.load`` in a
  fresh process (extra: peak minus the process before loading minus the buffer itself);
- **the limits** (wall time, and the loading process's CPU time, steadier on shared
  cores): a plain copy of the checkpoint's data files (``shutil.copyfile`` then
  ``fsync``, as a save writes and syncs) and a plain read of them into fresh memory in
  a new process (as a load fills a new buffer), in 4 MB chunks.

Timings are single runs of multi-second operations; page-cache state is what a save
then load leaves (the files are cached when they are read back, for us and the limit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

FRAME = (84, 84, 4)


def process_status(field: str) -> int:
    """A ``/proc/self/status`` size field (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak resident size (``VmHWM``) to the current one."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def build(size_gb: float) -> Any:
    """A full one-row buffer of about ``size_gb`` GB, written with ``extend`` blocks."""
    import replaybuffer as rb

    spec = {"observation": rb.ArraySpec(FRAME, np.uint8), "action": rb.ArraySpec((), np.int32),
            "reward": rb.ArraySpec((), np.float32), "step": rb.ArraySpec((), np.int64)}
    per_step = sum(s.nbytes for s in spec.values())
    capacity = max(1000, int(size_gb * 1e9 / per_step))
    buffer = rb.UniformReplayBuffer(spec, batch_size=1, max_length=capacity, seed=0)
    block = 1000
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (1, block) + FRAME, dtype=np.uint8)
    for start in range(0, capacity, block):
        n = min(block, capacity - start)
        steps = np.arange(start, start + n, dtype=np.int64)[None]
        buffer.extend({"observation": frames[:, :n], "action": (steps % 18).astype(np.int32),
                       "reward": (steps % 7).astype(np.float32), "step": steps})
    return buffer


def _step(t: int, frame: np.ndarray) -> dict[str, np.ndarray]:
    return {"observation": frame, "action": np.array([t % 18], np.int32),
            "reward": np.array([t % 7], np.float32), "step": np.array([t], np.int64)}


def start_collector(buffer: Any, add_rate: float, adds: list[tuple[float, float]]
                    ) -> Callable[[], None]:
    """Start a thread adding ``add_rate`` steps a second to ``buffer`` (of :func:`build`),
    appending each add's ``(start, seconds)`` (``perf_counter``) to ``adds``; returns
    the function that stops it."""
    frame = np.zeros((1,) + FRAME, np.uint8)
    stop = threading.Event()

    def collect() -> None:
        t = buffer.last_id + 1
        period = 1.0 / add_rate
        next_time = time.perf_counter()
        while not stop.is_set():
            start = time.perf_counter()
            buffer.add_batch(_step(t, frame))
            adds.append((start, time.perf_counter() - start))
            t += 1
            next_time += period
            delay = next_time - time.perf_counter()
            if delay > 0:
                time.sleep(delay)

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()

    def stop_collector() -> None:
        stop.set()
        thread.join()

    return stop_collector


def measure_save(buffer: Any, directory: Path, add_rate: float) -> dict[str, Any]:
    """Save while a thread adds ``add_rate`` steps a second; times and memory."""
    adds: list[tuple[float, float]] = []
    stop_collector = start_collector(buffer, add_rate, adds)
    time.sleep(2.0)  # adds at their pace before the save: the idle baseline
    before_save = len(adds)
    rss = process_status("VmRSS")
    peak_reset = reset_peak_rss()
    start = time.perf_counter()
    written = buffer.save(directory)
    seconds = time.perf_counter() - start
    peak = process_status("VmHWM")
    after_save = len(adds)
    time.sleep(0.2)
    stop_collector()
    latencies = [add_seconds for _, add_seconds in adds]
    during = latencies[before_save:after_save]
    data = sum(p.stat().st_size for p in written.glob("*.npy"))
    return {"seconds": seconds, "bytes": data, "gb_per_s": data / seconds / 1e9,
            "adds_during": len(during), "add_median_us": statistics.median(latencies) * 1e6,
            "add_max_us": max(during, default=0.0) * 1e6,
            "add_idle_max_us": max(latencies[:before_save], default=0.0) * 1e6,
            "add_p99_us": float(np.percentile(during, 99)) * 1e6 if during else 0.0,
            "extra_peak_rss_mb": (peak - rss) / 1e6 if peak_reset else None,
            "checkpoint": str(written)}


LOAD_SCRIPT = """
import json, sys, time
from pathlib import Path
import replaybuffer as rb
from replaybuffer_bench.checkpoint import process_status, reset_peak_rss
rss = process_status("VmRSS")
reset_peak_rss()
start, cpu = time.perf_counter(), time.process_time()
buffer = rb.load(sys.argv[1])
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "cpu": cpu, "rss_before": rss,
                  "peak": process_status("VmHWM"), "nbytes": buffer.nbytes,
                  "frames": buffer.num_frames()}))
"""


def measure_load(checkpoint: str) -> dict[str, Any]:
    """``replaybuffer.load`` in a fresh process: time and peak memory beyond the buffer."""
    out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, checkpoint], check=True,
                         capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    data = sum(p.stat().st_size for p in Path(checkpoint).glob("*.npy"))
    return {"seconds": result["seconds"], "gb_per_s": data / result["seconds"] / 1e9,
            "gb_per_cpu_s": data / max(result["cpu"], 1e-9) / 1e9,
            "extra_peak_rss_mb": (result["peak"] - result["rss_before"] - result["nbytes"])
            / 1e6}


READ_SCRIPT = """
import sys, time
import numpy as np
from pathlib import Path
files = sorted(Path(sys.argv[1]).glob("*.npy"))
memory = np.empty(sum(f.stat().st_size for f in files), np.uint8)
start, cpu, offset = time.perf_counter(), time.process_time(), 0
for f in files:
    with open(f, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(memoryview(memory[offset:offset + (4 << 20)]))
            if not n:
                break
            offset += n
print(time.perf_counter() - start, time.process_time() - cpu)
"""


def measure_copy(checkpoint: str, scratch: Path) -> float:
    """GB/s of a plain copy (``shutil.copyfile``, then ``fsync``, as a save syncs) of a
    checkpoint's data files."""
    files = sorted(Path(checkpoint).glob("*.npy"))
    data = sum(p.stat().st_size for p in files)
    scratch.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for f in files:
        target = scratch / f.name
        shutil.copyfile(f, target)
        with open(target, "rb+") as fh:
            os.fsync(fh.fileno())
    seconds = time.perf_counter() - start
    shutil.rmtree(scratch, ignore_errors=True)
    return data / seconds / 1e9


def measure_read(checkpoint: str) -> tuple[float, float]:
    """GB/s of a plain read of a checkpoint's data files into memory a fresh process had
    not touched (as a load fills a new buffer), in 4 MB chunks: per second of wall time,
    and per second of the process's CPU time (steadier where other processes share the
    cores)."""
    data = sum(p.stat().st_size for p in Path(checkpoint).glob("*.npy"))
    seconds, cpu = map(float, subprocess.run(
        [sys.executable, "-c", READ_SCRIPT, checkpoint], check=True, capture_output=True,
        text=True).stdout.split())
    return data / seconds / 1e9, data / max(cpu, 1e-9) / 1e9


def load_only(checkpoint: str, rounds: int) -> int:
    """``--load-only``: a plain read and a load of ``checkpoint``, alternated ``rounds``
    times (each in a fresh process); every round and the best of each printed, per
    second of wall time and per second of CPU time."""
    reads, loads = [], []
    for k in range(1, rounds + 1):
        reads.append(measure_read(checkpoint))
        load = measure_load(checkpoint)
        loads.append((load["gb_per_s"], load["gb_per_cpu_s"]))
        print(f"round {k}: load {loads[-1][0]:.2f} GB/s ({loads[-1][1]:.2f} per CPU "
              f"second), plain read {reads[-1][0]:.2f} ({reads[-1][1]:.2f})")
    wall = max(x[0] for x in loads) / max(x[0] for x in reads)
    cpu = max(x[1] for x in loads) / max(x[1] for x in reads)
    print(f"best of {rounds}: load {max(x[0] for x in loads):.2f} GB/s vs read "
          f"{max(x[0] for x in reads):.2f} ({wall:.2f}x); per CPU second "
          f"{max(x[1] for x in loads):.2f} vs {max(x[1] for x in reads):.2f} ({cpu:.2f}x)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replaybuffer bench --checkpoint",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=4.0)
    parser.add_argument("--add-rate", type=float, default=2000.0,
                        help="steps per second the collector thread adds during the save")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--load-only", metavar="CHECKPOINT",
                        help="only alternate a plain read and a load of this checkpoint "
                             "directory, --rounds times (no buffer built, no save)")
    args = parser.parse_args(argv)
    if args.load_only:
        return load_only(args.load_only, args.rounds)
    root = Path(args.dir or tempfile.mkdtemp(prefix="rb-checkpoint-bench-"))
    rounds: list[dict[str, Any]] = []
    try:
        start = time.perf_counter()
        buffer = build(args.size_gb)
        print(f"buffer: {buffer.nbytes / 1e9:.2f} GB, {buffer.num_frames():,} steps of "
              f"uint8{list(FRAME)} (built in {time.perf_counter() - start:.1f} s)")
        # Alternate ours and the limit, several times, and compare the best of each: on a
        # virtual machine the first touch of memory (the page cache's included) costs up
        # to 15x a later one, so a single run favours whichever went second.
        for _ in range(args.rounds):
            save = measure_save(buffer, root / "series", args.add_rate)
            rounds.append({"save": save,
                           "copy_gb_per_s": measure_copy(save["checkpoint"], root / "copy")})
        del buffer
        for r in rounds:
            r["read_gb_per_s"], r["read_gb_per_cpu_s"] = measure_read(
                rounds[-1]["save"]["checkpoint"])
            r["load"] = measure_load(rounds[-1]["save"]["checkpoint"])
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    for k, r in enumerate(rounds, 1):
        save, load = r["save"], r["load"]
        print(f"round {k}:")
        print(f"  save: {save['seconds']:.2f} s, {save['gb_per_s']:.2f} GB/s "
              f"({save['gb_per_s'] / r['copy_gb_per_s']:.2f}x a plain copy with fsync at "
              f"{r['copy_gb_per_s']:.2f} GB/s); peak extra RSS "
              f"{save['extra_peak_rss_mb']:.0f} MB")
        print(f"    while adding at {args.add_rate:.0f}/s: {save['adds_during']} adds during "
              f"the save, median add {save['add_median_us']:.1f} us, 99th percentile "
              f"{save['add_p99_us']:.0f} us, longest {save['add_max_us']:.0f} us (before the "
              f"save: {save['add_idle_max_us']:.0f} us)")
        print(f"  load: {load['seconds']:.2f} s, {load['gb_per_s']:.2f} GB/s "
              f"({load['gb_per_s'] / r['read_gb_per_s']:.2f}x a plain read into fresh memory "
              f"at {r['read_gb_per_s']:.2f} GB/s); peak extra RSS beyond the buffer "
              f"{load['extra_peak_rss_mb']:.0f} MB")
        print(f"    per CPU second: {load['gb_per_cpu_s']:.2f} GB against the read's "
              f"{r['read_gb_per_cpu_s']:.2f} "
              f"({load['gb_per_cpu_s'] / r['read_gb_per_cpu_s']:.2f}x)")
    best = {"save": max(r["save"]["gb_per_s"] for r in rounds),
            "copy": max(r["copy_gb_per_s"] for r in rounds),
            "load": max(r["load"]["gb_per_s"] for r in rounds),
            "read": max(r["read_gb_per_s"] for r in rounds),
            "load_cpu": max(r["load"]["gb_per_cpu_s"] for r in rounds),
            "read_cpu": max(r["read_gb_per_cpu_s"] for r in rounds),
            "stall_us": max(r["save"]["add_max_us"] for r in rounds),
            "save_rss_mb": max(r["save"]["extra_peak_rss_mb"] or 0 for r in rounds),
            "load_rss_mb": max(r["load"]["extra_peak_rss_mb"] for r in rounds)}
    print(f"best of {len(rounds)}: save {best['save']:.2f} GB/s vs copy {best['copy']:.2f} "
          f"({best['save'] / best['copy']:.2f}x); load {best['load']:.2f} GB/s vs read "
          f"{best['read']:.2f} ({best['load'] / best['read']:.2f}x; per CPU second "
          f"{best['load_cpu']:.2f} vs {best['read_cpu']:.2f}, "
          f"{best['load_cpu'] / best['read_cpu']:.2f}x); worst: longest add "
          f"{best['stall_us'] / 1000:.1f} ms, peak extra RSS {best['save_rss_mb']:.0f} MB "
          f"saving, {best['load_rss_mb']:.0f} MB loading")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "size_gb": args.size_gb},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
