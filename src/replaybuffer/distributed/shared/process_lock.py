"""The lock of a shared buffer and the life of its processes.

:class:`ProcessLock` is an exclusive ``flock`` that the kernel releases when a holder
dies, so a writer killed inside the critical section never deadlocks the others;
:func:`process_ended` tells a dead owner of rows from a live one;
:func:`directory_remover` is the finalizer that removes a temporary buffer's files in
the process that made them, :func:`removed_on_failure` what a failed creation made.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from contextlib import contextmanager
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any, Iterator


class ProcessLock:
    """An exclusive ``flock`` on a file, per process (reopened after a fork: a forked
    child shares its parent's open file, and with it the lock), plus a thread lock
    (``flock`` does not exclude threads sharing a descriptor). The kernel releases the
    ``flock`` of a process that dies, so a killed holder never deadlocks the others.

    Use as a context manager: ``with lock: ...``.

    Attributes:
        acquisitions: how many times this process took the lock (a plain count, for
            tests and the benchmark that check which paths take it).
        held_ns: nanoseconds this process held it, in all (the serial section the
            benchmark reports; two clock reads an acquisition, on paths that lock).
    """

    def __init__(self, file: Path):
        self._file = file
        self._pid = -1
        self._forks = -1  # _FORKS when this process opened it (-1: not opened)
        self._fd = -1
        self._threads = threading.Lock()
        self.acquisitions = 0
        self.held_ns = 0
        self._since = 0

    def _open(self) -> None:
        self._fd = os.open(self._file, os.O_RDWR | os.O_CREAT, 0o600)
        self._threads = threading.Lock()
        self._pid = os.getpid()
        self._forks = _FORKS[0]

    def __enter__(self) -> None:
        # Reopened in a forked child: a fork counter, not os.getpid() (a system call,
        # 0.4 us here, on every acquisition of the hot paths that lock).
        if self._forks != _FORKS[0]:
            self._open()
        self._threads.acquire()
        self.acquisitions += 1
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        self._since = time.perf_counter_ns()

    def __exit__(self, *exc: Any) -> None:
        held = time.perf_counter_ns() - self._since
        self.held_ns += held
        _TOTALS[0] += 1
        _TOTALS[1] += held
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def close(self) -> None:
        """Close this process's descriptor (a forked child's inherited one is left)."""
        if self._pid == os.getpid() and self._fd >= 0:
            os.close(self._fd)
        self._fd, self._pid, self._forks = -1, -1, -1


_TOTALS = [0, 0]  # acquisitions, nanoseconds held: every ProcessLock of this process
_FORKS = [0]  # forks this process descends through: a lock opened before one is reopened


def _forked() -> None:
    _FORKS[0] += 1


os.register_at_fork(after_in_child=_forked)


def lock_totals() -> tuple[int, int]:
    """Acquisitions and nanoseconds held of every shared buffer's lock in this process
    (since it started; a forked child inherits its parent's counts): for the benchmark,
    which reports the locks an insert takes and the serial section they make."""
    return _TOTALS[0], _TOTALS[1]


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie, not yet reaped, has ended too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return False


@contextmanager
def removed_on_failure(path: str, made_directory: bool) -> Iterator[None]:
    """Remove what a buffer's creation made in ``path`` when the block raises (no
    space, no memory): the directory it made, or the files it made in a given one
    (which was new or empty), then re-raise."""
    try:
        yield
    except BaseException:
        if made_directory:
            shutil.rmtree(path, ignore_errors=True)
        else:
            for entry in Path(path).iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        raise


def directory_remover(owner: object, path: str) -> Finalize[None]:
    """A finalizer that removes ``path`` in this process when ``owner`` is collected,
    called, or the process ends. A multiprocessing finalizer, not ``weakref.finalize``
    (an ``atexit`` hook): a multiprocessing child ends with ``os._exit``, which skips
    ``atexit`` but runs these, so a buffer made in a child that never closed it goes too.
    A negative priority runs it after the process's non-daemon children were joined.
    """
    return Finalize(owner, remove_directory, (path, os.getpid()), exitpriority=-1)


def remove_directory(path: str, creator: int) -> None:
    """Remove a temporary buffer's directory ``path``, only in process ``creator``."""
    if os.getpid() == creator:  # never from a forked child that inherited the finalizer
        shutil.rmtree(path, ignore_errors=True)
