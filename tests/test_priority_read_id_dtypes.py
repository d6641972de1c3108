"""``priorities(ring, item_ids)`` of both prioritized samplers (the host's and the torch
one, on the CPU) called directly with item ids of any integer dtype: read as the same
ids as int64, as ``update_priorities`` takes them (``int64_item_ids``); float and
boolean ids are refused with ``update_priorities``' ``TypeError`` naming ``item_ids``,
and leave the sampler as it was (float ids raised ``IndexError``, on fdeea8f)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring

DTYPES = [np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32,
          np.uint64]
KINDS = ["host", "torch prefix", "torch tree"]


def make(kind: str, capacity: int):
    if kind == "host":
        return PrioritizedSampler(capacity, 0.6, 0.4, seed=0)
    pytest.importorskip("torch")
    from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler
    return TorchPrioritizedSampler(capacity, 0.6, 0.4, seed=0, device="cpu",
                                   search=kind.split()[1])


def filled(kind: str, batch_size: int, adds: int, seed: int, cleared: bool = False):
    """A sampler over a ring of 40 steps per row holding ``adds`` steps of log-normal
    priorities (``cleared``: after as many adds and a clear, so ids carry a base)."""
    ring = Ring(batch_size, 40)
    sampler = make(kind, ring.capacity)
    rng = np.random.default_rng(seed)
    for round_ in range(2 if cleared else 1):
        if round_:
            sampler.on_clear(ring)
            ring.last_id = -1
        sampler.on_add(ring, 0, adds)
        ring.last_id = adds - 1
        base = sampler.key_base
        ids = np.arange((base + ring.oldest_id) * batch_size, (base + adds) * batch_size)
        sampler.update_priorities(ring, ids, rng.lognormal(0.0, 1.0, len(ids)))
    return sampler, ring


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS), dtype=st.sampled_from(DTYPES),
       batch_size=st.sampled_from([1, 3]), adds=st.integers(1, 80),
       cleared=st.booleans(), seed=st.integers(0, 2**16))
def test_ids_of_any_integer_dtype_read_what_int64_ids_read(kind, dtype, batch_size, adds,
                                                           cleared, seed):
    """The same values, bit for bit (NaN for stale ids), as the same ids in int64."""
    sampler, ring = filled(kind, batch_size, adds, seed, cleared)
    rng = np.random.default_rng(seed)
    top = min((sampler.key_base + adds + 5) * batch_size, int(np.iinfo(dtype).max))
    ids = rng.integers(0, top + 1, rng.integers(1, 200))
    want = sampler.priorities(ring, ids.astype(np.int64))
    got = sampler.priorities(ring, ids.astype(dtype))
    assert got.dtype == np.float64 and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("kind", KINDS)
def test_int32_ids_read_live_steps(kind):
    """The reproducer's shape: int32 ids of live steps give their priorities."""
    sampler, ring = filled(kind, 2, 30, 0)
    sampler.update_priorities(ring, np.arange(4), np.full(4, 2.0))
    got = sampler.priorities(ring, np.array([0, 3, 59, 60], np.int32))
    assert np.array_equal(got[:2], [2.0 ** 0.6] * 2) and np.isfinite(got[2])
    assert np.isnan(got[3])  # past the last step: stale


@pytest.mark.parametrize("kind", KINDS)
def test_unsigned_ids_past_int64_are_stale(kind):
    sampler, ring = filled(kind, 1, 30, 0)
    sampler.update_priorities(ring, np.array([3]), np.array([4.0]))
    got = sampler.priorities(ring, np.array([2**64 - 1, 2**63, 3], np.uint64))
    assert np.isnan(got[0]) and np.isnan(got[1]) and got[2] == 4.0 ** 0.6


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.bool_])
def test_non_integer_ids_are_refused_naming_item_ids_and_change_nothing(kind, dtype):
    """Against an untouched twin: the pending new step still pending, and then the
    same state (state_dict flushes it, so it is compared last)."""
    pair = []
    for _ in range(2):
        sampler, ring = filled(kind, 2, 20, 0)
        sampler.on_add(ring, 20, 1)  # a pending new step: not flushed by a refused call
        ring.last_id = 20
        pair.append((sampler, ring))
    (sampler, ring), (twin, _) = pair
    assert len(sampler._pending) == 1
    with pytest.raises(TypeError, match=rf"item_ids must be integer item ids \(int64.*"
                       rf"dtype {np.dtype(dtype)}"):
        sampler.priorities(ring, np.arange(4).astype(dtype))
    assert len(sampler._pending) == len(twin._pending) == 1
    state, want = sampler.state_dict(), twin.state_dict()
    assert np.asarray(state["priorities"]).tobytes() == \
        np.asarray(want["priorities"]).tobytes()
    assert state["max_priority"] == want["max_priority"]
    # the same ids as integers are read
    assert np.isfinite(sampler.priorities(ring, np.arange(4))).all()
