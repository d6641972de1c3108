"""Streams: the large arrays of a checkpoint (a storage's leaves, a frame ring), one
``.npy`` file per array, written and read in chunks of a bounded size.

Writing reads a :class:`~replaybuffer.storage.frozen.FrozenRows` chunk by chunk, each
chunk under the buffer's lock (so adds wait at most one chunk's copy); reading fills
the restoring buffer's storage with ``readinto`` (no memory maps, whose pages would
count in the process's resident memory): its own blocks where it has them
(:mod:`replaybuffer.persist.in_place`), chunk-sized buffers handed to it otherwise. Every file's
header, size and CRC-32 are checked against the manifest.

The chunk size is the caller's (:data:`replaybuffer.persist.CHUNK_BYTES`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from replaybuffer.errors import CheckpointError
import replaybuffer.persist.durable as durable
import replaybuffer.persist.checksum as checksum
from replaybuffer.persist.layout import stream_files
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.frozen import FrozenRows


def write_stream(directory: Path, name: str, rows: FrozenRows, lock: Any, chunk_bytes: int
                 ) -> list[dict[str, Any]]:
    """Write frozen rows to one ``.npy`` file per array, chunks of about ``chunk_bytes``
    each read under ``lock``; their manifest entries (file, leaf path, shape, dtype,
    CRC-32)."""
    files = stream_files(name, len(rows.specs))
    shapes = [(rows.count,) + spec.shape for spec in rows.specs]
    crcs = [0] * len(files)
    step = max(1, chunk_bytes // max(1, sum(spec.nbytes for spec in rows.specs)))
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(directory / f, "wb")) for f in files]
        for fh, spec, shape in zip(handles, rows.specs, shapes):
            np.lib.format.write_array_header_1_0(fh, {
                "descr": np.lib.format.dtype_to_descr(spec.dtype), "fortran_order": False,
                "shape": shape})
        for start in range(0, rows.count, step):
            with lock:
                chunk = rows.read(start, min(rows.count, start + step))
            for k, (fh, arr) in enumerate(zip(handles, chunk)):
                data = bytes_of(arr, rows.specs[k].dtype)
                crcs[k] = checksum.crc32(data, crcs[k])
                with durable.naming(fh.name):
                    fh.write(data)
        for fh in handles:
            with durable.naming(fh.name):
                durable.sync(fh)
    return [{"file": f, "path": path, "shape": list(shape), "dtype": spec.dtype.str,
             "crc32": crc}
            for f, path, shape, spec, crc in zip(files, rows.names, shapes, rows.specs, crcs)]


def bytes_of(array: np.ndarray, dtype: np.dtype) -> memoryview:
    """The bytes of ``array`` in ``dtype``, C order, without a copy where it already is."""
    array = np.ascontiguousarray(array, dtype=dtype)
    return array.reshape(-1).view(np.uint8).data


def read_stream(directory: Path, entries: list[dict[str, Any]], specs: Sequence[ArraySpec],
                count: int, write: Callable[[int, list[Any]], None] | None,
                chunk_bytes: int, in_place: Sequence[np.ndarray | None] = ()) -> None:
    """Check the files of one stream and, in chunks of about ``chunk_bytes``, hand their
    data (``[n, *spec.shape]`` per array, at position ``start``) to ``write`` (``None``:
    only check). Where ``in_place[k]`` is a block ``[count, *spec.shape]`` (C-contiguous,
    writable), file ``k`` is read into it directly and ``write`` gets ``None`` for that
    array (:mod:`replaybuffer.persist.in_place`). Each chunk is checksummed as it lands
    (while it is in the cache); the checksums are compared once all is read.

    Raises:
        CheckpointError: a file is missing, unreadable, truncated, of another shape or
            dtype than ``specs`` and ``count`` positions, or corrupt.
    """
    if len(entries) != len(specs):
        raise CheckpointError(f"{directory}: manifest lists {len(entries)} files for a "
                              f"stream of {len(specs)} arrays")
    direct = list(in_place) if write is not None and in_place else [None] * len(specs)
    step = max(1, chunk_bytes // max(1, sum(spec.nbytes for spec in specs)))
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(_open_npy(directory, entry, spec, count))
                   for entry, spec in zip(entries, specs)]
        # Per file: the block it is read into in place, or a chunk buffer reused.
        into = [(np.empty((min(step, count),) + spec.shape, spec.dtype), False)
                if block is None else (block, True) for spec, block in zip(specs, direct)]
        crcs = [0] * len(specs)
        for start in range(0, count, step):
            n = min(step, count - start)
            chunk: list[Any] = []
            for k, (fh, (array, in_place_k)) in enumerate(zip(handles, into)):
                target = array[start:start + n] if in_place_k else array[:n]
                data = target.reshape(-1).view(np.uint8).data
                if fh.readinto(data) != len(data):  # the size was checked: a file changed
                    raise CheckpointError(f"{where(entries[k], directory)} is truncated")
                crcs[k] = checksum.crc32(data, crcs[k])
                chunk.append(None if in_place_k else target)
            if write is not None and any(a is not None for a in chunk):
                write(start, chunk)
    for entry, crc in zip(entries, crcs):
        if crc != entry.get("crc32"):
            raise CheckpointError(f"{where(entry, directory)} is corrupt: its checksum does "
                                  "not match the manifest")


def where(entry: dict[str, Any], directory: Path) -> str:
    """How messages name a stream's file: ``leaf PATH (FILE)``, or ``file FILE``."""
    name = Path(str(entry.get("file"))).name
    return f"leaf {entry['path']} ({name})" if entry.get("path") else f"file {name}"


@contextlib.contextmanager
def _open_npy(directory: Path, entry: dict[str, Any], spec: ArraySpec, count: int
              ) -> Iterator[Any]:
    """A data file opened at its first byte of data, after checking its header and size
    against ``spec`` and ``count`` positions."""
    path = directory / str(entry.get("file"))
    named = where(entry, directory)
    if path.parent != directory or not path.is_file():
        raise CheckpointError(f"{named} is missing from {directory}")
    with open(path, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(fh)
        except (ValueError, OSError, EOFError, SyntaxError) as exc:
            raise CheckpointError(f"{named} is not a readable .npy file: {exc}") from exc
        if dtype.hasobject or fortran:
            raise CheckpointError(f"{named} is not a readable .npy file: it holds "
                                  f"{'Python objects' if dtype.hasobject else 'Fortran order'}"
                                  ", which replaybuffer never writes")
        expected_shape = (count,) + spec.shape
        if shape != expected_shape or dtype != spec.dtype:
            raise CheckpointError(f"{named}: expected shape {expected_shape} dtype "
                                  f"{spec.dtype.name}, found shape {shape} dtype "
                                  f"{dtype.name}")
        size = os.fstat(fh.fileno()).st_size - fh.tell()
        expected = count * spec.nbytes
        if size != expected:
            raise CheckpointError(f"{named} is not a readable .npy file: it holds {size} "
                                  f"bytes of data where its header says {expected} (truncated "
                                  "or extended)")
        yield fh
