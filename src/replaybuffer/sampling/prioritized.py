"""Proportional prioritized sampling (Schaul et al., 2016) over a ring of windows.

Each storage position (one step of one row) has a priority ``p``; a window is drawn
with probability ``p_start ** alpha / sum(p ** alpha)`` over the valid window starts,
so with ``num_steps > 1`` the priority is that of the window's first step. A sum tree
over positions (:mod:`replaybuffer.sampling.trees`) keeps the total and the
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
  descent; it is used while ``a >= 1/4`` (:mod:`~replaybuffer.sampling.rejection`;
  with numba, the candidates, the keep test and the weights are one compiled call,
  :mod:`~replaybuffer.sampling.fused_rejection`).
- Descent: targets drawn uniformly inside the range's share of the prefix sums, found
  in the sum tree. Used when a few high priorities make ``a`` small
  (:mod:`~replaybuffer.sampling.proportional_descent`; with numba, the draw, the search
  and the weights are one compiled call, :mod:`~replaybuffer.sampling.fused_descent`).

Within episodes (``episodes=``), draws are made among the windows inside one episode
(:mod:`~replaybuffer.sampling.episode_draws`).

Item ids: ``BufferInfo.ids`` of a prioritized buffer identify one step of one row,
``(base + id) * batch_size + row``, where ``id`` is the logical add id and ``base``
counts the ids used before the last ``clear()``, so ids are never reused. For one row
and no clear they equal TF-Agents' add ids. ``update_priorities`` maps an id back to
its position and ignores ids whose step has been overwritten (stale ids)
(:mod:`~replaybuffer.sampling.item_ids`).

Importance weights: ``w_i = (N * P(i)) ** -beta / max_w`` with ``N`` the steps stored.
By default (``normalize="batch"``, as Dopamine does) ``max_w`` is the largest weight in
the batch, so every batch's largest weight is exactly 1: ``N`` and the valid mass
cancel, leaving ``w_i = (v_i / min_j v_j) ** -beta`` for the batch's ``v = p ** alpha``.
With ``normalize="buffer"`` (as OpenAI baselines does) it is ``(N * P_min) ** -beta``
for the smallest positive priority stored, so that the largest weight any stored step
could get is 1; that needs a min tree, which doubles the cost of every priority update.
``beta`` may be annealed over sample calls (:mod:`~replaybuffer.sampling.beta_schedule`).

The sampler wires these pieces: it holds the trees, the pending priorities of new
steps, the schedule's counters and the generator, writes priorities through its base
:class:`~replaybuffer.sampling.priority_writes.PriorityWrites`, and is
:class:`~replaybuffer.protocols.Checkpointable` (restores are bit-exact).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replaybuffer.sampling.beta_schedule import annealed_beta
from replaybuffer.sampling.episode_draws import draw_within
from replaybuffer.sampling.episodes import EpisodeIndex
from replaybuffer.sampling.fused_descent import draw_weighted
from replaybuffer.sampling.fused_rejection import draw_kept_weighted
from replaybuffer.sampling.importance import probabilities_and_ratios
from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.item_ids import to_item_ids
from replaybuffer.sampling.outside_mass import OutsideMass
from replaybuffer.sampling.priority_writes import PriorityWrites
from replaybuffer.sampling.priority_range import cyclic_sum, range_segments, require_mass
from replaybuffer.sampling.priority_scale import exponent, scaled_bound
from replaybuffer.sampling.proportional_descent import WHOLE, draw_descending
from replaybuffer.sampling.rejection import ACCEPT_MIN, draw_rejecting
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices, check_seed, make_rng
from replaybuffer.sampling.step_draws import StepDraws, Steps
from replaybuffer.sampling.trees import MinTree, SumTree

__all__ = ["ACCEPT_MIN", "PrioritizedSampler"]

_FLUSH_AT = 4096  # pending new-step priorities applied in one tree update


class PrioritizedSampler(StepDraws, PriorityWrites):
    """Draws window starts in proportion to ``priority ** alpha``.

    Args:
        capacity: storage positions (``batch_size * max_length``).
        alpha: how much prioritization is used (0: uniform), >= 0.
        beta: importance-sampling exponent in [0, 1]; annealed linearly to
            ``beta_final`` over ``beta_steps`` sample calls when those are given.
        seed: seed of the generator.
        normalize: ``"batch"`` or ``"buffer"``: what the importance weights are
            divided by (module docstring).
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
        # Checked here so that a bad seed= is named, not left to numpy's SeedSequence.
        self._rng = make_rng(None if seed is None else check_seed(seed))
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
        # Small per-call costs kept out of the usual sample and update: the rejection
        # bound for the max_priority and floor it was made from; the exponents as 0-d
        # arrays (np.power takes a Python float about 0.3 us slower, converting it
        # each call, to the same value); an update's scratch of the last batch size
        # (its scaled values and positions, never handed out).
        self._bound = self._bound_max = self._bound_floor = math.nan
        self._beta_exponent = (math.nan, exponent(0.0, np.float32))
        self._scratch = (np.empty(0), np.empty(0, np.int64))

    # ---------------------------------------------------------------- schedule
    @property
    def beta(self) -> float:
        """The importance-sampling exponent for the next sample call."""
        if self.beta_final is None or self.beta_steps == 0:
            return self.beta_start
        return annealed_beta(self.beta_start, self.beta_final, self.beta_steps,
                             self.sample_calls)

    # ------------------------------------------------------------------- trees
    def _flush(self) -> None:
        """Apply the pending priorities of new steps (:meth:`on_add`) to the trees."""
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
        excluded = cyclic_sum(self._sum.leaves, (hi % ring.max_length) * ring.batch_size,
                              outside, ring.capacity) if outside else 0.0
        return max(0.0, self._sum.total() - excluded)

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None,
               episodes: EpisodeIndex | None = None
               ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        """Draw ``sample_batch_size`` window starts in proportion to ``priority ** alpha``
        (:class:`~replaybuffer.sampling.sampler.Sampler`), with float32 ``[S]``
        ``"probabilities"`` and importance ``"weights"`` (module docstring)."""
        if self._pending:
            self._flush()
        rng = rng or self._rng
        floor = math.nan if self._min is None else self._min.min()
        if episodes is None:
            positions, ids, values, valid_mass, weighted = self._draw_in_range(
                ring, sample_batch_size, num_steps, rng, floor)
            if weighted is not None:  # drawn and weighed in one call (fused_*)
                return self._finish(ids, positions, *weighted)
            assert values is not None
        else:
            if self._outside is None:
                self._outside = OutsideMass(self.capacity)
            positions, ids, valid_mass, weighted = draw_within(
                self._sum, self._outside, ring, sample_batch_size, num_steps, rng,
                episodes, floor)
            if weighted is not None:  # drawn and weighed in one call (episode_kernels)
                return self._finish(ids, positions, *weighted)
            values = self._sum.leaves[positions]
        # Divisions in float64, each rounded once to the float32 result. The weight
        # ratio is v_min / v: a ratio <= 1 cannot overflow float32, stays <= 1 when
        # rounded, and is exactly 1 for the smallest value. With normalize="batch" the
        # batch's largest weight is then 1; with "buffer" (floor: the smallest stored
        # value) the largest weight any stored step could get is.
        return self._finish(ids, positions,
                            *probabilities_and_ratios(values, valid_mass, floor))

    def _general_steps(self, ring: Ring, count: int) -> Steps:
        """:meth:`sample_steps` by the general draw (:meth:`_draw_in_range`): the
        reference of its short path (:mod:`~replaybuffer.sampling.step_draws`), and
        what it takes where that does not apply."""
        floor = math.nan if self._min is None else self._min.min()
        positions, ids, values, valid_mass, weighted = self._draw_in_range(
            ring, count, 1, self._rng, floor)
        if weighted is None:  # (drawn in parts: weighed here)
            assert values is not None
            weighted = probabilities_and_ratios(values, valid_mass, floor)
        probabilities, weights = weighted
        self._raise_to_beta(weights)
        if ring.batch_size > 1 or self.key_base:  # (else the ids are the item ids)
            ids = to_item_ids(ring, self.key_base, ids, positions)
        return ids, positions, probabilities, weights

    def _finish(self, ids: np.ndarray, positions: np.ndarray, probabilities: np.ndarray,
                weights: np.ndarray) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        """The sample's result from its weight ratios (:meth:`_raise_to_beta`)."""
        self._raise_to_beta(weights)
        return SampleIndices(ids, positions), {"probabilities": probabilities,
                                               "weights": weights}

    def _raise_to_beta(self, weights: np.ndarray) -> None:
        """A sample's weight ratios (float32 ``[S]``) raised to ``beta`` in place
        (float32's power, the result being float32 anyway), capped at 1 with
        ``normalize="buffer"``; the sample counted (the schedule's step)."""
        # (self.beta, without its call where nothing is annealed)
        beta = self.beta_start if self.beta_final is None else self.beta
        if self._beta_exponent[0] != beta:  # (annealed: a new one per sample call)
            self._beta_exponent = (beta, exponent(beta, np.float32))
        np.power(weights, self._beta_exponent[1], weights)
        if self._min is not None:
            np.minimum(weights, 1.0, out=weights)
        self.sample_calls += 1

    def _draw_in_range(self, ring: Ring, count: int, num_steps: int,
                       rng: np.random.Generator, floor: float
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, float,
                                  tuple[np.ndarray, np.ndarray] | None]:
        """Draw starts in proportion to priority among the valid window starts, by
        rejection or by descent (module docstring).

        Returns ``(positions, ids, values, valid_mass, weighted)``: int64 ``[count]``
        positions and logical ids, float64 ``[count]`` their ``priority ** alpha``, the
        mass of the valid starts, and, when the whole batch was drawn and weighed in one
        compiled call, its probabilities and weight ratios (float32 ``[count]`` each,
        for ``floor``: :func:`~replaybuffer.sampling.fused_descent.draw_weighted`,
        :func:`~replaybuffer.sampling.fused_rejection.draw_kept_weighted`; ``values``
        is then ``None``), else ``None``.
        """
        last, B, L, cap = ring.last_id, ring.batch_size, ring.max_length, ring.capacity
        # valid_start_range(last, L, num_steps), inline (two calls less per sample)
        lo = last + 1 - L if last >= L else 0  # the oldest id held
        hi = last + 2 - num_steps if last + 2 - num_steps > lo else lo
        first = (lo % L) * B  # the valid starts: the cyclic range [first, first + span)
        span = (hi - lo) * B
        tree = self._sum
        total = tree.total()
        # The only mass outside the range: the newest num_steps - 1 steps of each row.
        outside = (last + 1 - hi) * B
        excluded = cyclic_sum(tree.leaves, (hi % L) * B, outside, cap) if outside else 0.0
        segments = None
        if excluded <= 0.5 * total:
            valid_mass = total - excluded  # loses at most a bit or two to cancellation
        else:  # mostly outside: sum the range itself, with no cancellation
            segments = range_segments(tree, first, span, cap)
            valid_mass = float(segments[1].sum())
        if not valid_mass > 0.0:
            require_mass(valid_mass, num_steps)
        bound = self._bound
        if self._bound_max != self.max_priority or self._bound_floor != self._floor:
            bound = self._refresh_bound()
        accept = valid_mass / (span * bound)
        if not (accept >= self._accept_min and accept > 0.0):  # (0: no finite bound)
            if segments is None and excluded * count < 0.05 * total:
                segments = WHOLE  # targets in the whole tree, the few outside redrawn
            positions, ids, probabilities, ratios = draw_weighted(
                tree, ring, count, rng, first, span, hi, segments, valid_mass, floor)
            return positions, ids, None, valid_mass, (probabilities, ratios)
        if tree_kernels.AVAILABLE:  # one compiled call (fused_rejection)
            kept = draw_kept_weighted(tree.leaves, ring, rng, count, lo, span, bound,
                                      min(accept, 1.0), valid_mass, floor)
            if len(kept) == 4:  # the whole batch, weighed
                return kept[0], kept[1], None, valid_mass, (kept[2], kept[3])
            drawn = kept[0], kept[1], kept[2]
        else:
            drawn = draw_rejecting(tree.leaves, ring, rng, count, lo, span, bound,
                                   min(accept, 1.0))
        drawn = self._descend_rest(ring, drawn, count, rng, first, span, hi, segments,
                                   excluded, total)
        return (*drawn, valid_mass, None)

    def _refresh_bound(self) -> float:
        """The rejection bound made anew for the current ``max_priority`` and floor,
        and kept with them."""
        bound = self._bound = scaled_bound(self.max_priority, self.alpha, self._floor)
        self._bound_max, self._bound_floor = self.max_priority, self._floor
        return bound

    def _descend_rest(self, ring: Ring, drawn: tuple[np.ndarray, np.ndarray, np.ndarray],
                      count: int, rng: np.random.Generator, first: int, span: int, hi: int,
                      segments: Any, excluded: float, total: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A rejection draw's ``(positions, ids, values)`` completed to ``count`` by
        descent when its rounds kept fewer (practically never), else ``drawn``."""
        if len(drawn[0]) < count:
            rest = count - len(drawn[0])
            if segments is None and excluded * rest < 0.05 * total:
                segments = WHOLE
            more = draw_descending(self._sum, ring, rest, rng, first, span, hi, segments)
            drawn = (np.concatenate((drawn[0], more[0])), np.concatenate((drawn[1], more[1])),
                     np.concatenate((drawn[2], more[2])))
        return drawn

    def spawn_rng(self) -> np.random.Generator:
        """A new generator seeded from this sampler's, advancing its state."""
        return make_rng(int(self._rng.integers(0, 2**63 - 1)))

    # ---------------------------------------------------------------- item ids
    def item_ids(self, ring: Ring, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Item ids (module docstring) of steps given by logical id and position (int64
        ``[S]``); may return ``ids`` itself (one row, no clear yet: the item ids are
        the ids)."""
        return to_item_ids(ring, self.key_base, ids, positions)

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """The generator, the schedule's and ids' counters, the rejection bound and the
        priorities (float64 ``[capacity]``, a copy), pending ones applied first."""
        self._flush()
        return {"rng": self._rng.bit_generator.state, "max_priority": self.max_priority,
                "sample_calls": self.sample_calls, "key_base": self.key_base,
                "bound_floor": self._floor, "priorities": self._sum.state_dict()["leaves"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: the sampler then draws exactly what the
        original drew. Raises ``ValueError`` on priorities of another capacity."""
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
        if largest > scaled_bound(self.max_priority, self.alpha, self._floor):
            self._floor = largest
        self.sample_calls = int(state["sample_calls"])
        self.key_base = int(state["key_base"])
        self._pending.clear()
        self._pending_count = 0
        if self._outside is not None:
            self._outside.reset()
