"""Storage on memory-mapped files: the numpy storage's layout, larger than RAM.

``storage="mmap", path=DIR`` keeps :class:`~replaybuffer.storage.NumpyStorage`'s
arrays (the packed records and one array per large leaf) in ``.npy`` files under
``DIR/data`` mapped into memory, so the operating system pages them in and out: a
buffer may hold more than the RAM the process may use, and its data outlives it.

Crash safety. A write is staged in a journal (``journal_*.npy``, one row per position
written) and applied in place only at :meth:`MmapStorage.commit`, which the buffer
calls, under its lock, with the newest step id once the step's every write is staged:

1. the staged rows go to the journal files;
2. the header (``header.npy``) records where they go and the new ``last_id``, then
   sets its *committed* flag: the commit point;
3. the rows are copied to their places in the data files;
4. the header's ``last_id`` is updated and the flag cleared.

A process killed before step 2 leaves the data files as they were (the step is lost);
killed after it, :meth:`MmapStorage.recover` replays the journal when the buffer is
reopened (the step is kept). Either way no position holds part of one step and part of
another. This holds for a process crash: the page cache keeps every store the process
made, in order (x86-64 keeps stores in program order). After a power loss only what
:meth:`MmapStorage.flush` (``msync``) wrote is guaranteed; the buffer's ``flush()``
does that and then writes its state.

The journal files are recreated, larger, when a write needs more rows than they have;
a process killed meanwhile leaves one empty or partial. Nothing committed is in the
journal then (the header's flag is clear while a write is staged), so :meth:`reopen
<MmapStorage>` treats a journal it cannot read as absent and the next write makes a new
one. The crash point ``mmap.journal.recreate`` (:mod:`replaybuffer.crash_points`) ends the
process at that moment, for the tests that check this.

Space. Every file is reserved on its file system when it is created or reopened
(:func:`~replaybuffer.storage.memory.reserve_file`): a buffer larger than its file system
is refused with an error naming the file, the bytes needed and the bytes free, where
stores through the maps would otherwise end the process with ``SIGBUS`` later.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.errors import CheckpointError
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.base import checked_leaves
from replaybuffer.storage.memory import reserve_file
from replaybuffer.storage.numpy_storage import NumpyStorage

LAST_ID, COMMITTED, JOURNAL_START, JOURNAL_COUNT, JOURNAL_LAST_ID, EPOCH = range(6)
"""Fields of the int64 header: the committed ``last_id``; 1 while a committed journal
may not be applied yet; where the journal's rows go and how many; the ``last_id`` the
journal brings; how many times the buffer was cleared (a state saved before a clear is
stale)."""


def create_npy(file: Path, shape: tuple[int, ...], dtype: np.dtype,
               point: str | None = None, reserve: bool = True) -> np.memmap:
    """A new (or emptied and rewritten) ``.npy`` file of zeros, its space reserved on
    the file system (``reserve=False``: left sparse, for a caller that reserves a set of
    files at once), mapped read-write; ``point``: the crash point between emptying it
    and writing its header.

    Raises:
        InsufficientSpaceError: the file system cannot hold it (the file is left, empty
            or in part, for the caller to remove).
    """
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": shape}
    with open(file, "w+b") as fh:
        if ARMED is not None and point is not None:
            crash_point(point)
        try:
            np.lib.format.write_array_header_1_0(fh, header)
        except ValueError:  # a header over 64 KiB (a record of many fields)
            np.lib.format.write_array_header_2_0(fh, header)
        offset = fh.tell()
        fh.flush()
        if reserve:
            reserve_file(fh.fileno(), offset + int(np.prod(shape)) * dtype.itemsize, file)
    return np.memmap(file, dtype=dtype, mode="r+", offset=offset, shape=shape)


def map_npy(file: Path, shape: tuple[int, ...], dtype: np.dtype, create: bool,
            reserve: bool = True) -> np.memmap:
    """A ``.npy`` file mapped read-write: created zeroed, or opened and checked; its
    space reserved either way (``reserve=False``: a created file is left sparse, for a
    caller that reserves a set of files at once).

    Raises:
        CheckpointError: (opening) the file is missing, unreadable, or of another shape
            or dtype.
        InsufficientSpaceError: the file system cannot hold it.
    """
    if create:
        return create_npy(file, shape, dtype, reserve=reserve)
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: the mapped buffer in {file.parent.parent} "
                              "is incomplete")
    try:
        array = np.lib.format.open_memmap(file, mode="r")  # r+ would extend a short file
    except (ValueError, OSError, EOFError) as exc:
        raise CheckpointError(f"{file} is not a readable .npy file: {exc}") from exc
    if array.shape != shape or array.dtype != dtype:
        raise CheckpointError(f"{file}: expected shape {shape} dtype {dtype}, found "
                              f"shape {array.shape} dtype {array.dtype}")
    # Files written before space was reserved may be sparse: stores into their holes on
    # a full file system would be a SIGBUS.
    with open(file, "r+b") as fh:
        reserve_file(fh.fileno(), os.fstat(fh.fileno()).st_size, file)
    return np.lib.format.open_memmap(file, mode="r+")


class Reopening(os.PathLike[str]):
    """A path handed to a buffer's constructor by :func:`replaybuffer.reopen`: the
    storage attaches to the files there instead of refusing a non-empty directory."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return str(self.path)


class MmapStorage(NumpyStorage):
    """:class:`NumpyStorage` on memory-mapped ``.npy`` files under ``path/data``.

    Args:
        specs, capacity: as for :class:`NumpyStorage`.
        path: a new or empty directory (a :class:`Reopening` attaches to the files a
            buffer left there).

    Raises:
        CheckpointError: ``path`` holds something else, or (reopening) a data file is
            missing or has another shape or dtype; nothing is overwritten.
        InsufficientSpaceError: the file system cannot hold the files (the message
            names the file, the bytes needed and the bytes free); a new buffer's files
            (and ``path``, if this made it) are removed, a reopened one's kept.

    A write that needs a larger journal than the file system can hold raises
    :class:`~replaybuffer.storage.memory.InsufficientSpaceError` too, before anything of
    its step is committed.
    """

    kind = "mmap"

    def __init__(self, specs: Sequence[ArraySpec], capacity: int, path: str | os.PathLike[str]):
        self.reopening = isinstance(path, Reopening)
        self.path = Path(path)
        self.data = self.path / "data"
        if self.reopening:
            if not self.data.is_dir():
                raise CheckpointError(f"{self.path} holds no mmap buffer (no data directory)")
        elif self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise CheckpointError(f"{self.path} is not a new or empty directory: reopen a "
                                  "buffer there with replaybuffer.reopen(path), or give "
                                  "another path")
        created = not self.path.exists()
        self.data.mkdir(parents=True, exist_ok=True)
        # One buffer at a time on these files: an exclusive lock, which the kernel
        # releases when the process ends, however it ends.
        self._lock_file: Any = open(self.path / "lock", "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise CheckpointError(f"{self.path} is in use by another buffer (closed buffers "
                                  "and ended processes release it)") from None
        self._maps: dict[str, np.memmap] = {}
        try:
            super().__init__(specs, capacity)
            self.header = self._allocate("header", (6,), np.dtype(np.int64))
        except BaseException:  # no space, no memory, a file that does not match
            self._abandon(created)
            raise
        if not self.reopening:
            self.header[LAST_ID] = -1
        self._journal: dict[str, np.ndarray] = {}
        self._journal_maps: dict[str, np.memmap] = {}  # the memmaps, for flush()
        self._journal_rows = 0
        self._staged: list[tuple[int, int, int]] = []  # (start, count, journal row)
        if self.reopening:
            self._open_journal()

    # ------------------------------------------------------------------- files
    def _abandon(self, created: bool) -> None:
        """A construction that failed: release the lock and, for a new buffer, remove
        what it made (the path too, if it made that); a reopened buffer's files stay."""
        self._maps = {}
        self.release()
        if self.reopening:
            return
        shutil.rmtree(self.data, ignore_errors=True)
        (self.path / "lock").unlink(missing_ok=True)
        if created:
            self.path.rmdir()

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        array = map_npy(self.data / f"{name}.npy", shape, dtype, create=not self.reopening)
        self._maps[name] = array
        # Plain ndarray views of the mapping: a memmap's slices and takes are memmaps
        # too, each paying for __array_finalize__ (about 5 us a get_next).
        return array.view(np.ndarray)

    def _data_arrays(self) -> dict[str, np.ndarray]:
        """The data files' arrays by name: records and the leaves of their own."""
        out = {} if self._records is None else {"records": self._records}
        out.update({f"leaf_{i:03d}": self.arrays[i] for i in self._own})
        return out

    def _open_journal(self) -> None:
        """Map the journal files a buffer left, if they are whole. Missing, empty or
        partial ones (a process killed while it recreated them, when they held nothing
        committed) count as absent: :meth:`recover` has nothing to replay and the next
        write makes new ones."""
        arrays = self._data_arrays()
        files = {name: self.data / f"journal_{name}.npy" for name in arrays}
        try:
            # "r" first: "r+" would extend a file cut short after its header.
            found = {name: np.lib.format.open_memmap(f, mode="r") for name, f in files.items()}
        except (ValueError, OSError, EOFError):
            return
        if any(m.dtype != arrays[name].dtype or m.shape[1:] != arrays[name].shape[1:]
               or len(m) == 0 for name, m in found.items()):
            return
        for f in files.values():  # those of a version that did not reserve them
            with open(f, "r+b") as fh:
                reserve_file(fh.fileno(), os.fstat(fh.fileno()).st_size, f)
        self._journal_maps = {name: np.lib.format.open_memmap(f, mode="r+")
                              for name, f in files.items()}
        self._journal = {name: m.view(np.ndarray) for name, m in self._journal_maps.items()}
        self._journal_rows = min(len(a) for a in self._journal.values())

    def _grow_journal(self, rows: int) -> None:
        """Journal files of at least ``rows`` rows: recreated, doubling, when too small,
        with the rows staged so far carried over."""
        if rows <= self._journal_rows:
            return
        staged = sum(n for _, n, _ in self._staged)
        kept = {name: np.array(array[:staged]) for name, array in self._journal.items()}
        rows = max(rows, 2 * self._journal_rows)
        self._journal, self._journal_maps, self._journal_rows = {}, {}, 0
        try:
            for name, array in self._data_arrays().items():
                self._journal_maps[name] = create_npy(
                    self.data / f"journal_{name}.npy", (rows,) + array.shape[1:],
                    array.dtype, "mmap.journal.recreate")
        except BaseException:  # no space: the write is refused, with what it staged
            self._journal_maps, self._staged = {}, []
            raise
        self._journal = {name: m.view(np.ndarray) for name, m in self._journal_maps.items()}
        for name, rows_kept in kept.items():
            self._journal[name][:staged] = rows_kept
        self._journal_rows = rows

    # ---------------------------------------------------------------- writing
    def exact_writer(self, outer_shape: tuple[int, ...]) -> None:
        return None  # every write is staged, then committed

    def write(self, start: int, leaves: Sequence[np.ndarray]) -> None:
        """Stage ``leaves`` for positions ``[start, start + n)``; :meth:`commit` applies.

        Pieces staged before one commit must follow each other around the ring (as a
        write that wraps does)."""
        if self._lock_file is None:
            raise ValueError(f"the buffer on {self.path} is closed: reopen it with "
                             "replaybuffer.reopen(path) to write again")
        count = len(leaves[0])
        row = sum(n for _, n, _ in self._staged)
        if self._staged:
            first, staged, _ = self._staged[0]
            if int(start) != (first + staged) % self.capacity:
                raise ValueError(f"staged writes must follow each other around the ring: "
                                 f"[{first}, +{staged}) then {start}")
        self._grow_journal(row + count)
        journal = self._journal
        for i, leaf in enumerate(leaves):
            if i in self._field:
                journal["records"][self._field[i]][row:row + count] = leaf
            else:
                journal[f"leaf_{i:03d}"][row:row + count] = leaf
        self._staged.append((int(start), count, row))

    def commit(self, last_id: int) -> None:
        """Apply what is staged and record ``last_id`` (the commit protocol above)."""
        header = self.header
        if last_id < header[LAST_ID]:  # ids only go back on clear(): a new epoch
            header[EPOCH] += 1
        if self._staged:
            start = self._staged[0][0]
            count = sum(n for _, n, _ in self._staged)
            header[JOURNAL_START], header[JOURNAL_COUNT] = start, count
            header[JOURNAL_LAST_ID] = last_id
            header[COMMITTED] = 1  # the commit point
            self._apply(start, count, 0)
            self._staged = []
        header[LAST_ID] = last_id
        header[COMMITTED] = 0

    def _apply(self, start: int, count: int, row: int) -> None:
        """Copy journal rows ``[row, row + count)`` to positions ``start ..`` (mod capacity)."""
        head = min(count, self.capacity - start)
        for name, array in self._data_arrays().items():
            journal = self._journal[name]
            array[start:start + head] = journal[row:row + head]
            if head < count:
                array[:count - head] = journal[row + head:row + count]

    def recover(self) -> int:
        """Finish a commit a crash interrupted; the committed ``last_id``."""
        header = self.header
        if header[COMMITTED] == 1 and self._journal:
            self._apply(int(header[JOURNAL_START]), int(header[JOURNAL_COUNT]), 0)
            header[LAST_ID] = header[JOURNAL_LAST_ID]
        header[COMMITTED] = 0
        return int(header[LAST_ID])

    @property
    def epoch(self) -> int:
        """How many times the buffer on these files was cleared (a state saved in an
        earlier epoch describes other data)."""
        return int(self.header[EPOCH])

    # ------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """:class:`NumpyStorage`'s (``capacity``, ``leaves``) and the header's committed
        ``last_id`` and ``epoch``. Writes staged but not committed are not in it."""
        return {**super().state_dict(), "last_id": int(self.header[LAST_ID]),
                "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Write the leaves to the files in place and record ``last_id`` and ``epoch``
        as committed; writes staged and not committed are dropped.

        Raises:
            ValueError: the storage is closed, or the state does not fit it (nothing is
                written then).
        """
        if self._lock_file is None:
            raise ValueError(f"the buffer on {self.path} is closed: reopen it with "
                             "replaybuffer.reopen(path) to write again")
        leaves = checked_leaves(self, state)
        self._staged = []
        self.load(leaves)
        header = self.header
        header[LAST_ID], header[EPOCH] = int(state["last_id"]), int(state["epoch"])
        header[COMMITTED] = 0

    def flush(self) -> None:
        """``msync`` every file: what is written survives a power loss."""
        for array in list(self._maps.values()) + list(self._journal_maps.values()):
            array.flush()

    def release(self) -> None:
        """Give up the files (after a flush): writes are refused from now on, and another
        buffer may reopen them."""
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor releases the lock
            self._lock_file = None
