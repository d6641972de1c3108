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
(its binary search branches, so it runs faster when the same targets repeat). An
update recomputes those running sums with one ``np.add.accumulate`` (``np.cumsum``),
about 4 us for 1024 of them. Narrower wide nodes all the way down (rows of 16 or 32
children per node, 4-5 levels at 1M) measured worse. Every level then needs per-row
prefix sums or row sums over ``[K, W]`` gathers, and numpy runs those over short
rows at 4-17 us a call here. That made ``find_prefix`` 2.5-3 times slower than the
binary tree, and ``update`` no faster than this shape.

Layout: one flat float64 array ``nodes`` of length ``2 * size``, a binary heap. Node
``i`` has children ``2i`` and ``2i + 1``, and slot ``j`` is the leaf ``size + j``. The
subtree roots, the wide root's children, are the nodes ``[width, 2 * width)``. The
nodes ``[0, width)`` are unused and hold the identity. The leaves past ``capacity``
hold the identity of the tree's operation (0 for a sum, +inf for a min), so they
never change a result. The wide root itself is the ``width`` running sums of the
subtree roots (:class:`SumTree`), an inclusive running sum whose last entry is
:meth:`SumTree.total`, or their minimum (:class:`MinTree`).

Exact recomputation, not deltas: an update writes the new leaves, then recomputes
every affected binary ancestor from its two children, level by level, and then the
wide root from all of its children. Adding deltas (``node += new - old``) would carry
rounding error into the ancestors on every update, so after millions of updates
the total would drift from the sum of the leaves, and could go negative as
priorities shrink. Recomputed, every node is a pure function of the current leaves,
always combined in the same order: ``combine(left, right)`` per binary node, and a
sequential running sum (or minimum) over the subtree roots. So the tree after any sequence of
updates is bit-for-bit the tree that :meth:`SegmentTree.rebuild` builds from scratch.

Vectorised: a batch of ``K`` updates or ``K`` prefix searches walks all ``K`` paths
together. That is one Python iteration per binary level (``height`` of them), none
per item, plus a few whole-batch calls for the wide root.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Default fan-out of the wide root. The root costs one running sum over ``width``
#: floats per update (about 4 us for 1024 here) and saves ``log2(width)`` binary
#: levels (about 2.5 us each per update, 3 us each per search). 512, 1024 and 2048
#: measured within noise of each other at capacities 1e3-1e6.
DEFAULT_ROOT_WIDTH = 1024


class SegmentTree:
    """A wide root over binary subtrees, over ``capacity`` float64 slots, with one operation.

    The base of :class:`SumTree` and :class:`MinTree`. A variant names its ufunc
    (``_combine``), that ufunc's identity (``_identity``, the value of a slot past
    ``capacity``), how the wide root combines the subtree roots (``_combine_roots``)
    and which slot values it accepts (``_check_values``).

    Args:
        capacity: number of slots, a positive int. Slots start at the identity.
        root_width: the most children the wide root may have, a power of two >= 1.
            The root gets ``min(size, root_width)`` children (module docstring).
            1 gives a plain binary tree. Results hold at any width, and only
            speed and the order of the sums change with it.
    """

    _combine: np.ufunc
    _identity: float

    def __init__(self, capacity: int, *, root_width: int = DEFAULT_ROOT_WIDTH):
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
        self._nodes = np.full(2 * self._size, self._identity, np.float64)
        # The children of node i are left[i] and right[i]. Two 1-D gathers through these
        # strided views are several times faster than one gather of [K, 2] pairs.
        self._left = self._nodes[0::2]
        self._right = self._nodes[1::2]
        self._roots = self._nodes[self.root_width:2 * self.root_width]
        self._init_root()

    # ------------------------------------------------------------------ reading
    @property
    def nodes(self) -> np.ndarray:
        """Read-only view of the flat node array, float64 ``[2 * size]`` (module docstring).

        The binary nodes ``[root_width, 2 * size)``; ``[0, root_width)`` are unused
        and hold the identity. The wide root is not in it (``total()``/``min()``).
        """
        view = self._nodes.view()
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
        leaves = idx.reshape(-1) + self._size
        vals = vals.reshape(-1)
        old = self._nodes[leaves]
        with np.errstate(over="ignore"):  # an overflow is reported below, as an error
            self._write(leaves, vals)
        if self._overflowed():
            # Recomputing from the old leaves restores every node bit-for-bit.
            self._write(leaves, old)
            raise ValueError(f"update: expected a finite {self._what_overflows}, got inf "
                             "with these values (float64 overflow); the tree is unchanged")

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves, ``O(capacity)``.

        The same operations in the same order as :meth:`update`, so the result is
        bit-for-bit the tree that updates maintain.
        """
        nodes, lo = self._nodes, self._size
        while lo > self.root_width:  # parents of the level [lo, 2 lo) are [lo / 2, lo)
            self._combine(nodes[lo:2 * lo:2], nodes[lo + 1:2 * lo:2], out=nodes[lo >> 1:lo])
            lo >>= 1
        self._combine_roots()

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
        """Allocate the wide root for an empty tree."""
        raise NotImplementedError

    def _combine_roots(self) -> None:
        """Recompute the wide root from the subtree roots ``self._roots``."""
        raise NotImplementedError

    def _root_value(self) -> float:
        """The combination of every slot: the total or the minimum."""
        raise NotImplementedError

    def _check_values(self, values: np.ndarray, where: str, name: str) -> None:
        """Raise ``ValueError`` if a float64 array holds a value this tree rejects."""
        raise NotImplementedError

    def _overflowed(self) -> bool:
        """Whether the root left the representable range after a write."""
        return False

    # ------------------------------------------------------------------ internals
    def _write(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` (float64 ``[K]``) to ``leaves`` (int64 leaf nodes ``[K]``),
        the last value winning for a repeated leaf, then recompute the ancestors.

        Repeated parents on a level are left alone: each copy computes the same value
        from the same children, so the repeated write is harmless and cheaper than
        deduplicating every level.
        """
        nodes, left, right, combine = self._nodes, self._left, self._right, self._combine
        nodes[leaves] = values
        # Numpy does not promise which of repeated fancy-index assignments lands. If every
        # leaf now holds, bit for bit, each value given for it, repeats (if any) carried
        # equal values and the last won anyway; otherwise resolve them explicitly. The
        # check costs a gather, the sort several times more.
        if not (nodes[leaves].view(np.int64) == values.view(np.int64)).all():
            leaves, values = _last_wins(leaves, values)
            nodes[leaves] = values
        node = leaves >> 1
        for _ in range(self._height):
            nodes[node] = combine(left[node], right[node])
            node >>= 1
        self._combine_roots()

    def _as_indices(self, indices: Any, where: str, upper: int | None = None) -> np.ndarray:
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

    def _init_root(self) -> None:
        # The wide root: running sums of the subtree roots behind a leading 0, so
        # _runs[j] sums the subtrees before j and _runs[j + 1] those up to j.
        self._runs = np.zeros(self.root_width + 1, np.float64)
        self._upto = self._runs[1:]  # inclusive running sums, sorted (all terms >= 0)

    def _combine_roots(self) -> None:
        # np.cumsum is this accumulate behind a slower wrapper: the same sequential sums.
        np.add.accumulate(self._roots, out=self._upto)

    def _root_value(self) -> float:
        return float(self._runs[-1])

    def total(self) -> float:
        """The sum of all slots, a float >= 0: the running sum over every subtree root."""
        return float(self._runs[-1])

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
        full = e == self.capacity
        # The leaf node just past the range; a full range (capacity == size) would step
        # past the array, and takes the total instead.
        node = np.where(full, self._size, e + self._size)
        nodes = self._nodes
        acc = np.zeros(e.shape, np.float64)
        for _ in range(self._height):
            # A right child adds its left sibling, the sum of the run just before it.
            acc += nodes[node - 1] * (node & 1)
            node >>= 1
        acc += self._runs[node - self.root_width]  # the subtrees before this one
        acc[full] = self._runs[-1]
        return acc.reshape(shape)

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
        total = self._runs[-1]
        low, high = t.min(), t.max()
        if not (low >= 0.0 and high < np.inf):  # NaN fails both comparisons
            k = int(np.flatnonzero(~(np.isfinite(t) & (t >= 0.0)))[0])
            raise ValueError(f"find_prefix: expected finite targets >= 0, "
                             f"got {t[k].item()!r} at position {k}")
        if not total > 0.0:
            raise ValueError("find_prefix: expected a total priority > 0, got 0.0 "
                             "(every slot is 0, so nothing can be sampled)")
        # Sorted, the targets walk the tree in order: the root's binary search predicts
        # its branches and the gathers below run through memory in order, which saves
        # more than the sort costs (measured: ~20% at 1e5-1e6 slots). It also copies:
        # the descent consumes t, and the caller's array is never written.
        order = t.argsort()
        t = t[order]
        past = None
        if high >= total:
            # Past the rounded total the exact answer depends on how the sums rounded;
            # these targets all get the last slot with a priority > 0. They descend
            # from 0 meanwhile, which keeps them inside the tree.
            past = t >= total
            t[past] = 0.0
        kept = t.copy() if self._height else t  # for a second, guarded descent
        node = self._descend(t)
        if self._height:
            # Rounding can leave a target at or past the sum of the subtree it is in (the
            # sums are rounded, and so is each subtraction on the way down); the plain
            # descent then walks right into a run of zero slots, or the zero padding past
            # capacity. Only then is the leaf 0, so only those targets descend again, this
            # time never into a zero subtree. The wide root needs no such guard: it picks
            # the first subtree whose running sum exceeds the target, which is > 0.
            zero = self._nodes[node] == 0.0
            if zero.any():
                node[zero] = self._descend_guarded(kept[zero])
        if past is not None:
            node[past] = self._last_positive_leaf()
        node -= self._size
        found = np.empty_like(node)
        found[order] = node
        return found.reshape(shape)

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
        so the plain result stands wherever it is > 0.
        """
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
        root = int(np.flatnonzero(self._roots > 0.0)[-1]) + self.root_width
        # +inf turns right wherever the guard allows, so it ends on the last positive slot.
        return int(self._guarded_from(np.array([root]), np.array([np.inf]))[0])

    def _check_values(self, values: np.ndarray, where: str, name: str) -> None:
        if not (values.min() >= 0.0 and values.max() < np.inf):  # NaN fails both
            k = int(np.flatnonzero(~(np.isfinite(values) & (values >= 0.0)))[0])
            raise ValueError(f"{where}: expected finite {name} >= 0, "
                             f"got {values.reshape(-1)[k].item()!r} at position {k}")

    def _overflowed(self) -> bool:
        return not math.isfinite(self._runs[-1])


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

    def _init_root(self) -> None:
        self._min = np.full(1, np.inf)  # the wide root: the minimum of the subtree roots

    def _combine_roots(self) -> None:
        np.minimum.reduce(self._roots, out=self._min, keepdims=True)

    def _root_value(self) -> float:
        return float(self._min[0])

    def min(self) -> float:
        """The smallest slot value (the root); ``inf`` when every slot is empty."""
        return float(self._min[0])

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
