"""Sum and min segment trees over a fixed number of slots, for prioritized replay.

Layout: one flat float64 array ``nodes`` of length ``2 * size``, where ``size`` is the
smallest power of two >= ``capacity``. Node 1 is the root, node ``i`` has children
``2i`` and ``2i + 1``, and slot ``j`` is the leaf ``size + j``; node 0 is unused. The
leaves past ``capacity`` hold the identity of the tree's operation (0 for a sum,
+inf for a min), so they never change a result.

Exact recomputation, not deltas: an update writes the new leaves, then recomputes
every affected ancestor from its two children, level by level. Adding deltas
(``node += new - old``) would carry rounding error into the ancestors on every
update, so after millions of updates the total drifts from the sum of the leaves
and can go negative as priorities shrink. Recomputed, every node is a pure function
of the current leaves, and the tree after any sequence of updates is bit-for-bit
the tree :meth:`SegmentTree.rebuild` builds from scratch.

Vectorised: a batch of ``K`` updates or ``K`` prefix searches walks all ``K`` paths
together, one Python iteration per level (``log2(size)`` of them) and none per item:
``O(K log N)`` numpy work in five or six numpy calls per level.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SegmentTree:
    """A complete binary tree over ``capacity`` float64 slots, combined by one operation.

    The base of :class:`SumTree` and :class:`MinTree`; a variant names its ufunc
    (``_combine``), that ufunc's identity (``_identity``, the value of a slot past
    ``capacity``) and which slot values it accepts (``_check_values``).

    Args:
        capacity: number of slots, a positive int. Slots start at the identity.
    """

    _combine: np.ufunc
    _identity: float

    def __init__(self, capacity: int):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = int(capacity)
        self._depth = (self.capacity - 1).bit_length()  # levels below the root
        self._size = 1 << self._depth
        self._nodes = np.full(2 * self._size, self._identity, np.float64)
        # The children of node i are left[i] and right[i]. Two 1-D gathers through these
        # strided views are several times faster than one gather of [K, 2] pairs.
        self._left = self._nodes[0::2]
        self._right = self._nodes[1::2]

    # ------------------------------------------------------------------ reading
    @property
    def nodes(self) -> np.ndarray:
        """Read-only view of the flat node array, float64 ``[2 * size]`` (layout above)."""
        view = self._nodes.view()
        view.flags.writeable = False
        return view

    def get(self, indices: Any) -> np.ndarray:
        """Slot values, float64 with the shape of ``indices`` (ints in ``[0, capacity)``)."""
        idx = self._as_indices(indices, "get")
        return self._nodes[idx + self._size]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, root={self._nodes[1]!r})"

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
        """Recompute every internal node from the leaves, ``O(capacity)``."""
        nodes, lo = self._nodes, self._size
        while lo > 1:  # parents of the level [lo, 2 lo) are [lo / 2, lo)
            self._combine(nodes[lo:2 * lo:2], nodes[lo + 1:2 * lo:2], out=nodes[lo >> 1:lo])
            lo >>= 1

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
        for _ in range(self._depth):
            nodes[node] = combine(left[node], right[node])
            node >>= 1

    def _as_indices(self, indices: Any, where: str) -> np.ndarray:
        """``indices`` as int64, after checking they are ints in ``[0, capacity)``."""
        idx = np.asarray(indices)
        if idx.size == 0:  # np.asarray([]) is float64; an empty batch is still fine
            return idx.astype(np.int64)
        if idx.dtype.kind not in "iu":
            raise ValueError(f"{where}: expected integer indices, got dtype {idx.dtype}")
        if idx.min() < 0 or idx.max() >= self.capacity:
            flat = idx.reshape(-1)
            k = int(np.flatnonzero((flat < 0) | (flat >= self.capacity))[0])
            raise ValueError(f"{where}: expected indices in [0, {self.capacity}), "
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
    """

    _combine = np.add
    _identity = 0.0
    _what_overflows = "total priority"

    def total(self) -> float:
        """The sum of all slots (the root), a float >= 0."""
        return float(self._nodes[1])

    def find_prefix(self, targets: Any) -> np.ndarray:
        """For each target, the smallest slot ``i`` with ``sum(slot[:i + 1]) > target``.

        Drawing targets uniformly in ``[0, total())`` samples slot ``i`` with
        probability ``slot[i] / total()``. All targets descend the tree together.

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
        total = self._nodes[1]
        if not total > 0.0:
            raise ValueError("find_prefix: expected a total priority > 0, got 0.0 "
                             "(every slot is 0, so nothing can be sampled)")
        t = t.copy()  # clamped below; the caller's array is never written
        past = t >= total
        if past.any():
            # Past the rounded total the exact answer depends on how the sums rounded;
            # +inf turns right wherever the guarded descent may, so these targets all
            # get the last slot with a priority > 0.
            t[past] = np.inf
        node = self._descend(t.copy())  # the descent consumes its copy
        # Rounding can leave a target at or past the sum of the subtree it is in (the
        # sums are rounded, and so is each subtraction on the way down); the plain
        # descent then walks right into a run of zero slots, or the zero padding past
        # capacity. Only then is the leaf 0, so only those targets descend again, this
        # time never into a zero subtree.
        zero = self._nodes[node] == 0.0
        if zero.any():
            node[zero] = self._descend_guarded(t[zero])
        node -= self._size
        return node.reshape(shape)

    def _descend(self, t: np.ndarray) -> np.ndarray:
        """Leaf nodes int64 ``[K]`` reached by targets ``t`` (float64 ``[K]``, consumed)."""
        nodes = self._nodes
        node = np.ones(t.shape, np.int64)
        for _ in range(self._depth):
            node += node  # the left child
            left = nodes[node]
            right = t >= left
            # left * False is exactly 0.0: one multiply beats a masked subtract or a where.
            t -= left * right
            node += right
        return node

    def _descend_guarded(self, t: np.ndarray) -> np.ndarray:
        """:meth:`_descend` that turns right only into a subtree with a sum > 0.

        Each node on the path has a sum > 0: the root does, a right turn needs a right
        sum > 0, and a left turn either has ``t < left`` with ``t >= 0`` (subtracting
        a number no larger than ``t`` never goes below 0), so ``left > 0``, or a right
        sum of 0, so ``left`` is the node's sum. The leaf reached is therefore a slot
        with a priority > 0, hence inside capacity. Where this guard never fires the
        path is the plain descent's, so the plain result stands wherever it is > 0.
        """
        left_of, right_of = self._left, self._right
        node = np.ones(t.shape, np.int64)
        for _ in range(self._depth):
            left = left_of[node]
            right = (t >= left) & (right_of[node] > 0.0)
            t -= left * right
            node += node
            node += right
        return node

    def _check_values(self, values: np.ndarray, where: str, name: str) -> None:
        if not (values.min() >= 0.0 and values.max() < np.inf):  # NaN fails both
            k = int(np.flatnonzero(~(np.isfinite(values) & (values >= 0.0)))[0])
            raise ValueError(f"{where}: expected finite {name} >= 0, "
                             f"got {values.reshape(-1)[k].item()!r} at position {k}")

    def _overflowed(self) -> bool:
        return not np.isfinite(self._nodes[1])


class MinTree(SegmentTree):
    """The minimum over slots, for the largest importance weight in prioritized replay.

    Slots hold any float64 but NaN and -inf; +inf marks an empty slot (the identity,
    and the value every slot starts at).

    Args:
        capacity: number of slots, a positive int.
    """

    _combine = np.minimum
    _identity = np.inf

    def min(self) -> float:
        """The smallest slot value (the root); ``inf`` when every slot is empty."""
        return float(self._nodes[1])

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
