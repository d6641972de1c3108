"""The lock of a shared buffer and the life of its processes.

:class:`ProcessLock` is an exclusive ``flock`` that the kernel releases when a holder
dies, so a writer killed inside the critical section never deadlocks the others;
:func:`process_ended` tells a dead owner of rows from a live one; :func:`remove_directory`
is the finalizer that removes a temporary buffer's files in the process that made them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from pathlib import Path
from typing import Any


class ProcessLock:
    """An exclusive ``flock`` on a file, per process (reopened after a fork: a forked
    child shares its parent's open file, and with it the lock), plus a thread lock
    (``flock`` does not exclude threads sharing a descriptor). The kernel releases the
    ``flock`` of a process that dies, so a killed holder never deadlocks the others.

    Use as a context manager: ``with lock: ...``.
    """

    def __init__(self, file: Path):
        self._file = file
        self._pid = -1
        self._fd = -1
        self._threads = threading.Lock()

    def _open(self) -> None:
        self._fd = os.open(self._file, os.O_RDWR | os.O_CREAT, 0o600)
        self._threads = threading.Lock()
        self._pid = os.getpid()

    def __enter__(self) -> None:
        if self._pid != os.getpid():
            self._open()
        self._threads.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def close(self) -> None:
        """Close this process's descriptor (a forked child's inherited one is left)."""
        if self._pid == os.getpid() and self._fd >= 0:
            os.close(self._fd)
        self._fd, self._pid = -1, -1


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


def remove_directory(path: str, creator: int) -> None:
    """Remove a temporary buffer's directory ``path``, only in process ``creator``."""
    if os.getpid() == creator:  # never from a forked child that inherited the finalizer
        shutil.rmtree(path, ignore_errors=True)
