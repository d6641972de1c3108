"""Writes that survive a crash, and errors that name the file that failed.

A file is flushed and ``fsync``-ed before the rename that publishes it; the directory
is ``fsync``-ed after, so the new name is durable too.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator


def sync(fh: Any) -> None:
    """Flush a file object's buffer and ``fsync`` its descriptor."""
    fh.flush()
    os.fsync(fh.fileno())


def sync_directory(directory: Path) -> None:
    """fsync a directory, so the names of files and renames in it are durable too."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Give an ``OSError`` raised while writing ``path`` the file's name (a failed
    ``write`` or ``fsync`` names none), so the error says which file failed."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
