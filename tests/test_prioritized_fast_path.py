"""The prioritized fast paths against the general (numpy) paths they shortcut: the
compiled rejection draw (:mod:`replaybuffer.sampling.fused_rejection`), the compiled
check of an update's priorities (:func:`replaybuffer.sampling.fused_update.
checked_largest`) and the buffer's short ``get_next`` and ``update_priorities``, bit for
bit (ids, positions, probabilities, weights, the tree's nodes, the generator's state),
with bad updates refused with the general path's message and nothing changed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer import MinSize, PrioritizedReplayBuffer
from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling import fused_rejection, tree_kernels
from replaybuffer.sampling.fused_update import checked_largest
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.priority_scale import exponent
from replaybuffer.sampling.rejection import draw_rejecting, pool_size
from replaybuffer.sampling.ring import Ring

from sampler_twins import assert_same, bits, filled_twins  # noqa: E402

pytestmark = pytest.mark.skipif(not tree_kernels.AVAILABLE, reason="needs numba")


@settings(max_examples=150, deadline=None)
@given(batch_size=st.integers(1, 4), max_length=st.integers(1, 40),
       adds=st.integers(1, 120), num_steps=st.integers(1, 4),
       normalize=st.sampled_from(["batch", "buffer"]),
       zeros=st.floats(0.0, 0.9), spread=st.sampled_from([0.0, 0.3, 2.0]),
       count=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_fused_rejection_draws_the_numpy_paths_bits(batch_size, max_length, adds,
                                                     num_steps, normalize, zeros, spread,
                                                     count, seed):
    """Sampler.sample forced to draw by rejection, on the numpy path and the compiled
    one: the same bits out and the same generator state after, over rings that wrap
    (ranges that wrap past the last position), windows, zero priorities (short first
    rounds, then the numpy rounds and the descent for the rest) and tiny buffers."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        ring, reference, fused = filled_twins(monkeypatch, batch_size, max_length, adds,
                                              0.0, spread, zeros, seed, normalize)  # reject
        if num_steps > ring.items_per_row:
            return
        for _ in range(3):
            try:
                with monkeypatch.context() as m:
                    m.setattr(tree_kernels, "AVAILABLE", False)
                    want = reference.sample(ring, count, num_steps)
            except EmptyBufferError:
                with pytest.raises(EmptyBufferError):
                    fused.sample(ring, count, num_steps)
                return
            got = fused.sample(ring, count, num_steps)
            assert_same(want, got, reference, fused)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_short_first_round_continues_as_the_numpy_loop(batch_size):
    """A first round that keeps fewer than the batch (most values far below the bound)
    hands over to draw_rejecting's later rounds: the same draws, in the same order, as
    the numpy loop from the same generator, and the generator left in the same state."""
    ring = Ring(batch_size, 50)
    ring.last_id = 130  # wrapped
    leaves = np.zeros(ring.capacity)
    leaves[::7] = 1.0
    lo, hi = ring.valid_start_range(1)
    span = (hi - lo) * batch_size
    bound, count = 1.0, 200
    accept = float(leaves.sum()) / (span * bound) * 4  # sized far too small a pool
    want_rng, got_rng = np.random.default_rng(5), np.random.default_rng(5)
    want = draw_rejecting(leaves, ring, want_rng, count, lo, span, bound, min(accept, 1.0))
    got = fused_rejection.draw_kept_weighted(leaves, ring, got_rng, count, lo, span, bound,
                                             min(accept, 1.0), float(leaves.sum()))
    assert len(got) == 3  # short of the batch after the first round: unweighed
    for a, b in zip(want, got):
        assert a.dtype == b.dtype and bits(a) == bits(b)
    assert len(got[0]) == count
    assert want_rng.bit_generator.state == got_rng.bit_generator.state


# ------------------------------------------------------------- the tree's total
@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 3000), start=st.integers(0, 9), seed=st.integers(0, 2**16),
       sigma=st.sampled_from([0.0, 1.0, 5.0]), zeros=st.floats(0.0, 1.0))
def test_pairwise_sum_is_numpys_reduce_bit_for_bit(count, start, seed, sigma, zeros):
    """The compiled total of a fused update (tree_kernels.pairwise_sum) against
    np.add.reduce over the same run: every length (the < 8, <= 128 and split cases),
    offsets, wide and narrow spreads, zeros."""
    rng = np.random.default_rng(seed)
    values = rng.lognormal(0.0, sigma, start + count) * (rng.random(start + count) >= zeros)
    want = np.add.reduce(values[start:])
    got = tree_kernels.pairwise_sum(values, start, count)
    assert np.float64(got).tobytes() == np.float64(want).tobytes()
    assert tree_kernels.pairwise_matches()


# ------------------------------------------------------------- the buffer's reads
SPEC = {"obs": np.zeros(3, np.float32), "act": np.int64(0)}


def filled_pair(batch_size, max_length, adds, seed, cleared=False):
    """Two identical buffers (same seed, same adds; ``cleared``: the adds come after
    as many adds and a ``clear()``, so item ids carry a base)."""
    pair = []
    for _ in range(2):
        buf = PrioritizedReplayBuffer(SPEC, batch_size, max_length, seed=seed)
        rng = np.random.default_rng(seed)
        for lap in range(2 if cleared else 1):
            if lap:
                buf.clear()
            for _ in range(adds):
                buf.add_batch({"obs": rng.random((batch_size, 3), dtype=np.float32),
                               "act": rng.integers(0, 9, batch_size)})
        pair.append(buf)
    return pair


def assert_same_read(want, got):
    (w_items, w_info), (g_items, g_info) = want, got
    for key in SPEC:
        assert w_items[key].dtype == g_items[key].dtype
        assert bits(w_items[key]) == bits(g_items[key])
    for a, b in zip(w_info, g_info):
        assert a.dtype == b.dtype and a.shape == b.shape and bits(a) == bits(b)


@settings(max_examples=60, deadline=None)
@given(batch_size=st.integers(1, 3), max_length=st.integers(1, 30),
       adds=st.integers(1, 70), count=st.integers(1, 300), seed=st.integers(0, 2**16),
       spread=st.sampled_from([0.2, 3.0]), cleared=st.booleans(), data=st.data())
def test_the_short_get_next_reads_what_the_general_read_path_reads(
        batch_size, max_length, adds, count, seed, spread, cleared, data):
    """get_next(S) (the short path) against the general read path (ReadPath.draw, the
    same after argument checks): the same items, ids, probabilities and weights, bit
    for bit, and the generators in the same state, through updates of the sampled ids
    (repeated ones included) with even or skewed priorities, on rings that wrap, and
    after a clear (item ids with a base)."""
    short, general = filled_pair(batch_size, max_length, adds, seed, cleared)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        got = short.get_next(count)
        want = general.draw(count, None)
        assert_same_read(want, got)
        assert short._sampler._rng.bit_generator.state == \
            general._sampler._rng.bit_generator.state
        ids = got[1].ids
        if data.draw(st.booleans()):  # repeat some ids: the last value given wins
            ids = np.concatenate([ids, ids[: len(ids) // 2]])
        priorities = rng.lognormal(0.0, spread, len(ids))
        assert short.update_priorities(ids, priorities) == \
            general.update_priorities(list(ids), list(priorities))
        assert bits(short.priorities(ids)) == bits(general.priorities(ids))
        assert short.max_priority == general.max_priority


def test_reads_the_short_path_leaves_to_the_general_one():
    """Windows, single items, a rate limiter and an empty buffer go the general way,
    with its results and errors."""
    buf = PrioritizedReplayBuffer(SPEC, 2, 10, seed=1)
    with pytest.raises(EmptyBufferError, match="is empty"):
        buf.get_next(4)
    for _ in range(5):
        buf.add_batch({"obs": np.ones((2, 3), np.float32), "act": np.arange(2)})
    items, info = buf.get_next(4, num_steps=2)
    assert items["obs"].shape == (4, 2, 3) and info.ids.shape == (4, 2)
    items, info = buf.get_next()
    assert items["obs"].shape == (3,) and info.weights.shape == ()
    with pytest.raises(ValueError, match="sample_batch_size"):
        buf.get_next(0)
    buf.rate_limiter = MinSize(15)  # 10 stored
    assert buf.get_next(4, block=False) is None


# ------------------------------------------------------------- the buffer's updates
def tree_state(buf):
    state = buf._sampler.state_dict()
    return bits(state["priorities"]), state["max_priority"]


@settings(max_examples=80, deadline=None)
@given(batch_size=st.integers(1, 3), max_length=st.integers(2, 20),
       adds=st.integers(1, 50), seed=st.integers(0, 2**16),
       bad=st.sampled_from([None, math.nan, -1.0, -1e-30, math.inf, -math.inf]),
       repeat=st.booleans(), stale=st.booleans(),
       dtype=st.sampled_from([np.float64, np.float32]), data=st.data())
def test_the_short_update_writes_what_the_general_update_writes(
        batch_size, max_length, adds, seed, bad, repeat, stale, dtype, data):
    """update_priorities with int64 ids and float64 or float32 priorities (the short
    path, checked in one compiled call) against lists of the same (the general path):
    the same count, the same tree bits and max_priority; with repeated ids the last
    value wins; stale ids are dropped; a NaN, infinite or negative value is refused
    with the general path's message and nothing changes."""
    short, general = filled_pair(batch_size, max_length, adds, seed)
    rng = np.random.default_rng(seed)
    ids = short.get_next(data.draw(st.integers(1, 40)))[1].ids
    general.get_next(len(ids))
    if repeat:
        ids = np.concatenate([ids, ids[::-1]])
    if stale and adds > max_length:  # the oldest step's ids, once overwritten
        for buf in (short, general):
            buf.add_batch({"obs": np.zeros((batch_size, 3), np.float32),
                           "act": np.zeros(batch_size, np.int64)})
    priorities = rng.lognormal(0.0, 1.0, len(ids)).astype(dtype)
    if bad is not None:
        priorities[data.draw(st.integers(0, len(ids) - 1))] = bad
        before = tree_state(short)
        with pytest.raises(ValueError) as general_error:
            general.update_priorities(list(ids), list(priorities))
        with pytest.raises(ValueError) as short_error:
            short.update_priorities(ids, priorities)
        assert str(short_error.value) == str(general_error.value)
        assert "nothing was updated" in str(short_error.value)
        assert tree_state(short) == before == tree_state(general)
        return
    assert short.update_priorities(ids, priorities) == \
        general.update_priorities(list(ids), list(priorities))
    assert tree_state(short) == tree_state(general)
    got, want = short.get_next(64), general.get_next(64)
    assert_same_read(want, got)


def test_checked_largest_names_the_first_bad_value():
    """The compiled check: the largest of good values (-0.0 allowed), else -1 - the
    index of the first NaN, infinite or negative one."""
    assert checked_largest(np.array([0.5, 3.0, -0.0, 2.0])) == 3.0
    assert checked_largest(np.array([-0.0])) == 0.0
    for bad in (math.nan, math.inf, -math.inf, -1.0, -5e-324):
        values = np.array([1.0, 2.0, bad, math.nan])
        assert checked_largest(values) == -3.0


def test_a_tree_whose_total_numpy_sums_differently_sums_it_itself(monkeypatch):
    """Where pairwise_sum would not match numpy's reduce, the fused write leaves the
    total to np.add.reduce: the same tree either way."""
    ring = Ring(2, 300)
    ring.last_id = 299
    monkeypatch.setattr(tree_kernels, "pairwise_matches", lambda: False)
    plain = PrioritizedSampler(ring.capacity, seed=3)
    monkeypatch.undo()
    fused = PrioritizedSampler(ring.capacity, seed=3)
    rng = np.random.default_rng(0)
    for sampler in (plain, fused):
        sampler.on_add(ring, 0, 300)
    for _ in range(5):
        ids = rng.integers(0, 600, 256)
        values = rng.lognormal(0.0, 2.0, 256)
        for sampler in (plain, fused):
            sampler.update_priorities(ring, ids, values, float(values.max()))
        assert plain._sum.total() == fused._sum.total()
        assert bits(plain._sum.nodes) == bits(fused._sum.nodes)
        assert_same(plain.sample(ring, 100, 1), fused.sample(ring, 100, 1), plain,
                           fused)


# ------------------------------------------------------------- kept exponents
@settings(max_examples=150, deadline=None)
@given(value=st.floats(0.0, 4.0), seed=st.integers(0, 2**16), sigma=st.floats(0.0, 20.0),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_a_kept_exponent_powers_as_the_python_float(value, seed, sigma, dtype):
    """np.power with the sampler's kept 0-d exponents (priority_scale.exponent) against
    the Python float the numpy path passes: the same dtype and bits, over bases from
    tiny to huge (overflow to inf in float32 included), zeros and ones."""
    rng = np.random.default_rng(seed)
    base = np.concatenate([rng.lognormal(0.0, sigma, 300), [0.0, 1.0, -0.0]]).astype(dtype)
    with np.errstate(all="ignore"):
        want = np.power(base, value)
        got = np.power(base, exponent(value, dtype))
    assert want.dtype == got.dtype == dtype and bits(want) == bits(got)


@settings(max_examples=300, deadline=None)
@given(need=st.integers(1, 10**7), accept=st.floats(1e-9, 1.0, exclude_min=True))
def test_the_compiled_pool_size_is_the_python_one(need, accept):
    """The rejection kernel sizes its pool with pool_size compiled (fused_rejection's
    twin of rejection.pool_size): the same count for every need and acceptance, so it
    draws as many numbers as the numpy loop's first round."""
    assert fused_rejection._pool_size(need, accept) == pool_size(need, accept)
    assert type(pool_size(need, accept)) is int


def test_an_update_powers_with_the_alpha_of_the_moment():
    """The kept alpha exponent follows the sampler's alpha (a plain attribute) when it
    is changed: the fused update stores priority ** alpha for the alpha it is made
    with, as the numpy path does."""
    ring = Ring(1, 64)
    ring.last_id = 63
    sampler = PrioritizedSampler(ring.capacity, alpha=0.6, seed=1)
    sampler.on_add(ring, 0, 64)
    ids = np.arange(8, dtype=np.int64)
    values = np.linspace(0.5, 4.0, 8)
    for alpha in (0.6, 0.3, 0.6):
        sampler.alpha = alpha
        sampler.update_priorities(ring, ids, values, float(values.max()))
        assert bits(sampler.priorities(ring, ids)) == bits(np.power(values, alpha))
