"""The compiled draws within episodes (episode_kernels) against the numpy paths: uniform
window numbering and the prioritized rejection round give the same ids, positions,
probabilities and weights, bit for bit, with the generators left in the same state;
over wrapped rings of one to four rows, episodes shorter than the window, rows without
a start, zero priorities and both normalizations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling import episode_kernels, tree_kernels
from replaybuffer.sampling.episodes import EpisodeIndex
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring

pytestmark = pytest.mark.skipif(not tree_kernels.AVAILABLE, reason="needs numba")


def bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def episodes_of(ring: Ring, adds: int, start_rate: float, rng: np.random.Generator
                ) -> EpisodeIndex:
    """An index over ``adds`` steps of every row, each a FIRST step with ``start_rate``
    (1.0: every episode one step long, shorter than any window of two)."""
    index = EpisodeIndex()
    ring.last_id = adds - 1
    index.record(0, rng.random((adds, ring.batch_size)) < start_rate, ring.oldest_id)
    return index


rings = dict(batch_size=st.integers(1, 4), max_length=st.integers(1, 40),
             adds=st.integers(1, 120), num_steps=st.integers(1, 4),
             start_rate=st.sampled_from([0.0, 0.05, 0.3, 1.0]), seed=st.integers(0, 2**16))


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 300), **rings)
def test_uniform_window_numbers_match_the_numpy_mapping(batch_size, max_length, adds,
                                                        num_steps, start_rate, seed,
                                                        count):
    """sample_starts, compiled and numpy, for the same raw draws: the same start ids
    and positions; every window lies inside one episode and before the write head."""
    rng = np.random.default_rng(seed)
    ring = Ring(batch_size, max_length)
    index = episodes_of(ring, adds, start_rate, rng)
    if num_steps > ring.items_per_row or index.count(ring, num_steps) == 0:
        return
    raw = rng.bit_generator.random_raw(count)
    got = index.sample_starts(ring, num_steps, raw)
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:
        m.setattr(tree_kernels, "AVAILABLE", False)
        want = index.sample_starts(ring, num_steps, raw)
    for a, b in zip(want, got):
        assert a.dtype == b.dtype == np.int64 and bits(a) == bits(b)
    ids, positions = got
    assert index.within(ring, ids, positions % batch_size, num_steps).all()


def first_above_reference(values: np.ndarray, key: int) -> int:
    return int(np.searchsorted(values, key, side="right"))


@given(st.lists(st.integers(-5, 50), max_size=30), st.integers(-10, 60))
def test_first_above_is_searchsorted_right(values, key):
    values = np.sort(np.array(values, np.int64))
    assert episode_kernels.first_above(values, key) == first_above_reference(values, key)


@settings(max_examples=150, deadline=None)
@given(count=st.integers(1, 300), normalize=st.sampled_from(["batch", "buffer"]),
       zeros=st.sampled_from([0.0, 0.5]), **rings)
def test_prioritized_draws_within_episodes_match_the_numpy_path(
        batch_size, max_length, adds, num_steps, start_rate, seed, count, normalize,
        zeros):
    """PrioritizedSampler.sample within episodes, on the numpy path (trees and draws)
    and the compiled one: the same bits and generator state over three batches, or the
    same refusal when no window (or no mass) is left."""
    rng = np.random.default_rng(seed)
    ring = Ring(batch_size, max_length)
    index = episodes_of(ring, adds, start_rate, rng)
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:
        m.setattr(tree_kernels, "AVAILABLE", False)
        reference = PrioritizedSampler(ring.capacity, seed=5, normalize=normalize)
    fused = PrioritizedSampler(ring.capacity, seed=5, normalize=normalize)
    items = np.arange(ring.oldest_id * batch_size, adds * batch_size, dtype=np.int64)
    priorities = rng.lognormal(0.0, 2.0, len(items)) * (rng.random(len(items)) >= zeros)
    for sampler in (reference, fused):
        sampler.on_add(ring, 0, adds)
        sampler.update_priorities(ring, items, priorities)
    if num_steps > ring.items_per_row:
        return
    for _ in range(3):
        try:
            with monkeypatch.context() as m:
                m.setattr(tree_kernels, "AVAILABLE", False)
                want = reference.sample(ring, count, num_steps, episodes=index)
        except EmptyBufferError:
            with pytest.raises(EmptyBufferError):
                fused.sample(ring, count, num_steps, episodes=index)
            return
        got = fused.sample(ring, count, num_steps, episodes=index)
        for a, b in zip(want[0], got[0]):
            assert bits(a) == bits(b)
        for key in ("probabilities", "weights"):
            assert bits(want[1][key]) == bits(got[1][key]), key
        assert reference._rng.bit_generator.state == fused._rng.bit_generator.state
        ids, positions = got[0]
        assert index.within(ring, ids, positions % batch_size, num_steps).all()
