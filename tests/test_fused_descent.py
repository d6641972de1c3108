"""The fused descent draw (one compiled call: targets, search, ids, weights) against the
numpy path it replaces: the same positions, ids, values, probabilities and weights, bit
for bit, and the generator left in the same state, over tiny and wrapped rings, zero
priorities, windows whose starts leave mass outside the range, and both normalizations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling import fused_descent, tree_kernels
from replaybuffer.sampling.proportional_descent import WHOLE
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.trees import SumTree

from sampler_twins import assert_same, bits, filled_twins  # noqa: E402

pytestmark = pytest.mark.skipif(not tree_kernels.AVAILABLE, reason="needs numba")


def draw_both(monkeypatch, reference, fused, ring, count, num_steps):
    with monkeypatch.context() as m:
        m.setattr(tree_kernels, "AVAILABLE", False)
        want = reference.sample(ring, count, num_steps)
    got = fused.sample(ring, count, num_steps)
    return want, got


@settings(max_examples=150, deadline=None)
@given(batch_size=st.integers(1, 4), max_length=st.integers(1, 40),
       adds=st.integers(1, 120), num_steps=st.integers(1, 4),
       normalize=st.sampled_from(["batch", "buffer"]),
       zeros=st.floats(0.0, 0.9), sigma=st.sampled_from([0.5, 3.0]),
       count=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_fused_descent_draws_the_numpy_paths_bits(batch_size, max_length, adds,
                                                   num_steps, normalize, zeros, sigma,
                                                   count, seed):
    """Sampler.sample forced to descend, on the numpy path and the fused one: the same
    bits out and the same generator state after, over rings that wrap, windows longer
    than one step (mass outside the valid range: the whole-tree draw with redraws, or
    the range's one or two segments), priorities of 0, and tiny buffers. With no valid
    mass both refuse the same way."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        ring, reference, fused = filled_twins(monkeypatch, batch_size, max_length, adds,
                                              2.0, sigma, zeros, seed, normalize)  # descend
        if num_steps > ring.items_per_row:
            return
        for _ in range(3):
            try:
                want, got = draw_both(monkeypatch, reference, fused, ring, count, num_steps)
            except EmptyBufferError:
                with pytest.raises(EmptyBufferError):
                    fused.sample(ring, count, num_steps)
                return
            assert_same(want, got, reference, fused)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("segments", ["whole", "one", "two"])
def test_draw_weighted_matches_the_numpy_path_for_each_target_layout(monkeypatch,
                                                                      segments):
    """draw_weighted itself, numba against numpy, for targets over the whole tree, one
    segment of the range, and a range that wraps past the last position (two)."""
    capacity = 1000
    rng = np.random.default_rng(3)
    values = rng.lognormal(0.0, 2.0, capacity) * (rng.random(capacity) < 0.7)
    trees = {mode: SumTree(capacity, compiled=mode) for mode in (False, True)}
    for tree in trees.values():
        tree.update(np.arange(capacity), values)
    ring = Ring(1, capacity)
    ring.last_id = 2 * capacity + 299  # wrapped: oldest id 1300, slot 300
    lo, hi = ring.valid_start_range(5)
    first, span = (lo % capacity), hi - lo
    arg = {"whole": WHOLE, "one": None, "two": None}[segments]
    if segments == "one":
        ring.last_id = capacity - 1
        lo, hi = ring.valid_start_range(5)
        first, span = 0, hi - lo
    valid_mass = float(values.sum())
    for floor in (math.nan, float(values[values > 0].min())):
        with monkeypatch.context() as m:
            m.setattr(tree_kernels, "AVAILABLE", False)
            want = fused_descent.draw_weighted(trees[False], ring, 257,
                                               np.random.default_rng(9), first, span, hi,
                                               arg, valid_mass, floor)
        got = fused_descent.draw_weighted(trees[True], ring, 257, np.random.default_rng(9),
                                          first, span, hi, arg, valid_mass, floor)
        for a, b in zip(want, got):
            assert a.dtype == b.dtype and bits(a) == bits(b)
        assert (got[1] < hi).all() and (got[2] > 0).all()


def test_the_fused_call_hands_odd_batches_to_the_numpy_path(monkeypatch):
    """A batch with a target in the sliver outside the range (whole-tree targets over a
    range that excludes heavy slots) falls back to the numpy path, with the same draws,
    and still returns valid starts only."""
    capacity = 64
    values = np.ones(capacity)
    values[-3:] = 2.0  # the newest steps cannot start a window: targets there are redrawn
    trees = {mode: SumTree(capacity, compiled=mode) for mode in (False, True)}
    for tree in trees.values():
        tree.update(np.arange(capacity), values)
    ring = Ring(1, capacity)
    ring.last_id = capacity - 1
    lo, hi = ring.valid_start_range(4)
    calls = []
    real = fused_descent.draw_descending
    monkeypatch.setattr(fused_descent, "draw_descending",
                        lambda *a: calls.append(1) or real(*a))
    valid_mass = float(values[:hi].sum())
    got = fused_descent.draw_weighted(trees[True], ring, 50, np.random.default_rng(1), 0,
                                      hi - lo, hi, WHOLE, valid_mass)
    assert calls == [1]
    monkeypatch.setattr(tree_kernels, "AVAILABLE", False)
    want = fused_descent.draw_weighted(trees[False], ring, 50, np.random.default_rng(1), 0,
                                       hi - lo, hi, WHOLE, valid_mass)
    for a, b in zip(want, got):
        assert bits(a) == bits(b)
    assert (got[1] < hi).all()
