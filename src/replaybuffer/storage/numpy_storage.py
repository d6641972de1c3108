"""Storage in numpy arrays in RAM, small leaves packed into one record per position."""

from __future__ import annotations

import mmap
import operator
from typing import Any, Callable, Sequence

import numpy as np

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.base import checked_leaves, identity, leaves_state
from replaybuffer.storage.exact_writer import ExactWriter, exact_writer
from replaybuffer.storage.leaf_checker import LeafChecker

PACK_MAX_BYTES = 512
"""Leaves of at most this many bytes per item share one record per position.

Reading a small leaf costs one cache miss per item whatever its size, so a step
whose leaves live in five arrays costs five misses; packed into one record it costs
one (two lines at most for records up to 128 bytes). Large leaves (image frames)
are bound by bandwidth instead, and stay in arrays of their own, contiguous.
"""


def packed_leaves(specs: Sequence[ArraySpec]) -> tuple[int, ...]:
    """Indices of the leaves stored as fields of one record: those of at most
    :data:`PACK_MAX_BYTES` per item, when there are two or more (one gains nothing)."""
    small = tuple(i for i, s in enumerate(specs) if s.nbytes <= PACK_MAX_BYTES)
    return small if len(small) > 1 else ()


def record_dtype(specs: Sequence[ArraySpec]) -> np.dtype:
    """A structured dtype with one field ``f{k}`` per spec, each at an offset aligned
    to its item size, the whole padded to the largest alignment.

    Aligned fields keep every field view's strides a multiple of its item size, which
    ``torch.from_numpy`` and most consumers of strided arrays require.
    """
    names, formats, offsets = [], [], []
    offset, align = 0, 1
    for k, spec in enumerate(specs):
        size = spec.dtype.itemsize
        offset = -(-offset // size) * size
        names.append(f"f{k}")
        formats.append((spec.dtype, spec.shape) if spec.shape else spec.dtype)
        offsets.append(offset)
        offset += spec.nbytes
        align = max(align, size)
    itemsize = max(align, -(-offset // align) * align)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": itemsize})


def _in_mapped_file(array: np.ndarray) -> bool:
    """Whether ``array`` is (a view of) a file mapped in memory."""
    base: Any = array
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        base = getattr(base, "base", None)
    return False


class NumpyStorage:
    """Numpy arrays, ``[capacity, *spec.shape]`` per leaf.

    Leaves of at most :data:`PACK_MAX_BYTES` per item (when there are two or more)
    are fields of one structured array of records, so a gather reads each position
    with one ``take`` and one cache miss instead of one per leaf. ``arrays[i]`` is
    then a strided view of that record array; every other leaf has an array of its
    own. Gathered packed leaves are field views of one freshly gathered block: valid
    numpy arrays whose strides are multiples of their item size, but not
    C-contiguous (``np.ascontiguousarray`` where a consumer needs that).

    ``np.zeros`` maps fresh pages lazily, so RAM fills as the buffer does.

    Args:
        specs: leaf specs, in nest flatten order.
        capacity: number of positions.
        pack: pack small leaves into records (``False``: one contiguous array per leaf).
    """

    kind = "numpy"

    def __init__(self, specs: Sequence[ArraySpec], capacity: int, pack: bool = True):
        self.specs = tuple(specs)
        self.capacity = int(capacity)
        self.packed = packed_leaves(self.specs) if pack else ()
        # Placeholders, every one replaced below.
        self.arrays: list[np.ndarray] = [None] * len(self.specs)  # type: ignore[list-item]
        self._records: np.ndarray | None = None
        self._field: dict[int, str] = {}  # packed leaf index -> its record field
        self._all_fields: Callable[[np.ndarray], tuple[np.ndarray, ...]] | None = None
        if self.packed:
            self._record_dtype = record_dtype([self.specs[i] for i in self.packed])
            self._records = self._allocate("records", (self.capacity,), self._record_dtype)
            self._field = {i: f"f{k}" for k, i in enumerate(self.packed)}
            # The usual gather (every leaf, all of them packed, so two or more): the
            # record fields in leaf order read off one block by one C call, without
            # the general loop's lookups.
            if len(self.packed) == len(self.specs):
                self._all_fields = operator.itemgetter(
                    *(self._field[i] for i in range(len(self.specs))))
            self._view_records()
        for i, spec in enumerate(self.specs):
            if i not in self.packed:
                self.arrays[i] = self._allocate(f"leaf_{i:03d}", (self.capacity,) + spec.shape,
                                                spec.dtype)
        self._own = [i for i in range(len(self.specs)) if i not in self.packed]
        self.checker = LeafChecker(self.specs)

    def _view_records(self) -> None:
        """The views of the records: the plain bytes a gather takes from, and each
        packed leaf's field (``arrays[i]``). Made at construction and anew in a copy
        (:meth:`__setstate__`), where views copied apart from the records would no
        longer see the copy's writes."""
        assert self._records is not None
        # Gathering through a plain void view of the records is a byte copy per
        # item; taking from a structured dtype goes through its slower field logic.
        self._record_bytes = self._records.view(np.dtype((np.void,
                                                          self._record_dtype.itemsize)))
        for i, name in self._field.items():
            self.arrays[i] = self._records[name]

    def __getstate__(self) -> dict[str, Any]:
        """The storage for ``copy.deepcopy`` and pickling: its attributes but the views
        of the records, which :meth:`__setstate__` makes anew over the copied records
        (copied apart from them, a write to the copy would not show in its reads).

        Raises:
            TypeError: arrays that are files mapped in memory (the memory-mapped and
                shared storages), which a copy in this process's memory would silently
                detach from them.
        """
        if any(_in_mapped_file(a) for a in self.arrays):
            raise TypeError(f"a {type(self).__name__} cannot be copied or pickled: its "
                            f"arrays are files mapped in memory, and a copy would no "
                            f"longer write to them (save the buffer and restore it "
                            f"instead)")
        state = dict(self.__dict__)
        state.pop("_record_bytes", None)
        state["arrays"] = [None if i in self._field else a
                           for i, a in enumerate(self.arrays)]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy from :meth:`__getstate__`'s state: its views made over its records."""
        self.__dict__.update(state)
        if self._records is not None:
            self._view_records()

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A zeroed array for the records or one leaf (``name``); subclasses put it
        elsewhere (a file, see :mod:`replaybuffer.storage.mmap_storage`)."""
        return np.zeros(shape, dtype)

    @property
    def nbytes(self) -> int:
        """Bytes allocated: records (with their alignment padding) plus the other arrays."""
        own = sum(self.arrays[i].nbytes for i in self._own)
        return own + (self._records.nbytes if self._records is not None else 0)

    def convert(self, leaves: Sequence[Any], paths: Sequence[str],
                outer_shape: tuple[int, ...], outer_names: str) -> Sequence[np.ndarray]:
        shapes = self.checker.full_shapes(outer_shape)
        # Fast path: arrays of exactly the stored dtype and shape need no conversion.
        for leaf, shape, dtype in zip(leaves, shapes, self.checker.dtypes):
            if type(leaf) is not np.ndarray or leaf.dtype is not dtype or leaf.shape != shape:
                break
        else:
            return leaves
        check = self.checker.numpy_leaf
        return [check(i, leaf, shape, paths[i], outer_shape, outer_names)
                for i, (leaf, shape) in enumerate(zip(leaves, shapes))]

    def exact_writer(self, outer_shape: tuple[int, ...]) -> ExactWriter | None:
        return exact_writer(self.arrays, self.checker, outer_shape)

    def write(self, start: int, leaves: Sequence[np.ndarray]) -> None:
        stop = start + len(leaves[0])
        for dst, src in zip(self.arrays, leaves):
            dst[start:stop] = src

    def gather(self, positions: np.ndarray, which: Sequence[int] | None = None
               ) -> list[np.ndarray]:
        # mode="wrap" takes positions modulo the capacity as it copies, for free, where
        # an explicit modulo of a window's positions costs a numpy call or two; it also
        # skips the bounds-error bookkeeping of the default mode. Never ``take`` from a
        # packed leaf's strided view: numpy would first copy the whole array to make it
        # contiguous.
        if which is None and self._all_fields is not None:  # the usual read
            taken = self._record_bytes.take(positions, 0, mode="wrap")  # (_record_block)
            return list(self._all_fields(np.ndarray(taken.shape, self._record_dtype, taken)))
        indices = range(len(self.specs)) if which is None else which
        if not self.packed:
            return [self.arrays[i].take(positions, 0, mode="wrap") for i in indices]
        block = None
        out = []
        for i in indices:
            name = self._field.get(i)
            if name is None:
                out.append(self.arrays[i].take(positions, 0, mode="wrap"))
                continue
            if block is None:
                block = self._record_block(positions)
            out.append(block[name])
        return out

    def _record_block(self, positions: np.ndarray) -> np.ndarray:
        """The records at ``positions`` (int, any shape ``P``), copied into a fresh
        structured array ``[*P]`` of the record dtype.

        Taken as plain bytes (a byte copy per item), then typed by building the
        structured array over the taken block's memory: ``.view(record dtype)`` gives
        the same array but runs numpy's Python-level check of a view between
        structured dtypes on every call (about 0.4 us, a fifth of a small gather),
        which a fresh C-contiguous block of whole records does not need.
        """
        taken = self._record_bytes.take(positions, 0, mode="wrap")
        block: np.ndarray = np.ndarray(taken.shape, self._record_dtype, taken)
        return block

    from_numpy = staticmethod(identity)

    def zero(self) -> None:
        if self._records is not None:
            self._records.view(np.uint8)[...] = 0
        for i in self._own:
            self.arrays[i][...] = 0

    def load(self, arrays: Sequence[np.ndarray], start: int = 0) -> None:
        for dst, src in zip(self.arrays, arrays):
            dst[start:start + len(src)] = src

    def state_dict(self) -> dict[str, Any]:
        """``capacity`` and ``leaves``: a copy of every leaf's array, ``[capacity,
        *spec.shape]`` in its spec's dtype, C-contiguous (packed leaves too)."""
        return leaves_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Write back the leaves of :meth:`state_dict` (checked first: ``ValueError`` for
        another capacity, leaf count, shape or dtype, before anything is written)."""
        self.load(checked_leaves(self, state))

