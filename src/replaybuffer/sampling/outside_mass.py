"""The priority mass of the steps that cannot start a window within one episode.

Prioritized sampling within episodes
(:func:`replaybuffer.sampling.episode_draws.draw_within`) needs the valid mass, the
sum tree's total less the mass of the *outside* steps: the last ``T - 1`` steps of every
segment (:mod:`replaybuffer.sampling.episodes`). Summing them all on every draw costs
``O(episodes * T)``. :meth:`EpisodeIndex.outside_parts
<replaybuffer.sampling.episodes.EpisodeIndex.outside_parts>` splits them into the
steps of the interior segments, fixed until an episode start comes or goes, and those
of each row's two end segments (``O(B T)``, summed per call). This caches the sum of
the interior part and keeps it exact under priority writes:

* a bool mask over storage positions marks the cached steps, and every write of
  priorities (:meth:`OutsideMass.touch`, ``O(K)``) that lands on one drops the cached
  sum, which the next draw recomputes from the leaves;
* the cache is keyed by the identity of the interior arrays, so a new episode start or
  an eviction past a row's first start rebuilds it (``O(episodes * T)``, about as often
  as the episode index itself rebuilds its interior segments, ``O(E)``).

Exact, not deltas: the cached sum is always ``leaves[positions].sum()`` over the same
positions in the same order, recomputed in full when any of them changed, so it is a
pure function of the current leaves (bit for bit what a fresh sum gives: draws after a
save and restore, which starts with no cache, are the draws without one). Adding
``new - old`` per write would drift as the segment tree's module docstring describes.

A training loop's updates land on the starts it drew, which are valid and stay valid
(later steps can only end an episode after them, never within ``T - 1`` steps before
an id that was already ``T - 1`` steps from the write head), so they never touch the
mask: the sum is recomputed only when the episode starts change.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.sampling.episodes import EpisodeIndex
from replaybuffer.sampling.ring import Ring


class OutsideMass:
    """Cached mass of the interior segments' outside steps, for one ``num_steps`` at a
    time (another ``num_steps`` rebuilds it).

    Args:
        capacity: storage positions (the mask is bool ``[capacity]``, made on first use).
    """

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._mask: np.ndarray | None = None
        self._ids: np.ndarray | None = None  # the interior outside ids cached (identity key)
        self._num_steps = 0
        self._positions = np.zeros(0, np.int64)
        self._mass: float | None = None
        # The end segments' positions, for the (ids, rows) arrays they came from (the
        # episode index caches those per ring state: a new pair means a new state).
        self._end_ids: np.ndarray | None = None
        self._end_positions = np.zeros(0, np.int64)

    def reset(self) -> None:
        """Forget the cache (the leaves were replaced: a clear or a restore)."""
        if self._mask is not None:
            self._mask[self._positions] = False
        self._ids, self._positions, self._mass = None, np.zeros(0, np.int64), None
        self._end_ids = None

    def touch(self, positions: np.ndarray) -> None:
        """Priorities at ``positions`` (int64 ``[K]``) were written."""
        if self._mass is not None and self._mask is not None and self._mask[positions].any():
            self._mass = None

    def get(self, ring: Ring, num_steps: int, episodes: EpisodeIndex,
            leaves: np.ndarray) -> float:
        """The summed ``leaves`` (float64 ``[capacity]``) of every step that cannot start
        a window of ``num_steps`` within an episode."""
        (ids, rows), (end_ids, end_rows) = episodes.outside_parts(ring, num_steps)
        if ids is not self._ids or num_steps != self._num_steps:
            if self._mask is None:
                self._mask = np.zeros(self._capacity, bool)
            self._mask[self._positions] = False
            self._positions = ring.positions(ids, rows)
            self._mask[self._positions] = True
            self._ids, self._num_steps, self._mass = ids, num_steps, None
        if self._mass is None:
            self._mass = float(leaves[self._positions].sum())
        if not len(end_ids):
            return self._mass
        if end_ids is not self._end_ids:
            self._end_ids, self._end_positions = end_ids, ring.positions(end_ids, end_rows)
        return self._mass + float(leaves[self._end_positions].sum())
