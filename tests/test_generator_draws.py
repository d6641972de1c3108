"""Random numbers drawn inside compiled kernels (:mod:`replaybuffer.sampling.
generator_draws`) against ``rng.random``: the same numbers and the same generator
state after, for numpy's bit generators; others are refused (the callers then use
``rng.random``), and the prioritized draws give the same bits either way."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.sampling import generator_draws, tree_kernels
from replaybuffer.sampling.generator_draws import NUMPY_BIT_GENERATORS, bit_source, random_into
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring

from sampler_twins import bits

pytestmark = pytest.mark.skipif(not tree_kernels.AVAILABLE, reason="needs numba")


def same_state(a, b):
    """Two bit generator state dicts equal (MT19937's holds an array)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and bits(a) == bits(b)
    return type(a) is type(b) and a == b


@settings(max_examples=120, deadline=None)
@given(kind=st.sampled_from(NUMPY_BIT_GENERATORS), seed=st.integers(0, 2**64 - 1),
       sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=4),
       before=st.integers(0, 5))
def test_kernel_draws_are_rng_random_and_leave_its_state(kind, seed, sizes, before):
    """For every numpy bit generator, over seeds and sizes (0 included) and after other
    draws (an odd number of 32-bit draws leaves a buffered half that random() must not
    touch): the kernel's numbers are rng.random(n)'s bit for bit, and the state dict
    after is the same, so a checkpoint saves the same generator and a restore draws on
    alike."""
    want, got = np.random.Generator(kind(seed)), np.random.Generator(kind(seed))
    for rng in (want, got):
        rng.integers(0, 2**31, before, dtype=np.uint32)
    for n in sizes:
        expected = want.random(n)
        source = bit_source(got)
        assert source is not None
        out = np.empty(n)
        random_into(*source, out)
        assert bits(out) == bits(expected)
        assert same_state(got.bit_generator.state, want.bit_generator.state)
    restored = np.random.Generator(kind(0))
    restored.bit_generator.state = got.bit_generator.state
    out = np.empty(17)
    random_into(*bit_source(restored), out)
    assert bits(out) == bits(want.random(17))


class _Custom(np.random.PCG64):
    """A bit generator class bit_source does not know (it could draw any way)."""


def test_other_bit_generators_and_no_numba_take_rng_random(monkeypatch):
    assert bit_source(np.random.Generator(_Custom(1))) is None
    monkeypatch.setattr(tree_kernels, "AVAILABLE", False)
    monkeypatch.setattr(generator_draws, "_function_of", {})
    assert bit_source(np.random.default_rng(1)) is None


def wrapped_sampler(accept_min: float) -> tuple[Ring, PrioritizedSampler]:
    """A prioritized sampler over a wrapped ring of 2 x 300 with log-normal priorities,
    drawing by rejection (``accept_min`` 0) or by descent (2)."""
    ring = Ring(2, 300)
    ring.last_id = 450  # wrapped
    sampler = PrioritizedSampler(ring.capacity, seed=3)
    sampler._accept_min = accept_min
    sampler.on_add(ring, 0, 451)
    rng = np.random.default_rng(4)
    ids = (np.arange(ring.capacity) + 151 * 2).astype(np.int64)
    sampler.update_priorities(ring, ids, rng.lognormal(0.0, 1.5, ring.capacity))
    return ring, sampler


@pytest.mark.parametrize("accept_min", [0.0, 2.0])  # rejection, descent
def test_a_sampler_draws_alike_from_a_bit_generator_the_kernel_cannot_call(accept_min):
    """The same sampler state sampled with a generator the kernels draw from and with an
    unknown class over the same bits (drawn by rng.random, handed in): the same draws,
    probabilities and weights, and the generators end alike."""
    ring, sampler = wrapped_sampler(accept_min)
    for _ in range(3):
        known = np.random.Generator(np.random.PCG64(11))
        custom = np.random.Generator(_Custom(11))
        (a_ids, a_pos), a_info = sampler.sample(ring, 200, 3, known)
        (b_ids, b_pos), b_info = sampler.sample(ring, 200, 3, custom)
        assert bits(a_ids) == bits(b_ids) and bits(a_pos) == bits(b_pos)
        for key in ("probabilities", "weights"):
            assert bits(a_info[key]) == bits(b_info[key])
        assert known.bit_generator.state["state"] == custom.bit_generator.state["state"]


@pytest.mark.parametrize("accept_min", [0.0, 2.0])  # rejection, descent
def test_a_kernel_draw_takes_the_bit_generators_lock(accept_min):
    """A generator may be shared between threads (numpy's ``rng.random`` serialises
    them with ``rng.bit_generator.lock``; a buffer's ``draw(rng=...)`` takes any
    generator): the kernels draw from its state under that lock too. Reproducer: while
    another thread holds the lock, a draw waits for it, and once the lock is let go it
    draws exactly what it would have."""
    import threading

    ring, sampler = wrapped_sampler(accept_min)
    expected = sampler.sample(ring, 64, 1, np.random.default_rng(9))[0][0]
    shared = np.random.default_rng(9)
    done = []
    shared.bit_generator.lock.acquire()
    try:
        drawer = threading.Thread(
            target=lambda: done.append(sampler.sample(ring, 64, 1, shared)[0][0]))
        drawer.start()
        drawer.join(0.5)
        # The draw cannot have gone ahead: the state belongs to the lock's holder.
        assert not done
    finally:
        shared.bit_generator.lock.release()
    drawer.join()
    assert bits(done[0]) == bits(expected)
