"""How the peer benchmark measures: torch's thread count, interleaved timings with the
contention of other processes, and resident-memory growth."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import os
import time
from typing import Any, Callable, Iterator

from replaybuffer_bench.peers.workloads_spec import Sizes
from replaybuffer_bench.timing import compare

TORCH_THREADS: list[int | None] = [1]


def torch_module() -> Any:
    """``torch``, set to :data:`TORCH_THREADS` intra-op threads (as run_peers asked)."""
    import torch
    threads = TORCH_THREADS[0]
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return torch


def resident_bytes() -> int | None:
    """Resident set size of this process in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def release_memory() -> None:
    """Collect garbage and hand freed heap back to the OS, so RSS baselines are clean."""
    gc.collect()
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class MemoryGrowth:
    """RSS growth from construction to full, per transition."""

    def __init__(self, capacity: int):
        release_memory()
        self.capacity = capacity
        self.start = resident_bytes()

    def row(self, obs_nbytes: int | None = None, detail: str = "") -> dict[str, Any]:
        release_memory()  # drop the fill's freed temporaries from the count
        end = resident_bytes()
        grown = None if self.start is None or end is None else (end - self.start)
        return {"op": "bytes/transition", "items_per_call": None,
                "bytes_per_transition": None if grown is None else grown / self.capacity,
                "obs_bytes_per_transition": (None if obs_nbytes is None
                                             else obs_nbytes / self.capacity),
                "detail": f"capacity {self.capacity:,}" + (f"; {detail}" if detail else "")}


def timed_rows(ops: dict[str, tuple[Callable[[], object], int]], sizes: Sizes
           ) -> Iterator[dict[str, Any]]:
    """Time ``{op: (fn, items_per_call)}`` interleaved; yield one row per op.

    ``others_cores`` is how many cores other processes kept busy meanwhile (machine
    CPU time from /proc/stat less this process's, over the wall time): on a small
    shared machine anything well above 0 means the figures may be inflated.
    """
    wall, cpu, machine = time.perf_counter(), time.process_time(), machine_cpu_seconds()
    seconds = compare({op: fn for op, (fn, _) in ops.items()}, sizes.min_time, sizes.repeats)
    elapsed = max(time.perf_counter() - wall, 1e-9)
    own = time.process_time() - cpu
    end = machine_cpu_seconds()
    others = None if machine is None or end is None else max(0.0, (end - machine - own) / elapsed)
    for op, (_, items) in ops.items():
        yield {"op": op, "seconds_per_call": seconds[op], "items_per_call": items,
               "others_cores": None if others is None else round(others, 2)}


def machine_cpu_seconds() -> float | None:
    """CPU seconds all processes of the machine have used (Linux /proc/stat), else None."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        # user nice system idle iowait irq softirq steal ...: busy = all but idle, iowait
        values = [int(v) for v in fields[1:9]]
        busy = sum(values) - values[3] - values[4]
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def cycling(values: list[Any]) -> Callable[[], Any]:
    """A function returning ``values`` in turn, forever (a fresh batch per timed call)."""
    it = itertools.cycle(values)
    return lambda: next(it)

