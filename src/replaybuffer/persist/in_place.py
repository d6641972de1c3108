"""Reading a checkpoint's data files straight into a new buffer's storage.

A leaf that the plain numpy storage keeps in an array of its own (image frames: every
leaf over :data:`~replaybuffer.storage.numpy_storage.PACK_MAX_BYTES` per item) is one
C-contiguous block, ``[capacity, *spec.shape]``, and a checkpoint's file of it holds
positions ``0 .. count-1`` in the same layout. :func:`read_stream
<replaybuffer.persist.streams.read_stream>` then reads the file with ``readinto`` into
that block itself, chunk by chunk, and checksums each chunk where it landed: no
intermediate buffer and no second copy. Small leaves packed into records are strided
views, which a file read cannot fill; they go through a chunk buffer and the storage's
:meth:`~replaybuffer.storage.base.Storage.load` as before.

Only :class:`~replaybuffer.storage.numpy_storage.NumpyStorage` itself qualifies: its
``load`` is a plain slice assignment, so filling the block directly is the same write.
Other backends (and subclasses, which may keep more than the arrays: the memory-mapped
storage's journal) keep their own ``load``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from replaybuffer.storage.numpy_storage import NumpyStorage

InPlace = tuple["np.ndarray | None", ...]
"""Per array of a stream, the block ``[count, *spec.shape]`` (C-contiguous, writable) its
file is read into, or ``None`` for an array the stream's ``write`` receives."""


def in_place_leaves(storage: Any, count: int) -> InPlace:
    """The blocks of ``storage``'s leaves (their first ``count`` positions) that a restore
    reads into directly; ``None`` for each leaf it does not (packed into records, or a
    backend other than the plain numpy storage)."""
    if type(storage) is not NumpyStorage:
        return (None,) * len(storage.specs)
    return tuple(array[:count] if _fillable(array) else None for array in storage.arrays)


def _fillable(array: np.ndarray) -> bool:
    return type(array) is np.ndarray and array.flags.c_contiguous and array.flags.writeable


def load_rest(storage: Any) -> Callable[[int, Sequence[np.ndarray | None]], None]:
    """A stream ``write`` for the leaves of ``storage`` (of :func:`in_place_leaves`):
    ``write(start, arrays)`` writes arrays ``[n, *spec.shape]`` at positions ``[start,
    start + n)`` and skips each ``None`` (an array read in place already). With every
    array given (an in-memory ``load_state_dict``) it is the storage's own ``load``."""
    def write(start: int, arrays: Sequence[np.ndarray | None]) -> None:
        given = [a for a in arrays if a is not None]
        if len(given) == len(arrays):
            storage.load(given, start)
            return
        # The plain numpy storage's load, leaf by leaf (in_place_leaves gives no block
        # of another backend, so only it reaches this).
        for dst, src in zip(storage.arrays, arrays):
            if src is not None:
                dst[start:start + len(src)] = src
    return write
