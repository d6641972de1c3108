"""Proportional draws among the windows that stay inside one episode.

Rejection from the whole sum tree while it accepts often: candidates drawn in
proportion to priority are kept if they start a window within an episode
(:meth:`~replaybuffer.sampling.episodes.EpisodeIndex.within`), which they do with
probability ``valid_mass / total``; kept ones, in the order drawn, are exact draws.
Otherwise the exact distribution over the enumerated valid windows (``O(windows)``, a
fallback). The valid mass is the total less the outside steps' mass
(:mod:`~replaybuffer.sampling.outside_mass`: cached, ``O(B T)`` per call while no
episode starts come or go); it only picks the way and scales the probabilities and
sizes the pools, rejection itself never reads it.
"""

from __future__ import annotations

import math

import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.episode_kernels import draw_within_round

from replaybuffer.sampling.episodes import EpisodeIndex, no_window_error
from replaybuffer.sampling.item_ids import ids_at
from replaybuffer.sampling.outside_mass import OutsideMass
from replaybuffer.sampling.priority_range import require_mass
from replaybuffer.sampling.rejection import ROUNDS, pool_size
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.trees import SumTree


def draw_within(tree: SumTree, outside: OutsideMass, ring: Ring, count: int,
                num_steps: int, rng: np.random.Generator, episodes: EpisodeIndex,
                floor: float = math.nan
                ) -> tuple[np.ndarray, np.ndarray, float,
                           tuple[np.ndarray, np.ndarray] | None]:
    """Draw ``count`` starts in proportion to their values in ``tree`` among windows of
    ``num_steps`` inside one episode (module docstring).

    Returns ``(positions, ids, valid_mass, weighted)``: int64 ``[count]`` each, the mass
    of the valid starts, and when the batch came from one compiled round
    (:func:`~replaybuffer.sampling.episode_kernels.draw_within_round`, numba present)
    its probabilities and weight ratios for ``floor``
    (:func:`~replaybuffer.sampling.importance.probabilities_and_ratios`'s bits), else
    ``None``. Raises :class:`~replaybuffer.errors.EmptyBufferError` when no window
    fits in an episode or every valid one has priority 0.
    """
    leaves = tree.leaves
    total = tree.total()
    if episodes.count(ring, num_steps) == 0:
        raise no_window_error(num_steps)
    valid_mass = total - outside.get(ring, num_steps, episodes, leaves)
    if valid_mass > 1e-3 * total:  # rejection accepts often enough (and is exact)
        # A pool sized to fill the batch in one round saves the second round (a
        # descent and a check) that redrawing the few rejected ones took.
        accept = min(valid_mass / total, 1.0)
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        need = count
        for _ in range(ROUNDS):
            u = rng.random(pool_size(need, accept))
            positions = None
            if tree_kernels.AVAILABLE:  # the round in one call (the same numbers)
                nodes, runs, width, height, limit = tree.search_arrays()
                indices = np.empty((2, need), np.int64)  # filled in place
                weighed = np.empty((2, need), np.float32)
                kept_now = draw_within_round(
                    nodes, runs, width, height, limit, u, total,
                    episodes.start_keys(ring), ring.batch_size, ring.max_length,
                    ring.oldest_id, ring.last_id, num_steps, need, valid_mass, floor,
                    indices, weighed)
                if kept_now == count:  # the whole batch in one round, weighed
                    return indices[1], indices[0], valid_mass, (weighed[0], weighed[1])
                if kept_now >= 0:  # (-1: an odd target, rare: the numpy round from u)
                    positions, ids = indices[1, :kept_now], indices[0, :kept_now]
            else:
                u *= total
            if positions is None:
                positions = tree.find_prefix(u)
                ids = ids_at(ring, positions)
                keep = episodes.within(ring, ids, positions % ring.batch_size,
                                       num_steps).nonzero()[0][:need]
                positions, ids = positions[keep], ids[keep]
            kept.append((positions, ids))
            need -= len(positions)
            if not need:
                if len(kept) == 1:
                    return (*kept[0], valid_mass, None)
                return (np.concatenate([p for p, _ in kept]),
                        np.concatenate([i for _, i in kept]), valid_mass, None)
    # Little of the mass is valid (or rejection was unlucky): draw exactly from the
    # enumerated valid windows, whose mass is summed directly, without cancellation.
    firsts, lengths, rows = episodes.segments(ring)
    per_segment = np.maximum(lengths - num_steps + 1, 0)
    segment = np.repeat(np.arange(len(firsts)), per_segment)
    offsets = np.arange(len(segment)) - np.repeat(np.cumsum(per_segment) - per_segment,
                                                  per_segment)
    valid_ids = firsts[segment] + offsets
    valid_positions = ring.positions(valid_ids, rows[segment])
    cumulative = np.cumsum(leaves[valid_positions])
    valid_mass = float(cumulative[-1])
    require_mass(valid_mass, num_steps)
    picks = np.searchsorted(cumulative, rng.random(count) * valid_mass, side="right")
    picks = np.minimum(picks, len(cumulative) - 1)
    return valid_positions[picks], valid_ids[picks].copy(), valid_mass, None
