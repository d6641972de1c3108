"""Check-and-write in one call, for added leaves that need no conversion.

Adding one small step is the hottest write path (one call per env step), and most
of its cost is Python overhead around four or five row assignments: a convert call,
a shape lookup, a write call, two loops. :func:`exact_writer` compiles one function
per buffer that unpacks the leaves, checks each one's type, dtype and shape, and
assigns it, with the arrays, dtypes and shapes bound as constants. Like
``collections.namedtuple`` and ``dataclasses``, it builds that function from source
text, since the specialisation itself is the speed-up (1.9 us vs 2.4 us for a
closure with the same loops, four leaves).

Leaves stored as the fields of one record per position (numpy storage packs small
leaves so, :mod:`replaybuffer.storage.numpy_storage`) are written, for one position,
as that record's bytes in one slice assignment: the leaves' ``tobytes()`` joined
with the record's padding (0.4 us against 1.2 us for five field assignments, each of
which builds a strided view first). Several positions are assembled in a scratch
block of records through field views made once, then copied in one assignment.

Anything unusual (a list, another dtype, a shape numpy would broadcast, a subclass
of ``np.ndarray``) makes the writer return ``False`` before any write; the caller
then takes the validating path, which converts or raises a clear error.
"""

from __future__ import annotations

import math
import struct
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from replaybuffer.storage.leaf_checker import LeafChecker

ExactWriter = Callable[[int, Sequence[Any]], bool]
"""``write(start, leaves) -> bool``: writes ``leaves`` at positions ``start ..`` and
returns ``True`` only when every leaf is already stored as is; otherwise writes
nothing and returns ``False``."""


def exact_writer(arrays: Sequence[np.ndarray], checker: LeafChecker,
                 outer_shape: tuple[int, ...], order: Sequence[int] | None = None
                 ) -> ExactWriter:
    """A writer of ``outer_shape[0]`` consecutive positions into ``arrays``, or of one
    position from leaves without that axis (``outer_shape=()``).

    Args:
        arrays: one numpy array per leaf, ``[capacity, *spec.shape]`` (views allowed;
            field views of one structured array are written a record at a time).
        checker: the storage's leaf checker (dtypes and expected shapes).
        outer_shape: ``(count,)``, the leading dimension of every incoming leaf; ``()``:
            one position, every leaf of its spec's shape (one env's step as it comes,
            where ``(1,)`` would need an axis added to every leaf first).
        order: the leaves' order in the calls, as leaf indices (``leaves[k]`` is leaf
            ``order[k]``); ``None``: the order of ``arrays``. A caller whose own
            arguments come in another order skips a reordering per call.

    ``write(start, leaves)`` writes ``leaves[i]`` (shape ``[count, *spec_i.shape]``) into
    ``arrays[i][start:start + count]`` when every leaf is an ``np.ndarray`` of exactly
    its spec's dtype and that shape, and returns ``True``; otherwise it returns
    ``False`` having written nothing. With ``outer_shape=()`` a leaf of spec shape
    ``()`` may also be a numpy scalar of exactly its dtype, and a float32 or float64
    one a Python ``float`` (a reward as an env gives it: packed with ``struct``, 40 ns,
    where ``np.array((reward,), np.float32)`` costs 300 ns; the same bytes as numpy's
    cast, and ``False`` where that would overflow to inf). With ``outer_shape=(count,)``
    a float32 leaf of spec shape ``()`` may also come as float64 (a vector env's
    rewards, as gymnasium gives them), cast as it is written: the bytes of the
    validating path, which casts by the same assignment. The caller guarantees
    ``start + count <= capacity``.
    """
    unbatched = outer_shape == ()
    (count,) = (1,) if unbatched else outer_shape
    shapes = checker.full_shapes(outer_shape)
    bound: dict[str, Any] = {"ndarray": np.ndarray}
    checks, views, writes = [], [], []
    floats = set()  # unbatched float leaves that may come as Python floats
    widened_leaves = set()  # batched float32 scalars that may come as float64
    record = record_layout(arrays, checker.dtypes)
    many = record is not None and \
        count * record[0].itemsize > max(BLOCK_MAX, record[0].itemsize)
    in_record = set() if record is None or many else {i for _, i in record[1]}
    whole_items = {} if record is None or not many else _whole_item_views(*record)
    for i, (array, dtype, shape) in enumerate(zip(arrays, checker.dtypes, shapes)):
        bound[f"a{i}"], bound[f"d{i}"], bound[f"s{i}"] = array, dtype, shape
        check = f"type(x{i}) is ndarray and x{i}.dtype is d{i} and x{i}.shape == s{i}"
        widened = not unbatched and dtype is _FLOAT32 and shape == (count,)
        if widened:  # float64 accepted, cast by the assignment (or astype: one record)
            bound[f"w{i}"] = _FLOAT64
            check = f"type(x{i}) is ndarray and (x{i}.dtype is d{i} or x{i}.dtype is " \
                f"w{i}) and x{i}.shape == s{i}"
        if unbatched and shape == ():
            bound[f"t{i}"] = dtype.type
            check = f"(type(x{i}) is ndarray or type(x{i}) is t{i}) and x{i}.dtype is d{i} " \
                f"and x{i}.shape == s{i}"
            if dtype.kind == "f" and dtype.isnative and dtype.itemsize in (4, 8):
                floats.add(i)
                check = f"(type(x{i}) is float or {check})"
        checks.append(check)
        if widened:
            widened_leaves.add(i)
        if i in in_record:
            continue
        if i in whole_items:
            # Many positions of a record field of several items: each position's items
            # copied as one void item (one strided loop of `count` copies) rather than
            # item by item (one loop per position): 256 positions of float32 [17],
            # 1.2 us against 2.1 us (view included). A leaf whose last axis is not
            # contiguous has no void view (numpy refuses it): written item by item.
            bound[f"v{i}"], bound[f"e{i}"] = whole_items[i]
            views += ["try:", f"    y{i} = x{i}.view(e{i})",
                      "except ValueError:", f"    y{i} = None"]
            writes += [f"if y{i} is None:", f"    a{i}[start:start + {count}] = x{i}",
                       "else:", f"    v{i}[start:start + {count}] = y{i}"]
            continue
        # One position: an integer index assigns without building a slice view.
        writes.append(f"a{i}[start] = x{i}" if unbatched else f"a{i}[start] = x{i}[0]"
                      if count == 1 else f"a{i}[start:start + {count}] = x{i}")
    if in_record and count > 1:
        # Several positions: their records are contiguous. The leaves go into the
        # fields of a scratch block of `count` records (views made once, where a
        # slice of the storage's strided field builds one per call), then the block
        # into storage in one copy: ~0.1 us per leaf less.
        assert record is not None
        base, fields = record
        size = base.itemsize
        scratch = np.zeros(count, base.dtype)  # its padding stays zero
        names = {field[1]: name for name, field in (base.dtype.fields or {}).items()}
        bound["records"], bound["block"] = base.view(np.uint8).data, scratch.view(np.uint8).data
        for offset, i in fields:
            bound[f"r{i}"] = scratch[names[offset]]
            writes.append(f"r{i}[...] = x{i}")
        writes += [f"at = start * {size}", f"records[at:at + {count * size}] = block"]
    elif in_record:
        assert record is not None
        base, fields = record
        size = base.itemsize
        bound["records"] = base.view(np.uint8).data
        pieces, end = [], 0
        for offset, i in fields:  # in offset order, gaps filled with the padding's zeros
            if offset > end:
                bound[f"pad{end}"] = bytes(offset - end)
                pieces.append(f"pad{end}")
            if i in floats:  # C's cast, as numpy's: the same bytes (struct raises
                # OverflowError where numpy would give inf: the caller casts instead)
                bound[f"pack{i}"] = struct.Struct("=" + arrays[i].dtype.char).pack
                pieces.append(f"(pack{i}(x{i}) if type(x{i}) is float else x{i}.tobytes())")
            elif i in widened_leaves:
                pieces.append(f"(x{i}.tobytes() if x{i}.dtype is d{i} else "
                              f"x{i}.astype(d{i}).tobytes())")
            else:
                pieces.append(f"x{i}.tobytes()")
            end = offset + int(arrays[i].dtype.itemsize * math.prod(arrays[i].shape[1:]))
        if end < size:
            bound[f"pad{end}"] = bytes(size - end)
            pieces.append(f"pad{end}")
        joined = f"b''.join(({', '.join(pieces)},))"
        writes[:0] = [f"at = start * {size}", f"records[at:at + {size}] = {joined}"] \
            if not floats & in_record else [
                "try:", f"    record = {joined}", "except OverflowError:", "    return False",
                f"at = start * {size}", f"records[at:at + {size}] = record"]
    if order is not None and sorted(order) != list(range(len(checks))):
        raise ValueError(f"order must be a permutation of the {len(checks)} leaves, "
                         f"got {list(order)}")
    unpack = "".join(f"x{i}, " for i in (range(len(checks)) if order is None else order))
    source = "\n".join([
        "def write(start, leaves):",
        "    try:",  # free unless it raises: cheaper than checking len(leaves) first
        f"        {unpack}= leaves",
        "    except (TypeError, ValueError):  # not a sequence of that length",
        "        return False",
        "    if not (" + "\n            and ".join(checks) + "):",
        "        return False",
        *(f"    {w}" for w in views + writes),
        "    return True",
    ])
    exec(compile(source, f"<exact_writer {len(checks)} leaves>", "exec"), bound)
    # Popped, not read: a function in its own globals is a reference cycle that kept
    # the storage arrays it writes alive until the garbage collector ran.
    write: ExactWriter = bound.pop("write")
    _LAYOUTS[write] = (arrays, checker, outer_shape)
    return write


_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)

BLOCK_MAX = 8192
"""Bytes of records up to which several positions are assembled in a scratch block:
beyond, the extra copy costs more than the field views it saves (256 records of 100
bytes: 5.2 us against 5.1 us field by field; 8 records: 1.5 against 1.8). Beyond it,
vector fields are copied as void items (4.2 us against 3.3 us for those 256 records;
assembling those in a block instead: 3.5 us, 7.4 against 5.8 into a ring larger than
the cache)."""

_LAYOUTS: weakref.WeakKeyDictionary[Callable[..., bool], tuple[Sequence[np.ndarray],
                                                               LeafChecker, tuple[int, ...]]]
_LAYOUTS = weakref.WeakKeyDictionary()
"""What each writer :func:`exact_writer` built writes into, for :func:`reordered`."""


def reordered(write: ExactWriter, order: Sequence[int],
              outer_shape: tuple[int, ...] | None = None) -> ExactWriter | None:
    """The writer ``write`` (built by :func:`exact_writer`), taking its leaves in
    ``order`` instead (see :func:`exact_writer`'s ``order``), and for ``outer_shape``
    (by default ``write``'s own); ``None`` for a writer built otherwise. Storages hand
    out writers in their own leaf order; a buffer whose calls come in another order
    (or one env's leaves without the env axis, ``outer_shape=()``) asks for this one
    once."""
    layout = _LAYOUTS.get(write)
    if layout is None:
        return None
    arrays, checker, own_outer = layout
    return exact_writer(arrays, checker, own_outer if outer_shape is None else outer_shape,
                        order=order)


def record_layout(arrays: Sequence[np.ndarray], dtypes: Sequence[np.dtype]
                   ) -> tuple[np.ndarray, list[tuple[int, int]]] | None:
    """The structured array whose every field is one of ``arrays``, with
    ``(byte offset, leaf index)`` of those fields in offset order; ``None`` when no
    structured array has all its fields among them (its padding is then free to
    write: no other field lives there).

    A field view's ``base`` is its structured array when that owns its memory (numpy
    storage's records); views of views of other buffers collapse to the buffer, and
    are written field by field instead.
    """
    base = next((a.base for a in arrays if isinstance(a.base, np.ndarray)
                 and a.base.dtype.names), None)
    if base is None or base.ndim != 1 or not base.flags.c_contiguous \
            or not base.flags.writeable or len(base) < 1:
        return None
    start = base.ctypes.data
    fields = []
    for i, (a, dtype) in enumerate(zip(arrays, dtypes)):
        if a.base is not base:
            continue
        # A field: one item per record, its bytes contiguous inside the record.
        if a.dtype != dtype or a.shape[:1] != base.shape or a.strides[:1] != (base.itemsize,) \
                or not a[:1].flags.c_contiguous:
            return None
        fields.append((a.ctypes.data - start, i))
    fields.sort()
    described = sorted(field[1] for field in (base.dtype.fields or {}).values())
    if [offset for offset, _ in fields] != described:
        return None  # fields that are not among the leaves: their bytes are not ours
    return base, fields


def _whole_item_views(base: np.ndarray, fields: list[tuple[int, int]]
                      ) -> dict[int, tuple[np.ndarray, np.dtype]]:
    """For every field of ``base`` (records, as :func:`record_layout` gives them) that
    holds several items per record, a view of the records ``[len(base), 1]`` whose one
    item per record is that field's bytes, as a void dtype, and that dtype: leaf ``i``'s
    ``x.view(dtype)`` (``[count, 1]``, for ``x`` of spec shape ``[n]`` whose last axis
    is contiguous) then copies into ``view[start:start + count]`` position by position."""
    out = {}
    raw = base.view(np.uint8)
    dtypes = {field[1]: field[0] for field in (base.dtype.fields or {}).values()}
    for offset, i in fields:
        dtype = dtypes[offset]
        if dtype.ndim != 1:  # scalars copy in one loop already; n-d leaves view poorly
            continue
        whole = np.dtype((np.void, dtype.itemsize))
        out[i] = (np.ndarray((len(base), 1), whole, raw, offset, (base.itemsize, whole.itemsize)),
                  whole)
    return out
