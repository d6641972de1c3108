"""Storage that several processes map at once: the numpy layout on ``.npy`` files.

:class:`SharedStorage` is :class:`~replaybuffer.storage.NumpyStorage` (packed records,
one array per large leaf) whose arrays are ``.npy`` files under a directory, mapped
shared: what one process writes, every process that attached sees. It adds no locking
and no journal; :class:`~replaybuffer.distributed.shared.SharedReplayBuffer` decides who
writes where and marks each position's writes with a version (a seqlock) so that a
reader never takes a half-written step.

Put the directory on a RAM file system (``/dev/shm``, the default of the buffer) for
memory speed, or on a disk for a buffer larger than RAM.

Space. The files are made sparse, so a buffer larger than its file system (a container's
64 MB ``/dev/shm``) would map without error and its writer die of ``SIGBUS`` at the
first page the file system cannot back. :meth:`SharedStorage.reserve` allocates every
file's bytes (``posix_fallocate``) once they are all made, and raises
:class:`StorageSpaceError` (the directory, the bytes needed, the bytes free) instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import numpy.typing as npt

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.memory import InsufficientSpaceError, reserve_file
from replaybuffer.storage.mmap_storage import map_npy
from replaybuffer.storage.numpy_storage import NumpyStorage


class StorageSpaceError(InsufficientSpaceError):
    """The file system of a shared buffer's directory cannot hold its files (an
    :class:`~replaybuffer.storage.memory.InsufficientSpaceError`, as mmap storage raises,
    about the whole directory).

    Attributes:
        directory: the buffer's directory.
        needed: bytes the buffer's files take.
        free: bytes free to this user on that file system before reserving them.
    """

    def __init__(self, directory: Path, needed: int, free: int):
        super().__init__(
            f"not enough space for the shared buffer in {directory}: it needs "
            f"{needed:,} bytes and {free:,} are free on that file system; give it a "
            "smaller buffer, a larger file system (a container's /dev/shm is 64 MB "
            "unless its --shm-size says more) or path= on one that is larger")
        self.directory, self.needed, self.free = directory, needed, free


class SharedStorage(NumpyStorage):
    """:class:`NumpyStorage` on ``.npy`` files in ``directory``, mapped shared.

    Args:
        specs, capacity: as for :class:`NumpyStorage`.
        directory: where the files are.
        create: make the files (zeroed); otherwise map the files another process made
            (checked against ``specs`` and ``capacity``).

    Raises:
        CheckpointError: (attaching) a file is missing or of another shape or dtype.
    """

    kind = "shared"

    def __init__(self, specs: Sequence[ArraySpec], capacity: int,
                 directory: str | os.PathLike[str], create: bool):
        self.directory = Path(directory)
        self._create = create
        super().__init__(specs, capacity)

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return self.map(name, shape, dtype)

    def map(self, name: str, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        """Another array in the directory (``name.npy``), created or attached as the
        storage's own; a plain ndarray view of the mapping (memmap slices are slower)."""
        # Created files stay sparse until reserve() allocates the whole directory, so
        # that a buffer too large is refused before any file takes room.
        return map_npy(self.directory / f"{name}.npy", shape, np.dtype(dtype),
                       create=self._create, reserve=not self._create).view(np.ndarray)

    def reserve(self) -> None:
        """Allocate the bytes of every file in the directory (made sparse), so that a
        write to the mapping can never meet a full file system (``SIGBUS``). Called once
        by the process that made the files, after all of them are made.

        Raises:
            StorageSpaceError: the file system has less room than the files need
                (checked first, then met by ``posix_fallocate`` when something else
                took the room meanwhile).
        """
        files = sorted(self.directory.glob("*.npy"))
        sizes = [file.stat().st_size for file in files]
        stat = os.statvfs(self.directory)
        free = stat.f_bavail * stat.f_frsize
        if sum(sizes) > free:
            raise StorageSpaceError(self.directory, sum(sizes), free)
        for file, size in zip(files, sizes):
            descriptor = os.open(file, os.O_RDWR)
            try:
                reserve_file(descriptor, size, file)
            except InsufficientSpaceError as exc:
                raise StorageSpaceError(self.directory, sum(sizes), free) from exc
            finally:
                os.close(descriptor)
