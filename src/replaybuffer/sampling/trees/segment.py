"""The segment tree's common part: slots, updates, lazy levels and checkpoints.

:class:`SegmentTree` holds the flat node array (:mod:`~replaybuffer.sampling.trees.layout`)
and keeps it a pure function of the leaves (:mod:`~replaybuffer.sampling.trees.recompute`).
Its variants, :class:`~replaybuffer.sampling.trees.sum_tree.SumTree` and
:class:`~replaybuffer.sampling.trees.min_tree.MinTree`, add the root value and the
searches.

Lazy levels: the root value, :meth:`SumTree.total` or :meth:`MinTree.min`, is not
read from the top of the tree but reduced over the *total level* by ``np.add.reduce``
(numpy's pairwise sum) or ``np.minimum.reduce``. An update then recomputes the levels
up to the total level and reduces it, and leaves the levels above it and the running
sums stale until something reads them (a search, a prefix sum, :attr:`SegmentTree.nodes`),
which recomputes them whole first. Sampling that only needs the total (rejection, in
:mod:`replaybuffer.sampling.prioritized`) never pays for them; at capacity 1,000,000
that is four levels and the running sums, about a third of an update. While nothing
reads the tree between updates, an update recomputes only the row heights 3, 6, ...
and records the leaves' paths; a read recomputes the levels between them along those
paths first (or whole, once there are too many to list). Once reads come between
updates (searches), updates recompute every level along the paths again, which is
cheaper than recording them.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.trees.layout import (
    DEFAULT_ROOT_WIDTH,
    ROWS_MAX,
    aligned_full,
    total_level_start,
)
from replaybuffer.sampling.trees.recompute import (
    combine_levels,
    last_wins,
    recompute_paths,
    recompute_rows,
)
from replaybuffer.sampling.trees.validation import as_indices, as_values


class SegmentTree:
    """A wide root over binary subtrees, over ``capacity`` float64 slots, with one operation.

    The base of :class:`~replaybuffer.sampling.trees.sum_tree.SumTree` and
    :class:`~replaybuffer.sampling.trees.min_tree.MinTree`. A variant names its ufunc
    (``_combine``), that ufunc's identity (``_identity``, the value of a slot past
    ``capacity``), how it reduces the total level to its root value
    (``_reduce_level``), what wide root it keeps over the subtree roots
    (``_combine_roots``) and which slot values it accepts (``_check_values``).

    Args:
        capacity: number of slots, a positive int. Slots start at the identity.
        root_width: the most children the wide root may have, a power of two >= 1.
            The root gets ``min(size, root_width)`` children
            (:mod:`~replaybuffer.sampling.trees.layout`). 1 gives a plain binary tree.
            Results hold at any width, and only speed and the order of the sums
            change with it.
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
        self._nodes = aligned_full(2 * self._size, self._identity)
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
        # The slot values, read-only: one view for the tree's life (``leaves``).
        self._leaves = self._nodes[self._size:self._size + self.capacity]
        self._leaves.flags.writeable = False
        # The total level (module docstring): nodes [total_lo, 2 total_lo).
        total_lo = total_level_start(self._size, self.root_width)
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
        self._stale_max = max(ROWS_MAX, self._size >> 6)
        self._init_root()

    def _level(self, height: int) -> np.ndarray:
        """View of the nodes at ``height`` (0: the leaves), float64 ``[size >> height]``."""
        return self._nodes[self._size >> height:(2 * self._size) >> height]

    # ------------------------------------------------------------------ reading
    @property
    def nodes(self) -> np.ndarray:
        """Read-only view of the flat node array, float64 ``[2 * size]``
        (:mod:`~replaybuffer.sampling.trees.layout`).

        The binary nodes ``[root_width, 2 * size)``; ``[0, root_width)`` are unused
        and hold the identity. The wide root is not in it (``total()``/``min()``).
        Reading it brings every level up to date first (module docstring).
        """
        self.sync()
        view: npt.NDArray[np.float64] = self._nodes.view()
        view.flags.writeable = False
        return view

    def get(self, indices: Any) -> np.ndarray:
        """Slot values, float64 with the shape of ``indices`` (ints in ``[0, capacity)``)."""
        idx = as_indices(indices, "get", self.capacity)
        return self._nodes[idx + self._size]

    @property
    def leaves(self) -> np.ndarray:
        """Read-only view of the slot values, float64 ``[capacity]`` (always current).

        For callers whose indices are valid by construction: indexing it skips the
        checks of :meth:`get`, a sizeable part of a small read.
        """
        return self._leaves

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
        idx = as_indices(indices, "update", self.capacity)
        vals = as_values(values, idx.shape, "update", self._check_values)
        if idx.size == 0:
            return
        self.assign(idx.reshape(-1), vals.reshape(-1), self._bound(vals))

    def assign(self, slots: np.ndarray, values: np.ndarray,
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
                self.sync()
        if overflowed:
            raise ValueError(f"update: expected a finite {self._what_overflows}, got inf "
                             "with these values (float64 overflow); the tree is unchanged")

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves, ``O(capacity)``.

        The same operations in the same order as :meth:`update`, so the result is
        bit-for-bit the tree that updates maintain.
        """
        combine_levels(self._nodes, self._pairs, self._combine, self._size >> 1,
                       self.root_width)
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
        leaves = as_values(state["leaves"], (self.capacity,), "load_state_dict",
                           self._check_values, name="leaves", allow_scalar=False)
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

    def sync(self) -> None:
        """Bring the levels between row heights, those above the total level and the
        wide root up to date (module docstring); a no-op when they are. Every read of
        those levels calls it first."""
        if self._synced:
            return
        if self.compiled:  # compiled updates left only the wide root stale
            self._combine_roots()
            self._synced = True
            return
        nodes, pairs, combine, size = self._nodes, self._pairs, self._combine, self._size
        if self._stale:
            # The two levels above each row height but the top one, from that row height.
            leaves = (None if self._stale is True
                      else np.concatenate(self._stale) + size)
            for height in range(0, self._chunk_top, 3):
                lo = size >> (height + 1)
                if leaves is None:
                    combine_levels(nodes, pairs, combine, lo, lo >> 1)
                else:
                    recompute_paths(nodes, pairs, combine, self._shifts, size, leaves, lo,
                                    lo >> 1)
            self._stale, self._stale_count = [], 0
        combine_levels(nodes, pairs, combine, self._total_lo >> 1, self.root_width)
        self._combine_roots()
        self._synced = True

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
            self._assign_kernel(self._nodes, slots, values, self._size, self.root_width)
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
            slots, values = last_wins(slots, values)
            leaf_level[slots] = values
        self._recompute(slots)

    def _recompute(self, slots: np.ndarray) -> None:
        """Recompute the ancestors of ``slots`` (int64 ``[K]``) up to the total level,
        then the root value; the levels above go stale.

        Bottom up, each binary node is ``combine(left, right)`` of its children's
        current values, whichever way it is reached: so the result is the tree
        :meth:`rebuild` builds. Right after a read of the upper levels (searches are
        being made), every level up to the total level is recomputed along the paths.
        Otherwise (only the root value is being read) the row heights are recomputed
        from rows and the levels between them are left stale, and recorded, until a
        read brings them up to date (:meth:`sync`).
        """
        size = self._size
        if self._synced or not self._chunk_top or len(slots) > ROWS_MAX:
            recompute_paths(self._nodes, self._pairs, self._combine, self._shifts, size,
                            slots + size, size >> 1, self._total_lo)
        else:
            recompute_rows(self._row_levels, self._combine, slots)
            top = size >> self._chunk_top  # the nodes [top, 2 top) are at the top row
            if top > self._total_lo:
                recompute_paths(self._nodes, self._pairs, self._combine, self._shifts,
                                size, slots + size, top >> 1, self._total_lo)
            if self._stale is not True:
                self._stale.append(slots)
                self._stale_count += len(slots)
                if self._stale_count > self._stale_max:  # redone whole, when read
                    self._stale, self._stale_count = True, 0
        self._reduce_level()
        self._synced = False
