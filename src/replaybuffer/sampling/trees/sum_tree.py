"""The sum tree: totals, prefix sums and proportional search over priorities.

Its wide root is the ``width`` running sums of the subtree roots: inclusive running
sums, for searches (:mod:`~replaybuffer.sampling.trees.descent`). Why this shape: numpy
charges a fixed cost per call (about half a microsecond here) that dwarfs the work on
a batch of ``K`` ~ 256 paths, so a batch costs about one such cost per numpy call, and
a binary level costs five or six calls, 2.5-3 us. The wide root takes the place of
the top ``log2(width)`` binary levels for a handful of whole-batch calls. A search
picks the child with one ``np.searchsorted`` over the root's running sums, about
1.6 us per halving of the root on fresh random targets (its binary search branches,
so it runs faster when the same targets repeat). The running sums are one
``np.add.accumulate`` (``np.cumsum``), about 4 us for 1024 of them. Narrower wide
nodes all the way down (rows of 16 or 32 children per node, 4-5 levels at 1M)
measured worse. Every level then needs per-row prefix sums or row sums over
``[K, W]`` gathers, and numpy runs those over short rows at 4-17 us a call here.
That made ``find_prefix`` 2.5-3 times slower than the binary tree, and ``update`` no
faster than this shape. So did storing only every third level and rebuilding the
other two from rows of 8 on the way (the descent pays more for the rebuilt rows than
the update saves).

The total (the pairwise sum of the total level) and the last running sum are both
sums of the same slots in different orders, equal within rounding.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.trees.descent import descend, descend_guarded_from, descend_root
from replaybuffer.sampling.trees.segment import SegmentTree
from replaybuffer.sampling.trees.validation import as_indices


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
        # What a compiled writer writes to (write_target), without and with the
        # running sums, made on its first call; whether a search read the running sums
        # since the last such write, and whether that write made them.
        self._targets: tuple[tuple[np.ndarray, int, int, int, np.ndarray], ...] | None = None
        self._searched = self._runs_written = False

    def write_target(self, count: int, largest: float
                     ) -> tuple[np.ndarray, int, int, int, np.ndarray] | None:
        """For a caller that writes leaves in its own compiled loop (a fused priority
        update, :mod:`replaybuffer.sampling.fused_update`): ``(nodes, size, stop,
        total_start, upto)`` when ``count`` values of at most ``largest`` may be written
        that way, else ``None`` (numpy loops, or the root might overflow: use
        :meth:`assign`).

        The caller then writes as :func:`~replaybuffer.sampling.tree_kernels.assign_sum`
        does (leaf ``size + slot``, every ancestor ``>= stop`` recomputed); unless
        ``upto`` is empty, puts the running sums of nodes ``[stop, 2 * stop)`` in it
        (float64 ``[stop]``, as :func:`~replaybuffer.sampling.tree_kernels.
        running_sums`); unless ``total_start`` is 0, sums the total level, nodes
        ``[total_start, 2 * total_start)``, as :func:`~replaybuffer.sampling.
        tree_kernels.pairwise_sum` does; then calls :meth:`written` at once with that
        sum. The running sums are asked for while searches read them (a search since
        the last write): draws by rejection never do, and would only waste them.
        """
        # (_may_overflow's test, inline: one call less per priority update)
        if not self.compiled or self._total + count * largest > 1e307:
            return None
        if self._targets is None:
            start = self._total_lo if tree_kernels.pairwise_matches() else 0
            self._targets = ((self._nodes, self._size, self.root_width, start,
                              np.empty(0)),
                             (self._nodes, self._size, self.root_width, start, self._upto))
        self._runs_written = self._searched
        return self._targets[self._searched]

    def written(self, total: float = math.nan) -> None:
        """After a write through :meth:`write_target`: ``total`` is the total level's
        sum the writer made (NaN: it made none, the tree sums it here); every level is
        current, and the wide root's running sums too if they were asked for."""
        if self._targets is not None and self._targets[0][3]:
            self._total = total
        else:
            self._reduce_level()
        self._synced = self._runs_written
        self._searched = False

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
        (:mod:`~replaybuffer.sampling.trees.segment`)."""
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
        e = as_indices(ends, "prefix_sum", self.capacity + 1)
        shape = e.shape
        e = e.reshape(-1)
        if e.size == 0:
            return np.zeros(shape, np.float64)
        return self.sums_before(e).reshape(shape)

    def sums_before(self, ends: np.ndarray) -> np.ndarray:
        """:meth:`prefix_sum` without the checks, for callers that have made them.

        Args:
            ends: int64 ``[E]``, ``E >= 1``, in ``[0, capacity]``.

        Returns:
            float64 ``[E]``: the sum of the slots before each end, as :meth:`prefix_sum`.
        """
        self.sync()
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
        return self.find(t)[0].reshape(shape)

    def find(self, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`find_prefix` without the checks, and the slots' values with the slots.

        Args:
            targets: float64 ``[K]``, ``K >= 1``, finite and >= 0 (left unchanged);
                the total must be > 0.

        Returns:
            ``(slots, values)``: int64 ``[K]`` as :meth:`find_prefix` returns them, and
            float64 ``[K]``, their values (all > 0).
        """
        self.sync()
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
            t = targets[zero]  # a copy (none of them is past), which the descent consumes
            node = descend_root(self._upto, self._runs, self.root_width, t)
            found[zero] = descend_guarded_from(self._left, self._right, self._height, node, t)
            values = self._nodes[found]
        found -= self._size
        return found, values

    def search_arrays(self) -> tuple[np.ndarray, np.ndarray, int, int, float]:
        """What a compiled search reads, every level brought up to date first:
        ``(nodes, runs, root_width, height, limit)``.

        ``nodes`` is the flat float64 ``[2 * size]`` node array, ``runs`` the wide
        root's running sums behind a leading 0 (float64 ``[root_width + 1]``), and
        ``limit`` the lower of the total and the last running sum: targets at or past
        it take :meth:`find`'s general path. Read-only by contract (views, not copies:
        a fused draw reads them in place, :mod:`replaybuffer.sampling.fused_descent`).
        """
        self.sync()
        self._searched = True
        return (self._nodes, self._runs, self.root_width, self._height,
                min(self._total, float(self._runs[-1])))

    def search_layout(self) -> tuple[np.ndarray, np.ndarray, int, int]:
        """:meth:`search_arrays` without the limit, for a compiled search that takes
        it from ``runs`` and :meth:`total` itself
        (:func:`~replaybuffer.sampling.fused_descent.steps`): ``(nodes, runs,
        root_width, height)``, every level brought up to date first."""
        if not self._synced:
            self.sync()
        self._searched = True
        return self._nodes, self._runs, self.root_width, self._height

    def _descend(self, t: np.ndarray) -> np.ndarray:
        """Leaf nodes int64 ``[K]`` reached by targets ``t`` (float64 ``[K]`` in
        ``[0, total())``, consumed): the plain numpy descent, unguarded."""
        self.sync()
        return descend(self._nodes, self._upto, self._runs, self.root_width, self._height, t)

    def _last_positive_leaf(self) -> int:
        """The leaf node of the last slot with a priority > 0 (the total is > 0)."""
        self.sync()
        root = int(np.flatnonzero(self._roots > 0.0)[-1]) + self.root_width
        # +inf turns right wherever the guard allows, so it ends on the last positive slot.
        return int(descend_guarded_from(self._left, self._right, self._height,
                                        np.array([root]), np.array([np.inf]))[0])

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
        self.sync()
        return not math.isfinite(self._runs[-1])

    def _may_overflow(self, count: int, largest: float | None) -> bool:
        # Every node sums a subset of the slots, so none exceeds the new total, which is
        # at most the old total plus count * largest; rounding adds a relative 1e-16 or
        # so per level, far inside the margin to the largest float (1.8e308).
        return largest is None or self._total + count * largest > 1e307
