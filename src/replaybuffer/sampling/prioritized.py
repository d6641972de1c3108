"""Proportional prioritized sampling (Schaul et al., 2016) over a ring of windows.

Each storage position (one step of one row) has a priority ``p``; a window is drawn
with probability ``p_start ** alpha / sum(p ** alpha)`` over the valid window starts,
so with ``num_steps > 1`` the priority is that of the window's first step. A sum tree
over positions (:mod:`replaybuffer.sampling.segment_tree`) keeps the total and the
prefix sums exact under ``O(K log N)`` updates.

Validity without range queries: positions never written, or emptied by a clear, hold
priority 0 and are never drawn. The only positions with mass that are not valid
starts for a window of ``T`` steps are the newest ``T - 1`` steps of every row (a
window starting there would cross the write head). In the slot-major layout the valid
starts of every row form one cyclic range of positions.

Two exact ways to draw, chosen per call:

- Rejection (the usual case): a candidate drawn uniformly from the valid range is kept
  with probability ``p ** alpha / bound``, where ``bound >= max(p ** alpha)`` is
  ``max_priority ** alpha`` (every stored priority is at most ``max_priority``). Kept
  candidates are exactly proportional draws, in the order drawn. A batch costs a dozen
  numpy calls over about ``K / a`` candidates, ``a = valid_mass / (range * bound)``
  being the chance of keeping one, against about five calls per tree level for a
  descent; it is used while ``a >= 1/4``.
- Descent: targets drawn uniformly inside the range's share of the prefix sums, found
  in the sum tree. Used when a few high priorities make ``a`` small.

Item ids: ``BufferInfo.ids`` of a prioritized buffer identify one step of one row,
``(base + id) * batch_size + row``, where ``id`` is the logical add id and ``base``
counts the ids used before the last ``clear()``, so ids are never reused. For one row
and no clear they equal TF-Agents' add ids. ``update_priorities`` maps an id back to
its position and ignores ids whose step has been overwritten (stale ids).

Importance weights: ``w_i = (N * P(i)) ** -beta / max_w`` with ``N`` the steps stored.
By default (``normalize="batch"``, as Dopamine does) ``max_w`` is the largest weight in
the batch, so every batch's largest weight is exactly 1: ``N`` and the valid mass
cancel, leaving ``w_i = (v_i / min_j v_j) ** -beta`` for the batch's ``v = p ** alpha``.
With ``normalize="buffer"`` (as OpenAI baselines does) it is ``(N * P_min) ** -beta``
for the smallest positive priority stored, so that the largest weight any stored step
could get is 1; that needs a min tree, which doubles the cost of every priority update.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.episodes import EpisodeIndex, no_window_error
from replaybuffer.sampling.importance import probabilities_and_ratios
from replaybuffer.sampling.outside_mass import OutsideMass
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices, make_rng
from replaybuffer.sampling.segment_tree import MinTree, SumTree

_FLUSH_AT = 4096  # pending new-step priorities applied in one tree update

#: Draw by rejection while a uniform candidate is kept at least this often (module
#: docstring). At 1/4 a batch of 256 takes about 1,200 candidates, still well under
#: the cost of a descent through a tree of 1e5-1e6 slots.
ACCEPT_MIN = 0.25

#: Relative slack on the rejection bound: ``np.power`` (vectorised) and ``math.pow`` may
#: round ``p ** alpha`` a few ulp (2 ** -52 each) apart.
_BOUND_SLACK = 1.0 + 2.0 ** -40

#: ``segments`` for :meth:`PrioritizedSampler._draw_descending`: the whole tree.
_WHOLE: Any = (None, None)

#: Below the largest float by more than any slack used here.
_FINITE = 1e307

#: The most candidates in one round (a bound on memory when few are kept).
_POOL_MAX = 1 << 20

#: Rounds of rejection before the rest of a batch is drawn by descent. Each round's pool
#: is sized to fill the batch with probability ~99%, so a second round is rare and a
#: sixteenth unheard of.
_ROUNDS = 16


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
        # A bound on stored priority ** alpha beyond max_priority ** alpha: 0 unless a
        # restored state holds priorities above its max_priority (see load_state_dict).
        self._floor = 0.0
        # Draw by rejection while a candidate is kept at least this often (tests set it
        # above 1 or to 0 to force one way).
        self._accept_min = ACCEPT_MIN
        # The mass of steps that cannot start a window within an episode (made on the
        # first such draw; every write of priorities goes past it).
        self._outside: OutsideMass | None = None

    # ---------------------------------------------------------------- schedule
    @property
    def beta(self) -> float:
        """The importance-sampling exponent for the next sample call."""
        if self.beta_final is None or self.beta_steps == 0:
            return self.beta_start
        frac = min(1.0, self.sample_calls / self.beta_steps)
        return self.beta_start + frac * (self.beta_final - self.beta_start)

    # ------------------------------------------------------------------- trees
    def _set(self, positions: np.ndarray, priorities: np.ndarray, largest: float) -> None:
        """Store raw priorities (float64 ``[K]``, ``K >= 1``, checked: finite and >= 0)
        at positions (int64 ``[K]``, in range); ``largest`` is ``priorities.max()``."""
        if self.alpha == 1.0:
            scaled = priorities
        elif self.alpha == 0.0:  # 0 ** 0 is 1, but a zero priority must stay unsampled
            scaled = np.where(priorities > 0, 1.0, 0.0)
            largest = 1.0
        else:
            scaled = np.power(priorities, self.alpha)
            # A bound of scaled.max() without another pass over it (math.pow and the
            # vectorised np.power round a few ulp apart, far inside the slack).
            try:
                largest = math.pow(largest, self.alpha) * _BOUND_SLACK
            except OverflowError:
                largest = math.inf
        if largest < _FINITE:
            self._sum.assign(positions, scaled, largest)
        else:  # priority ** alpha may have overflowed: the checked update reports it
            self._sum.update(positions, scaled)
        if self._min is not None:
            self._min.assign(positions, np.where(scaled > 0, scaled, np.inf))
        if self._outside is not None:
            self._outside.touch(positions)

    def _bound(self) -> float:
        """An upper bound of every stored ``priority ** alpha`` (``inf`` if unknown)."""
        try:
            top = math.pow(self.max_priority, self.alpha)
        except OverflowError:
            return math.inf
        return max(top, self._floor) * _BOUND_SLACK

    def _flush(self) -> None:
        if not self._pending:
            return
        positions = np.concatenate([p for p, _ in self._pending])
        values = np.concatenate([np.full(len(p), v) for p, v in self._pending])
        largest = max(v for _, v in self._pending)
        self._pending.clear()
        self._pending_count = 0
        self._set(positions, values, largest)  # later entries win, as in the trees' update

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
        self._floor = 0.0
        if self._outside is not None:
            self._outside.reset()

    # ---------------------------------------------------------------- sampling
    def valid_mass(self, ring: Ring, num_steps: int) -> float:
        """The summed ``priority ** alpha`` of the steps that may start a window of
        ``num_steps`` now (what one draw is proportional to); 0.0 when there are none."""
        if self._pending:
            self._flush()
        if ring.last_id + 1 < num_steps:
            return 0.0
        hi = ring.valid_start_range(num_steps)[1]
        outside = (ring.last_id + 1 - hi) * ring.batch_size
        excluded = _cyclic_sum(self._sum.leaves, (hi % ring.max_length) * ring.batch_size,
                               outside, ring.capacity) if outside else 0.0
        return max(0.0, self._sum.total() - excluded)

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None,
               episodes: EpisodeIndex | None = None
               ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        if self._pending:
            self._flush()
        rng = rng or self._rng
        if episodes is None:
            positions, ids, values, valid_mass = self._draw_in_range(
                ring, sample_batch_size, num_steps, rng)
        else:
            positions, ids, valid_mass = self._draw_within(ring, sample_batch_size,
                                                           num_steps, rng, episodes)
            values = self._sum.leaves[positions]
        # Divisions in float64, each rounded once to the float32 result, and the power in
        # float32 (the result is float32 anyway, and float32's power is cheaper). The
        # weight is (v_min / v) ** beta: a ratio <= 1 cannot overflow float32, stays
        # <= 1 when rounded, and is exactly 1 for the smallest value.
        if self._min is None:  # the batch's largest weight is 1 (module docstring)
            probabilities, weights = probabilities_and_ratios(values, valid_mass)
            np.power(weights, self.beta, out=weights)
        else:  # the largest weight any stored step could get is 1
            probabilities, weights = probabilities_and_ratios(values, valid_mass,
                                                              self._min.min())
            np.power(weights, self.beta, out=weights)
            np.minimum(weights, 1.0, out=weights)
        self.sample_calls += 1
        return SampleIndices(ids, positions), {"probabilities": probabilities,
                                               "weights": weights}

    def _draw_in_range(self, ring: Ring, count: int, num_steps: int,
                       rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Draw starts in proportion to priority among the valid window starts.

        Returns ``(positions, ids, values, valid_mass)``: int64 ``[count]`` positions
        and logical ids, float64 ``[count]`` their ``priority ** alpha``, and the mass
        of the valid starts.
        """
        lo, hi = ring.valid_start_range(num_steps)
        B, L, cap = ring.batch_size, ring.max_length, ring.capacity
        first = (lo % L) * B  # the valid starts: the cyclic range [first, first + span)
        span = (hi - lo) * B
        total = self._sum.total()
        # The only mass outside the range: the newest num_steps - 1 steps of each row.
        outside = (ring.last_id + 1 - hi) * B
        excluded = _cyclic_sum(self._sum.leaves, (hi % L) * B, outside, cap) if outside else 0.0
        segments = None
        if excluded <= 0.5 * total:
            valid_mass = total - excluded  # loses at most a bit or two to cancellation
        else:  # mostly outside: sum the range itself, with no cancellation
            segments = self._segments(first, span, cap)
            valid_mass = float(segments[1].sum())
        self._require_mass(valid_mass, num_steps)
        bound = self._bound()
        accept = valid_mass / (span * bound)
        drawn = None
        if accept >= self._accept_min and accept > 0.0:  # (0: no finite bound)
            drawn = self._draw_rejecting(ring, rng, count, lo, span, bound, min(accept, 1.0))
        if drawn is None or len(drawn[0]) < count:  # descent, for all or the rest
            rest = count - (0 if drawn is None else len(drawn[0]))
            if segments is None and excluded * rest < 0.05 * total:
                segments = _WHOLE  # targets in the whole tree, the few outside redrawn
            more = self._draw_descending(ring, rest, rng, first, span, hi, segments)
            drawn = more if drawn is None else (np.concatenate((drawn[0], more[0])),
                                                np.concatenate((drawn[1], more[1])),
                                                np.concatenate((drawn[2], more[2])))
        return (*drawn, valid_mass)

    def _draw_rejecting(self, ring: Ring, rng: np.random.Generator, count: int, lo: int,
                        span: int, bound: float, accept: float
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Up to ``count`` valid starts, in proportion to their values, by rejection.

        The valid starts are the ``span`` steps-and-rows from id ``lo`` on (the cyclic
        position range ``[first, first + span)`` in slot-major order). Each candidate is
        uniform over them and kept with probability ``value / bound`` (``bound`` >= every
        value), so each kept one is an exact proportional draw, independent of the
        others; kept ones are returned in the order drawn. ``accept`` is the chance of
        keeping a candidate, ``valid_mass / (span * bound)``.

        Returns ``(positions, ids, values)`` (int64, int64, float64), fewer than
        ``count`` only after :data:`_ROUNDS` short rounds (practically never).
        """
        slots = self._sum.leaves
        B, L, cap = ring.batch_size, ring.max_length, ring.capacity
        first = (lo % L) * B
        # Offsets are floor(u * span) for u uniform in [0, 1). With span itself the
        # product can round up to span (u = 1 - 2**-53, span a power of two); scaled by
        # 1 - 2**-53 it stays below span, and the buckets change by 2**-53 relative.
        scale = span * (1.0 - 2.0 ** -53)
        kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        need = count
        for _ in range(_ROUNDS):
            n = _pool_size(need, accept)
            u = rng.random(2 * n)
            pick = u[:n]
            pick *= scale
            offset = pick.astype(np.int64)  # in [0, span)
            if B == 1:  # the offset counts steps: the id is lo + offset
                ids = offset
                ids += lo
                pos = ids % L if lo else ids  # ids below max_length are their positions
            else:
                ids = None
                pos = offset
                pos += first
                if first + span > cap:  # the range wraps past the last position
                    pos[pos >= cap] -= cap
            vals = slots[pos]
            # The first `need` kept (never a value of 0); indices gather faster than masks.
            keep = (u[n:] * bound < vals).nonzero()[0][:need]
            pos, vals = pos[keep], vals[keep]
            ids = self._ids_of(ring, pos) if ids is None else ids[keep]
            kept.append((pos, ids, vals))
            need -= len(pos)
            if not need:
                break
        if len(kept) == 1:
            return kept[0]
        positions, ids_kept, values = zip(*kept)
        return np.concatenate(positions), np.concatenate(ids_kept), np.concatenate(values)

    def _segments(self, first: int, span: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, masses)``, float64 ``[S]``: the prefix sum before each of the
        ``S <= 2`` position segments of the cyclic range ``[first, first + span)``, and
        the segment's mass."""
        ends = [first, min(first + span, cap)]
        if first + span > cap:  # the range wraps past the last position
            ends += [0, first + span - cap]
        bounds = self._sum.sums_before(np.array(ends, np.int64))
        return bounds[0::2], bounds[1::2] - bounds[0::2]

    def _draw_descending(self, ring: Ring, count: int, rng: np.random.Generator,
                         first: int, span: int, hi: int,
                         segments: tuple[np.ndarray, np.ndarray] | None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``count`` starts of the cyclic position range ``[first, first + span)``, in
        proportion to their values, by descent of the sum tree: targets are drawn
        inside the range's share of the prefix sums, so this is exact however little
        of the mass the range holds. ``hi`` bounds the ids of valid starts;
        ``segments`` is :meth:`_segments` output if known, or :data:`_WHOLE` to draw
        over the whole tree and redraw the starts outside the range (cheaper while the
        range holds all but a sliver of the mass).

        Returns ``(positions, ids, values)`` (int64, int64, float64 ``[count]``).
        """
        spans: tuple[np.ndarray, np.ndarray] | None  # (starts, masses)
        if segments is _WHOLE:  # the whole tree: exact too, since starts outside it are
            spans = None  # redrawn below, but rarely worth a prefix sum
            mass = self._sum.total()
        else:
            spans = segments if segments is not None else \
                self._segments(first, span, ring.capacity)
            mass = float(spans[1].sum())
        u = rng.random(count) * mass
        # Rounding can land a target a hair outside the range: redraw those (rare).
        for _ in range(100):
            if spans is None:
                targets = u
            elif len(spans[0]) == 1:
                targets = spans[0][0] + u
            else:
                starts, masses = spans
                targets = np.where(u < masses[0], starts[0] + u, starts[-1] + u - masses[0])
            positions, values = self._sum.find(targets)
            ids = self._ids_of(ring, positions)
            if ids.max() < hi:  # one reduction for the usual all-valid batch
                return positions, ids, values
            bad = ids >= hi
            u[bad] = rng.random(int(bad.sum())) * mass
        raise RuntimeError("prioritized sampling could not find valid windows")  # pragma: no cover

    def _draw_within(self, ring: Ring, count: int, num_steps: int, rng: np.random.Generator,
                     episodes: EpisodeIndex) -> tuple[np.ndarray, np.ndarray, float]:
        """Draw starts in proportion to priority among windows inside one episode.

        Rejection from the whole tree while it accepts often; otherwise the exact
        distribution over the enumerated valid windows (``O(windows)``, a fallback).
        The valid mass is the total less the outside steps' mass
        (:mod:`~replaybuffer.sampling.outside_mass`: cached, ``O(B T)`` per call while
        no episode starts come or go); it only picks the way and scales the
        probabilities and sizes the pools, rejection itself never reads it.
        """
        leaves = self._sum.leaves
        total = self._sum.total()
        if episodes.count(ring, num_steps) == 0:
            raise no_window_error(num_steps)
        if self._outside is None:
            self._outside = OutsideMass(self.capacity)
        valid_mass = total - self._outside.get(ring, num_steps, episodes, leaves)
        if valid_mass > 1e-3 * total:  # rejection accepts often enough (and is exact)
            # Candidates from the whole tree, kept if they start a window within an
            # episode (which they do with probability valid_mass / total): kept ones,
            # in the order drawn, are exact draws. A pool sized to fill the batch in
            # one round saves the second round (a descent and a check) that redrawing
            # the few rejected ones took.
            accept = min(valid_mass / total, 1.0)
            kept: list[tuple[np.ndarray, np.ndarray]] = []
            need = count
            for _ in range(_ROUNDS):
                positions = self._sum.find_prefix(rng.random(_pool_size(need, accept)) * total)
                ids = self._ids_of(ring, positions)
                keep = episodes.within(ring, ids, positions % ring.batch_size,
                                       num_steps).nonzero()[0][:need]
                kept.append((positions[keep], ids[keep]))
                need -= len(keep)
                if not need:
                    if len(kept) == 1:
                        return (*kept[0], valid_mass)
                    return (np.concatenate([p for p, _ in kept]),
                            np.concatenate([i for _, i in kept]), valid_mass)
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
        """Logical ids (int64, a new array) of the steps at stored positions."""
        slots = positions // ring.batch_size if ring.batch_size > 1 else positions
        oldest = ring.oldest_id
        if not oldest:  # the ring has not wrapped: the slot is the id
            return slots.copy() if slots is positions else slots
        ids = slots - oldest % ring.max_length
        ids %= ring.max_length
        ids += oldest
        return ids

    def spawn_rng(self) -> np.random.Generator:
        return make_rng(int(self._rng.integers(0, 2**63 - 1)))

    # ---------------------------------------------------------------- item ids
    def item_ids(self, ring: Ring, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Item ids (module docstring) of steps given by logical id and position; may
        return ``ids`` itself (one row, no clear yet: the item ids are the ids)."""
        if ring.batch_size == 1:
            return ids + self.key_base if self.key_base else ids
        item_ids: np.ndarray = (self.key_base + ids) * ring.batch_size \
            + positions % ring.batch_size
        return item_ids

    def update_priorities(self, ring: Ring, item_ids: np.ndarray, priorities: np.ndarray,
                          largest: float | None = None) -> int:
        """Set priorities of the steps behind ``item_ids`` (int64 ``[S]``) to
        ``priorities`` (float64 ``[S]``, checked by the caller: finite and >= 0).

        ``largest`` is ``priorities.max()`` if the caller knows it. Returns how many
        were applied; ids of overwritten (or cleared) steps are ignored.
        """
        if self._pending:
            self._flush()
        B = ring.batch_size
        if tree_kernels.AVAILABLE and item_ids.size:  # all live, the usual case, in one call
            positions, all_live = _live_positions(item_ids, self.key_base, B, ring.oldest_id,
                                                  ring.last_id, ring.max_length)
            if all_live:
                if largest is None:
                    largest = float(np.maximum.reduce(priorities))
                self._set(positions, priorities, largest)
                self.max_priority = max(self.max_priority, largest)
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
        """Current ``priority ** alpha`` of live item ids (NaN for stale ones)."""
        self._flush()
        live, positions = self._live(ring, item_ids)
        out = np.full(item_ids.shape, np.nan)
        out[live] = self._sum.get(positions)
        return out

    def _live(self, ring: Ring, item_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(live, positions)``: bool ``[K]``, whether each item id names a stored step,
        and int64 positions of the live ones."""
        B = ring.batch_size
        ids = item_ids // B - self.key_base
        live = (ids >= ring.oldest_id) & (ids <= ring.last_id) & (item_ids >= 0)
        return live, ring.positions(ids[live], item_ids[live] % B)

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        self._flush()
        return {"rng": self._rng.bit_generator.state, "max_priority": self.max_priority,
                "sample_calls": self.sample_calls, "key_base": self.key_base,
                "bound_floor": self._floor, "priorities": self._sum.state_dict()["leaves"]}

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
        # The rejection bound, as saved (states from before it start at 0). A consistent
        # state stores nothing above it; one that does (edited, or from elsewhere)
        # raises it to its largest value, so that the bound holds.
        self._floor = float(state.get("bound_floor", 0.0))
        largest = float(leaves.max()) if leaves.size else 0.0
        if largest > self._bound():
            self._floor = largest
        self.sample_calls = int(state["sample_calls"])
        self.key_base = int(state["key_base"])
        self._pending.clear()
        self._pending_count = 0
        if self._outside is not None:
            self._outside.reset()


@tree_kernels.compile_kernel
def _live_positions(item_ids: np.ndarray, key_base: int, batch_size: int, oldest: int,
                    last_id: int, max_length: int) -> tuple[np.ndarray, bool]:
    """:meth:`PrioritizedSampler.update_priorities`' usual case compiled: the storage
    positions (int64 ``[S]``) of item ids (int64 ``[S]``), and whether all of them are
    live (``oldest <= id <= last_id``); when not, the positions are incomplete and the
    caller takes the numpy path, which drops the stale ones."""
    count = item_ids.shape[0]
    positions = np.empty(count, np.int64)
    for k in range(count):
        item = item_ids[k]
        step = item // batch_size - key_base  # (floor division, as numpy's)
        if item < 0 or step < oldest or step > last_id:
            return positions, False
        positions[k] = (step % max_length) * batch_size + item % batch_size
    return positions, True


def _pool_size(need: int, accept: float) -> int:
    """Candidates for one round of rejection that keep ``need`` or more with probability
    ~99% (2.5 standard deviations of the binomial count kept) when each is kept with
    probability ``accept`` (in ``(0, 1]``), so one round usually does; at most
    :data:`_POOL_MAX`."""
    n = math.ceil((need + 2.5 * math.sqrt(need * (1.0 - accept)) + 2.0) / accept)
    return min(n, _POOL_MAX)


def _cyclic_sum(values: np.ndarray, start: int, count: int, size: int) -> float:
    """The sum of ``count`` (1 to ``size``) entries of ``values`` (float64 ``[size]``)
    from ``start``, wrapping past the end."""
    if count == 1:
        return float(values[start])
    end = start + count
    if end <= size:
        return float(values[start:end].sum())
    return float(values[start:].sum()) + float(values[:end - size].sum())
