"""Rate limiting across processes: one :class:`~replaybuffer.RateLimiter`'s decisions
on counters in shared memory.

Every process holds its own copy of the limiter (it pickles with the buffer's handle);
before each decision the copy is loaded with the shared totals (``control``'s fields),
so every writer and sampler is paced by the same counts. A held-back call polls (50 us,
doubling to 2 ms) until it may go, ``timeout`` passes, or, with ``block=False``, at once.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from replaybuffer.distributed.shared.layout import (
    INSERT_BLOCKED_NS, INSERTS, INSERTS_BLOCKED, LARGEST_INSERT, LARGEST_SAMPLE,
    SAMPLE_BLOCKED_NS, SAMPLES, SAMPLES_BLOCKED)
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.rate_limiter import RateLimitedError, RateLimiter, RateLimiterStats


class SharedAdmission:
    """Admits inserts and samples by ``limiter`` on the shared ``control`` counters.

    Args:
        limiter: this process's copy of the buffer's rate limiter.
        control: the shared int64 control array (:mod:`.layout`).
        lock: the buffer's process lock, held while counters are read and counted.
        size: the buffer's item count now (``len(buffer)``).
        check_open: raises :class:`~replaybuffer.distributed.BufferClosedError` once the
            buffer is closed (a waiting call stops then).
    """

    def __init__(self, limiter: RateLimiter, control: np.ndarray, lock: ProcessLock,
                 size: Callable[[], int], check_open: Callable[[], None]):
        self.limiter = limiter
        self._control = control
        self._lock = lock
        self._size = size
        self._check_open = check_open

    def admit(self, insert: bool, n: int, timeout: float | None, block: bool) -> bool:
        """Wait until the rate limiter lets ``n`` items be inserted (or sampled); count
        them in the shared counters. ``False``: held back with ``block=False``.

        Raises:
            RateLimitedError: ``timeout`` seconds passed with the call held back.
            ValueError: ``n`` is too large for the limiter's window (it would wait
                forever).
        """
        limiter = self.limiter
        control = self._control
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, started, checked = 50e-6, None, False
        while True:
            with self._lock:
                limiter.inserts, limiter.samples = int(control[INSERTS]), int(control[SAMPLES])
                limiter.largest_insert = max(1, int(control[LARGEST_INSERT]))
                limiter.largest_sample = max(1, int(control[LARGEST_SAMPLE]))
                size = self._size()
                ready = limiter.can_insert(n, size) if insert else limiter.can_sample(n, size)
                if not checked and not ready:  # a call too large for the window
                    (limiter.check_insert_size if insert else limiter.check_sample_size)(n)
                    control[INSERTS_BLOCKED if insert else SAMPLES_BLOCKED] += 1
                    checked = True
                if ready:
                    field, largest = (INSERTS, LARGEST_INSERT) if insert else \
                        (SAMPLES, LARGEST_SAMPLE)
                    control[field] += n
                    control[largest] = max(int(control[largest]), n)
                    if started is not None:
                        control[INSERT_BLOCKED_NS if insert else SAMPLE_BLOCKED_NS] += \
                            time.monotonic_ns() - started
                    return True
            if started is None:
                started = time.monotonic_ns()
            if not block:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                with self._lock:
                    control[INSERT_BLOCKED_NS if insert else SAMPLE_BLOCKED_NS] += \
                        time.monotonic_ns() - started
                stats = self.stats()
                raise RateLimitedError(
                    f"{'insert' if insert else 'sample'} of {n} items held back by "
                    f"{limiter!r} for {timeout} s: {stats.inserts} inserts, "
                    f"{stats.samples} samples (diff {stats.diff:g}), {stats.size} items held")
            self._check_open()
            time.sleep(pause)
            pause = min(2 * pause, 2e-3)

    def stats(self) -> RateLimiterStats:
        """The limiter's counters over every process."""
        c = self._control
        inserts, samples = int(c[INSERTS]), int(c[SAMPLES])
        return RateLimiterStats(inserts, samples, self._size(), c[INSERT_BLOCKED_NS] / 1e9,
                                c[SAMPLE_BLOCKED_NS] / 1e9, int(c[INSERTS_BLOCKED]),
                                int(c[SAMPLES_BLOCKED]),
                                inserts * self.limiter.samples_per_insert - samples)
