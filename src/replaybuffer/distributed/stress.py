"""A stress run of :class:`SharedReplayBuffer`: writer, sampler and priority-updater
processes for a fixed time, every sampled item checked against what was written.

Each item carries its row and step and a payload of bytes all equal to a value those
determine; a torn item (bytes of two steps, or a step other than its id says) fails the
check. Writers may be killed with SIGKILL at random moments and replaced. Used by the
test suite (``tests/test_shared.py``, about 10 s; ``tests/test_shared_faults.py``, as
long as :data:`SOAK_VARIABLE` says) and by ``replaybuffer bench --processes --soak
SECONDS``.

The run's clock starts when every process has started (imported the library and mapped
the buffer): on a loaded machine a spawned process can take seconds to start, and a run
timed from before that would cut the last one short or take it for hung.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaybuffer.distributed.shared import SharedReplayBuffer
from replaybuffer.rate_limiter import RateLimitedError, SampleToInsertRatio
from replaybuffer.specs import ArraySpec

ENVS_PER_WRITER = 2
SAMPLE_SIZE = 64
UPDATE_SIZE = 32
NUM_STEPS = 2

SOAK_VARIABLE = "REPLAYBUFFER_SOAK_SECONDS"
"""The environment variable that sets how long the suite's soak runs (seconds)."""
STANDBY_VICTIMS = 3
"""Writers to kill started ahead of their turn (:func:`run_stress`)."""


def soak_seconds(default: float) -> float:
    """Seconds for a soak run: :data:`SOAK_VARIABLE` if set, else ``default``.

    Raises:
        ValueError: the variable is not a positive finite number.
    """
    value = os.environ.get(SOAK_VARIABLE)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not (np.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{SOAK_VARIABLE} must be a positive number of seconds, got "
                         f"{value!r}")
    return seconds


def stress_spec(payload_bytes: int) -> dict[str, ArraySpec]:
    """Items of the run: ``payload`` uint8[payload_bytes] (every byte the item's
    value), ``row`` and ``step`` int64, ``value`` uint8."""
    return {"payload": ArraySpec((payload_bytes,), np.uint8),
            "row": ArraySpec((), np.int64), "step": ArraySpec((), np.int64),
            "value": ArraySpec((), np.uint8)}


def item_value(row: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The byte an item's payload is made of, from its row and step (uint8)."""
    value: np.ndarray = ((row * 7919 + step * 104729) % 251).astype(np.uint8)
    return value


def torn_items(items: dict[str, np.ndarray], ids: np.ndarray, num_rows: int) -> int:
    """How many of the sampled items (leaves ``[S, T, ...]``, ids ``[S, T]``) fail the
    check: payload bytes not all the value, value not that of the row and step, row
    and step not those the id names, or a window's steps not consecutive in one row."""
    steps, rows = np.divmod(ids, num_rows)
    bad = (items["payload"] != items["value"][..., None]).any(-1)
    bad |= items["value"] != item_value(items["row"], items["step"])
    bad |= (items["row"] != rows) | (items["step"] != steps)
    bad[:, 1:] |= (np.diff(items["step"], axis=1) != 1) | (np.diff(items["row"], axis=1) != 0)
    return int(bad.sum())


def _writer(buffer: SharedReplayBuffer, seconds: float, out: Any, ready: Any,
            go: Any) -> None:
    inserted = 0
    ready.put(os.getpid())
    go.wait()
    first, count = buffer.claim_rows(ENVS_PER_WRITER)
    rows = np.arange(first, first + count)
    width = buffer.data_spec["payload"].shape[0]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        steps = buffer.steps_written()[rows]
        value = item_value(rows, steps)
        items = {"payload": np.repeat(value[:, None], width, 1), "row": rows,
                 "step": steps, "value": value}
        try:
            if buffer.add_batch(items, timeout=0.2):
                inserted += count
        except RateLimitedError:
            pass
    out.put(("writer", os.getpid(), inserted))


def _sampler(buffer: SharedReplayBuffer, seconds: float, out: Any, update: bool,
             ready: Any, go: Any) -> None:
    sampled = torn = updates = stale = 0
    ready.put(os.getpid())
    go.wait()
    rng = np.random.default_rng(os.getpid())
    size = UPDATE_SIZE if update else SAMPLE_SIZE
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            drawn = buffer.get_next(size, NUM_STEPS, timeout=0.2)
        except RateLimitedError:
            continue
        assert drawn is not None
        items, info = drawn
        sampled += size
        torn += torn_items(items, info.ids, buffer.num_rows)
        if update:
            applied = buffer.update_priorities(info.ids, rng.exponential(1.0, size))
            updates += applied
            stale += size - applied
    out.put(("updater" if update else "sampler", os.getpid(), (sampled, torn, updates, stale)))


@dataclass
class StressReport:
    """What a stress run saw.

    Attributes:
        inserted, sampled: items, as counted by the processes.
        torn: sampled items that failed the check (must be 0).
        updates, stale: priority updates applied and ignored as stale.
        killed: writers killed with SIGKILL during the run.
        hung: processes still running 20 s after the run's end (a deadlock).
        stats: the buffer's rate-limiter counters at the end.
        window: the limiter's ``(min_diff, max_diff)``.
    """

    inserted: int = 0
    sampled: int = 0
    torn: int = 0
    updates: int = 0
    stale: int = 0
    killed: int = 0
    hung: list[str] = field(default_factory=list)
    stats: Any = None
    window: tuple[float, float] = (0.0, 0.0)
    seconds: float = 0.0


def run_stress(seconds: float = 8.0, writers: int = 4, samplers: int = 2,
               kill_every: float | None = 1.0, payload_bytes: int = 4096,
               max_length: int = 500, seed: int = 0) -> StressReport:
    """Run ``writers`` writer processes, ``samplers`` samplers and one priority updater
    on one prioritized buffer under a :class:`SampleToInsertRatio` for ``seconds``.

    With ``kill_every``, one extra writer is started and killed (SIGKILL) after a random
    time up to ``kill_every`` seconds, again and again; each new one reclaims the rows
    the last left (with their steps).

    :data:`SOAK_VARIABLE`, when set, makes the run at least that long (the suite's
    stress test becomes a soak).
    """
    if os.environ.get(SOAK_VARIABLE):
        seconds = max(seconds, soak_seconds(seconds))
    ctx = mp.get_context("spawn")
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=256,
                                  error_buffer=512)
    rows = ENVS_PER_WRITER * (writers + (1 if kill_every else 0))
    buffer = SharedReplayBuffer(stress_spec(payload_bytes), rows, max_length,
                                prioritized=True, rate_limiter=limiter, seed=seed)
    report = StressReport(window=(limiter.min_diff, limiter.max_diff))
    out = ctx.Queue()
    rng = np.random.default_rng(seed)
    ready, go, victim_ready = ctx.Queue(), ctx.Event(), ctx.Queue()
    # Writers to kill, started ahead (each imports while earlier ones write) and writing
    # once its event is set: several, so that a slow process start on a loaded machine
    # does not space the kills out (at least STANDBY_VICTIMS kills in any run).
    standby: deque[tuple[Any, Any]] = deque()
    started_pids: set[int] = set()

    def next_victim() -> tuple[Any, Any]:
        victim_go = ctx.Event()
        victim = ctx.Process(target=_writer,
                             args=(buffer, seconds, out, victim_ready, victim_go))
        victim.start()
        return victim, victim_go

    def wait_started(pid: int | None) -> None:
        while pid not in started_pids:
            started_pids.add(victim_ready.get(timeout=300))

    try:
        procs = [ctx.Process(target=_writer, args=(buffer, seconds, out, ready, go))
                 for _ in range(writers)]
        procs += [ctx.Process(target=_sampler, args=(buffer, seconds, out, False, ready, go))
                  for _ in range(samplers)]
        procs.append(ctx.Process(target=_sampler, args=(buffer, seconds, out, True, ready,
                                                        go)))
        for p in procs:
            p.start()
        if kill_every:
            standby.extend(next_victim() for _ in range(STANDBY_VICTIMS))
        for _ in procs:  # every process started: the clock starts
            ready.get(timeout=300)
        go.set()
        start = time.monotonic()
        end = start + seconds
        while standby and time.monotonic() < end - 0.5:
            victim, victim_go = standby.popleft()
            wait_started(victim.pid)  # killed while writing, not while starting
            victim_go.set()
            standby.append(next_victim())
            time.sleep(float(rng.uniform(0.3, kill_every or 1.0)))
            if victim.is_alive() and victim.pid is not None:  # (a started one has a pid)
                os.kill(victim.pid, signal.SIGKILL)
                report.killed += 1
            victim.join()
        results: list[tuple[str, Any, Any]] = []
        for p in procs:
            p.join(timeout=max(0.0, end - time.monotonic()) + 20.0)
            if p.is_alive():
                report.hung.append(f"{p.name} (pid {p.pid})")
                p.kill()
                p.join()
        while len(results) < len(procs) - len(report.hung):
            results.append(out.get(timeout=5.0))
        report.seconds = time.monotonic() - start
        for kind, _, value in results:
            if kind == "writer":
                report.inserted += value
            else:
                sampled, torn, updates, stale = value
                report.sampled += sampled
                report.torn += torn
                report.updates += updates
                report.stale += stale
        report.stats = buffer.stats()
    finally:
        for waiting, _ in standby:
            waiting.kill()
            waiting.join()
        buffer.close()
    return report
