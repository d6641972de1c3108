"""False sharing between the writers (and the sampler) of one shared buffer.

Each writer process, pinned to a CPU of its own (``os.sched_setaffinity``), writes its
own row of one :class:`~replaybuffer.distributed.SharedReplayBuffer` (the control
workload of ``replaybuffer bench --processes``: 104-byte records, ``MinSize(1000)``,
``add_batch`` of one item) for ``--seconds``; a sampler process, when asked for, pinned
to the next CPU, draws ``get_next(256)`` meanwhile. The writers' rows are ``spacing``
apart: spacing 1 puts their row heads (and, at equal
step counts, their versions and records) in shared cache lines; spacing 8 puts them 64
bytes or more apart whatever the layout. A case reports per process the thread CPU time
per call (``time.thread_time``), which counts the cache misses a process takes while
it runs and not the time it waits for a core; the cases run interleaved, ``--repeats``
rounds, and the report gives each case's median and range over the rounds.

Cases (``--cases``, comma-separated, each ``WRITERS[xSPACING][o][+s]``): ``2x1`` two
writers on adjacent rows, ``2x8`` two writers eight rows apart (both in a buffer of ``--num-rows`` rows, 16 unless said, so
that the cases differ only in which rows are written), ``1x1+s`` one writer
and a sampler, ``1x1o+s`` one writer on another buffer (of the same shape) and the
sampler on a buffer filled beforehand (what a busy neighbour core costs the sampler
without any shared line), ``0+s`` the sampler alone; ``/D`` slows the writers down
``D`` times by spinning between their batches of adds (their cores stay as busy), e.g.
``1x1/4+s``: how the sampler's cost follows the rate of the steps written beside it. On a 16-core machine:
``--cases 8x1,8x8,8x1+s,1x1+s,0+s``.

``--stores`` measures the stores alone: two processes pinned to CPUs 0 and 1, each
loading its row's ``next_id`` and storing it and ``held`` (memoryview loads and stores,
as the writer's plain step does) ``--iterations`` times, with the rows' heads packed (the layout before
version 2: the rows 8 bytes apart in each of two arrays) or padded (a 64-byte line per
row, both fields in it); thread CPU nanoseconds per step's load and two stores.

Run: ``PYTHONPATH=src python benchmarks/false_sharing.py --repeats 9 --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from replaybuffer.distributed.shared import SharedReplayBuffer
from replaybuffer.rate_limiter import MinSize
from replaybuffer_bench.workloads import control_spec, random_items

MAX_LENGTH = 4096
WARM_STEPS = 1100
"""Steps each writer adds before the timing (so the sampler's ``MinSize(1000)`` opens)."""
SAMPLE = 256


def _pin(cpu: int) -> None:
    """Run this process on CPU ``cpu`` (modulo the CPUs it may use) alone."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[cpu % len(allowed)]})


def _writer(buffer: SharedReplayBuffer, cpu: int, ready: Any, go: Any, seconds: float,
            out: Any, slowdown: int = 1) -> None:
    _pin(cpu)
    rng = np.random.default_rng(cpu)
    batches = [random_items(buffer.data_spec, (1,), rng) for _ in range(16)]
    for i in range(WARM_STEPS):  # claims the row (the first unowned) and warms up
        buffer.add_batch(batches[i % 16])
    rows = buffer.claim_rows(1)
    ready.put(1)
    go.wait()
    done, spent = 0, 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        began, cpu_began = time.perf_counter(), time.thread_time()
        for batch in batches:
            buffer.add_batch(batch)
        done += len(batches)
        spent += time.thread_time() - cpu_began  # the adds' CPU, not the spinning's
        if slowdown > 1:  # spin (the core stays busy) for (slowdown - 1) times as long
            spin_start = time.perf_counter()
            until = spin_start + (spin_start - began) * (slowdown - 1)
            while time.perf_counter() < until:
                pass
    out.put(("writer", rows[0], done, spent))


def _sampler(buffer: SharedReplayBuffer, cpu: int, ready: Any, go: Any, seconds: float,
             out: Any) -> None:
    _pin(cpu)
    buffer.get_next(SAMPLE)
    ready.put(1)
    go.wait()
    done, cpu_start = 0, time.thread_time()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        buffer.get_next(SAMPLE)
        done += 1
    out.put(("sampler", -1, done, time.thread_time() - cpu_start))


def _store_loop(heads: Any, held: Any, row: int, cpu: int, iterations: int,
                go: Any, out: Any) -> None:
    _pin(cpu)
    go.wait()
    start = time.thread_time()
    for _ in range(iterations):
        step = heads[row]  # the writer's step begins by loading its row's head
        held[row] = step
        heads[row] = step + 1
    out.put(1e9 * (time.thread_time() - start) / iterations)


def run_stores(padded: bool, iterations: int) -> float:
    """Nanoseconds of thread CPU per pair of stores, the mean of the two processes."""
    ctx = mp.get_context("fork")
    shared = np.frombuffer(mmap.mmap(-1, 4096), np.int64)  # MAP_SHARED, page aligned
    if padded:  # row r: next_id at r * 64 bytes, held beside it
        lines = shared[:16 * 8].reshape(16, 8)
        heads, held = lines[:, 0].data, lines[:, 1].data
    else:  # two packed arrays, as next_id.npy and held.npy were
        heads, held = shared[:16].data, shared[64:80].data
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_store_loop, args=(heads, held, row, row, iterations, go, out))
             for row in (0, 1)]
    for p in procs:
        p.start()
    time.sleep(0.2)
    go.set()
    figures: list[float] = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(30)
    return statistics.mean(figures)


def parse_case(case: str) -> tuple[int, int, bool, bool, int]:
    """``WRITERS[xSPACING][o][/SLOWDOWN][+s]`` -> (writers, spacing, elsewhere, sampler,
    slowdown)."""
    sampler = case.endswith("+s")
    body = case[:-2] if sampler else case
    body, _, slowdown = body.partition("/")
    elsewhere = body.endswith("o")
    body = body[:-1] if elsewhere else body
    writers, _, spacing = body.partition("x")
    return int(writers), int(spacing or 1), elsewhere, sampler, int(slowdown or 1)


def run_case(case: str, seconds: float, num_rows: int) -> dict[str, Any]:
    """One round of ``case`` on a buffer of ``num_rows`` rows (at least the case's
    writers times its spacing): per process kind, microseconds of thread CPU per call."""
    writers, spacing, elsewhere, sampling, slowdown = parse_case(case)
    ctx = mp.get_context("fork")
    num_rows = max(num_rows, writers * spacing)
    spec = control_spec()
    with SharedReplayBuffer(spec, num_rows, MAX_LENGTH, rate_limiter=MinSize(1000),
                            seed=0) as buffer, \
            SharedReplayBuffer(spec, num_rows, MAX_LENGTH, rate_limiter=MinSize(1000),
                               seed=0) as other:
        # Rows no writer of this case is to take are marked as this (live) process's,
        # so that writer k's claim (the first unowned row) is row k * spacing.
        wanted = {k * spacing for k in range(writers)}
        for row in range(num_rows):
            if row not in wanted:
                buffer.layout.owner[row] = os.getpid()
        if not writers or elsewhere:  # the sampler's rows filled here
            buffer.layout.owner[:] = 0
            buffer.extend(random_items(spec, (1, WARM_STEPS), np.random.default_rng(0)))
        for row in range(num_rows):
            if row not in wanted:
                other.layout.owner[row] = os.getpid()
        written = other if elsewhere else buffer
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = []
        for k in range(writers):  # one at a time: writer k claims row k * spacing
            procs.append(ctx.Process(target=_writer,
                                     args=(written, k, ready, go, seconds, out, slowdown)))
            procs[-1].start()
            ready.get(timeout=120)
        if sampling:
            procs.append(ctx.Process(target=_sampler,
                                     args=(buffer, writers, ready, go, seconds, out)))
            procs[-1].start()
            ready.get(timeout=120)
        go.set()
        results = [out.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join(30)
    report: dict[str, Any] = {"case": case}
    writer_us = [1e6 * cpu / done for kind, _, done, cpu in results if kind == "writer"]
    if writer_us:
        report["writer_cpu_us_per_add"] = statistics.mean(writer_us)
        report["rows"] = sorted(row for kind, row, _, _ in results if kind == "writer")
    for kind, _, done, cpu in results:
        if kind == "sampler":
            report["sampler_cpu_us_per_get_next"] = 1e6 * cpu / done
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="2x1,2x8,1x1+s,0+s")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--num-rows", type=int, default=16,
                        help="rows of every case's buffer (so that the cases differ in "
                        "which rows are written, not in the buffer's size)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--stores", action="store_true",
                        help="time the row heads' stores alone, packed and padded")
    parser.add_argument("--iterations", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    if args.stores:
        times: dict[str, list[float]] = {"packed": [], "padded": []}
        for _ in range(args.repeats):
            for name in times:
                times[name].append(run_stores(name == "padded", args.iterations))
        for name, values in times.items():
            print(f"{name}: {statistics.median(values):.1f} ns per step's load and two stores "
                  f"({min(values):.1f}-{max(values):.1f})", flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"load": os.getloadavg(), "stores_ns": times}, fh, indent=1)
        return 0
    cases = args.cases.split(",")
    rounds: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
    for _ in range(args.repeats):  # interleaved: a busy moment of the machine hits all
        for case in cases:
            rounds[case].append(run_case(case, args.seconds, args.num_rows))
    summary = []
    for case, results in rounds.items():
        line: dict[str, Any] = {"case": case, "rows": results[0].get("rows")}
        for key in ("writer_cpu_us_per_add", "sampler_cpu_us_per_get_next"):
            values = [r[key] for r in results if key in r]
            if values:
                line[key] = {"median": statistics.median(values), "min": min(values),
                             "max": max(values)}
        summary.append(line)
        figures = "  ".join(
            f"{key}: {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"
            for key, v in line.items() if isinstance(v, dict))
        print(f"{case:8s} rows {line['rows']}  {figures}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "load": os.getloadavg(), "summary": summary,
                       "rounds": rounds}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
