"""How much memory a buffer will take, checked against what the machine has."""

from __future__ import annotations

import os
import warnings

from replaybuffer.errors import ReplayBufferError


class InsufficientMemoryError(ReplayBufferError, MemoryError):
    """A buffer asked to be strict would not fit in the available memory."""


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
