"""The rate limiter's counts of a shared buffer, one slot per process: each process
adds to its own slot without a lock, whoever decides sums the slots.

Layout (``counters`` int64 ``[SLOTS + 1, COLUMNS]``, a slot per 64-byte cache line so
that two processes' counts never share one, and ``counter_owners`` int64
``[SLOTS + 1]`` in the buffer's directory): row 0 is the overflow row, written under the
buffer's lock by processes that found no free slot; row ``k >= 1`` belongs to the
process whose pid ``counter_owners[k]`` holds, claimed once per process under the lock
(a slot of an ended process is taken over with its counts, which stay part of the
totals). ``counter_owners[0]`` holds how many slots were ever claimed, so a sum reads
only those. The four columns:

- ``ADMITTED_INSERTS``, ``ADMITTED_SAMPLES``: items the limiter let through (and that
  did not fail since: :meth:`ProcessCounters.add` of ``-n`` gives them back);
- ``RESERVED_INSERTS``, ``RESERVED_SAMPLES``: items of calls being decided now. A call
  that the limiter can refuse by the counts reserves first, then (after a full fence)
  sums the slots and decides (:mod:`.admission` argues why that is exact).

Threads of one process share its slot; a thread lock makes their read-modify-writes of
it one at a time (uncontended with one thread).
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from replaybuffer.distributed.shared.process_lock import ProcessLock, process_ended

SLOTS = 128
"""Processes that count without a lock; more share the overflow row, under the lock."""

ADMITTED_INSERTS, RESERVED_INSERTS, ADMITTED_SAMPLES, RESERVED_SAMPLES = range(4)
"""Columns of the ``counters`` array."""

COLUMNS = 8
"""Columns of a slot: the four above, padded to 64 bytes (a cache line), so a process's
writes to its slot never take a line from another process (false sharing)."""


class ProcessCounters:
    """The limiter's counts in shared memory, this process writing its own slot.

    Args:
        counts: the shared int64 ``[SLOTS + 1, COLUMNS]`` array.
        owners: the shared int64 ``[SLOTS + 1]`` array (slot owners; ``[0]``: slots
            used).
        lock: the buffer's process lock (claims a slot; guards the overflow row).
    """

    def __init__(self, counts: np.ndarray, owners: np.ndarray, lock: ProcessLock):
        self._counts, self._owners = counts, owners
        self._lock = lock
        self._forget_slot()
        mine = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(mine))

    def _forget_slot(self) -> None:
        """Own no slot (yet, or in a forked child, whose parent's slot is not its own)."""
        self._slot = -1
        self._row = self._counts[0]
        self._row_at = memoryview(self._row)
        self._threads = threading.Lock()

    def _claim_slot(self) -> None:
        """Claim a free slot (or one of an ended process) for this process, under the
        lock; none free: the overflow row, written under the lock."""
        pid = os.getpid()
        with self._lock:
            owners = self._owners
            used = int(owners[0])
            for slot in range(1, used + 1):
                owner = int(owners[slot])
                if owner == pid or owner == 0 or process_ended(owner):
                    break
            else:
                slot = used + 1 if used < SLOTS else 0
                if slot:
                    owners[0] = slot
            if slot:
                owners[slot] = pid
                # A reservation of an ended process was never decided: it is void.
                self._counts[slot, [RESERVED_INSERTS, RESERVED_SAMPLES]] = 0
        self._slot = slot
        self._row = self._counts[slot]
        # Its counts as a memoryview: a read-modify-write of one costs a third of
        # numpy's (an insert counted at its commit is on every add_batch's path).
        self._row_at = memoryview(self._row)

    def add(self, column: int, n: int) -> None:
        """Add ``n`` (negative: take back) to this process's count in ``column``."""
        if self._slot > 0:  # the usual case
            with self._threads:
                self._row_at[column] += n
            return
        if self._slot < 0:
            self._claim_slot()
        with self._threads:
            if self._slot == 0:  # the overflow row is shared: under the lock
                with self._lock:
                    self._row[column] += n
            else:
                self._row_at[column] += n

    def totals(self) -> np.ndarray:
        """Every column summed over the slots ever claimed: int64 ``[COLUMNS]``."""
        used = int(self._owners[0])
        total: np.ndarray = self._counts[:used + 1].sum(0)
        return total

    def void_dead_reservations(self) -> None:
        """Zero the reservations of slots whose process ended (killed between reserving
        and deciding): they would hold calls back for good. Called under the lock, by a
        call the limiter held back (the only kind such a reservation hurts)."""
        used = int(self._owners[0])
        reserved = self._counts[1:used + 1, [RESERVED_INSERTS, RESERVED_SAMPLES]]
        for index in np.flatnonzero(reserved.any(1)):
            owner = int(self._owners[index + 1])
            if owner and owner != os.getpid() and process_ended(owner):
                self._counts[index + 1, [RESERVED_INSERTS, RESERVED_SAMPLES]] = 0

    def forked(self) -> None:
        """In a forked child: count in a slot of its own (claimed at its first add)."""
        self._forget_slot()


def _after_fork(counters: "weakref.ref[ProcessCounters]") -> None:
    alive = counters()
    if alive is not None:
        alive.forked()
