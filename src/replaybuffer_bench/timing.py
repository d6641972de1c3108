"""Timing helpers: calibrated loops, interleaved so that drift hits every contender alike."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def calibrate(fn: Callable[[], object], min_time: float) -> int:
    """Calls per timed loop so that one loop lasts about ``min_time`` seconds."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time / 4 or n >= 1 << 22:
            return max(1, int(n * min_time / max(elapsed, 1e-9)))
        n *= 4


def compare(fns: dict[str, Callable[[], object]], min_time: float = 0.2,
            repeats: int = 7) -> dict[str, float]:
    """Median seconds per call of each function, timed in interleaved rounds."""
    loops = {name: calibrate(fn, min_time) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            n = loops[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return {name: statistics.median(values) for name, values in samples.items()}
