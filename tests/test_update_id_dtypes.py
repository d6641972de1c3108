"""``PrioritizedSampler.update_priorities`` called directly (not through a buffer, which
always passes int64) with item ids of any integer dtype, in any order: the fused
write's compiled entry (``tree_kernels.direct_entry``) is made for int64 ids, so ids of
another dtype are converted at the sampler's boundary (a call with int32 ids after an
int64 one raised numba's ``TypeError`` on 324fdec; with numba off the numpy path read
int32 ids as uint64 and raised or misread). Non-integer ids are refused, naming
``item_ids``, and change nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring

DTYPES = [np.int64, np.int32, np.int16, np.uint32, np.uint64, np.uint16]


def filled(batch_size: int, max_length: int, adds: int) -> tuple[PrioritizedSampler, Ring]:
    ring = Ring(batch_size, max_length)
    sampler = PrioritizedSampler(batch_size * max_length, 0.6, 0.4, seed=0)
    sampler.on_add(ring, 0, adds)
    ring.last_id = adds - 1
    return sampler, ring


def tree_bits(sampler: PrioritizedSampler) -> tuple[bytes, float]:
    state = sampler.state_dict()
    return np.asarray(state["priorities"]).tobytes(), float(state["max_priority"])


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from(DTYPES), st.integers(0, 2**16)),
                      min_size=1, max_size=6),
       batch_size=st.sampled_from([1, 3]), adds=st.integers(1, 60))
def test_ids_of_any_integer_dtype_write_what_int64_ids_write(calls, batch_size, adds):
    """Against a twin given the same ids as int64 (the buffers' way): the same count
    returned at every call and the same stored priorities, bit for bit, whatever the
    order of dtypes (int64 first or not: the compiled entry is made at the first call),
    stale ids included."""
    sampler, ring = filled(batch_size, 40, adds)
    twin, twin_ring = filled(batch_size, 40, adds)
    top = (adds + 5) * batch_size
    for dtype, seed in calls:
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, min(top, np.iinfo(dtype).max), rng.integers(1, 300))
        priorities = rng.lognormal(0.0, 1.0, len(ids))
        assert sampler.update_priorities(ring, ids.astype(dtype), priorities) == \
            twin.update_priorities(twin_ring, ids.astype(np.int64), priorities)
        assert tree_bits(sampler) == tree_bits(twin)


def test_int32_ids_after_int64_ids_are_applied():
    """The reproducer: int64 ids first (the compiled entry made for them), then int32."""
    sampler, ring = filled(1, 100, 50)
    assert sampler.update_priorities(ring, np.arange(4), np.ones(4)) == 4
    assert sampler.update_priorities(ring, np.arange(3, dtype=np.int32),
                                     np.full(3, 2.0)) == 3
    got = sampler.priorities(ring, np.arange(5))
    assert np.array_equal(got, [2.0 ** 0.6] * 3 + [1.0, 1.0])


def test_unsigned_ids_past_int64_are_stale():
    """An unsigned id past int64's range names no step: ignored, as any stale id."""
    sampler, ring = filled(1, 100, 50)
    ids = np.array([2**64 - 1, 2**63, 3], np.uint64)
    assert sampler.update_priorities(ring, ids, np.full(3, 4.0)) == 1
    assert sampler.priorities(ring, np.array([3]))[0] == 4.0 ** 0.6


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.bool_])
def test_non_integer_ids_are_refused_naming_item_ids_and_change_nothing(dtype):
    sampler, ring = filled(2, 30, 20)
    sampler.update_priorities(ring, np.arange(8), np.linspace(0.5, 3.0, 8))
    sampler.on_add(ring, 20, 1)  # a pending new step: not flushed by a refused call
    ring.last_id = 20
    pending = len(sampler._pending)
    sums = sampler._sum.get(np.arange(60)).tobytes()
    with pytest.raises(TypeError, match=rf"item_ids must be integer item ids \(int64.*"
                       rf"dtype {np.dtype(dtype)}"):
        sampler.update_priorities(ring, np.arange(4).astype(dtype), np.full(4, 9.0))
    assert len(sampler._pending) == pending
    assert sampler._sum.get(np.arange(60)).tobytes() == sums
    assert sampler.max_priority == 3.0
