"""Rate limiting across processes: one :class:`~replaybuffer.RateLimiter`'s decisions
on counts in shared memory, with no lock on the path of a call that goes ahead.

Every process holds its own copy of the limiter (it pickles with the buffer's handle);
before each decision the copy is loaded with the shared totals, so every writer and
sampler is paced by the same counts. The counts are per process
(:mod:`.counters`): a process adds to its own slot, a decision sums the slots.

Exact without a lock. An insert can only be refused for the diff getting too high, a
sample only for the diff getting too low (or the buffer too small): a call of one side
only ever makes the other side's calls more welcome. So a call needs to see every
admitted or concurrently decided call *of its own side*, and may see the other side's
admitted calls late (which only makes it stricter). A call the limiter can refuse by the
counts (an insert under a finite ``max_diff``, a sample under a finite ``min_diff``):

1. adds its ``n`` to its slot's *reserved* count of its side;
2. full fence (:func:`~.memory_fences.full_fence`: its store before the loads below);
3. sums the slots: its side's admitted plus reserved counts (less its own ``n``) and the
   other side's admitted count, and asks the limiter;
4. admitted: adds ``n`` to its admitted count, then (order fence) takes ``n`` off its
   reserved count; refused: takes ``n`` off its reserved count.

Of two calls of one side decided at once, each stores its reservation before loading the
others' (step 2), so at least one of them sees the other (Dekker's argument: both missing
each other would need each load to come before the other's store, a cycle the full
fences forbid); the one that sees both decides on both, so the window holds for the pair,
and by induction for any number. Between steps 4's two stores a call may be counted
twice by its own side (stricter, never looser). The limiter's "let the buffer fill"
clause (``size + n <= min_size_to_sample``) is given as ``size`` the larger of
``len()`` and the inserts seen (capped at the capacity), so inserts in flight count
there too. A call that cannot be refused by the counts (a ``MinSize``'s inserts; its
samples are held back by ``len()`` alone) skips the reservation and the fences.
A refusal is exact but may be spurious under contention: two calls of one side that
see each other's reservation both back off, and retry at their next poll.

An admitted sample is counted at once (two processes must not both take the last room
in the window), before it is drawn; a draw (or insert) that then fails gives its count
back (:meth:`SharedAdmission.give_back`), so a refused call never holds later ones back.
The largest call of each side (against which the limiter refuses a held-back call of
the other side that could never go ahead) is raised only once a call went through
(:meth:`SharedAdmission.record_largest`, after the write or draw, as the local limiter
records it when it counts the call): a call that failed after its admission (an insert
refused for its side frames, a draw that raised) leaves it as it was, with nothing to
restore. It only grows, under the lock, so two processes raising it at once keep the
larger, and none ever lowers what another recorded.

Held back, a call polls (50 us, doubling to 2 ms) until it may go, ``timeout`` passes,
or, with ``block=False``, at once; only then does it take the lock, to count itself
blocked and to publish itself as waiting. Waiting calls in different processes can block
each other (see :mod:`replaybuffer.rate_limiter`). Each side publishes its smallest
waiting call in the control block (``WAITING_INSERT``/``WAITING_SAMPLE``), refreshed by
that waiter at every poll; a waiter that ends takes its entry out, and one that was
killed goes stale after :data:`STALE_NS`. A call that finds itself held back beside a
held-back call of the other side, arriving or at any poll, is refused with the deadlock
named. A process killed between reserving and deciding leaves a reservation that the
next held-back call voids (:meth:`~.counters.ProcessCounters.void_dead_reservations`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from replaybuffer.arguments import check_timeout
from replaybuffer.distributed.shared.counters import (ADMITTED_INSERTS, ADMITTED_SAMPLES,
                                                       RESERVED_INSERTS, RESERVED_SAMPLES,
                                                       ProcessCounters)
from replaybuffer.distributed.shared.layout import (
    INSERT_BLOCKED_NS, INSERTS_BLOCKED, LARGEST_INSERT, LARGEST_SAMPLE, SAMPLE_BLOCKED_NS,
    SAMPLES_BLOCKED, WAITING_INSERT, WAITING_INSERT_NS, WAITING_SAMPLE, WAITING_SAMPLE_NS)
from replaybuffer.distributed.shared.memory_fences import full_fence, order_fence
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
        lock: the buffer's process lock, held by calls held back (to count and
            publish themselves) and to raise the largest call recorded.
        size: the buffer's item count now (``len(buffer)``, exact).
        quick_size: the same by the writers' own counts, cheaper, and at most short
            (never over) after a writer was killed: the first look of a decision; a
            sample it would hold back is decided again on ``size``.
        check_open: raises :class:`~replaybuffer.distributed.BufferClosedError` once the
            buffer is closed (a waiting call stops then).
        counters: the per-process counts (:mod:`.counters`).
        capacity: the buffer's capacity in items.
    """

    def __init__(self, limiter: RateLimiter, control: np.ndarray, lock: ProcessLock,
                 size: Callable[[], int], quick_size: Callable[[], int],
                 check_open: Callable[[], None], counters: ProcessCounters,
                 capacity: int):
        self.limiter = limiter
        self._control = control
        self._lock = lock
        self._size = size
        self._quick_size = quick_size
        self._check_open = check_open
        self._counters = counters
        self._capacity = capacity
        # Which side the counts can hold back (a MinSize: neither; its samples wait for
        # len() alone, which needs no reservation).
        self._refusable = {True: limiter.max_diff != float("inf"),
                           False: limiter.min_diff != float("-inf")}
        # [samples, inserts]: a size the shared largest sample (insert) is known to have
        # reached, so that a call no larger skips its load.
        self._known_largest = [0, 0]

    @property
    def admits_inserts(self) -> bool:
        """Whether inserts are admitted (and counted) before they are written: the
        limiter can hold them back. Otherwise (a ``MinSize``) the writer counts each
        insert at its commit (:meth:`committed`), and none waits."""
        return self._refusable[True]

    def committed(self, n: int) -> None:
        """Count an insert of ``n`` items at its commit (a limiter that never holds
        inserts back: see :attr:`admits_inserts`), in this process's slot."""
        self._counters.add(ADMITTED_INSERTS, n)
        if n > self._known_largest[True]:  # (on every add_batch's path: no call usually)
            self.record_largest(True, n)

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
        if self._try_admit(insert, n):  # the usual case: no lock, no clock
            return True
        limiter = self.limiter
        control = self._control
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, started, checked, published = 50e-6, time.monotonic_ns(), False, False
        blocked_ns = INSERT_BLOCKED_NS if insert else SAMPLE_BLOCKED_NS
        try:
            while True:
                with self._lock:
                    self._counters.void_dead_reservations()
                    size = self._size()
                    if not checked:  # a call too large for the window
                        (limiter.check_insert_size if insert else limiter.check_sample_size)(n)
                        control[INSERTS_BLOCKED if insert else SAMPLES_BLOCKED] += 1
                        checked = True
                    if block:
                        self._refuse_a_deadlock(insert, n, size)
                        self._publish(insert, n)
                        published = True
                if not block:
                    return False
                if deadline is not None and time.monotonic() >= deadline:
                    with self._lock:
                        control[blocked_ns] += time.monotonic_ns() - started
                    stats = self.stats()
                    raise RateLimitedError(
                        f"{'insert' if insert else 'sample'} of {n} items held back by "
                        f"{limiter!r} for {timeout} s: {stats.inserts} inserts, "
                        f"{stats.samples} samples (diff {stats.diff:g}), {stats.size} "
                        "items held")
                self._check_open()
                time.sleep(pause)
                pause = min(2 * pause, 2e-3)
                if self._try_admit(insert, n):
                    with self._lock:
                        control[blocked_ns] += time.monotonic_ns() - started
                    return True
        finally:
            if published:
                self._withdraw(insert, n)

    def _try_admit(self, insert: bool, n: int) -> bool:
        """Decide a call of ``n`` items once, without a lock (see the module: reserve,
        full fence, sum, decide); admitted, it is counted. The limiter is left loaded
        with the totals it decided on (others' calls, not this one)."""
        counters, limiter = self._counters, self.limiter
        reserved, admitted = (RESERVED_INSERTS, ADMITTED_INSERTS) if insert else \
            (RESERVED_SAMPLES, ADMITTED_SAMPLES)
        refusable = self._refusable[insert]
        if refusable:
            counters.add(reserved, n)
            full_fence()
        totals = counters.totals()
        mine = n if refusable else 0
        size = self._quick_size()
        if insert:
            limiter.inserts = int(totals[ADMITTED_INSERTS] + totals[RESERVED_INSERTS]) - mine
            limiter.samples = int(totals[ADMITTED_SAMPLES])
            ready = limiter.can_insert(n, max(size, min(limiter.inserts, self._capacity)))
        else:
            limiter.inserts = int(totals[ADMITTED_INSERTS])
            limiter.samples = int(totals[ADMITTED_SAMPLES] + totals[RESERVED_SAMPLES]) - mine
            ready = limiter.can_sample(n, size)
            if not ready:  # only the exact count may hold a sample back
                exact = self._size()
                ready = exact != size and limiter.can_sample(n, exact)
        control = self._control
        limiter.largest_insert = max(1, int(control[LARGEST_INSERT]))
        limiter.largest_sample = max(1, int(control[LARGEST_SAMPLE]))
        if ready:  # (its size is recorded once it went through: given_back_on_error)
            counters.add(admitted, n)
            if refusable:
                order_fence()  # admitted before unreserved: never seen as neither
                counters.add(reserved, -n)
        elif refusable:
            counters.add(reserved, -n)
        return ready

    def record_largest(self, insert: bool, n: int) -> None:
        """Raise the largest call recorded to ``n`` if it is larger: under the lock,
        taken only then (once per new size). Called for calls that went through only."""
        known = self._known_largest
        if n <= known[insert]:  # the usual call: no shared load
            return
        field = LARGEST_INSERT if insert else LARGEST_SAMPLE
        if n > self._control[field]:
            with self._lock:
                self._control[field] = max(int(self._control[field]), n)
        known[insert] = n  # the shared value is at least n now, and only grows

    @contextmanager
    def given_back_on_error(self, insert: bool, n: int) -> Iterator[None]:
        """Run the admitted insert (or draw) of ``n`` items in this context: if it
        raises, its count is given back (:meth:`give_back`) before the error goes on;
        once it went through, its size is recorded (:meth:`record_largest`)."""
        try:
            yield
        except BaseException:
            self.give_back(insert, n)
            raise
        self.record_largest(insert, n)

    def give_back(self, insert: bool, n: int) -> None:
        """Take back the count of ``n`` admitted items whose insert (or draw) failed, so
        that it does not hold later calls back. (Its size was never recorded as the
        largest: that waits for the call to go through.)"""
        self._counters.add(ADMITTED_INSERTS if insert else ADMITTED_SAMPLES, -n)

    def count_more(self, insert: bool, n: int) -> None:
        """Count ``n`` items more than were admitted: a ``Queue`` read that replaced
        windows lost while it copied them consumed those too (:mod:`.queue`)."""
        self._counters.add(ADMITTED_INSERTS if insert else ADMITTED_SAMPLES, n)

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
        totals = self._counters.totals()
        inserts, samples = int(totals[ADMITTED_INSERTS]), int(totals[ADMITTED_SAMPLES])
        # Python numbers, as the in-process limiter's stats: numpy scalars from the
        # shared array would print as np.float64(...).
        return RateLimiterStats(inserts, samples, self._size(),
                                float(c[INSERT_BLOCKED_NS]) / 1e9,
                                float(c[SAMPLE_BLOCKED_NS]) / 1e9, int(c[INSERTS_BLOCKED]),
                                int(c[SAMPLES_BLOCKED]),
                                inserts * self.limiter.samples_per_insert - samples)


class Pacing:
    """The rate limiter's part of :class:`~replaybuffer.distributed.SharedReplayBuffer`:
    its admission of each call and its counters."""

    _admission: SharedAdmission | None

    def _admit(self, insert: bool, n: int, timeout: float | None, block: bool) -> bool:
        """Wait until the rate limiter lets ``n`` items be inserted (or sampled); see
        :class:`SharedAdmission`."""
        assert self._admission is not None
        return self._admission.admit(insert, n, timeout, block)

    def stats(self) -> RateLimiterStats | None:
        """The rate limiter's counters over every process (``None`` without one)."""
        return None if self._admission is None else self._admission.stats()
