"""``replaybuffer bench --processes``: many writer processes and one sampler process on
one :class:`~replaybuffer.distributed.SharedReplayBuffer`, beside one process alone and
beside Reverb on the same workload.

Per workload (control, frames) and writer count (1, 2, 4): a uniform shared buffer
(100k control items, 20k frames items) under ``MinSize(1000)``, prefilled with 1000
items; every process maps it, then all start together and run for ``--seconds``:
each writer adds one item per ``add_batch`` (an actor with one env), the sampler draws
``get_next(256)``. Inserts/s sum the writers' items; samples/s count sampled items.
The single-process row times ``add_batch`` of one item alone, then ``get_next(256)``
alone, on an in-process :class:`~replaybuffer.UniformReplayBuffer`.

Reverb runs in its own venv (``bash benchmarks/setup_reverb.sh``) through
``benchmarks/reverb_processes.py`` with the same workloads, writer counts and time: a
server on localhost, writers with one item per step, a sampler of batches of 256; it is
reported as not runnable where that venv is missing.

Each shared row also reports what serializes the writers: the buffer lock's
acquisitions per insert and the time it was held per insert (``serial_us_per_insert``,
summed over the writers: the part of an insert no other writer can overlap; 0 on a
uniform buffer, whose steps take no lock), and ``scaling_bound``, the speed-up over one
writer that this serial section allows (Amdahl: ``1 / (serial / per-insert time)``;
``inf`` when nothing is serialized), and ``cpu_us_per_insert``: the writers' thread CPU
time per insert (the one-process row's too), a measure that a loaded machine slows less
than the rates, and ``sampler_cpu_us_per_draw``: the sampler's thread CPU time per
``get_next(256)`` (``--writers 0``: the sampler alone on the shared buffer; beside
writers, what their stores cost its reads, apart from the cores they share). ``--prioritized`` runs the shared rows on a prioritized buffer (whose
``add_batch`` takes the tree's lock once a step, its ``extend`` once a block of up to
``max_length`` steps). ``--extend STEPS`` makes each writer call ``extend`` with
``STEPS`` steps of its row (leaves ``[1, STEPS]``) instead of ``add_batch`` of one.
``--frame-dedup`` stores the frames workload's stacked observation (uint8
``[84, 84, 4]``) deduplicated (``frame_stack="observation", stack_axis=-1``): one frame
per step in the shared frame ring, stacks rebuilt on read. The frames workload's
observations are always sliding stacks of a cyclic stream of 64 frames per writer (as
a frame-stack wrapper makes them; the bytes copied are the same as random stacks'), so
the rows with and without dedup write the same data. Every shared row reports
``bytes_per_step``: the buffer's shared files over its capacity. The benchmark needs numpy,
this package and its core dependencies only, so it runs as it is on a larger machine:
``python -m replaybuffer.cli bench --processes --writers 1,2,4,8,12 --seconds 3
--no-reverb --json FILE``.

``--soak SECONDS`` runs the stress run of the test suite for longer instead
(:func:`replaybuffer.distributed.stress.run_stress`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from replaybuffer_bench.workloads import control_spec, frames_spec, random_items
from replaybuffer.buffers.uniform import UniformReplayBuffer
from replaybuffer.distributed.shared import SharedReplayBuffer
from replaybuffer.distributed.shared.process_lock import lock_totals
from replaybuffer.rate_limiter import MinSize

WORKLOADS = {"control": (control_spec, 100_000), "frames": (frames_spec, 20_000)}
PREFILL = 1000
SAMPLE = 256
CYCLE = 16
"""Inserts a writer repeats (its batches' first ``CYCLE``)."""
ROOT = Path(__file__).resolve().parents[3]


def _batches(spec: Any, seed: int, count: int = 64, steps: int = 1) -> list[Any]:
    """``count`` inserts of one row: ``[1]`` leaves, or ``[1, steps]`` for ``extend``.
    An ``observation`` leaf of stacked frames (uint8 ``[H, W, K]``) holds the sliding
    stacks of a cyclic stream of frames, consecutive across the inserts and across the
    end of every ``CYCLE`` inserts, which a writer repeats (as a frame-stack wrapper's
    observations are)."""
    rng = np.random.default_rng(seed)
    shape = (1,) if steps == 1 else (1, steps)
    batches = [random_items(spec, shape, rng) for _ in range(count)]
    observation = spec.get("observation") if isinstance(spec, dict) else None
    if observation is not None and observation.dtype == np.uint8 and \
            len(observation.shape) == 3:  # the frames workload's stacks
        stacks = sliding_stacks(observation.shape, min(count, CYCLE) * steps, rng)
        for i, batch in enumerate(batches):
            at = i % CYCLE
            batch["observation"] = stacks[at * steps:(at + 1) * steps].reshape(
                shape + stacks.shape[1:])
    return batches


def sliding_stacks(shape: tuple[int, ...], count: int, rng: np.random.Generator
                   ) -> np.ndarray:
    """uint8 ``[count, H, W, K]``: stack ``t`` holds frames ``t .. t + K - 1`` (mod
    ``count``) of a stream of ``count`` random frames."""
    K = shape[-1]
    frames = rng.integers(0, 256, (count,) + shape[:-1], dtype=np.uint8)
    index = (np.arange(count)[:, None] + np.arange(K)) % count  # [count, K]
    return np.ascontiguousarray(np.moveaxis(frames[index], 1, -1))


def _buffer_bytes(buffer: SharedReplayBuffer) -> int:
    """Bytes of the buffer's shared files."""
    return sum(f.stat().st_size for f in buffer.path.glob("*.npy"))


def _writer(buffer: SharedReplayBuffer, seed: int, ready: Any, go: Any, seconds: float,
            out: Any, steps: int = 1) -> None:
    batches = _batches(buffer.data_spec, seed, 64 if steps == 1 else 16, steps)
    write = buffer.add_batch if steps == 1 else buffer.extend
    write(batches[0])  # claims the row and warms up; not counted
    ready.put(1)
    go.wait()
    acquired, held = lock_totals()
    cpu = time.thread_time()
    done, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for batch in batches[:CYCLE]:
            write(batch)
        done += CYCLE * steps
    cpu = time.thread_time() - cpu
    acquired_after, held_after = lock_totals()
    out.put(("inserts", done, acquired_after - acquired, held_after - held, cpu))


def _sampler(buffer: SharedReplayBuffer, ready: Any, go: Any, seconds: float,
             out: Any) -> None:
    buffer.get_next(SAMPLE)
    ready.put(1)
    go.wait()
    cpu = time.thread_time()
    done, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        buffer.get_next(SAMPLE)
        done += SAMPLE
    out.put(("samples", done, 0, 0, time.thread_time() - cpu))


def run_shared(workload: str, writers: int, seconds: float,
               prioritized: bool = False, steps: int = 1, frame_dedup: bool = False
               ) -> dict[str, Any]:
    """Writers and one sampler on a shared buffer for ``seconds`` (see the module);
    ``frame_dedup``: the frames workload's observation deduplicated."""
    make_spec, capacity = WORKLOADS[workload]
    spec = make_spec()
    rows = writers + 1  # one for the prefill
    ctx = mp.get_context("spawn")
    dedup = frame_dedup and workload == "frames"
    frames: dict[str, Any] = {"frame_stack": "observation", "stack_axis": -1} if dedup else {}
    with SharedReplayBuffer(spec, rows, capacity // rows, rate_limiter=MinSize(PREFILL),
                            prioritized=prioritized, seed=0, **frames) as buffer:
        buffer.extend(_batches(spec, 10_000, 1, PREFILL)[0])
        size = _buffer_bytes(buffer)
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_writer,
                             args=(buffer, k, ready, go, seconds, out, steps))
                 for k in range(writers)]
        procs.append(ctx.Process(target=_sampler, args=(buffer, ready, go, seconds, out)))
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        go.set()
        totals = {"inserts": 0, "samples": 0}
        locks = held_ns = 0
        cpu = {"inserts": 0.0, "samples": 0.0}  # the writers', the sampler's
        for _ in procs:
            kind, count, acquired, held, spent = out.get(timeout=seconds + 60)
            totals[kind] += count
            locks, held_ns = locks + acquired, held_ns + held
            cpu[kind] += spent
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    inserts = max(1, totals["inserts"])
    per_insert_us = 1e6 * seconds * writers / inserts  # one writer's time per insert
    serial_us = held_ns / 1e3 / inserts
    return {"peer": "replaybuffer[shared]" + ("[prioritized]" if prioritized else "")
            + (f"[extend {steps}]" if steps > 1 else "") + ("[frame dedup]" if dedup else ""),
            "workload": workload, "writers": writers,
            "inserts_per_s": totals["inserts"] / seconds,
            "samples_per_s": totals["samples"] / seconds, "seconds": seconds,
            "locks_per_insert": locks / inserts, "serial_us_per_insert": serial_us,
            "us_per_insert": per_insert_us, "cpu_us_per_insert": 1e6 * cpu["inserts"] / inserts,
            "sampler_cpu_us_per_draw": 1e6 * cpu["samples"] * SAMPLE / max(1, totals["samples"]),
            "scaling_bound": per_insert_us / serial_us if serial_us else float("inf"),
            "bytes_per_step": size / (rows * (capacity // rows)), "cpus": os.cpu_count()}


def run_single(workload: str, seconds: float) -> dict[str, Any]:
    """One process: ``add_batch`` of one item for ``seconds / 2``, then ``get_next(256)``."""
    make_spec, capacity = WORKLOADS[workload]
    spec = make_spec()
    buffer = UniformReplayBuffer(spec, 1, capacity, seed=0)
    buffer.extend(random_items(spec, (1, PREFILL), np.random.default_rng(0)))
    batches = _batches(spec, 1)
    rates, cpus, cpu = [], [], time.thread_time()
    for op in ("insert", "sample"):
        done, deadline = 0, time.perf_counter() + seconds / 2
        while time.perf_counter() < deadline:
            if op == "insert":
                for batch in batches[:16]:
                    buffer.add_batch(batch)
                done += 16
            else:
                buffer.get_next(SAMPLE)
                done += SAMPLE
        spent, cpu = time.thread_time() - cpu, time.thread_time()
        cpus.append(1e6 * spent / max(1, done))
        rates.append(done / (seconds / 2))
    return {"peer": "replaybuffer[one process]", "workload": workload, "writers": 0,
            "inserts_per_s": rates[0], "samples_per_s": rates[1], "seconds": seconds,
            "cpu_us_per_insert": cpus[0], "sampler_cpu_us_per_draw": cpus[1] * SAMPLE}


def run_reverb(workloads: list[str], writers: list[int], seconds: float
               ) -> list[dict[str, Any]]:
    """Reverb's rows from its own venv, or one row per workload saying why not."""
    python = ROOT / ".venv-reverb" / "bin" / "python"
    script = ROOT / "benchmarks" / "reverb_processes.py"
    if not python.exists() or not script.exists():
        return [{"peer": "reverb", "workload": w, "writers": None,
                 "unsupported": "not runnable here: no .venv-reverb (run bash "
                                "benchmarks/setup_reverb.sh)"} for w in workloads]
    command = [str(python), str(script), "--writers", ",".join(map(str, writers)),
               "--seconds", str(seconds), "--workload", ",".join(workloads)]
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=60 + 30 * len(workloads) * len(writers) * seconds)
    except subprocess.TimeoutExpired:
        return [{"peer": "reverb", "workload": w, "writers": None,
                 "unsupported": "timed out"} for w in workloads]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not rows:
        return [{"peer": "reverb", "workload": w, "writers": None,
                 "unsupported": f"failed (exit {done.returncode}): "
                                f"{done.stderr.strip().splitlines()[-1:]}"} for w in workloads]
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table; a shared row's inserts/s also as a multiple of the
    workload's one-process row, what serializes its writers, and a writer's CPU time
    per insert (its thread's, whatever else the machine runs)."""
    lines = ["| workload | peer | writers | inserts/s | x one process | samples/s | "
             "locks/insert | serial us/insert | writer CPU us/insert | sampler CPU us/draw |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    alone = {r["workload"]: r["inserts_per_s"] for r in rows
             if r.get("peer") == "replaybuffer[one process]"}
    for r in rows:
        if "unsupported" in r:
            lines.append(f"| {r['workload']} | {r['peer']} | | {r['unsupported']} "
                         "| | | | | | |")
            continue
        writers = r["writers"] if r["writers"] else "one process" \
            if r.get("peer") == "replaybuffer[one process]" else "0 (sampler alone)"
        ratio = f"{r['inserts_per_s'] / alone[r['workload']]:.2f}x" \
            if r["workload"] in alone and r["writers"] else ""
        locks = f"{r['locks_per_insert']:.2f}" if "locks_per_insert" in r else ""
        serial = f"{r['serial_us_per_insert']:.2f}" if "serial_us_per_insert" in r else ""
        inserted = r["writers"] or r.get("peer") == "replaybuffer[one process]"
        cpu = f"{r['cpu_us_per_insert']:.2f}" if "cpu_us_per_insert" in r and inserted \
            else ""
        draw = f"{r['sampler_cpu_us_per_draw']:.1f}" if "sampler_cpu_us_per_draw" in r else ""
        lines.append(f"| {r['workload']} | {r['peer']} | {writers} | "
                     f"{r['inserts_per_s']:,.0f} | {ratio} | {r['samples_per_s']:,.0f} | "
                     f"{locks} | {serial} | {cpu} | {draw} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replaybuffer bench --processes")
    parser.add_argument("--workloads", default="control,frames")
    parser.add_argument("--writers", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--no-reverb", action="store_true")
    parser.add_argument("--prioritized", action="store_true",
                        help="shared rows on a prioritized buffer")
    parser.add_argument("--extend", type=int, default=1, metavar="STEPS",
                        help="writers extend by STEPS steps a call (1: add_batch)")
    parser.add_argument("--frame-dedup", action="store_true",
                        help="frames workload: observation stored deduplicated "
                             "(frame_stack)")
    parser.add_argument("--soak", type=float, default=None, metavar="SECONDS",
                        help="run the stress run for SECONDS instead")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if args.soak is not None:
        from replaybuffer.distributed.stress import run_stress

        report = run_stress(seconds=args.soak)
        print(report)
        return 0 if report.torn == 0 and not report.hung else 1
    workloads = [w for w in args.workloads.split(",") if w]
    writers = [int(w) for w in args.writers.split(",") if w]
    rows = []
    for workload in workloads:
        rows.append(run_single(workload, args.seconds))
        print(json.dumps(rows[-1]), flush=True)
        for count in writers:
            rows.append(run_shared(workload, count, args.seconds, args.prioritized,
                                   args.extend, args.frame_dedup))
            print(json.dumps(rows[-1]), flush=True)
    if not args.no_reverb:
        for row in run_reverb(workloads, writers, args.seconds):
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
