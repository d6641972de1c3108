"""PrioritizedReplayBuffer: distribution, weights, stale ids, bad priorities, persistence."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from conftest import to_np
from replaybuffer.sampling import prioritized

# Upper 0.1% points of the chi-square distribution, by degrees of freedom.
CHI2_999 = {3: 16.27, 7: 24.32, 9: 27.88, 15: 37.70}


# The two exact ways a batch is drawn (PrioritizedSampler's docstring): by rejection
# against the priority bound, and by descent of the sum tree. Which one runs depends on
# how often rejection keeps a candidate; these force one.
DRAWS = {"rejection": 0.0, "descent": 2.0}


def counter_buffer(storage=None, batch_size=1, max_length=10, adds=10, draw=None, **kwargs):
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), batch_size, max_length,
                                     seed=0, **(storage or {}), **kwargs)
    if draw is not None:
        buf._sampler._accept_min = DRAWS[draw]
    for t in range(adds):
        buf.add_batch(np.arange(batch_size, dtype=np.int64) * 100 + t)
    return buf


def chi_square(counts, expected):
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("draw", sorted(DRAWS))
@pytest.mark.parametrize("alpha", [0.6, 1.0, 0.0])
def test_sampling_follows_priorities_to_the_alpha(storage, alpha, draw):
    buf = counter_buffer(storage, max_length=10, adds=10, alpha=alpha, draw=draw)
    priorities = np.arange(1.0, 11.0)
    buf.update_priorities(np.arange(10), priorities)
    draws = 1_000_000
    counts = np.zeros(10)
    for _ in range(draws // 1000):
        items, info = buf.get_next(1000)
        counts += np.bincount(to_np(items), minlength=10)
    expected = priorities ** alpha / (priorities ** alpha).sum()
    assert chi_square(counts, draws * expected) < CHI2_999[9]
    _, info = buf.get_next(64)
    ids = to_np(info.ids)
    np.testing.assert_allclose(to_np(info.probabilities), expected[ids], rtol=1e-5)


@pytest.mark.parametrize("draw", sorted(DRAWS))
@pytest.mark.parametrize("normalize", ["batch", "buffer"])
def test_importance_weights_match_the_formula(normalize, draw):
    buf = counter_buffer(max_length=8, adds=8, alpha=0.7, beta=0.5, normalize=normalize,
                         draw=draw)
    priorities = np.array([0.5, 1, 2, 3, 4, 5, 6, 9.0])
    buf.update_priorities(np.arange(8), priorities)
    scaled = priorities ** 0.7
    for size in (256, 3):  # small batches rarely hold the lowest-priority step
        _, info = buf.get_next(size)
        p = scaled[info.ids] / scaled.sum()
        raw = (8 * p) ** -0.5
        if normalize == "batch":
            expected = raw / raw.max()
            assert info.weights.max() == pytest.approx(1.0)
        else:
            expected = raw / (8 * scaled.min() / scaled.sum()) ** -0.5
        np.testing.assert_allclose(info.weights, expected, rtol=1e-5)
        assert info.weights.max() <= 1.0 and info.weights.dtype == np.float32
    if normalize == "buffer":  # a batch without step 0 has no weight of 1
        for _ in range(50):
            _, info = buf.get_next(3)
            if 0 not in info.ids:
                assert info.weights.max() < 0.999
                break
        else:
            pytest.fail("every small batch held step 0")
    with pytest.raises(ValueError, match="normalize must be"):
        counter_buffer(normalize="global")


def test_beta_anneals_linearly_over_sample_calls():
    buf = counter_buffer(adds=4, beta=0.4, beta_final=1.0, beta_steps=3)
    assert buf.beta == pytest.approx(0.4)
    buf.get_next(2)
    assert buf.beta == pytest.approx(0.6)
    for _ in range(5):
        buf.get_next(2)
    assert buf.beta == pytest.approx(1.0)
    with pytest.raises(ValueError, match="beta must be a number in"):
        counter_buffer(beta=1.5)
    with pytest.raises(ValueError, match="alpha must be a number"):
        counter_buffer(alpha=-1)


def test_new_items_enter_at_the_largest_priority_seen():
    buf = counter_buffer(max_length=10, adds=3)
    buf.update_priorities(np.array([0, 1]), np.array([5.0, 0.25]))
    assert buf.max_priority == 5.0
    buf.add_batch(np.array([3]))
    np.testing.assert_allclose(buf.priorities(np.array([0, 1, 2, 3])),
                               np.array([5.0, 0.25, 1.0, 5.0]) ** 0.6)


def test_stale_ids_are_ignored(storage):
    buf = counter_buffer(storage, max_length=4, adds=4)
    _, info = buf.get_next(3)
    old_ids = to_np(info.ids)
    for t in range(4, 8):  # overwrite everything
        buf.add_batch(np.array([t]))
    before = buf.priorities(np.arange(4, 8))
    assert buf.update_priorities(old_ids, np.array([7.0, 7.0, 7.0])) == 0
    np.testing.assert_array_equal(buf.priorities(np.arange(4, 8)), before)
    assert np.isnan(buf.priorities(old_ids)).all()
    # Partly stale: only the live id is applied.
    assert buf.update_priorities(np.array([1, 6]), np.array([2.0, 3.0])) == 1
    assert buf.priorities(np.array([6]))[0] == pytest.approx(3.0 ** 0.6)


def test_ids_are_never_reused_after_clear():
    buf = counter_buffer(max_length=4, adds=3)
    _, info = buf.get_next(2)
    buf.clear()
    for t in range(3):
        buf.add_batch(np.array([t]))
    assert buf.update_priorities(info.ids, np.array([9.0, 9.0])) == 0
    _, fresh = buf.get_next(50)
    assert set(fresh.ids.tolist()) <= {3, 4, 5}
    assert buf.max_priority == 1.0


@pytest.mark.parametrize("bad,pattern", [
    (np.array([1.0, np.nan]), r"priorities\[1\] is nan"),
    (np.array([np.inf, 1.0]), r"priorities\[0\] is inf"),
    (np.array([1.0, -0.5]), r"priorities\[1\] is -0.5"),
])
def test_bad_priorities_raise_and_change_nothing(storage, bad, pattern):
    buf = counter_buffer(storage, adds=5)
    _, info = buf.get_next(2)
    before = (buf.priorities(np.arange(5)), buf.max_priority,
              buf._sampler.state_dict()["rng"]["state"])
    with pytest.raises(ValueError, match=pattern):
        buf.update_priorities(info.ids, bad)
    after = (buf.priorities(np.arange(5)), buf.max_priority,
             buf._sampler.state_dict()["rng"]["state"])
    np.testing.assert_array_equal(before[0], after[0])
    assert before[1:] == after[1:]


def test_update_priorities_argument_errors():
    buf = counter_buffer(adds=5)
    with pytest.raises(ValueError, match="same S"):
        buf.update_priorities(np.arange(3), np.ones(2))
    with pytest.raises(ValueError, match="ids must be integers"):
        buf.update_priorities(np.array([0.5]), np.ones(1))
    with pytest.raises(ValueError, match="expected numbers"):
        buf.update_priorities(np.array(["a"]), np.ones(1))


def test_zero_priorities_are_never_drawn_and_all_zero_is_an_error():
    buf = counter_buffer(max_length=5, adds=5)
    buf.update_priorities(np.arange(5), np.array([0.0, 1.0, 0.0, 1.0, 0.0]))
    items, info = buf.get_next(500)
    assert set(items.tolist()) == {1, 3} and (info.weights <= 1).all()
    buf.update_priorities(np.array([1, 3]), np.zeros(2))
    with pytest.raises(rb.EmptyBufferError, match="priority 0"):
        buf.get_next(1)


@pytest.mark.parametrize("draw", sorted(DRAWS))
def test_windows_take_their_first_steps_priority_and_respect_the_head(storage, draw):
    buf = counter_buffer(storage, max_length=6, adds=9, draw=draw)  # 3..8, head after 8
    ids = np.arange(3, 9)
    buf.update_priorities(ids, np.array([1.0, 1, 1, 1, 1, 1000.0]))  # id 8 cannot start
    items, info = buf.get_next(3000, num_steps=2)
    x = to_np(items)
    np.testing.assert_array_equal(x[:, 0] + 1, x[:, 1])
    assert x[:, 0].max() == 7  # the heavy newest step is never a start
    starts = x[:, 0]
    probs = to_np(info.probabilities)
    np.testing.assert_allclose(probs, 1 / 5, rtol=1e-5)  # 5 valid starts, equal priority
    counts = np.bincount(starts - 3, minlength=5)
    assert chi_square(counts, np.full(5, 600.0)) < CHI2_999[3] + 5


@pytest.mark.parametrize("draw", sorted(DRAWS))
def test_item_ids_with_several_rows(storage, draw):
    buf = counter_buffer(storage, batch_size=3, max_length=4, adds=5, draw=draw)
    items, info = buf.get_next(400, num_steps=2)
    x, ids = to_np(items), to_np(info.ids)
    rows, add_ids = x // 100, x % 100
    np.testing.assert_array_equal(ids, add_ids * 3 + rows)  # unique per step and row
    np.testing.assert_array_equal(ids[:, 1] - ids[:, 0], 3)
    target = ids[0, 0]
    assert buf.update_priorities(torch.as_tensor(ids), torch.ones(400) * 0.5) > 0
    assert buf.priorities(np.array([target]))[0] == pytest.approx(0.5 ** 0.6)


def test_save_load_keeps_priorities_and_the_generator(storage, tmp_path):
    buf = counter_buffer(storage, batch_size=2, max_length=6, adds=9, beta_final=1.0,
                         beta_steps=100)
    _, info = buf.get_next(8)
    buf.update_priorities(info.ids, np.linspace(0.1, 3.0, 8))
    buf.add_batch(np.array([50, 150]))  # pending max-priority entries
    buf.save(tmp_path / "per")
    again = rb.load(tmp_path / "per")
    assert isinstance(again, rb.PrioritizedReplayBuffer)
    assert again.beta == buf.beta and again.max_priority == buf.max_priority
    a, ia = buf.get_next(32, num_steps=2)
    b, ib = again.get_next(32, num_steps=2)
    np.testing.assert_array_equal(to_np(ia.ids), to_np(ib.ids))
    np.testing.assert_allclose(to_np(ia.weights), to_np(ib.weights))
    (rb.checkpoints(tmp_path / "per")[-1] / "state.sampler.priorities.npy").write_bytes(b"junk")
    with pytest.raises(rb.CheckpointError, match="state array state.sampler.priorities.npy"):
        rb.load(tmp_path / "per")


def test_datasets_and_deterministic_pass_work(storage):
    buf = counter_buffer(storage, batch_size=2, max_length=5, adds=5)
    it = iter(buf.as_dataset(4, num_steps=2, num_parallel_calls=2))
    items, info = next(it)
    assert tuple(items.shape) == (4, 2) and info.weights is not None
    it.close()
    assert len(list(buf.as_dataset(single_deterministic_pass=True))) == 10


@settings(max_examples=60, deadline=None)
@given(data=st.data(), batch_size=st.integers(1, 3), max_length=st.integers(1, 6),
       num_steps=st.integers(1, 3), draw=st.sampled_from(sorted(DRAWS)))
def test_probabilities_match_a_brute_force_model(data, batch_size, max_length, num_steps,
                                                 draw):
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), batch_size, max_length,
                                     alpha=0.5, seed=1)
    buf._sampler._accept_min = DRAWS[draw]
    model: dict[int, float] = {}  # item id -> raw priority, for live items
    max_priority = 1.0
    adds = data.draw(st.integers(1, 3 * max_length))
    for t in range(adds):
        buf.add_batch(np.arange(batch_size) * 1000 + t)
        for row in range(batch_size):
            model[t * batch_size + row] = max_priority
        for key in [k for k in model if k // batch_size <= t - max_length]:
            del model[key]
        if data.draw(st.booleans()) and num_steps <= min(t + 1, max_length):
            _, info = buf.get_next(4, num_steps)
            new = np.array(data.draw(st.lists(st.floats(0.01, 10), min_size=4, max_size=4)))
            buf.update_priorities(info.ids, new)
            for key, value in zip(np.asarray(info.ids)[:, 0].tolist(), new.tolist()):
                model[key] = value  # duplicates: the last one wins
            max_priority = max(max_priority, float(new.max()))
    if num_steps > min(adds, max_length):
        with pytest.raises(rb.EmptyBufferError):
            buf.get_next(2, num_steps)
        return
    last = adds - 1
    valid = {k: p ** 0.5 for k, p in model.items() if k // batch_size <= last - num_steps + 1}
    total = sum(valid.values())
    items, info = buf.get_next(64, num_steps)
    starts = np.asarray(info.ids)[:, 0]
    for key, prob in zip(starts.tolist(), info.probabilities.tolist()):
        assert key in valid
        assert prob == pytest.approx(valid[key] / total, rel=1e-5)
    x = np.asarray(items)[:, 0]
    np.testing.assert_array_equal(x % 1000 * batch_size + x // 1000, starts)


@pytest.mark.parametrize("draw", sorted(DRAWS))
def test_windows_holding_little_mass_are_still_drawn_exactly(draw):
    # The newest steps (invalid starts for long windows) hold nearly all the mass.
    buf = counter_buffer(max_length=10, adds=10, draw=draw)
    buf.update_priorities(np.arange(6), np.full(6, 1e-4))
    buf.update_priorities(np.arange(6, 10), np.full(4, 10.0))
    items, info = buf.get_next(400, num_steps=5)
    assert to_np(items)[:, 0].max() <= 5
    np.testing.assert_allclose(to_np(info.probabilities), 1 / 6, rtol=1e-5)


def test_plain_tuples_of_ids():
    buf = counter_buffer(adds=5)
    assert buf.update_priorities((1, 2, 3), [1.0, 2.0, 3.0]) == 3


# --------------------------------------------------------------------- the two draws
def test_the_draw_follows_the_acceptance_rate(monkeypatch):
    """Rejection while a candidate is kept often enough, descent once a few priorities
    dwarf the rest; a large buffer (whose tree has levels below the wide root), both."""
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 1, 20_000, seed=3)
    buf.extend(np.arange(20_000)[None])
    calls = {"rejection": 0, "descent": 0}
    # Descent draws and weighs in one call (fused_descent.draw_weighted); so does
    # rejection with numba (fused_rejection.draw_kept_weighted), numpy's without.
    rejecting, descending = prioritized.draw_rejecting, prioritized.draw_weighted
    rejecting_fused = prioritized.draw_kept_weighted

    def count_rejecting(*args):
        calls["rejection"] += 1
        return rejecting(*args)

    def count_rejecting_fused(*args):
        calls["rejection"] += 1
        return rejecting_fused(*args)

    def count_descending(*args):
        calls["descent"] += 1
        return descending(*args)

    monkeypatch.setattr(prioritized, "draw_rejecting", count_rejecting)
    monkeypatch.setattr(prioritized, "draw_kept_weighted", count_rejecting_fused)
    monkeypatch.setattr(prioritized, "draw_weighted", count_descending)
    rng = np.random.default_rng(0)
    priorities = rng.random(20_000) + 0.1
    buf.update_priorities(np.arange(20_000), priorities)
    for heavy in (False, True):
        if heavy:  # one huge priority: a candidate is almost never kept
            buf.update_priorities(np.array([123]), np.array([1e6]))
            priorities[123] = 1e6
        calls.update(rejection=0, descent=0)
        counts = np.zeros(20_000)
        for _ in range(40):
            items, info = buf.get_next(500, num_steps=2)
            x = to_np(items)[:, 0]
            counts += np.bincount(x, minlength=20_000)
            scaled = priorities ** 0.6
            valid = scaled[:-1].sum()  # the newest step cannot start a window of two
            np.testing.assert_allclose(to_np(info.probabilities), scaled[x] / valid,
                                       rtol=1e-5)
            assert x.max() < 19_999
        assert calls == ({"rejection": 0, "descent": 40} if heavy
                         else {"rejection": 40, "descent": 0})
        # Coarse: 20 bins of 1000 steps, against their share of the valid mass.
        bins = counts.reshape(20, 1000).sum(axis=1)
        mass = scaled.copy()
        mass[-1] = 0.0
        expected = mass.reshape(20, 1000).sum(axis=1) / mass.sum() * counts.sum()
        keep = expected > 50
        assert chi_square(bins[keep], expected[keep]) < 45.3  # 99.9% at 19 df


def test_rejection_bound_covers_restored_priorities():
    """A restored state whose priorities exceed max_priority ** alpha (edited, say) still
    samples in proportion: the bound is raised to the largest stored value, and saved."""
    buf = counter_buffer(max_length=4, adds=4, draw="rejection")
    buf.update_priorities(np.arange(4), np.array([1.0, 1.0, 1.0, 1.0]))
    state = buf._sampler.state_dict()
    assert state["bound_floor"] == 0.0
    state["priorities"] = np.array([1.0, 1.0, 1.0, 16.0]) ** 0.6
    other = counter_buffer(max_length=4, adds=4, draw="rejection")
    other._sampler.load_state_dict(state)
    assert other._sampler._floor == pytest.approx(16.0 ** 0.6)
    assert other._sampler.state_dict()["bound_floor"] == other._sampler._floor
    counts = np.zeros(4)
    for _ in range(100):
        items, _ = other.get_next(1000)
        counts += np.bincount(to_np(items), minlength=4)
    expected = np.array([1.0, 1.0, 1.0, 16.0 ** 0.6]) / (3 + 16.0 ** 0.6) * 100_000
    assert chi_square(counts, expected) < CHI2_999[3]
    # States from before the bound was saved restore too.
    del state["bound_floor"]
    other._sampler.load_state_dict(state)
    assert other._sampler._floor == pytest.approx(16.0 ** 0.6)


def test_rejection_stays_inside_the_range_when_it_wraps():
    """Valid starts that wrap past the last position, with several rows: every start
    is valid, and the window's steps follow each other in its row."""
    buf = counter_buffer(batch_size=2, max_length=5, adds=13, draw="rejection")
    for num_steps in (1, 2, 4):
        items, info = buf.get_next(2000, num_steps=num_steps)
        x = to_np(items)
        steps = x % 100
        assert steps.min() >= 13 - 5 and steps[:, 0].max() <= 13 - num_steps
        np.testing.assert_array_equal(np.diff(x, axis=1), 1)
        assert set(np.unique(steps[:, 0])) == set(range(8, 14 - num_steps))


def test_zero_and_negative_zero_priorities():
    buf = counter_buffer(adds=4)
    assert buf.update_priorities(np.array([0, 1]), np.array([-0.0, 0.0])) == 2
    assert buf.priorities(np.array([0, 1])).tolist() == [0.0, 0.0]
    items, _ = buf.get_next(200)
    assert set(to_np(items).tolist()) == {2, 3}


@pytest.mark.parametrize("normalize", ["batch", "buffer"])
def test_weights_over_a_huge_range_of_priorities(normalize):
    """Ratios far past float32's range: weights stay in [0, 1], the largest exactly 1,
    with no overflow on the way (warnings are errors here)."""
    buf = counter_buffer(max_length=4, adds=4, alpha=1.0, beta=1.0, normalize=normalize)
    buf.update_priorities(np.arange(4), np.array([1e-300, 1e-200, 1.0, 1e300]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seen = set()
        for _ in range(50):
            items, info = buf.get_next(64)
            seen |= set(to_np(items).tolist())
            w = to_np(info.weights)
            assert ((w >= 0.0) & (w <= 1.0)).all()
    assert seen == {3}  # 1e300 against 1: nothing else is ever drawn
    # The batch's smallest value is 1e300: weight 1; against the buffer's smallest,
    # 1e-300, the weight is 1e-600, 0 in float32 (and in float64).
    assert (w == (1.0 if normalize == "batch" else 0.0)).all()


# ------------------------------------------------- the sampler's pieces, on plain numbers
def test_the_beta_schedule_anneals_linearly_then_holds():
    from replaybuffer.sampling.beta_schedule import annealed_beta

    assert annealed_beta(0.4, None, 100, 50) == 0.4
    assert annealed_beta(0.4, 1.0, 0, 50) == 0.4
    assert annealed_beta(0.4, 1.0, 100, 0) == 0.4
    assert annealed_beta(0.4, 1.0, 100, 50) == pytest.approx(0.7)
    assert annealed_beta(0.4, 1.0, 100, 100) == annealed_beta(0.4, 1.0, 100, 10_000) == 1.0


def test_item_ids_map_back_to_the_ring_positions_and_drop_stale_ones():
    from replaybuffer.sampling.item_ids import ids_at, live_positions, to_item_ids
    from replaybuffer.sampling.ring import Ring

    for batch_size, max_length, last_id, key_base in ((1, 5, 2, 0), (1, 5, 12, 7),
                                                      (3, 4, 9, 0), (3, 4, 9, 11)):
        ring = Ring(batch_size, max_length)
        ring.last_id = last_id
        ids = np.repeat(np.arange(ring.oldest_id, last_id + 1), batch_size)
        rows = np.tile(np.arange(batch_size), len(ids) // batch_size)
        positions = ring.positions(ids, rows)
        assert ids_at(ring, positions).tolist() == ids.tolist()
        items = to_item_ids(ring, key_base, ids, positions)
        assert items.tolist() == ((key_base + ids) * batch_size + rows).tolist()
        stale = np.array([-1, (key_base + ring.oldest_id) * batch_size - 1,
                          (key_base + last_id + 1) * batch_size], np.int64)
        live, found = live_positions(ring, key_base, np.concatenate([items, stale]))
        assert live.tolist() == [True] * len(items) + [False] * 3
        assert found.tolist() == positions.tolist()


def test_priority_scale_and_its_bound():
    from replaybuffer.sampling.priority_scale import scale, scaled_bound

    p = np.array([0.0, 0.25, 1.0, 9.0])
    scaled, bound = scale(p, 0.5, 9.0)
    assert scaled.tolist() == [0.0, 0.5, 1.0, 3.0] and 3.0 <= bound < 3.0 * (1 + 1e-11)
    assert scale(p, 1.0, 9.0)[0] is p and scale(p, 1.0, 9.0)[1] == 9.0
    assert scale(p, 0.0, 9.0)[0].tolist() == [0.0, 1.0, 1.0, 1.0]  # 0 stays unsampled
    assert scaled_bound(4.0, 0.5, 0.0) >= 2.0 and scaled_bound(4.0, 0.5, 5.0) >= 5.0
    assert scaled_bound(1e300, 2.0, 0.0) == float("inf")


def test_the_valid_range_mass_wraps_and_rejection_pools_fill_a_batch():
    from replaybuffer.sampling.priority_range import cyclic_sum
    from replaybuffer.sampling.rejection import POOL_MAX, pool_size

    values = np.arange(10, dtype=np.float64)
    assert cyclic_sum(values, 3, 1, 10) == 3.0
    assert cyclic_sum(values, 8, 4, 10) == 8 + 9 + 0 + 1
    assert cyclic_sum(values, 0, 10, 10) == values.sum()
    assert pool_size(256, 1.0) >= 256 and pool_size(256, 0.25) >= 4 * 256
    assert pool_size(10**9, 1e-3) == POOL_MAX
