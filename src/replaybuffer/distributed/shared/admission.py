"""Rate limiting across processes: one :class:`~replaybuffer.RateLimiter`'s decisions
on counters in shared memory.

Every process holds its own copy of the limiter (it pickles with the buffer's handle);
before each decision the copy is loaded with the shared totals (``control``'s fields),
so every writer and sampler is paced by the same counts. A held-back call polls (50 us,
doubling to 2 ms) until it may go, ``timeout`` passes, or, with ``block=False``, at once.

An admitted sample is counted at once (two processes must not both take the last room
in the window), before it is drawn; a draw that then fails gives its count back
(:meth:`SharedAdmission.give_back`), so a refused sample never holds later ones back.

Waiting calls in different processes can block each other (see
:mod:`replaybuffer.rate_limiter`). Each side publishes its smallest waiting call in the
control block (``WAITING_INSERT``/``WAITING_SAMPLE``), refreshed by that waiter at every
poll; a waiter that ends takes its entry out, and one that was killed goes stale after
:data:`STALE_NS`. A call that finds itself held back beside a held-back call of the
other side, arriving or at any poll, is refused with the deadlock named.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from replaybuffer.arguments import check_timeout
from replaybuffer.distributed.shared.layout import (
    INSERT_BLOCKED_NS, INSERTS, INSERTS_BLOCKED, LARGEST_INSERT, LARGEST_SAMPLE,
    SAMPLE_BLOCKED_NS, SAMPLES, SAMPLES_BLOCKED, WAITING_INSERT, WAITING_INSERT_NS,
    WAITING_SAMPLE, WAITING_SAMPLE_NS)
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.rate_limiter import RateLimitedError, RateLimiter, RateLimiterStats

STALE_NS = 200_000_000
"""A published waiting call not refreshed for this long (200 ms; waiters poll every
2 ms at most) is taken for a waiter that died."""


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
            ValueError: ``timeout`` is NaN or negative; ``n`` is too large for the
                limiter's window; or the call and one waiting on the other side are
                both held back (a deadlock). Nothing is counted then.
        """
        timeout = check_timeout(timeout)
        limiter = self.limiter
        control = self._control
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, started, checked, published = 50e-6, None, False, False
        try:
            while True:
                with self._lock:
                    limiter.inserts, limiter.samples = int(control[INSERTS]), \
                        int(control[SAMPLES])
                    limiter.largest_insert = max(1, int(control[LARGEST_INSERT]))
                    limiter.largest_sample = max(1, int(control[LARGEST_SAMPLE]))
                    size = self._size()
                    ready = limiter.can_insert(n, size) if insert else \
                        limiter.can_sample(n, size)
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
                    if block:
                        self._refuse_a_deadlock(insert, n, size)
                        self._publish(insert, n)
                        published = True
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
                        f"{stats.samples} samples (diff {stats.diff:g}), {stats.size} "
                        "items held")
                self._check_open()
                time.sleep(pause)
                pause = min(2 * pause, 2e-3)
        finally:
            if published:
                self._withdraw(insert, n)

    @contextmanager
    def given_back_on_error(self, insert: bool, n: int) -> Iterator[None]:
        """Run the admitted insert (or draw) of ``n`` items in this context: if it
        raises, its count is given back (:meth:`give_back`) before the error goes on."""
        try:
            yield
        except BaseException:
            self.give_back(insert, n)
            raise

    def give_back(self, insert: bool, n: int) -> None:
        """Take back the count of ``n`` admitted items whose insert (or draw) failed, so
        that it does not hold later calls back. (The largest call recorded stays: it
        only makes the check of calls too large for the window stricter.)"""
        with self._lock:
            self._control[INSERTS if insert else SAMPLES] -= n

    # ---------------------------------------------------------- waiting calls
    def _refuse_a_deadlock(self, insert: bool, n: int, size: int) -> None:
        """Raise the limiter's deadlock error if the smallest call waiting on the other
        side is held back too (the lock is held, the limiter loaded)."""
        value, stamp = (WAITING_SAMPLE, WAITING_SAMPLE_NS) if insert else \
            (WAITING_INSERT, WAITING_INSERT_NS)
        other = int(self._control[value])
        if other <= 0 or time.monotonic_ns() - int(self._control[stamp]) > STALE_NS:
            return
        limiter = self.limiter
        if limiter.deadlocked(*((n, other) if insert else (other, n)), size):
            raise limiter.deadlock_error("insert" if insert else "sample", n, other, size)

    def _publish(self, insert: bool, n: int) -> None:
        """Say that a call of ``n`` items waits (lock held): it takes the entry when it
        is the smallest, or the entry is empty or stale; its holder keeps it fresh."""
        control = self._control
        value, stamp = (WAITING_INSERT, WAITING_INSERT_NS) if insert else \
            (WAITING_SAMPLE, WAITING_SAMPLE_NS)
        now = time.monotonic_ns()
        held = int(control[value])
        if held <= 0 or n <= held or now - int(control[stamp]) > STALE_NS:
            control[value], control[stamp] = n, now

    def _withdraw(self, insert: bool, n: int) -> None:
        """Take a finished waiter's entry out (other waiters of its size put it back at
        their next poll)."""
        value = WAITING_INSERT if insert else WAITING_SAMPLE
        with self._lock:
            if int(self._control[value]) == n:
                self._control[value] = 0

    def stats(self) -> RateLimiterStats:
        """The limiter's counters over every process."""
        c = self._control
        inserts, samples = int(c[INSERTS]), int(c[SAMPLES])
        # Python numbers, as the in-process limiter's stats: numpy scalars from the
        # shared array would print as np.float64(...).
        return RateLimiterStats(inserts, samples, self._size(),
                                float(c[INSERT_BLOCKED_NS]) / 1e9,
                                float(c[SAMPLE_BLOCKED_NS]) / 1e9, int(c[INSERTS_BLOCKED]),
                                int(c[SAMPLES_BLOCKED]),
                                inserts * self.limiter.samples_per_insert - samples)
