"""Storage that several processes map at once: the numpy layout on ``.npy`` files.

:class:`SharedStorage` is :class:`~replaybuffer.storage.NumpyStorage` (packed records,
one array per large leaf) whose arrays are ``.npy`` files under a directory, mapped
shared: what one process writes, every process that attached sees. It adds no locking
and no journal; :class:`~replaybuffer.distributed.shared.SharedReplayBuffer` decides who
writes where and marks each position's writes with a version (a seqlock) so that a
reader never takes a half-written step.

Put the directory on a RAM file system (``/dev/shm``, the default of the buffer) for
memory speed, or on a disk for a buffer larger than RAM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import numpy.typing as npt

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.mmap_storage import map_npy
from replaybuffer.storage.numpy_storage import NumpyStorage


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
        return map_npy(self.directory / f"{name}.npy", shape, np.dtype(dtype),
                       create=self._create).view(np.ndarray)
