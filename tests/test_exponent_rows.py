"""The prioritized sampler's exponent rows (``priority_scale.ExponentRows``): the one
cache of ``np.power``'s exponent rows, per sampler and by batch size, for alpha (the
update's write) and beta (the usual draw's weights). A row is made once per value and
size, sizes changing from call to call included, a new alpha or beta starts afresh, and
the powers keep the 0-d exponent's bits."""

from __future__ import annotations

import numpy as np
import pytest

from replaybuffer import PrioritizedReplayBuffer
from replaybuffer.sampling import priority_scale, tree_kernels
from replaybuffer.sampling.priority_scale import ExponentRows, exponent
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring

needs_numba = pytest.mark.skipif(not tree_kernels.AVAILABLE, reason="needs numba")
SIZES = [32, 31, 200, 33, 32, 200, 31, 33, 32]


@pytest.fixture
def made(monkeypatch):
    """The (value, dtype, count) of every row made."""
    calls: list[tuple[float, type, int]] = []
    make = priority_scale.exponent_row

    def counted(value, dtype, count):
        calls.append((value, dtype, count))
        return make(value, dtype, count)

    monkeypatch.setattr(priority_scale, "exponent_row", counted)
    return calls


@needs_numba
def test_updates_of_changing_sizes_make_each_size_s_row_once(made):
    ring = Ring(1, 500)
    sampler = PrioritizedSampler(500, 0.6, 0.4, seed=0)
    sampler.on_add(ring, 0, 500)
    ring.last_id = 499
    rng = np.random.default_rng(0)
    for count in SIZES:
        sampler.update_priorities(ring, rng.integers(0, 500, count), rng.random(count))
    assert sorted(made) == sorted((0.6, np.float64, c) for c in set(SIZES))
    sampler.alpha = 0.7  # a new alpha: its rows are made anew, the old ones dropped
    for count in SIZES:
        sampler.update_priorities(ring, rng.integers(0, 500, count), rng.random(count))
    assert sorted(made[4:]) == sorted((0.7, np.float64, c) for c in set(SIZES))
    assert set(sampler._alpha_kept[3]) == set(SIZES)


@needs_numba
def test_draws_of_changing_sizes_make_each_size_s_row_once(made):
    buf = PrioritizedReplayBuffer({"x": np.zeros((), np.float32)}, 1, 500, seed=0)
    buf.extend({"x": np.zeros((1, 500), np.float32)})
    buf.update_priorities(np.arange(500), np.random.default_rng(0).lognormal(0, 2, 500))
    before = len(made)
    for count in SIZES:
        buf.get_next(count)
    beta_rows = [call for call in made[before:] if call[1] is np.float32]
    assert sorted(beta_rows) == sorted((0.4, np.float32, c) for c in set(SIZES))


@pytest.mark.parametrize("value, dtype", [(0.6, np.float64), (0.4, np.float32),
                                          (2.0, np.float64), (0.5, np.float32)])
def test_a_kept_row_powers_as_the_0d_exponent(value, dtype):
    rows = ExponentRows(value, dtype)
    for count in SIZES:
        row = rows.get(count)
        row = rows.made(count) if row is None else row
        assert not row.flags.writeable
        bases = np.random.default_rng(count).lognormal(0.0, 3.0, count).astype(dtype)
        assert np.power(bases, row).tobytes() == \
            np.power(bases, exponent(value, dtype)).tobytes()


def test_a_row_larger_than_the_bound_is_kept_alone():
    rows = ExponentRows(0.6, np.float64)
    rows.made(10)
    huge = priority_scale.KEPT_EXPONENTS + 1
    kept = rows.made(huge)
    assert list(rows) == [huge] and rows.get(huge) is kept and rows.held == huge
    rows.made(10)  # the next one drops it
    assert list(rows) == [10] and rows.held == 10
