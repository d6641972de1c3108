"""Proportional prioritized sampling (Schaul et al., 2016) over a ring of windows.

Each storage position (one step of one row) has a priority ``p``; a window is drawn
with probability ``p_start ** alpha / sum(p ** alpha)`` over the valid window starts,
so with ``num_steps > 1`` the priority is that of the window's first step. Sum and
min trees over positions give ``O(K log N)`` draws and updates.

Validity without range queries: positions never written, or emptied by a clear, hold
priority 0 and are never drawn. The only positions with mass that are not valid
starts for a window of ``T`` steps are the newest ``T - 1`` steps of every row (a
window starting there would cross the write head). Their mass is subtracted from the
total for the probabilities, and a draw landing on one is redrawn: rejection keeps
the distribution exactly proportional over the valid starts.

Item ids: ``BufferInfo.ids`` of a prioritized buffer identify one step of one row,
``(base + id) * batch_size + row``, where ``id`` is the logical add id and ``base``
counts the ids used before the last ``clear()``, so ids are never reused. For one row
and no clear they equal TF-Agents' add ids. ``update_priorities`` maps an id back to
its position and ignores ids whose step has been overwritten (stale ids).

Importance weights: ``w_i = (N * P(i)) ** -beta / max_w`` with ``N`` the steps stored.
By default (``normalize="batch"``, as Dopamine does) ``max_w`` is the largest weight in
the batch, so every batch's largest weight is exactly 1. With ``normalize="buffer"``
(as OpenAI baselines does) it is ``(N * P_min) ** -beta`` for the smallest positive
priority stored, so that the largest weight any stored step could get is 1; that
needs a min tree, which doubles the cost of every priority update.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling.episodes import EpisodeIndex, no_window_error
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices, make_rng
from replaybuffer.sampling.segment_tree import MinTree, SumTree

_FLUSH_AT = 4096  # pending new-step priorities applied in one tree update


class PrioritizedSampler:
    """Draws window starts in proportion to ``priority ** alpha``.

    Args:
        capacity: storage positions (``batch_size * max_length``).
        alpha: how much prioritization is used (0: uniform), >= 0.
        beta: importance-sampling exponent in [0, 1]; annealed linearly to
            ``beta_final`` over ``beta_steps`` sample calls when those are given.
        seed: seed of the generator.
    """

    def __init__(self, capacity: int, alpha: float = 0.6, beta: float = 0.4, *,
                 beta_final: float | None = None, beta_steps: int = 0,
                 seed: int | None = None, normalize: str = "batch"):
        for name, value, hi in (("alpha", alpha, math.inf), ("beta", beta, 1.0),
                                ("beta_final", 1.0 if beta_final is None else beta_final, 1.0)):
            if not isinstance(value, (int, float)) or not 0.0 <= value <= hi:
                raise ValueError(f"{name} must be a number in [0, {hi}], got {value!r}")
        if normalize not in ("batch", "buffer"):
            raise ValueError(f"normalize must be 'batch' or 'buffer', got {normalize!r}")
        if isinstance(beta_steps, bool) or not isinstance(beta_steps, int) or beta_steps < 0:
            raise ValueError(f"beta_steps must be a non-negative int, got {beta_steps!r}")
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.beta_start = float(beta)
        self.beta_final = None if beta_final is None else float(beta_final)
        self.beta_steps = beta_steps
        self._rng = make_rng(seed)
        self.normalize = normalize
        self._sum = SumTree(self.capacity)
        self._min = MinTree(self.capacity) if normalize == "buffer" else None
        self.max_priority = 1.0
        self.sample_calls = 0
        self.key_base = 0
        self._pending: list[tuple[np.ndarray, float]] = []
        self._pending_count = 0

    # ---------------------------------------------------------------- schedule
    @property
    def beta(self) -> float:
        """The importance-sampling exponent for the next sample call."""
        if self.beta_final is None or self.beta_steps == 0:
            return self.beta_start
        frac = min(1.0, self.sample_calls / self.beta_steps)
        return self.beta_start + frac * (self.beta_final - self.beta_start)

    # ------------------------------------------------------------------- trees
    def _set(self, positions: np.ndarray, priorities: np.ndarray) -> None:
        """Store raw priorities (already checked) at positions."""
        scaled = np.power(priorities, self.alpha) if self.alpha != 1.0 else priorities
        if self.alpha == 0.0:  # 0 ** 0 is 1, but a zero priority must stay unsampled
            scaled = np.where(priorities > 0, 1.0, 0.0)
        self._sum.update(positions, scaled)
        if self._min is not None:
            self._min.update(positions, np.where(scaled > 0, scaled, np.inf))

    def _flush(self) -> None:
        if not self._pending:
            return
        positions = np.concatenate([p for p, _ in self._pending])
        values = np.concatenate([np.full(len(p), v) for p, v in self._pending])
        self._pending.clear()
        self._pending_count = 0
        self._set(positions, values)  # later entries win, as in the trees' update

    def on_add(self, ring: Ring, first_id: int, num_steps: int) -> None:
        """New steps enter at the largest priority seen so far."""
        kept = min(num_steps, ring.max_length)
        ids = np.arange(first_id + num_steps - kept, first_id + num_steps, dtype=np.int64)
        positions = ring.positions(ids[:, None], np.arange(ring.batch_size)).ravel()
        # Deferred: one tree update per flush instead of one per add keeps add_batch cheap.
        self._pending.append((positions, self.max_priority))
        self._pending_count += len(positions)
        if self._pending_count >= _FLUSH_AT:
            self._flush()

    def on_clear(self, ring: Ring) -> None:
        """Forget all priorities; ids keep growing so that old ids stay stale."""
        self.key_base += ring.last_id + 1
        self._pending.clear()
        self._pending_count = 0
        self._sum = SumTree(self.capacity)
        self._min = MinTree(self.capacity) if self._min is not None else None
        self.max_priority = 1.0

    # ---------------------------------------------------------------- sampling
    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None,
               episodes: EpisodeIndex | None = None
               ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        self._flush()
        rng = rng or self._rng
        leaves = self._sum.leaves  # positions below come from the ring: valid by construction
        if episodes is None:
            positions, ids, valid_mass = self._draw_in_range(ring, sample_batch_size,
                                                             num_steps, rng)
        else:
            positions, ids, valid_mass = self._draw_within(ring, sample_batch_size,
                                                           num_steps, rng, episodes)
        probabilities = leaves[positions] / valid_mass
        beta = self.beta
        n = ring.num_frames
        weights = np.power(n * probabilities, -beta)
        if self._min is None:  # the batch's largest weight is 1
            weights /= weights.max()
        else:  # the largest weight any stored step could get is 1
            weights /= (n * self._min.min() / valid_mass) ** -beta
        self.sample_calls += 1
        return SampleIndices(ids, positions), {
            "probabilities": probabilities.astype(np.float32),
            "weights": np.minimum(weights, 1.0).astype(np.float32)}

    def _draw_in_range(self, ring: Ring, count: int, num_steps: int,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
        """Draw starts in proportion to priority among the valid window starts.

        In the slot-major layout the valid starts of every row form one cyclic range of
        positions, so targets are drawn inside that range's share of the prefix sums:
        exact, with no rejection however little of the mass the range holds.
        """
        lo, hi = ring.valid_start_range(num_steps)
        first = (lo % ring.max_length) * ring.batch_size
        span = (hi - lo) * ring.batch_size
        segments = [(first, min(first + span, ring.capacity))]
        if first + span > ring.capacity:  # the range wraps past the last position
            segments.append((0, first + span - ring.capacity))
        bounds = self._sum.prefix_sum(np.array([p for seg in segments for p in seg]))
        starts, masses = bounds[0::2], bounds[1::2] - bounds[0::2]
        valid_mass = float(masses.sum())
        self._require_mass(valid_mass, num_steps)
        u = rng.random(count) * valid_mass
        # Rounding can land a target a hair outside the range: redraw those (rare).
        for _ in range(100):
            targets = np.where(u < masses[0], starts[0] + u, starts[-1] + u - masses[0])
            positions = self._sum.find_prefix(targets)
            ids = self._ids_of(ring, positions)
            bad = ids >= hi
            if not bad.any():
                return positions, ids, valid_mass
            u[bad] = rng.random(int(bad.sum())) * valid_mass
        raise RuntimeError("prioritized sampling could not find valid windows")  # pragma: no cover

    def _draw_within(self, ring: Ring, count: int, num_steps: int, rng: np.random.Generator,
                     episodes: EpisodeIndex) -> tuple[np.ndarray, np.ndarray, float]:
        """Draw starts in proportion to priority among windows inside one episode.

        Rejection from the whole tree while it accepts often; otherwise the exact
        distribution over the enumerated valid windows (``O(windows)``, a fallback).
        """
        leaves = self._sum.leaves
        total = self._sum.total()
        if episodes.count(ring, num_steps) == 0:
            raise no_window_error(num_steps)
        outside = ring.positions(*episodes.outside(ring, num_steps))
        valid_mass = total - (float(leaves[outside].sum()) if len(outside) else 0.0)
        if valid_mass > 1e-3 * total:  # rejection accepts often enough (and is exact)
            positions = self._sum.find_prefix(rng.random(count) * total)
            ids = self._ids_of(ring, positions)
            for _ in range(64):
                bad = ~episodes.within(ring, ids, positions % ring.batch_size, num_steps)
                if not bad.any():
                    return positions, ids, valid_mass
                redraw = self._sum.find_prefix(rng.random(int(bad.sum())) * total)
                positions[bad] = redraw
                ids[bad] = self._ids_of(ring, redraw)
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
        self._require_mass(valid_mass, num_steps)
        picks = np.searchsorted(cumulative, rng.random(count) * valid_mass, side="right")
        picks = np.minimum(picks, len(cumulative) - 1)
        return valid_positions[picks], valid_ids[picks].copy(), valid_mass

    @staticmethod
    def _require_mass(valid_mass: float, num_steps: int) -> None:
        if not valid_mass > 0.0:
            raise EmptyBufferError(f"every window of num_steps={num_steps} has priority 0; "
                                   "update_priorities with positive values first")

    @staticmethod
    def _ids_of(ring: Ring, positions: np.ndarray) -> np.ndarray:
        """Logical ids of the steps at stored positions."""
        slots = positions // ring.batch_size
        oldest = ring.oldest_id
        return oldest + (slots - oldest % ring.max_length) % ring.max_length

    def spawn_rng(self) -> np.random.Generator:
        return make_rng(int(self._rng.integers(0, 2**63 - 1)))

    # ---------------------------------------------------------------- item ids
    def item_ids(self, ring: Ring, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Item ids (module docstring) of steps given by logical id and position."""
        return (self.key_base + ids) * ring.batch_size + positions % ring.batch_size

    def update_priorities(self, ring: Ring, item_ids: np.ndarray,
                          priorities: np.ndarray) -> int:
        """Set priorities of the steps behind ``item_ids`` (checked by the caller).

        Returns how many were applied; ids of overwritten (or cleared) steps are ignored.
        """
        self._flush()
        B = ring.batch_size
        ids = item_ids // B - self.key_base
        live = (ids >= ring.oldest_id) & (ids <= ring.last_id) & (item_ids >= 0)
        if not live.any():
            return 0
        positions = ring.positions(ids[live], item_ids[live] % B)
        values = priorities[live]
        self._set(positions, values)
        self.max_priority = max(self.max_priority, float(values.max()))
        return int(live.sum())

    def priorities(self, ring: Ring, item_ids: np.ndarray) -> np.ndarray:
        """Current ``priority ** alpha`` of live item ids (NaN for stale ones)."""
        self._flush()
        B = ring.batch_size
        ids = item_ids // B - self.key_base
        live = (ids >= ring.oldest_id) & (ids <= ring.last_id) & (item_ids >= 0)
        out = np.full(item_ids.shape, np.nan)
        out[live] = self._sum.get(ring.positions(ids[live], item_ids[live] % B))
        return out

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        self._flush()
        return {"rng": self._rng.bit_generator.state, "max_priority": self.max_priority,
                "sample_calls": self.sample_calls, "key_base": self.key_base,
                "priorities": self._sum.state_dict()["leaves"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        leaves = np.asarray(state["priorities"], np.float64)
        if leaves.shape != (self.capacity,):
            raise ValueError(f"priorities of shape {leaves.shape} for a capacity of "
                             f"{self.capacity}")
        self._sum.load_state_dict({"leaves": leaves})
        if self._min is not None:
            self._min.load_state_dict({"leaves": np.where(leaves > 0, leaves, np.inf)})
        self._rng.bit_generator.state = state["rng"]
        self.max_priority = float(state["max_priority"])
        self.sample_calls = int(state["sample_calls"])
        self.key_base = int(state["key_base"])
        self._pending.clear()
        self._pending_count = 0
