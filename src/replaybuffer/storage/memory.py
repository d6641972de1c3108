"""How much memory a buffer will take, checked against what the machine has: RAM
(:func:`check_memory`) and, for buffers on files, the file system's space, reserved
(:func:`reserve_file`)."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

from replaybuffer.errors import ReplayBufferError


class InsufficientMemoryError(ReplayBufferError, MemoryError):
    """A buffer asked to be strict would not fit in the available memory."""


class InsufficientSpaceError(ReplayBufferError, OSError):
    """A file system has too little free space for the files of a buffer (``errno`` is
    the file system's: ``ENOSPC``, ``EDQUOT`` or ``EFBIG``)."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""What a file system answers when it cannot hold the bytes asked for."""


def available_memory() -> int | None:
    """Bytes of memory available to new allocations, or ``None`` if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(nbytes: int, what: str, strict: bool = False) -> None:
    """Warn (or, when ``strict``, raise) if ``nbytes`` exceed the available memory."""
    available = available_memory()
    if available is None or nbytes <= available:
        return
    message = (f"{what} needs {nbytes / 2**30:.2f} GiB but only {available / 2**30:.2f} GiB "
               "of memory is available")
    if strict:
        raise InsufficientMemoryError(message)
    warnings.warn(message, ResourceWarning, stacklevel=3)


def free_space(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged process may still write on the file system of ``path``, or
    ``None`` if unknown."""
    try:
        stats = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def reserve_file(fd: int, nbytes: int, path: str | os.PathLike[str]) -> None:
    """Allocate the first ``nbytes`` of the open file ``fd`` (at ``path``) on its file
    system, so that stores through a memory map of it never meet a full file system:
    there that is a ``SIGBUS`` that kills the process, here a clear error at once.
    Parts already allocated cost nothing (a file reserved before takes microseconds).

    Raises:
        InsufficientSpaceError: the file system cannot hold the file; the message names
            ``path``, the bytes needed and the bytes free. The file is as it was, or
            allocated in part.
    """
    fallocate = getattr(os, "posix_fallocate", None)  # absent on macOS
    if fallocate is None:
        free = free_space(Path(path).parent)
        size = os.fstat(fd).st_size
        if free is not None and nbytes - size > free:
            raise InsufficientSpaceError(errno.ENOSPC, _message(nbytes, path, free),
                                         str(path))
        return
    try:
        fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return  # a file system that reserves nothing: unchecked, as files were before
        if exc.errno not in NO_SPACE:
            raise
        raise InsufficientSpaceError(exc.errno, _message(nbytes, path,
                                                         free_space(Path(path).parent)),
                                     str(path)) from exc


def _message(nbytes: int, path: str | os.PathLike[str], free: int | None) -> str:
    held = "an unknown number of" if free is None else str(free)
    return (f"cannot reserve {nbytes} bytes for {path}: the file system holds {held} bytes "
            "free")
