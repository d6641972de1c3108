"""Copy-on-write snapshots: arrays read as they were at one moment while writers go on.

Saving a multi-GB buffer takes seconds; holding the buffer's lock that long would stall
every collector, and copying the buffer first would double its memory. A
:class:`FrozenRows` instead records, under the lock, how many positions the snapshot
covers, then hands them out in chunks (each read under the lock, briefly). A writer
about to overwrite positions that have not been handed out yet first copies them
aside (:meth:`FrozenRows.preserve`), so every chunk holds exactly what the positions
held when the snapshot was taken. Extra memory is what the writers overwrite during
the save, not the buffer's size.

:class:`CopyOnWriteStorage` puts that hook in front of any :class:`Storage` while a
snapshot is open: ``write``, ``load`` and ``zero`` preserve before they write.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Sequence

import numpy as np

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.base import Storage, to_numpy

ReadPositions = Callable[[np.ndarray], Sequence[np.ndarray]]
"""Positions (int64 ``[n]``) -> one numpy array ``[n, *shape]`` per array: a copy (or a
view of a fresh copy), never a view of the live arrays."""


class FrozenRows:
    """Positions ``[0, count)`` of a set of arrays, frozen when this object is made.

    The owner of the arrays holds one lock for writes and for every call here.

    Args:
        read: copies the given positions out of the live arrays.
        count: positions covered.
        specs: one spec per array (the dtype and item shape of a position).
        names: one name per array, for the save's manifest.
    """

    def __init__(self, read: ReadPositions, count: int, specs: Sequence[ArraySpec],
                 names: Sequence[str]):
        self._read = read
        self.count = int(count)
        self.specs = tuple(specs)
        self.names = tuple(names)
        self._handed_out = 0  # positions [0, _handed_out) were read already
        self._kept: np.ndarray | None = None  # preserved positions (made on first use)
        # Preserved positions (each >= _handed_out) in blocks of one preserve call, a heap
        # on their lowest position: (lowest, highest, tie-break, positions, values).
        self._blocks: list[tuple[int, int, int, np.ndarray, list[np.ndarray]]] = []
        self._order = itertools.count()

    def preserve(self, positions: np.ndarray | slice) -> None:
        """Copy aside the positions a writer is about to overwrite (those of this snapshot
        not yet handed out and not copied before). Call it under the owner's lock."""
        if isinstance(positions, slice):
            start = max(positions.start or 0, self._handed_out)
            stop = min(self.count if positions.stop is None else positions.stop, self.count)
            if start >= stop:
                return
            wanted = np.arange(start, stop, dtype=np.int64)
        else:
            wanted = np.asarray(positions, np.int64).ravel()
            wanted = wanted[(wanted >= self._handed_out) & (wanted < self.count)]
            if len(wanted) == 0:
                return
            wanted = np.unique(wanted)
        if self._kept is None:
            self._kept = np.zeros(self.count, bool)
        wanted = wanted[~self._kept[wanted]]
        if len(wanted):
            heapq.heappush(self._blocks, (int(wanted.min()), int(wanted.max()),
                                          next(self._order), wanted, list(self._read(wanted))))
            self._kept[wanted] = True

    def read(self, start: int, stop: int) -> list[np.ndarray]:
        """Positions ``[start, stop)`` as they were when frozen, one array per array.

        Chunks must be read in order (``start`` is where the last read stopped).
        Call it under the owner's lock.
        """
        if start != self._handed_out or not start <= stop <= self.count:
            raise ValueError(f"frozen rows are read in order: expected a chunk from "
                             f"{self._handed_out}, got [{start}, {stop}) of {self.count}")
        out = list(self._read(np.arange(start, stop, dtype=np.int64)))
        blocks = self._blocks
        straddling = []
        while blocks and blocks[0][0] < stop:  # the blocks this chunk reaches, lowest first
            _, hi, order, positions, values = heapq.heappop(blocks)
            inside = positions < stop  # every preserved position is >= start
            for dst, src in zip(out, values):
                dst[positions[inside] - start] = src[inside]
            if hi >= stop:  # a block that straddles the chunk's end keeps its tail
                rest = ~inside
                straddling.append((int(positions[rest].min()), hi, order, positions[rest],
                                   [v[rest] for v in values]))
        for block in straddling:
            heapq.heappush(blocks, block)
        self._handed_out = stop
        return out


def static_rows(arrays: Sequence[np.ndarray], specs: Sequence[ArraySpec],
                names: Sequence[str]) -> FrozenRows:
    """A :class:`FrozenRows` over arrays nobody writes to any more (a copy already taken)."""
    arrays = [np.asarray(a) for a in arrays]
    count = len(arrays[0]) if arrays else 0
    return FrozenRows(lambda p: [a[p] for a in arrays], count, specs, names)


def storage_rows(storage: Storage, count: int, names: Sequence[str]) -> FrozenRows:
    """Positions ``[0, count)`` of every leaf of ``storage``, frozen now (for saving)."""
    def read(positions: np.ndarray) -> list[np.ndarray]:
        return [to_numpy(a) for a in storage.gather(positions)]
    return FrozenRows(read, count, storage.specs, names)


class CopyOnWriteStorage:
    """A storage that preserves the positions of open snapshots before writing to them.

    Every other attribute is the wrapped storage's. A buffer swaps it in while a save
    is under way and back afterwards.
    """

    def __init__(self, storage: Storage, frozen: FrozenRows):
        self.wrapped = storage
        self.frozen = frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def write(self, start: int, leaves: Sequence[Any]) -> None:
        self.frozen.preserve(slice(start, start + len(leaves[0])))
        self.wrapped.write(start, leaves)

    def load(self, arrays: Sequence[np.ndarray], start: int = 0) -> None:
        self.frozen.preserve(slice(start, start + (len(arrays[0]) if len(arrays) else 0)))
        self.wrapped.load(arrays, start)

    def zero(self) -> None:
        self.frozen.preserve(slice(0, None))
        self.wrapped.zero()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The wrapped storage's, with every open position preserved first."""
        self.frozen.preserve(slice(0, None))
        self.wrapped.load_state_dict(state)

    def exact_writer(self, outer_shape: tuple[int, ...]) -> None:
        return None  # writes must go through write(), where they are preserved first
