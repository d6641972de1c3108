"""Ring arithmetic and deterministic-pass plans, with plain integers."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.sampling import Ring, UniformSampler
from replaybuffer.sampling import ring as r
from replaybuffer.sampling.deterministic import check_not_all_dropped, plan, window_starts


@pytest.mark.parametrize("last_id,L,T,expected", [
    (-1, 5, 1, (0, 0)),      # empty
    (0, 5, 1, (0, 1)),
    (3, 5, 2, (0, 3)),       # not full: [0, last_id + 2 - T)
    (3, 5, 5, (0, 0)),       # T longer than what is stored
    (9, 5, 1, (5, 10)),      # full: [last_id + 1 - L, last_id + 2 - T)
    (9, 5, 2, (5, 9)),
    (9, 5, 5, (5, 6)),
])
def test_valid_start_range(last_id, L, T, expected):
    assert r.valid_start_range(last_id, L, T) == expected


def test_items_oldest_positions_and_table_rows():
    assert r.items_per_row(-1, 4) == 0 and r.items_per_row(2, 4) == 3 and r.items_per_row(9, 4) == 4
    assert r.oldest_id(2, 4) == 0 and r.oldest_id(9, 4) == 6
    ids = np.array([5, 6, 7])
    assert r.positions(ids, np.array([1, 0, 2]), 4, 3).tolist() == [4, 6, 11]
    assert r.positions(ids, 0, 4, 1).tolist() == [1, 2, 3]
    assert r.window_positions(np.array([4, 11]), 3, 4, 3).tolist() == [[4, 7, 10], [11, 2, 5]]
    assert r.table_rows(ids, np.array([1, 0, 2]), 4).tolist() == [5, 2, 11]


def test_ring_rejects_bad_shapes():
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="positive int"):
            Ring(bad, 3)
        with pytest.raises(ValueError, match="positive int"):
            Ring(2, bad)


def test_ring_counts():
    ring = Ring(3, 4)
    assert ring.capacity == 12 and ring.num_frames == 0
    ring.last_id = 9
    assert ring.num_frames == 12 and ring.oldest_id == 6 and ring.items_per_row == 4


def test_uniform_sampler_stays_in_the_valid_range_and_reports_probability():
    ring = Ring(3, 5)
    ring.last_id = 11  # holds ids 7..11 in every row
    sampler = UniformSampler(seed=1)
    (starts, positions), info = sampler.sample(ring, 5000, 2)
    assert starts.min() == 7 and starts.max() == 10  # start + 1 <= 11
    rows = positions % 3
    assert set(rows.tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(positions, r.positions(starts, rows, 5, 3))
    np.testing.assert_allclose(info["probabilities"], 1 / (4 * 3))
    counts = np.bincount((starts - 7) * 3 + rows, minlength=12)
    assert counts.min() > 5000 / 12 * 0.75  # every (start, row) pair is drawn


@pytest.mark.parametrize("batch_size,max_length,last_id,num_steps", [
    (1, 5, 2, 1), (1, 5, 7, 1), (1, 5, 7, 3), (1, 5, 4, 5), (3, 5, 2, 1), (3, 5, 7, 2),
    (3, 5, 9, 1), (4, 3, 11, 3), (2, 7, 100, 4)])
def test_uniform_sampler_positions_match_ids(batch_size, max_length, last_id, num_steps):
    ring = Ring(batch_size, max_length)
    ring.last_id = last_id
    (starts, positions), _ = UniformSampler(seed=0).sample(ring, 3000, num_steps)
    lo, hi = ring.valid_start_range(num_steps)
    assert starts.min() >= lo and starts.max() < hi
    rows = positions % batch_size
    np.testing.assert_array_equal(positions, r.positions(starts, rows, max_length, batch_size))
    assert len(set(zip(starts.tolist(), rows.tolist()))) == (hi - lo) * batch_size


def test_uniform_sampler_state_round_trip_is_bit_exact():
    ring = Ring(2, 10)
    ring.last_id = 30
    a = UniformSampler(seed=7)
    a.sample(ring, 10, 1)
    state = a.state_dict()
    b = UniformSampler(seed=99)
    b.load_state_dict(state)
    np.testing.assert_array_equal(a.sample(ring, 64, 3)[0].start_ids, b.sample(ring, 64, 3)[0].start_ids)


def test_window_starts():
    assert window_starts(5, 2, 2, False) == [(0, 2), (2, 2), (4, 1)]
    assert window_starts(5, 2, 2, True) == [(0, 2), (2, 2)]
    assert window_starts(5, 2, 1, False) == [(0, 2), (1, 2), (2, 2), (3, 2), (4, 1)]
    assert window_starts(0, 2, 2, False) == []


def test_plan_orders_rows_then_steps():
    blocks = list(plan(first_id=3, num_frames=2, batch_size=2, sample_batch_size=None,
                       num_steps=None))
    assert [(int(i), int(b)) for i, b in blocks] == [(3, 0), (4, 0), (3, 1), (4, 1)]


def test_plan_groups_rows_and_keeps_the_partial_group():
    blocks = list(plan(0, 2, 5, 2, 2))
    shapes = [np.broadcast_shapes(np.shape(i), np.shape(b)) for i, b in blocks]
    assert shapes == [(2, 2), (2, 2), (1, 2)]
    assert len(list(plan(0, 2, 5, 2, 2, drop_remainder=True))) == 2


def test_check_not_all_dropped():
    check_not_all_dropped(2, 3, 3, None, False)
    with pytest.raises(ValueError, match="ALL data will be dropped"):
        check_not_all_dropped(2, 3, 3, None, True)
    with pytest.raises(ValueError, match="ALL data will be dropped"):
        check_not_all_dropped(2, 3, None, 4, True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), max_size=40), st.integers(1, 6), st.integers(1, 4),
       st.integers(1, 50))
def test_windows_and_window_positions_match_broadcasting(starts, T, B, L):
    starts = np.array(starts, np.int64)
    expected = starts[:, None] + B * np.arange(T)
    got = r.windows(starts, T, B)
    assert got.shape == (len(starts), T) and got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)
    capacity = L * B
    starts %= capacity
    np.testing.assert_array_equal(r.window_positions(starts, T, L, B),
                                  (starts[:, None] + B * np.arange(T)) % capacity)
    # The cached offsets are shared between calls: a caller must not be able to corrupt them.
    got += 1
    np.testing.assert_array_equal(r.windows(starts, T, B), starts[:, None] + B * np.arange(T))
