"""Writing priorities into a prioritized sampler's trees: the checked update of sampled
item ids, and the trees' writes behind it and behind new steps.

:class:`PriorityWrites` is a part of :class:`~replaybuffer.sampling.prioritized.
PrioritizedSampler` (its base: one class per concern, as the buffers combine theirs).
An update maps item ids to positions (:mod:`~replaybuffer.sampling.item_ids`), drops
stale ones, stores ``priority ** alpha`` (:mod:`~replaybuffer.sampling.priority_scale`)
in the sum tree (and the min tree with ``normalize="buffer"``) and raises
``max_priority``. With numba, an update whose ids are all live is one compiled call
(:mod:`~replaybuffer.sampling.fused_update`) after numpy's power.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.fused_update import write_live
from replaybuffer.sampling.item_ids import live_positions
from replaybuffer.sampling.outside_mass import OutsideMass
from replaybuffer.sampling.priority_scale import (BOUND_SLACK, FINITE, KeptRow, kept_row,
                                                  no_kept_row, scale)
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.tree_kernels import direct_entry
from replaybuffer.sampling.trees import MinTree, SumTree


class PriorityWrites:
    """The priority writes of a prioritized sampler (module docstring); the sampler
    holds the state named below."""

    fused_updates = True
    """Whether an update of live ids may write the host sum tree in one compiled call
    (:mod:`~replaybuffer.sampling.fused_update`), bypassing :meth:`_set`; a subclass
    that keeps its priorities elsewhere (on a device) sets it to ``False``."""

    alpha: float
    max_priority: float
    key_base: int
    _sum: SumTree
    _min: MinTree | None
    _outside: OutsideMass | None
    _pending: list[tuple[np.ndarray, float]]
    # alpha as np.power's exponent row for the last batch size S, and the rows by size
    # it came from (priority_scale.kept_row); the class's, of no alpha, is replaced at
    # the first update, before anything is kept in it.
    _alpha_kept: KeptRow = no_kept_row(np.float64)
    # The fused write's entry point (tree_kernels.direct_entry) and the sum tree it was
    # made for: int64 item ids (C-contiguous, aligned), this scratch, that tree's arrays,
    # ints; made at the first such write to each tree.
    _write_entry: Callable[..., Any] = write_live
    _write_tree: SumTree | None = None
    # An update's scaled values and positions (float64, int64 ``[S]``) for the last
    # batch size S: never handed out, so reused.
    _scratch: tuple[np.ndarray, np.ndarray]

    def _flush(self) -> None:
        raise NotImplementedError  # (the sampler's: pending new steps applied)

    def _set(self, positions: np.ndarray, priorities: np.ndarray, largest: float) -> None:
        """Store raw priorities (float64 ``[K]``, ``K >= 1``, checked: finite and >= 0)
        at positions (int64 ``[K]``, in range); ``largest`` is ``priorities.max()``."""
        scaled, largest = scale(priorities, self.alpha, largest)
        if largest < FINITE:
            self._sum.assign(positions, scaled, largest)
        else:  # priority ** alpha may have overflowed: the checked update reports it
            self._sum.update(positions, scaled)
        self._written(positions, scaled)

    def _written(self, positions: np.ndarray, scaled: np.ndarray) -> None:
        """The sum tree's ``positions`` (int64 ``[K]``) now hold ``scaled`` (float64
        ``[K]``): the min tree and the outside-mass cache follow."""
        if self._min is not None:
            self._min.assign(positions, np.where(scaled > 0, scaled, np.inf))
        if self._outside is not None:
            self._outside.touch(positions)

    def update_priorities(self, ring: Ring, item_ids: np.ndarray, priorities: np.ndarray,
                          largest: float | None = None) -> int:
        """Set priorities of the steps behind ``item_ids`` (int64 ``[S]``) to
        ``priorities`` (float64 ``[S]``, checked by the caller: finite and >= 0).

        ``largest`` is ``priorities.max()`` if the caller knows it. Returns how many
        were applied; ids of overwritten (or cleared) steps are ignored. Ids of another
        integer dtype are converted (the buffers pass int64; the compiled write's entry
        is made for int64 ids and takes no other).

        Raises:
            TypeError: ``item_ids`` are not integers (nothing is changed).
        """
        if item_ids.dtype is not _INT64:  # (one identity test on the usual call)
            item_ids = int64_item_ids(item_ids)
        if self._pending:
            self._flush()
        B = ring.batch_size
        if self.fused_updates and tree_kernels.AVAILABLE and item_ids.size:
            # all live, the usual case, in one call
            if largest is None:
                largest = float(np.maximum.reduce(priorities))
            count = len(priorities)
            values, positions = self._scratch
            if len(values) != count:
                values, positions = self._scratch = (np.empty(count),
                                                     np.empty(count, np.int64))
            alpha = self.alpha
            kept = self._alpha_kept
            if kept[0] != alpha or kept[1] != count:  # (alpha is a plain attribute)
                kept = self._alpha_kept = kept_row(kept, alpha, count, np.float64)
            direct = False
            if alpha != 1.0 and alpha != 0.0:  # scale()'s usual case, inline (a call less)
                scaled = np.power(priorities, kept[2], values)
                try:
                    bound = math.pow(largest, alpha) * BOUND_SLACK
                except OverflowError:
                    bound = math.inf
                flags = item_ids.flags
                # every argument then of the types the entry is made for (below): the
                # scaled values and positions in this scratch, the tree's arrays
                direct = flags.c_contiguous and flags.aligned
            else:
                scaled, bound = scale(priorities, alpha, largest)
            target = self._sum.write_target(count, bound) if bound < FINITE else None
            if target is not None:
                last, L = ring.last_id, ring.max_length
                oldest = last + 1 - L if last >= L else 0
                write = write_live
                if direct:
                    if self._write_tree is not self._sum:
                        self._write_tree = self._sum
                        self._write_entry = direct_entry(
                            write_live, item_ids, scaled, self.key_base, B, oldest, last,
                            L, *target, positions)
                    write = self._write_entry
                total = write(item_ids, scaled, self.key_base, B, oldest, last, L, *target,
                              positions)
                if total >= 0.0:  # written (else a stale id: nothing was)
                    self._sum.written(total)
                    if self._min is not None or self._outside is not None:
                        self._written(positions, scaled)
                    if largest > self.max_priority:
                        self.max_priority = largest
                    return len(priorities)
        if B == 1:
            ids = item_ids - self.key_base if self.key_base else item_ids
        else:
            ids = item_ids // B - self.key_base
        if not ids.size:
            return 0
        oldest = ring.oldest_id
        # All live, the usual case: oldest <= ids <= last_id, one comparison per id as
        # unsigned (below oldest wraps around to huge); it implies item_ids >= 0.
        if (ids - oldest).view(np.uint64).max() <= ring.last_id - oldest:
            positions = ids % ring.max_length if B == 1 else ring.positions(ids, item_ids % B)
            values = priorities
        else:
            live = (ids >= oldest) & (ids <= ring.last_id) & (item_ids >= 0)
            if not live.any():
                return 0
            positions = ring.positions(ids[live], item_ids[live] % B)
            values = priorities[live]
            largest = None
        if largest is None:
            largest = float(values.max())
        self._set(positions, values, largest)
        self.max_priority = max(self.max_priority, largest)
        return len(values)

    def priorities(self, ring: Ring, item_ids: np.ndarray) -> np.ndarray:
        """Current ``priority ** alpha`` (float64 ``[S]``) of live item ids (int64
        ``[S]``; NaN for stale ones). Ids of another integer dtype are converted, as
        :meth:`update_priorities` converts them.

        Raises:
            TypeError: ``item_ids`` are not integers (nothing is changed).
        """
        if item_ids.dtype is not _INT64:
            item_ids = int64_item_ids(item_ids)
        self._flush()
        live, positions = live_positions(ring, self.key_base, item_ids)
        out = np.full(item_ids.shape, np.nan)
        out[live] = self._sum.get(positions)
        return out


_INT64 = np.dtype(np.int64)


def int64_item_ids(item_ids: np.ndarray) -> np.ndarray:
    """``item_ids`` of any integer dtype as int64 (a new array ``[S]``). An unsigned id
    past int64's range becomes negative, which no step has: stale, as it was.

    Raises:
        TypeError: naming ``item_ids``, int64 and the dtype given, for non-integers.
    """
    if item_ids.dtype.kind not in "iu":
        raise TypeError(f"item_ids must be integer item ids (int64, as BufferInfo.ids "
                        f"gives them), got an array of dtype {item_ids.dtype}")
    return item_ids.astype(np.int64)
