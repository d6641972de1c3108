"""Sum and min segment trees over a fixed number of slots, for prioritized replay.

Shape: a wide root over a forest of binary trees. ``size`` is the smallest power of
two >= ``capacity`` and ``width = min(size, root_width)`` (``root_width`` a power of
two, 1024 by default). The slots are split into ``width`` runs of ``size / width``
slots, each the leaves of a complete binary tree of height
``height = log2(size / width)``, and one wide root node has those ``width`` subtree
roots as its children. At capacity 1,000,000 that is a root of 1024 children over
binary trees of height 10, rather than a binary tree of depth 20.

Why this shape: numpy charges a fixed cost per call (about half a microsecond here)
that dwarfs the work on a batch of ``K`` ~ 256 paths, so a batch costs about one
such cost per numpy call, and a binary level costs five or six calls, 2.5-3 us. The
wide root takes the place of the top ``log2(width)`` binary levels for a handful of
whole-batch calls. A search picks the child with one ``np.searchsorted`` over the
root's running sums, about 1.6 us per halving of the root on fresh random targets
(its binary search branches, so it runs faster when the same targets repeat). The
running sums are one ``np.add.accumulate`` (``np.cumsum``), about 4 us for 1024 of
them. Narrower wide nodes all the way down (rows of 16 or 32 children per node, 4-5
levels at 1M) measured worse. Every level then needs per-row prefix sums or row sums
over ``[K, W]`` gathers, and numpy runs those over short rows at 4-17 us a call
here. That made ``find_prefix`` 2.5-3 times slower than the binary tree, and
``update`` no faster than this shape. So did storing only every third level and
rebuilding the other two from rows of 8 on the way (the descent pays more for the
rebuilt rows than the update saves).

Layout: one flat float64 array ``nodes`` of length ``2 * size``, a binary heap. Node
``i`` has children ``2i`` and ``2i + 1``, and slot ``j`` is the leaf ``size + j``. The
subtree roots, the wide root's children, are the nodes ``[width, 2 * width)``. The
nodes ``[0, width)`` are unused and hold the identity. The leaves past ``capacity``
hold the identity of the tree's operation (0 for a sum, +inf for a min), so they
never change a result. The wide root itself is the ``width`` running sums of the
subtree roots (:class:`SumTree`): inclusive running sums, for searches.

The root value, :meth:`SumTree.total` or :meth:`MinTree.min`, is not read from the
top of the tree but reduced over a lower level: the *total level*, the lowest binary
level with at most :data:`TOTAL_WIDTH` nodes (the subtree roots if none is lower),
by ``np.add.reduce`` (numpy's pairwise sum) or ``np.minimum.reduce``. An update then
recomputes the levels up to the total level and reduces it, and leaves the levels
above it and the running sums stale until something reads them (a search, a prefix
sum, :attr:`SegmentTree.nodes`), which recomputes them whole first. Sampling that only
needs the total (rejection, in :mod:`replaybuffer.sampling.prioritized`) never pays
for them; at capacity 1,000,000 that is four levels and the running sums, about a
third of an update. The total and the last running sum are both sums of the same
slots in different orders, equal within rounding.

Row heights: while nothing reads the tree between updates, an update recomputes the
heights 3, 6, ... (up to the total level's) from *rows*: the 8 nodes three levels
below node ``n`` are ``nodes[8n:8n + 8]``, one 64-byte line (the array is aligned so),
and three pairwise combines over a gathered row give the node, the same value the
three binary levels give. Of the levels between row heights, only the leaves' paths
are recorded; a read recomputes those levels along them first (or whole, once there
are too many to list). That takes three levels' random accesses, each a cache miss
on a large tree, down to one. Once reads come between updates (searches), updates
recompute every level along the paths again, which is cheaper than recording them.

Exact recomputation, not deltas: an update writes the new leaves, then recomputes
every affected binary ancestor from its two children, level by level, and then the
root value from its level. Adding deltas (``node += new - old``) would carry rounding
error into the ancestors on every update, so after millions of updates the total
would drift from the sum of the leaves, and could go negative as priorities shrink.
Recomputed, every node is a pure function of the current leaves, always combined in
the same order: ``combine(left, right)`` per binary node, a pairwise reduction over
the total level, and a sequential running sum over the subtree roots. So the tree
after any sequence of updates is bit-for-bit the tree that
:meth:`SegmentTree.rebuild` builds from scratch.

Vectorised: a batch of ``K`` updates or ``K`` prefix searches walks all ``K`` paths
together. That is one Python iteration per binary level (``height`` of them), none
per item, plus a few whole-batch calls for the wide root.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from replaybuffer.sampling import tree_kernels

#: Default fan-out of the wide root. The root costs one running sum over ``width``
#: floats per search after an update (about 4 us for 1024 here) and saves
#: ``log2(width)`` binary levels (about 3 us each per search). 512, 1024 and 2048
#: measured within noise of each other at capacities 1e3-1e6.
DEFAULT_ROOT_WIDTH = 1024

#: The most nodes a total level may have (module docstring). An update pays one
#: pairwise reduction over it (about 3.5 us for 16384 here) instead of a path level
#: per halving above it (about 2 us each, more when the level misses the cache) and
#: the running sums. At 1M slots, 8192 measured 5% slower on sample+update.
TOTAL_WIDTH = 16384

#: The largest batch recomputed by rows (module docstring); larger ones recompute every
#: level along their paths, or whole.
_ROWS_MAX = 4096


class SegmentTree:
    """A wide root over binary subtrees, over ``capacity`` float64 slots, with one operation.

    The base of :class:`SumTree` and :class:`MinTree`. A variant names its ufunc
    (``_combine``), that ufunc's identity (``_identity``, the value of a slot past
    ``capacity``), how it reduces the total level to its root value
    (``_reduce_level``), what wide root it keeps over the subtree roots
    (``_combine_roots``) and which slot values it accepts (``_check_values``).

    Args:
        capacity: number of slots, a positive int. Slots start at the identity.
        root_width: the most children the wide root may have, a power of two >= 1.
            The root gets ``min(size, root_width)`` children (module docstring).
            1 gives a plain binary tree. Results hold at any width, and only
            speed and the order of the sums change with it.
        compiled: walk paths with the compiled loops of
            :mod:`~replaybuffer.sampling.tree_kernels` (bit-for-bit the same tree and
            results); ``None``: when numba is installed.
    """

    _combine: np.ufunc
    _identity: float
    _assign_kernel: Any  # tree_kernels.assign_sum or assign_min

    def __init__(self, capacity: int, *, root_width: int = DEFAULT_ROOT_WIDTH,
                 compiled: bool | None = None):
        if compiled and not tree_kernels.AVAILABLE:
            raise ValueError("compiled=True needs numba (pip install 'replaybuffer[fast]') "
                             "and REPLAYBUFFER_NUMBA not set to 0")
        #: Whether paths are walked by compiled loops (updates then keep every binary
        #: level current, and only the wide root goes stale).
        self.compiled = tree_kernels.AVAILABLE if compiled is None else bool(compiled)
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if isinstance(root_width, bool) or not isinstance(root_width, (int, np.integer)) \
                or root_width < 1 or root_width & (root_width - 1):
            raise ValueError(f"root_width must be a power of two >= 1, got {root_width!r}")
        self.capacity = int(capacity)
        depth = (self.capacity - 1).bit_length()  # binary levels below a single root
        self._size = 1 << depth
        #: The wide root's number of children (subtree roots), a power of two.
        self.root_width = min(self._size, int(root_width))
        self._height = depth - (self.root_width.bit_length() - 1)  # levels per subtree
        self._nodes = _aligned_full(2 * self._size, self._identity)
        # The children of node i are left[i] and right[i] (strided views, for searches
        # that read one child), and pairs[i] is both at once: nodes 2i and 2i + 1 are
        # adjacent, so a complex128 view gathers the pair in one call, half the calls
        # of two float gathers.
        self._left = self._nodes[0::2]
        self._right = self._nodes[1::2]
        self._pairs = self._nodes.view(np.complex128)
        self._roots = self._nodes[self.root_width:2 * self.root_width]
        # Shifts from a leaf node to its ancestors at heights 1..height (and 0..height-1),
        # as a column, so that one call computes a batch's ancestors ([height, K]).
        self._shifts = np.arange(1, self._height + 1, dtype=np.int64)[:, None]
        self._shifts_from_0 = self._shifts - 1
        #: The slot values, writable: for this package's callers whose indices are valid
        #: by construction (``leaves`` is the public, read-only view).
        self._slots = self._nodes[self._size:self._size + self.capacity]
        # The total level (module docstring): nodes [total_lo, 2 total_lo).
        total_lo = self._size
        while total_lo > max(TOTAL_WIDTH, self.root_width):
            total_lo >>= 1
        self._total_lo = total_lo
        self._total_level = self._nodes[total_lo:2 * total_lo]
        # Row updates (module docstring): the heights 3, 6, ... up to the total level's,
        # each from rows of 8 nodes three levels down; _chunk_top is the highest.
        total_height = self._size.bit_length() - total_lo.bit_length()
        self._chunk_top = total_height - total_height % 3
        # Per row height h: the level 3 below as rows of 8, and the level h itself; a
        # node's index within its level is its slot's, shifted by the height.
        self._leaf_level = self._nodes[self._size:]
        self._row_levels = [(self._level(h - 3).reshape(-1, 8), self._level(h))
                            for h in range(3, self._chunk_top + 1, 3)]
        self._synced = True  # whether the levels above it and the wide root are current
        # Slots (int64 arrays) whose ancestors between row heights are stale, or True
        # when too many are to list: all of those levels are.
        self._stale: list[np.ndarray] | Literal[True] = []
        self._stale_count = 0
        self._stale_max = max(_ROWS_MAX, self._size >> 6)
        self._init_root()

    def _level(self, height: int) -> np.ndarray:
        """View of the nodes at ``height`` (0: the leaves), float64 ``[size >> height]``."""
        return self._nodes[self._size >> height:(2 * self._size) >> height]

    # ------------------------------------------------------------------ reading
    @property
    def nodes(self) -> np.ndarray:
        """Read-only view of the flat node array, float64 ``[2 * size]`` (module docstring).

        The binary nodes ``[root_width, 2 * size)``; ``[0, root_width)`` are unused
        and hold the identity. The wide root is not in it (``total()``/``min()``).
        Reading it brings every level up to date first (module docstring).
        """
        self._sync()
        view: npt.NDArray[np.float64] = self._nodes.view()
        view.flags.writeable = False
        return view

    def get(self, indices: Any) -> np.ndarray:
        """Slot values, float64 with the shape of ``indices`` (ints in ``[0, capacity)``)."""
        idx = self._as_indices(indices, "get")
        return self._nodes[idx + self._size]

    @property
    def leaves(self) -> np.ndarray:
        """Read-only view of the slot values, float64 ``[capacity]``.

        For callers whose indices are valid by construction: indexing it skips the
        checks of :meth:`get`, a sizeable part of a small read.
        """
        view = self._nodes[self._size:self._size + self.capacity]
        view.flags.writeable = False
        return view

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self.capacity}, "
                f"root_width={self.root_width}, root={self._root_value()!r})")

    # ------------------------------------------------------------------ writing
    def update(self, indices: Any, values: Any) -> None:
        """Set ``slot[indices[k]] = values[k]`` for every ``k`` and update the ancestors.

        Args:
            indices: int ``[K]`` in ``[0, capacity)``; any shape is read in C order.
            values: float64 ``[K]`` (the shape of ``indices``) or a scalar for all ``K``;
                which values are allowed depends on the variant.

        An index given more than once takes the value of its last occurrence, as a
        sequence of single updates would. Raises ``ValueError`` on bad input, and then
        the tree is unchanged.
        """
        idx = self._as_indices(indices, "update")
        vals = self._as_values(values, idx.shape, "update")
        if idx.size == 0:
            return
        self._assign(idx.reshape(-1), vals.reshape(-1), self._bound(vals))

    def _assign(self, slots: np.ndarray, values: np.ndarray,
                largest: float | None = None) -> None:
        """:meth:`update` without the checks, for callers that have made them.

        Args:
            slots: int64 ``[K]``, ``K >= 1``, in ``[0, capacity)``.
            values: float64 ``[K]`` that :meth:`update` would accept.
            largest: an upper bound of ``values``, or ``None``. With it, a sum tree
                that cannot overflow skips keeping the old leaves for a rollback.

        Raises ``ValueError`` if the root overflows, and then the tree is unchanged.
        """
        if not self._may_overflow(len(slots), largest):
            self._write(slots, values)
            return
        old = self._leaf_level[slots]
        with np.errstate(over="ignore"):  # an overflow is reported below, as an error
            self._write(slots, values)
            overflowed = self._overflowed()
            if overflowed:
                # Recomputing from the old leaves restores every node bit-for-bit.
                self._write(slots, old)
                self._sync()
        if overflowed:
            raise ValueError(f"update: expected a finite {self._what_overflows}, got inf "
                             "with these values (float64 overflow); the tree is unchanged")

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves, ``O(capacity)``.

        The same operations in the same order as :meth:`update`, so the result is
        bit-for-bit the tree that updates maintain.
        """
        self._combine_levels(self._size >> 1, self.root_width)
        self._reduce_level()
        self._combine_roots()
        self._synced = True
        self._stale, self._stale_count = [], 0

    def state_dict(self) -> dict[str, Any]:
        """``{"leaves": float64 [capacity]}``, a copy; internal nodes are rebuilt on load."""
        return {"leaves": self._nodes[self._size:self._size + self.capacity].copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the slots from :meth:`state_dict` output and rebuild the tree.

        Raises ``ValueError`` (tree unchanged) when ``state["leaves"]`` is not a real
        array of shape ``[capacity]`` holding values :meth:`update` would accept.
        """
        if not isinstance(state, dict) or "leaves" not in state:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"load_state_dict: expected a dict with 'leaves', got {got}")
        leaves = self._as_values(state["leaves"], (self.capacity,), "load_state_dict",
                                 name="leaves", allow_scalar=False)
        span = slice(self._size, self._size + self.capacity)
        old = self._nodes[span].copy()
        self._nodes[span] = leaves
        with np.errstate(over="ignore"):  # an overflow is reported below, as an error
            self.rebuild()
        if self._overflowed():
            self._nodes[span] = old
            self.rebuild()
            raise ValueError(f"load_state_dict: expected a finite {self._what_overflows}, "
                             "got inf (float64 overflow); the tree is unchanged")

    # ------------------------------------------------------------------ variant hooks
    _what_overflows = "root"

    def _init_root(self) -> None:
        """Allocate the root value and the wide root for an empty tree."""
        raise NotImplementedError

    def _reduce_level(self) -> None:
        """Recompute the root value from the total level ``self._total_level``."""
        raise NotImplementedError

    def _combine_roots(self) -> None:
        """Recompute the wide root from the subtree roots ``self._roots``, if the
        variant has one."""

    def _root_value(self) -> float:
        """The combination of every slot: the total or the minimum."""
        raise NotImplementedError

    def _check_values(self, values: np.ndarray, where: str, name: str) -> None:
        """Raise ``ValueError`` if a float64 array holds a value this tree rejects."""
        raise NotImplementedError

    def _bound(self, values: np.ndarray) -> float | None:
        """An upper bound of checked ``values`` for :meth:`_may_overflow`, if needed."""
        return None

    def _overflowed(self) -> bool:
        """Whether the root left the representable range after a write."""
        return False

    def _may_overflow(self, count: int, largest: float | None) -> bool:
        """Whether writing ``count`` values of at most ``largest`` (``None``: unknown)
        could overflow the root."""
        return False

    # ------------------------------------------------------------------ internals
    def _write(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` (float64 ``[K]``) to ``slots`` (int64 ``[K]``), the last value
        winning for a repeated slot, then recompute the ancestors."""
        if self.compiled:  # in order (the last value wins), every binary level, one loop
            type(self)._assign_kernel(self._nodes, slots, values, self._size, self.root_width)
            self._reduce_level()
            self._synced = False
            return
        leaf_level = self._leaf_level
        leaf_level[slots] = values
        # Numpy does not promise which of repeated fancy-index assignments lands. If every
        # leaf now holds, bit for bit, each value given for it, repeats (if any) carried
        # equal values and the last won anyway; otherwise resolve them explicitly. The
        # check costs a gather and a byte comparison (cheaper than an elementwise one and
        # its reduction), the sort several times more.
        if len(slots) > 1 and leaf_level[slots].tobytes() != values.tobytes():
            slots, values = _last_wins(slots, values)
            leaf_level[slots] = values
        self._recompute(slots)

    def _recompute(self, slots: np.ndarray) -> None:
        """Recompute the ancestors of ``slots`` (int64 ``[K]``) up to the total level,
        then the root value; the levels above go stale.

        Bottom up, each binary node is ``combine(left, right)`` of its children's
        current values, whichever way it is reached: so the result is the tree
        :meth:`rebuild` builds. Right after a read of the upper levels (searches are
        being made), every level up to the total level is recomputed along the paths
        (:meth:`_recompute_paths`). Otherwise (only the root value is being read) the
        row heights are recomputed from rows (:meth:`_recompute_rows`) and the levels
        between them are left stale, and recorded, until a read brings them up to date.
        """
        if self._synced or not self._chunk_top or len(slots) > _ROWS_MAX:
            self._recompute_paths(slots + self._size, self._size >> 1, self._total_lo)
        else:
            self._recompute_rows(slots)
        self._reduce_level()
        self._synced = False

    def _recompute_paths(self, leaves: np.ndarray, lo: int, stop: int) -> None:
        """Recompute the levels from the nodes ``[lo, 2 lo)`` up to ``[stop, 2 stop)``
        along the paths of ``leaves`` (int64 leaf nodes ``[K]``, height 0), each node
        from its children.

        The low levels along the ``K`` paths, three calls a level: gather the child
        pairs, combine, scatter. A parent reached by several paths is written several
        times with the same value, which is cheaper than deduplicating. High levels,
        with few nodes, are recomputed whole instead: one call over a contiguous level
        of ``n`` nodes costs less than three calls over ``K`` paths while ``n`` is below
        about ``1024 + 8 K`` (measured).
        """
        nodes, pairs, combine = self._nodes, self._pairs, self._combine
        limit = 1024 + 8 * len(leaves)
        first = self._size.bit_length() - lo.bit_length()  # the height of the nodes [lo, 2 lo)
        paths = 0
        while lo >= stop and lo > limit:
            paths += 1
            lo >>= 1
        if paths:
            for node in leaves >> self._shifts[first - 1:first - 1 + paths]:  # per level
                pair = pairs[node]
                nodes[node] = combine(pair.real, pair.imag)
        self._combine_levels(lo, stop)

    def _recompute_rows(self, slots: np.ndarray) -> None:
        """Recompute the row heights (3, 6, ...) along the paths of ``slots`` (int64
        ``[K]``) from rows of 8, then the levels above them to the total level along
        the paths; record the slots, whose levels between row heights go stale.

        The 8 nodes three levels below node ``n`` are the contiguous ``nodes[8n:8n + 8]``,
        one 64-byte line: the one just written below (the leaves, or the last row
        height), so one gather of rows and three pairwise combines replace three path
        levels (nine calls, each touching a line of its own level). The pairwise
        combines are the binary levels' own, so the values are the same.
        """
        combine = self._combine
        index = slots
        for rows, level in self._row_levels:
            index = index >> 3
            row = rows.take(index, axis=0).ravel()
            half = combine(row[0::2], row[1::2])
            quarter = combine(half[0::2], half[1::2])
            level[index] = combine(quarter[0::2], quarter[1::2])
        top = self._size >> self._chunk_top  # the nodes [top, 2 top) are at the top row
        if top > self._total_lo:
            self._recompute_paths(slots + self._size, top >> 1, self._total_lo)
        if self._stale is not True:
            self._stale.append(slots)
            self._stale_count += len(slots)
            if self._stale_count > self._stale_max:  # redone whole, when read
                self._stale, self._stale_count = True, 0

    def _sync(self) -> None:
        """Bring the levels between row heights, those above the total level and the
        wide root up to date."""
        if self._synced:
            return
        if self.compiled:  # compiled updates left only the wide root stale
            self._combine_roots()
            self._synced = True
            return
        if self._stale:
            # The two levels above each row height but the top one, from that row height.
            leaves = (None if self._stale is True
                      else np.concatenate(self._stale) + self._size)
            for height in range(0, self._chunk_top, 3):
                lo = self._size >> (height + 1)
                if leaves is None:
                    self._combine_levels(lo, lo >> 1)
                else:
                    self._recompute_paths(leaves, lo, lo >> 1)
            self._stale, self._stale_count = [], 0
        self._combine_levels(self._total_lo >> 1, self.root_width)
        self._combine_roots()
        self._synced = True

    def _combine_levels(self, lo: int, stop: int) -> None:
        """Recompute whole levels, from the nodes ``[lo, 2 lo)`` up to the nodes
        ``[stop, 2 stop)``, each node from its two children (powers of two)."""
        nodes, pairs, combine = self._nodes, self._pairs, self._combine
        while lo >= stop:
            pair = pairs[lo:2 * lo]  # the children of the nodes [lo, 2 lo)
            combine(pair.real, pair.imag, out=nodes[lo:2 * lo])
            lo >>= 1

    def _as_indices(self, indices: Any, where: str, upper: int | None = None
                    ) -> npt.NDArray[np.int64]:
        """``indices`` as int64, after checking they are ints in ``[0, upper)``.

        ``upper`` defaults to ``capacity``.
        """
        upper = self.capacity if upper is None else upper
        idx = np.asarray(indices)
        if idx.size == 0:  # np.asarray([]) is float64; an empty batch is still fine
            return idx.astype(np.int64)
        if idx.dtype.kind not in "iu":
            raise ValueError(f"{where}: expected integer indices, got dtype {idx.dtype}")
        if idx.min() < 0 or idx.max() >= upper:
            flat = idx.reshape(-1)
            k = int(np.flatnonzero((flat < 0) | (flat >= upper))[0])
            raise ValueError(f"{where}: expected indices in [0, {upper}), "
                             f"got {flat[k].item()} at position {k}")
        return idx.astype(np.int64, copy=False)

    def _as_values(self, values: Any, shape: tuple[int, ...], where: str,
                   name: str = "values", allow_scalar: bool = True) -> np.ndarray:
        """``values`` as float64 of ``shape``, after checking dtype, shape and range."""
        vals = np.asarray(values)
        if vals.dtype.kind not in "fiu":
            raise ValueError(f"{where}: expected real-number {name}, got dtype {vals.dtype}")
        if vals.shape != shape:
            if not (allow_scalar and vals.ndim == 0):
                scalar = " or a scalar" if allow_scalar else ""
                raise ValueError(f"{where}: expected {name} of shape {shape}{scalar}, "
                                 f"got shape {vals.shape}")
            vals = np.broadcast_to(vals, shape)
        vals = vals.astype(np.float64, copy=False)
        if vals.size:
            self._check_values(vals, where, name)
        return vals


def _aligned_full(length: int, value: float) -> npt.NDArray[np.float64]:
    """``np.full(length, value)``, float64, starting on a 64-byte boundary: a row of 8
    nodes is then one cache line (numpy only promises 16 bytes)."""
    spare = np.full(length + 7, value, np.float64)
    skip = (-spare.ctypes.data % 64) // 8
    return spare[skip:skip + length]


class SumTree(SegmentTree):
    """Sums of non-negative priorities, with prefix-sum search for proportional sampling.

    Slots hold finite priorities >= 0 (0: never sampled); empty slots are 0.

    Args:
        capacity: number of slots, a positive int.
        root_width: the wide root's most children (:class:`SegmentTree`).
    """

    _combine = np.add
    _identity = 0.0
    _what_overflows = "total priority"
    _assign_kernel = staticmethod(tree_kernels.assign_sum)

    def _init_root(self) -> None:
        # The wide root: running sums of the subtree roots behind a leading 0, so
        # _runs[j] sums the subtrees before j and _runs[j + 1] those up to j.
        self._runs = np.zeros(self.root_width + 1, np.float64)
        self._upto = self._runs[1:]  # inclusive running sums, sorted (all terms >= 0)
        self._total = 0.0

    def _reduce_level(self) -> None:
        self._total = float(np.add.reduce(self._total_level))

    def _combine_roots(self) -> None:
        if self.compiled:  # the same sequential sums, without the call's fixed cost
            tree_kernels.running_sums(self._roots, self._upto)
        else:  # np.cumsum is this accumulate behind a slower wrapper
            np.add.accumulate(self._roots, out=self._upto)

    def _root_value(self) -> float:
        return self._total

    def total(self) -> float:
        """The sum of all slots, a float >= 0: the pairwise sum of the total level
        (module docstring)."""
        return self._total

    def prefix_sum(self, ends: Any) -> np.ndarray:
        """For each ``end``, the sum of the slots ``[0, end)``, summed by the tree.

        Args:
            ends: int ``[K]`` (any shape) in ``[0, capacity]``.

        Returns:
            float64 with the shape of ``ends``. ``end = 0`` gives exactly 0.0 and
            ``end = capacity`` gives exactly :meth:`total`. Other ends give the sum
            over the ``O(log capacity)`` nodes that cover ``[0, end)``: exact when
            those sums are exact, otherwise within rounding of
            ``np.cumsum(slots)[end - 1]``.

        Raises ``ValueError`` when an end is not an int in ``[0, capacity]``.
        """
        e = self._as_indices(ends, "prefix_sum", upper=self.capacity + 1)
        shape = e.shape
        e = e.reshape(-1)
        if e.size == 0:
            return np.zeros(shape, np.float64)
        return self._prefix_sum(e).reshape(shape)

    def _prefix_sum(self, ends: np.ndarray) -> np.ndarray:
        """:meth:`prefix_sum` without the checks: ``ends`` int64 ``[E]`` in
        ``[0, capacity]``, ``E >= 1``; float64 ``[E]``."""
        self._sync()
        full = ends == self.capacity
        # The leaf node just past the range; a full range (capacity == size) would step
        # past the array, and takes the total instead.
        node = np.where(full, self._size, ends + self._size)
        # The subtrees before each end.
        acc: npt.NDArray[np.float64] = self._runs[(node >> self._height) - self.root_width]
        if self._height:
            # On each binary level a right child adds its left sibling, the sum of the run
            # just before it: one [height, E] gather for all levels, summed level by level
            # from the leaves up (accumulate is sequential, whatever E is).
            below = node >> self._shifts_from_0  # the path's nodes at heights 0..height-1
            left = self._nodes[below - 1] * (below & 1)
            acc = np.add.accumulate(left, axis=0)[-1] + acc
        acc[full] = self._total
        return acc

    def find_prefix(self, targets: Any) -> np.ndarray:
        """For each target, the smallest slot ``i`` with ``sum(slot[:i + 1]) > target``.

        Drawing targets uniformly in ``[0, total())`` samples slot ``i`` with
        probability ``slot[i] / total()``. All targets descend the tree together: one
        ``searchsorted`` over the wide root's running sums, then the binary levels.

        Args:
            targets: float64 ``[K]`` (any shape), finite and >= 0.

        Returns:
            int64 with the shape of ``targets``: slots in ``[0, capacity)``, always with
            a priority > 0, rounding notwithstanding. A target at or above ``total()``
            (``u * total`` can round up to it) gets the last slot with a priority > 0.

        Raises ``ValueError`` on a NaN, infinite or negative target, and when the total
        is 0 (nothing can be sampled).
        """
        t = np.asarray(targets)
        if t.dtype.kind not in "fiu":
            raise ValueError(f"find_prefix: expected real-number targets, got dtype {t.dtype}")
        shape = t.shape
        t = t.astype(np.float64, copy=False).reshape(-1)
        if t.size == 0:
            return np.empty(shape, np.int64)
        if not (t.min() >= 0.0 and t.max() < np.inf):  # NaN fails both comparisons
            k = int(np.flatnonzero(~(np.isfinite(t) & (t >= 0.0)))[0])
            raise ValueError(f"find_prefix: expected finite targets >= 0, "
                             f"got {t[k].item()!r} at position {k}")
        if not self._total > 0.0:
            raise ValueError("find_prefix: expected a total priority > 0, got 0.0 "
                             "(every slot is 0, so nothing can be sampled)")
        return self._find(t)[0].reshape(shape)

    def _find(self, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`find_prefix` without the checks, and the slots' values with the slots.

        Args:
            targets: float64 ``[K]``, ``K >= 1``, finite and >= 0 (left unchanged);
                the total must be > 0.

        Returns:
            ``(slots, values)``: int64 ``[K]`` as :meth:`find_prefix` returns them, and
            float64 ``[K]``, their values (all > 0).
        """
        self._sync()
        # Targets from here on get the last slot with a priority > 0: at the total, and
        # at the last running sum (the same sum in another order) if that is lower.
        total = min(self._total, self._runs[-1])
        if self.compiled:  # the usual case in one call; the rare odd targets below
            slots, values, odd = tree_kernels.find(self._nodes, self._upto, self._runs,
                                                   self.root_width, self._height, targets,
                                                   total)
            if not odd:
                return slots, values
        # Sorted, the targets walk the tree in order: the root's binary search predicts
        # its branches and the gathers below run through memory in order, which saves
        # more than the sort costs (measured: ~20% at 1e5-1e6 slots). Indexing copies,
        # so the descent can consume t.
        if self.compiled:  # some target is past the total or found a slot of 0
            t = targets.copy()
            past = t >= total if t.max() >= total else None
            if past is not None:
                t[past] = 0.0
            found = tree_kernels.descend(self._nodes, self._upto, self._runs,
                                         self.root_width, self._height, t)
            if past is not None:
                found[past] = self._last_positive_leaf()
        else:
            order = targets.argsort()
            t = targets[order]
            past = None
            if t[-1] >= total:
                # Past the rounded total the exact answer depends on how the sums
                # rounded; these targets all get the last slot with a priority > 0.
                # They descend from 0 meanwhile, which keeps them inside the tree.
                past = t >= total
                t[past] = 0.0
            node = self._descend(t)
            if past is not None:
                node[past] = self._last_positive_leaf()
            found = np.empty_like(node)
            found[order] = node
        values = self._nodes[found]
        if not values.all():
            # Rounding can leave a target at or past the sum of the subtree it is in (the
            # sums are rounded, and so is each subtraction on the way down); the plain
            # descent then walks right into a run of zero slots, or the zero padding past
            # capacity. Only then is the leaf 0, so only those targets descend again, this
            # time never into a zero subtree. The wide root needs no such guard: it picks
            # the first subtree whose running sum exceeds the target, which is > 0.
            zero = values == 0.0
            found[zero] = self._descend_guarded(targets[zero])  # none of them is past
            values = self._nodes[found]
        found -= self._size
        return found, values

    def _descend(self, t: np.ndarray) -> np.ndarray:
        """Leaf nodes int64 ``[K]`` reached by targets ``t`` (float64 ``[K]`` in
        ``[0, total())``, consumed)."""
        node = self._descend_root(t)
        nodes = self._nodes
        for _ in range(self._height):
            node += node  # the left child
            left = nodes[node]
            right = t >= left
            # left * False is exactly 0.0: one multiply beats a masked subtract or a where.
            t -= left * right
            node += right
        return node

    def _descend_root(self, t: np.ndarray) -> np.ndarray:
        """The subtree-root nodes for targets ``t`` in ``[0, total())``, minus the sums
        of the subtrees before them (subtracted from ``t`` in place).

        The first subtree whose inclusive running sum exceeds the target. Its root is
        > 0, since a 0 would leave the running sum equal to the one before it, and
        the target keeps ``>= 0``, since the subtracted running sum is <= the target.
        """
        self._sync()
        j = self._upto.searchsorted(t, side="right")
        t -= self._runs[j]
        j += self.root_width
        return j

    def _descend_guarded(self, t: np.ndarray) -> np.ndarray:
        """:meth:`_descend` that turns right only into a subtree with a sum > 0.

        Each node on the path has a sum > 0: the subtree root does
        (:meth:`_descend_root`), a right turn needs a right sum > 0, and a left turn
        either has ``t < left`` with ``t >= 0`` (subtracting a number no larger than
        ``t`` never goes below 0), so ``left > 0``, or a right sum of 0, so ``left`` is
        the node's sum. The leaf reached is therefore a slot with a priority > 0, hence
        inside capacity. Where this guard never fires the path is the plain descent's,
        so the plain result stands wherever it is > 0. ``t`` is left unchanged.
        """
        t = t.copy()
        node = self._descend_root(t)
        return self._guarded_from(node, t)

    def _guarded_from(self, node: np.ndarray, t: np.ndarray) -> np.ndarray:
        left_of, right_of = self._left, self._right
        for _ in range(self._height):
            left = left_of[node]
            right = (t >= left) & (right_of[node] > 0.0)
            t -= left * right
            node += node
            node += right
        return node

    def _last_positive_leaf(self) -> int:
        """The leaf node of the last slot with a priority > 0 (the total is > 0)."""
        self._sync()
        root = int(np.flatnonzero(self._roots > 0.0)[-1]) + self.root_width
        # +inf turns right wherever the guard allows, so it ends on the last positive slot.
        return int(self._guarded_from(np.array([root]), np.array([np.inf]))[0])

    def _check_values(self, values: np.ndarray, where: str, name: str) -> None:
        if not (values.min() >= 0.0 and values.max() < np.inf):  # NaN fails both
            k = int(np.flatnonzero(~(np.isfinite(values) & (values >= 0.0)))[0])
            raise ValueError(f"{where}: expected finite {name} >= 0, "
                             f"got {values.reshape(-1)[k].item()!r} at position {k}")

    def _bound(self, values: np.ndarray) -> float | None:
        return float(values.max())

    def _overflowed(self) -> bool:
        if not math.isfinite(self._total):
            return True
        # The running sums add the same slots in another order: they can round to inf
        # only within a few ulp of the largest float, but then they must not.
        self._sync()
        return not math.isfinite(self._runs[-1])

    def _may_overflow(self, count: int, largest: float | None) -> bool:
        # Every node sums a subset of the slots, so none exceeds the new total, which is
        # at most the old total plus count * largest; rounding adds a relative 1e-16 or
        # so per level, far inside the margin to the largest float (1.8e308).
        return largest is None or self._total + count * largest > 1e307


class MinTree(SegmentTree):
    """The minimum over slots, for the largest importance weight in prioritized replay.

    Slots hold any float64 but NaN and -inf; +inf marks an empty slot (the identity,
    and the value every slot starts at).

    Args:
        capacity: number of slots, a positive int.
        root_width: the wide root's most children (:class:`SegmentTree`).
    """

    _combine = np.minimum
    _identity = np.inf
    _assign_kernel = staticmethod(tree_kernels.assign_min)

    def _init_root(self) -> None:
        self._min = math.inf  # the minimum over the total level; no wide root

    def _reduce_level(self) -> None:
        self._min = float(np.minimum.reduce(self._total_level))

    def _root_value(self) -> float:
        return self._min

    def min(self) -> float:
        """The smallest slot value; ``inf`` when every slot is empty."""
        return self._min

    def _check_values(self, values: np.ndarray, where: str, name: str) -> None:
        if not values.min() > -np.inf:  # NaN fails the comparison too
            flat = values.reshape(-1)
            k = int(np.flatnonzero(np.isnan(flat) | (flat == -np.inf))[0])
            raise ValueError(f"{where}: expected {name} that are not NaN or -inf (+inf marks "
                             f"an empty slot), got {flat[k].item()!r} at position {k}")


def _last_wins(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``indices`` (int64 ``[M]``, sorted) and the last of ``values`` for each.

    A stable sort keeps equal indices in call order, so the last of each run of equal
    indices is the last occurrence.
    """
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    last = np.empty(ordered.shape, bool)
    last[-1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
    return ordered[last], values[order[last]]
