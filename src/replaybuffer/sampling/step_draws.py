"""The usual read's draw: single steps by priority in one compiled call, with as little
Python before it as the draw allows.

``PrioritizedReplayBuffer.get_next``'s short path asks its sampler for single steps
(:meth:`StepDraws.sample_steps`). The general draw (:meth:`PrioritizedSampler.sample
<replaybuffer.sampling.prioritized.PrioritizedSampler.sample>`) first works out what
windows of any length need (the mass outside the valid range, the range's segments,
``normalize="buffer"``'s floor), then hands a dozen values to a compiled call; that
Python was about 3 us of a skewed sample+update of 256 at 2,000 steps. For one-step
windows most of it is fixed: every step held may start one, so no mass lies outside
the valid range, the valid mass is the tree's total and a descent searches the whole
tree. With ``normalize="batch"`` (the floor is the batch's own), a generator numpy's
own and numba present, :meth:`StepDraws.sample_steps` makes the general path's choice
(rejection or descent) by the same arithmetic, then one compiled call:

- descent: :func:`~replaybuffer.sampling.fused_descent.steps` (the general descent's
  kernel with the fixed arguments filled in inside, and the ids made item ids), the
  generator's C source and lock read once per generator, the targets in kept scratch;
- rejection: :func:`~replaybuffer.sampling.fused_rejection.steps` (the general
  rejection's kernel likewise, item ids made inside), its pool drawn inside from the
  same kept source.

Anything unusual (a target past the total, a short rejection round, another
normalization or bit generator, no mass) goes the general path's way from the same
numbers, so the draws, ids, probabilities, weights and generator state are the general
path's bit for bit (``tests/test_step_draws.py``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.tree_kernels import direct_entry
from replaybuffer.sampling.fused_descent import steps as descent_steps
from replaybuffer.sampling.fused_rejection import continued
from replaybuffer.sampling.fused_rejection import steps as rejection_steps
from replaybuffer.sampling.generator_draws import bit_source
from replaybuffer.sampling.importance import probabilities_and_ratios
from replaybuffer.sampling.item_ids import to_item_ids
from replaybuffer.sampling.priority_scale import KeptRow, kept_row, no_kept_row
from replaybuffer.sampling.proportional_descent import WHOLE, draw_descending
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.trees import MinTree, SumTree

Steps = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""``(item ids, positions, probabilities, weights)``: int64, int64, float32, float32."""


class StepDraws:
    """:meth:`sample_steps` of a prioritized sampler (module docstring); the sampler
    holds the state named below and the general path's methods."""

    max_priority: float
    key_base: int
    _sum: SumTree
    _min: MinTree | None
    _rng: np.random.Generator
    _pending: list[tuple[np.ndarray, float]]
    _floor: float
    _accept_min: float
    # (the rejection bound and the max_priority and floor it was made from)
    _bound: float
    _bound_max: float
    _bound_floor: float
    beta_start: float
    beta_final: float | None
    sample_calls: int
    # beta as np.power's float32 exponent row for the last batch size S, and the rows
    # by size it came from (priority_scale.kept_row); the class's, of no beta, is
    # replaced at the first draw, before anything is kept in it.
    _beta_kept: KeptRow = no_kept_row(np.float32)
    # The generator whose C source (bit_source's pair and its lock, None for a bit
    # generator a kernel cannot call) is kept, and the descent's targets (float64
    # [count], scratch: never handed out).
    _step_rng: np.random.Generator | None = None
    _step_source: tuple[int, int, Any] | None = None
    _step_targets: np.ndarray = np.empty(0)  # (replaced, never written: the first draw's)
    # The compiled draws' entry points (tree_kernels.direct_entry), made at the first
    # draw from each sum tree, for that tree's arrays and the types passed beside them
    # (ints, floats, fresh C-contiguous outputs: the same every call): (tree, entry).
    _descent_entry: tuple[SumTree | None, Callable[..., Any]] = (None, descent_steps)
    _rejection_entry: tuple[SumTree | None, Callable[..., Any]] = (None, rejection_steps)

    def __getstate__(self) -> dict[str, Any]:
        """The sampler's attributes but the kept source and entry points, for pickling
        and ``copy.deepcopy``: the source holds the generator's lock (which cannot be
        pickled) and the addresses of its C state, which a copy must never draw from
        (its own generator is another); the entry points (compiled functions, not
        picklable) are made for the original's tree. The copy makes its own at its
        first draw."""
        state = dict(self.__dict__)
        # (with the update's write entry, priority_writes.PriorityWrites': the sampler's
        # one __getstate__ is this)
        for name in ("_step_rng", "_step_source", "_step_targets", "_descent_entry",
                     "_rejection_entry", "_write_entry", "_write_tree"):
            state.pop(name, None)
        return state

    def _flush(self) -> None:
        raise NotImplementedError  # (the sampler's: pending new steps applied)

    def _raise_to_beta(self, weights: np.ndarray) -> None:
        raise NotImplementedError  # (the sampler's: ratios to weights, in place)

    def _refresh_bound(self) -> float:
        raise NotImplementedError  # (the sampler's: the rejection bound made anew)

    def _general_steps(self, ring: Ring, count: int) -> Steps:
        raise NotImplementedError  # (the sampler's: sample_steps by the general path)

    def _descend_rest(self, ring: Ring, drawn: tuple[np.ndarray, np.ndarray, np.ndarray],
                      count: int, rng: np.random.Generator, first: int, span: int, hi: int,
                      segments: Any, excluded: float, total: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError  # (the sampler's: a short rejection completed)

    def sample_steps(self, ring: Ring, count: int) -> Steps:
        """``sample(ring, count, 1)`` from the sampler's own generator, its ids made item
        ids, flat: ``(item ids, positions, probabilities, weights)`` (int64, int64,
        float32, float32, each ``[count]``), bit for bit the same, for the buffer's
        usual read (``PrioritizedReplayBuffer.get_next``) without the general result's
        tuple and dict (module docstring). Needs a step stored. (A subclass that draws
        otherwise overrides both: the device sampler's buffers never call this.)

        Contract (the buffer wraps them without a copy or a check, torch storage's
        ``wraps_fresh``; ``tests/test_step_draws_fresh.py``): the ids, probabilities
        and weights are numpy arrays made by this call, C-contiguous, aligned and
        writeable, of exactly int64, float32 and float32, and share no memory with the
        sampler's state or with any earlier call's results, on every path (compiled
        or numpy, rejection or descent, with or without a min tree)."""
        if self._pending:
            self._flush()
        rng = self._rng
        if rng is not self._step_rng:  # (a generator's source is fixed: read once)
            # (bit_source keeps a class's function once read, so numba's absence is
            # asked here too: tests switch the kernels off to draw the reference.)
            pair = bit_source(rng) if tree_kernels.AVAILABLE else None
            self._step_source = None if pair is None else (*pair, rng.bit_generator.lock)
            self._step_rng = rng
        tree = self._sum
        total = tree.total()
        source = self._step_source
        if source is None or self._min is not None or not total > 0.0:
            return self._general_steps(ring, count)
        # PrioritizedSampler._draw_in_range's arithmetic for num_steps = 1: the valid
        # starts are every step held, ids [lo, last], mass total.
        last, L, B = ring.last_id, ring.max_length, ring.batch_size
        lo = last + 1 - L if last >= L else 0
        span = (last + 1 - lo) * B
        bound = self._bound
        if self._bound_max != self.max_priority or self._bound_floor != self._floor:
            bound = self._refresh_bound()
        accept = total / (span * bound)
        # Handed out (ids and positions; probabilities and weights): fresh each call.
        indices = np.empty((2, count), np.int64)
        weighed = np.empty((2, count), np.float32)
        function, state, lock = source
        if accept >= self._accept_min and accept > 0.0:  # by rejection
            accept = min(accept, 1.0)
            leaves = tree.leaves
            entry = self._rejection_entry
            if entry[0] is not tree:  # (the first draw from this tree: types as below)
                entry = self._rejection_entry = (tree, direct_entry(
                    rejection_steps, leaves, function, state, accept, count, span, bound,
                    lo, B, L, total, self.key_base, indices, weighed))
            lock.acquire()  # (the generator's, as rng.random takes it: fused_rejection;
            try:            # an RLock, whose `with` costs 0.09 us more)
                kept = entry[1](leaves, function, state, accept, count, span, bound, lo, B,
                                L, total, self.key_base, indices, weighed)
            finally:
                lock.release()
            if kept == count:
                return self._steps_weighed(indices, weighed)
            # A short first round (about 1 in 100), completed as the general path does.
            positions, ids, values = self._descend_rest(
                ring, continued(leaves, ring, rng, count, lo, span, bound, accept, indices,
                                kept),
                count, rng, (lo % L) * B, span, last + 1, None, 0.0, total)
            return self._weighed(ring, ids, positions, values, total)
        u = self._step_targets
        if len(u) != count:
            u = self._step_targets = np.empty(count)
        nodes, runs, root_width, height = tree.search_layout()
        entry = self._descent_entry
        if entry[0] is not tree:  # (the first draw from this tree: types as below)
            entry = self._descent_entry = (tree, direct_entry(
                descent_steps, nodes, runs, root_width, height, total, function, state, u,
                B, L, last, self.key_base, indices, weighed))
        lock.acquire()  # (the generator's, as rng.random takes it: fused_descent)
        try:
            usual = entry[1](nodes, runs, root_width, height, total, function, state, u, B,
                             L, last, self.key_base, indices, weighed)
        finally:
            lock.release()
        if usual:
            return self._steps_weighed(indices, weighed)
        # Odd (rare): the numpy path from the same scaled targets, as draw_weighted.
        positions, ids, values = draw_descending(tree, ring, count, rng, (lo % L) * B,
                                                 span, last + 1, WHOLE, u)
        return self._weighed(ring, ids, positions, values, total, math.nan)

    def _steps_weighed(self, indices: np.ndarray, weighed: np.ndarray) -> Steps:
        """A kernel's whole batch as :meth:`sample_steps` returns it: ``indices`` (int64
        ``[2, S]``: item ids, positions) and ``weighed`` (float32 ``[2, S]``:
        probabilities, weight ratios), the ratios raised to ``beta`` in place."""
        weights = weighed[1]
        if self.beta_final is None:
            # _raise_to_beta's work where nothing is annealed and no min tree caps the
            # weights (this path has none), without its call and tests, and with the
            # exponent kept as a row where numpy's power gives the same bits with it
            beta, count = self.beta_start, len(weights)
            kept = self._beta_kept
            if kept[0] != beta or kept[1] != count:
                kept = self._beta_kept = kept_row(kept, beta, count, np.float32)
            np.power(weights, kept[2], weights)
            self.sample_calls += 1
        else:
            self._raise_to_beta(weights)
        return indices[0], indices[1], weighed[0], weights

    def _weighed(self, ring: Ring, ids: np.ndarray, positions: np.ndarray,
                 values: np.ndarray, *total: float) -> Steps:
        """A draw the numpy path completed, as :meth:`sample_steps` returns it: its
        probabilities and weights from the leaf ``values`` (``total`` as
        ``probabilities_and_ratios`` takes it), ids made item ids."""
        probabilities, weights = probabilities_and_ratios(values, *total)
        self._raise_to_beta(weights)
        if ring.batch_size > 1 or self.key_base:
            ids = to_item_ids(ring, self.key_base, ids, positions)
        return ids, positions, probabilities, weights
