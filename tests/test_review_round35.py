"""Reproducers for the review of round 35's changes (prioritized direct calls, exponent
rows, torch record tensors, device check choices, numba cache stamps, the Ray
look-ahead). A reproducer fails on b401dd4 (its docstring says what it shows); a test
whose docstring starts with "Guard" checks that a fix here keeps the behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from replaybuffer.sampling import priority_scale
from replaybuffer.sampling.priority_scale import ExponentRows, exponent, exponent_row
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring


def bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("value", [0.6, 0.4, 0.5, 2.0])
def test_an_exponent_row_is_made_once_per_value_and_size(value, dtype):
    """The samplers keep only the last batch size's exponent row; with sizes that
    change from call to call (a shard's share of each update or draw), b401dd4 made
    a new row (np.full, about 1.5 us) at every call, where the 0-d exponent it
    replaced was made once per value. Asked again for a size it has made, after other
    sizes, the sampler's rows (ExponentRows, the one cache of them since exponent_row
    keeps none) give back the row they made: nothing is made per call."""
    rows = ExponentRows(value, dtype)
    first = rows.made(32)
    for count in (256, 31, 200, 33):
        assert rows.get(count) is None
        rows.made(count)
    again = rows.get(32)
    assert again is first
    # ... and it is still the exponent it was: read-only, the 0-d exponent's bits.
    assert not again.flags.writeable
    bases = np.random.default_rng(0).lognormal(0.0, 3.0, 32).astype(dtype)
    assert bits(np.power(bases, again)) == bits(np.power(bases, exponent(value, dtype)))


def test_the_kept_rows_memory_stays_bounded():
    """Guard: the kept rows' memory stays bounded (at most KEPT_ROWS rows and
    KEPT_EXPONENTS exponents, the oldest made dropped first); exponent_row itself
    keeps nothing."""
    big = priority_scale.KEPT_EXPONENTS // 4
    assert exponent_row(0.6, np.float64, big) is not exponent_row(0.6, np.float64, big)
    assert exponent_row(0.6, np.float64, big).shape == (big,)
    rows = ExponentRows(0.6, np.float64)
    for count in range(1, 3 * priority_scale.KEPT_ROWS):
        rows.made(count)
        assert len(rows) <= priority_scale.KEPT_ROWS
        assert rows.held == sum(row.size for row in rows.values())
        assert rows.held <= priority_scale.KEPT_EXPONENTS
    assert rows.get(3 * priority_scale.KEPT_ROWS - 1) is not None  # the newest kept
    assert rows.get(1) is None  # the oldest dropped
    for _ in range(5):
        rows.made(big)
        assert rows.held <= priority_scale.KEPT_EXPONENTS


def test_updates_of_changing_sizes_write_what_the_general_path_writes():
    """Guard: the fused update with kept rows, batch sizes changing every call: the stored
    priorities are those of the 0-d exponent (the general path's arithmetic)."""
    ring = Ring(1, 64)
    sampler = PrioritizedSampler(ring.capacity, 0.6, 0.4, seed=0)
    sampler.on_add(ring, 0, 64)
    ring.last_id = 63
    rng = np.random.default_rng(1)
    want = np.ones(64)
    for count in (8, 5, 8, 13, 5, 8, 2):
        ids = rng.choice(64, count, replace=False).astype(np.int64)
        values = rng.lognormal(0.0, 2.0, count)
        assert sampler.update_priorities(ring, ids, values) == count
        want[ids] = np.power(values, exponent(0.6, np.float64))
    assert bits(sampler.priorities(ring, np.arange(64, dtype=np.int64))) == bits(want)
