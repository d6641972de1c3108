"""Windows that a ``Queue`` read has claimed and is copying, pinned so that a writer
waits instead of overwriting them.

A ``Queue`` read (:mod:`.queue`) claims the oldest unread windows under the buffer's
lock, moves the rows' read cursors past them, then copies them with no lock. The rate
limiter counts the read at once, so from the claim on the writers may go ahead; a reader
that the system deschedules between its claim and its copy could find a row's writer
has lapped the window, and the step, read by nobody, would be gone. Each reading
process therefore pins, per row, the first step id of the oldest window it is copying;
a writer about to overwrite step ``id`` of a row waits while a pin at or below ``id``
stands there. A read unpins when its copy is done (or fails).

Arrays (``.npy`` files in the buffer's directory, only in buffers with a ``Queue``):

- ``read_pins`` int64 ``[PIN_SLOTS, num_rows]``: per reading process's slot and row,
  ``1 +`` the first id of the oldest window being copied (0: none);
- ``read_pin_owners`` int64 ``[PIN_SLOTS]``: the pid of each slot (0: free).

A slot is claimed under the buffer's lock, once per handle and process (two handles of
one buffer in a process never share one; the slot of a process that ended is taken
over, its pins cleared; a handle that is collected gives its slot back). A process that finds no free slot reads
unpinned: should a writer then lap a window it claimed, the window counts as dropped
and is replaced (:class:`~.queue.QueueWindows`), as it does in the one race pins leave
open: a writer that loaded the pins just before a claim of the very step it then
overwrites, which needs a row holding a whole ``max_length`` of unread steps.

A writer waiting on a pin of a process that ended clears it (under the lock), so a
reader killed mid-copy never stalls the writers.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from replaybuffer.distributed.shared.process_lock import ProcessLock, process_ended
from replaybuffer.storage.shared_storage import SharedStorage

PIN_SLOTS = 32
"""Processes that can pin at once; more read unpinned (see the module docstring)."""


class ReadPins:
    """The pins of a ``Queue`` buffer's reads (see the module docstring), made or
    attached in ``storage``'s directory.

    Args:
        storage: the buffer's storage (its directory holds the arrays).
        num_rows: the buffer's rows.
        lock: its process lock.
    """

    def __init__(self, storage: SharedStorage, num_rows: int, lock: ProcessLock):
        self._pins = storage.map("read_pins", (PIN_SLOTS, num_rows), np.int64)
        self._owners = storage.map("read_pin_owners", (PIN_SLOTS,), np.int64)
        self._lock = lock
        self._slot, self._slot_pid = -1, -1
        self._threads = threading.Lock()  # one pinning read of this handle at a time
        mine = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(mine))

    def forked(self) -> None:
        """In a forked child: a fresh thread lock (the parent's may be held by a thread
        the child does not have); the child claims a slot of its own at its first pin."""
        self._threads = threading.Lock()
    @contextmanager
    def reading(self) -> Iterator[None]:
        """The context of one read: its pins (:meth:`pin`) stand until it ends."""
        with self._threads:
            try:
                yield
            finally:
                if self._slot >= 0 and self._slot_pid == os.getpid():
                    self._pins[self._slot] = 0

    def pin(self, claimed: np.ndarray, starts: np.ndarray) -> None:
        """Pin the windows a claim of this read took: ``claimed`` (bool ``[num_rows]``)
        marks the rows it took windows of, ``starts`` (int64 ``[num_rows]``) the first
        step of the oldest of them per row. The buffer's lock is held (the claim's)."""
        slot = self._my_slot()
        if slot < 0:
            return
        pins = self._pins[slot]
        new = np.where(claimed, starts + 1, 0)
        older = (pins > 0) & ((new == 0) | (pins < new))  # an earlier claim of this read
        pins[:] = np.where(older, pins, new)

    def _my_slot(self) -> int:
        """This process's slot, claimed if it has none (the lock held); -1: none free."""
        pid = os.getpid()
        if self._slot_pid == pid:
            return self._slot
        owners = self._owners
        free = [s for s in range(PIN_SLOTS) if owners[s] == 0]
        free = free or [s for s in range(PIN_SLOTS) if process_ended(int(owners[s]))]
        self._slot = free[0] if free else -1
        self._slot_pid = pid
        if free:
            owners[self._slot] = pid
            self._pins[self._slot] = 0
            weakref.finalize(self, _give_back, self._pins, owners, self._slot, pid)
        return self._slot

    def wait_for_readers(self, first: int, count: int, step: int) -> None:
        """Return once no read pins a window at or below step id ``step`` of rows
        ``first .. first + count - 1`` (a writer about to overwrite ``step`` there).
        Pins of processes that ended are cleared."""
        pause = 20e-6
        while True:
            pins = self._pins[:, first:first + count]
            standing = (pins > 0) & (pins <= step + 1)
            if not standing.any():
                return
            slots = np.flatnonzero(standing.any(1))
            ended = [int(s) for s in slots if process_ended(int(self._owners[s]))]
            if ended:
                with self._lock:  # a claim could be handing the slot over
                    for slot in ended:
                        if process_ended(int(self._owners[slot])):
                            self._pins[slot] = 0
                continue
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)


def _give_back(pins: np.ndarray, owners: np.ndarray, slot: int, pid: int) -> None:
    """A collected handle's slot, free again (if its process still owns it: a fork's
    copy of the handle never claimed it)."""
    if owners[slot] == pid and os.getpid() == pid:
        pins[slot] = 0
        owners[slot] = 0


def _after_fork(pins: "weakref.ref[ReadPins]") -> None:
    """In a forked child: :meth:`ReadPins.forked`, if the handle still exists."""
    alive = pins()
    if alive is not None:
        alive.forked()
