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

import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.fused_update import checked_largest, write_live
from replaybuffer.sampling.item_ids import live_positions
from replaybuffer.sampling.outside_mass import OutsideMass
from replaybuffer.sampling.priority_scale import BOUND_SLACK, FINITE, exponent, scale
from replaybuffer.sampling.ring import Ring
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
    # (alpha, alpha as np.power's kept exponent: priority_scale.exponent)
    _alpha_exponent: tuple[float, np.ndarray]
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

    def checked_update(self, ring: Ring, item_ids: np.ndarray, priorities: np.ndarray
                       ) -> int:
        """The usual update, checked and written with no Python between its calls but
        what numpy's power needs: ``item_ids`` int64 ``[S]`` and ``priorities`` float64
        ``[S]``, ``S >= 1``, unchecked (numpy arrays; the buffer's
        ``update_priorities`` tests that much). One compiled call checks the
        priorities and finds the largest (:func:`~replaybuffer.sampling.fused_update.
        checked_largest`), numpy raises them to ``alpha`` (before: a negative one would
        warn), one compiled call maps the ids and writes the tree
        (:meth:`_write_live`); stale ids, overflow and samplers that keep their
        priorities elsewhere go through :meth:`update_priorities`, with the largest.

        Returns how many were applied, or -1 (nothing changed) for a NaN, infinite or
        negative priority: the caller's general path then raises its error.
        """
        largest = checked_largest(priorities)
        if not largest >= 0.0:
            return -1
        if self._pending or not self.fused_updates or not tree_kernels.AVAILABLE:
            return self.update_priorities(ring, item_ids, priorities, largest)
        written = self._write_live(ring, item_ids, priorities, largest)
        return written if written >= 0 else self.update_priorities(ring, item_ids,
                                                                   priorities, largest)

    def _write_live(self, ring: Ring, item_ids: np.ndarray, priorities: np.ndarray,
                    largest: float) -> int:
        """Write checked ``priorities`` (float64 ``[S]``, ``S >= 1``, the largest
        ``largest``) of live ``item_ids`` (int64 ``[S]``) in one compiled call
        (:mod:`~replaybuffer.sampling.fused_update`), nothing pending; returns ``S``,
        or -1 with nothing changed (a stale id, or a sum that might overflow: the
        general update's to make)."""
        values, positions = self._scratch
        if len(values) != len(priorities):
            values, positions = self._scratch = (np.empty(len(priorities)),
                                                 np.empty(len(priorities), np.int64))
        alpha = self.alpha
        if self._alpha_exponent[0] != alpha:  # (made once; alpha is a plain attribute)
            self._alpha_exponent = (alpha, exponent(alpha, np.float64))
        if alpha != 1.0 and alpha != 0.0:  # scale()'s usual case, inline (a call less)
            scaled = np.power(priorities, self._alpha_exponent[1], values)
            try:
                bound = math.pow(largest, alpha) * BOUND_SLACK
            except OverflowError:
                return -1
        else:
            scaled, bound = scale(priorities, alpha, largest)
        target = self._sum.write_target(len(scaled), bound) if bound < FINITE else None
        if target is None:
            return -1
        last, L = ring.last_id, ring.max_length
        total = write_live(item_ids, scaled, self.key_base, ring.batch_size,
                           last + 1 - L if last >= L else 0,  # (oldest_id)
                           last, L, *target, positions)
        if total < 0.0:  # a stale id: nothing was written
            return -1
        self._sum.written(total)
        if self._min is not None or self._outside is not None:
            self._written(positions, scaled)
        if largest > self.max_priority:
            self.max_priority = largest
        return len(priorities)

    def update_priorities(self, ring: Ring, item_ids: np.ndarray, priorities: np.ndarray,
                          largest: float | None = None) -> int:
        """Set priorities of the steps behind ``item_ids`` (int64 ``[S]``) to
        ``priorities`` (float64 ``[S]``, checked by the caller: finite and >= 0).

        ``largest`` is ``priorities.max()`` if the caller knows it. Returns how many
        were applied; ids of overwritten (or cleared) steps are ignored.
        """
        if self._pending:
            self._flush()
        if self.fused_updates and tree_kernels.AVAILABLE and item_ids.size:
            # all live, the usual case, in one call
            if largest is None:
                largest = float(np.maximum.reduce(priorities))
            if self._write_live(ring, item_ids, priorities, largest) >= 0:
                return len(priorities)
        B = ring.batch_size
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
        ``[S]``; NaN for stale ones)."""
        self._flush()
        live, positions = live_positions(ring, self.key_base, item_ids)
        out = np.full(item_ids.shape, np.nan)
        out[live] = self._sum.get(positions)
        return out
