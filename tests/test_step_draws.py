"""The usual read's draw (PrioritizedSampler.sample_steps, sampling/step_draws.py: one
compiled call after little Python) against the general draw it shortens, on the numpy
path (the reference: numba's kernels switched off) and on the compiled general path:
the same item ids, positions, probabilities and weights, bit for bit, and the
generator left in the same state, by rejection and by descent, over rings that wrap,
several rows, item ids with a base (after a clear), zero priorities, a short rejection
round and the descent's odd targets."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.sampling import fused_descent, fused_rejection, step_draws, tree_kernels
from replaybuffer.sampling.ring import Ring

from sampler_twins import bits, two_samplers  # noqa: E402

pytestmark = pytest.mark.skipif(not tree_kernels.AVAILABLE, reason="needs numba")


def filled(monkeypatch, batch_size, max_length, adds, accept_min, sigma, zeros, seed,
           cleared):
    """``(ring, reference, fused)``: twin samplers (numpy path, compiled path) over a
    ring of ``adds`` steps per row, log-normal priorities (``sigma``), a share ``zeros``
    of them 0, after a clear and refill when ``cleared`` (item ids then have a base);
    ``accept_min`` forces rejection (0.0), the descent (2.0), or leaves the choice to
    the priorities (the default)."""
    ring = Ring(batch_size, max_length)
    reference, fused = two_samplers(monkeypatch, ring.capacity)
    rng = np.random.default_rng(seed)
    rounds = 2 if cleared else 1
    for round_ in range(rounds):
        if round_:
            for sampler in (reference, fused):
                sampler.on_clear(ring)
            ring.last_id = -1
        ring.last_id = adds - 1
        for sampler in (reference, fused):
            sampler.on_add(ring, 0, adds)
            if accept_min is not None:
                sampler._accept_min = accept_min
        base = reference.key_base
        item_ids = np.arange((base + ring.oldest_id) * batch_size,
                             (base + adds) * batch_size, dtype=np.int64)
        priorities = rng.lognormal(0.0, sigma, len(item_ids)) * (
            rng.random(len(item_ids)) >= zeros)
        if not priorities.any():
            priorities[-1] = 1.0
        for sampler in (reference, fused):
            sampler.update_priorities(ring, item_ids, priorities)
    return ring, reference, fused


def assert_same_steps(want, got):
    for a, b in zip(want, got):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert bits(a) == bits(b)


@settings(max_examples=200, deadline=None)
@given(batch_size=st.integers(1, 4), max_length=st.integers(1, 40),
       adds=st.integers(1, 120), accept_min=st.sampled_from([None, 0.0, 2.0]),
       sigma=st.sampled_from([0.0, 0.5, 3.0]), zeros=st.sampled_from([0.0, 0.5, 0.95]),
       count=st.integers(1, 300), cleared=st.booleans(), seed=st.integers(0, 2**16))
def test_sample_steps_draws_the_general_paths_bits(batch_size, max_length, adds,
                                                   accept_min, sigma, zeros, count,
                                                   cleared, seed):
    """sample_steps on the compiled sampler against the numpy sampler's (which takes
    the general path: its trees are numpy's and it has no kernels), three draws in a
    row, with a priority update between them so the next descent reads fresh sums."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        ring, reference, fused = filled(monkeypatch, batch_size, max_length, adds,
                                        accept_min, sigma, zeros, seed, cleared)
        rng = np.random.default_rng(seed + 1)
        for _ in range(3):
            with monkeypatch.context() as m:
                m.setattr(tree_kernels, "AVAILABLE", False)
                want = reference.sample_steps(ring, count)
            got = fused.sample_steps(ring, count)
            assert_same_steps(want, got)
            assert reference._rng.bit_generator.state == fused._rng.bit_generator.state
            assert reference.sample_calls == fused.sample_calls
            priorities = rng.lognormal(0.0, sigma, len(got[0]))
            with monkeypatch.context() as m:
                m.setattr(tree_kernels, "AVAILABLE", False)
                reference.update_priorities(ring, want[0], priorities)
            fused.update_priorities(ring, got[0], priorities)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("cleared", [False, True])
def test_the_short_path_matches_the_compiled_general_path(monkeypatch, batch_size,
                                                          cleared):
    """The same sampler state drawn by sample_steps and by _general_steps (the general
    draw with numba's kernels): the same bits, by descent and by rejection."""
    for accept_min in (2.0, 0.0):
        ring, one, other = filled(monkeypatch, batch_size, 37, 90, accept_min, 3.0, 0.3,
                                  4, cleared)
        with monkeypatch.context() as m:  # two compiled samplers in one state
            m.setattr(tree_kernels, "AVAILABLE", True)
        other.load_state_dict(one.state_dict())
        other._accept_min = accept_min
        for _ in range(3):
            want = other._general_steps(ring, 256)
            got = one.sample_steps(ring, 256)
            assert_same_steps(want, got)
            assert one._rng.bit_generator.state == other._rng.bit_generator.state


@pytest.mark.parametrize("batch_size", [1, 2])
def test_odd_targets_take_the_numpy_descent_from_the_same_targets(monkeypatch,
                                                                   batch_size):
    """A descent whose kernel reports an odd batch (forced here: the kernel runs, then
    says odd) finishes on the numpy path from the targets the kernel drew: the
    reference's draws and generator state all the same."""
    ring, reference, fused = filled(monkeypatch, batch_size, 30, 70, 2.0, 2.0, 0.2, 9,
                                    True)
    calls = []

    def odd(*args):
        fused_descent.steps(*args)
        calls.append(1)
        return False

    monkeypatch.setattr(step_draws, "descent_steps", odd)
    with monkeypatch.context() as m:
        m.setattr(tree_kernels, "AVAILABLE", False)
        want = reference.sample_steps(ring, 200)
    got = fused.sample_steps(ring, 200)
    assert calls == [1]
    assert_same_steps(want, got)
    assert reference._rng.bit_generator.state == fused._rng.bit_generator.state


def test_a_short_rejection_round_is_completed_as_the_general_path_does(monkeypatch):
    """A first round whose pool keeps fewer than the batch (sized for 99%, so about 1
    draw in 100-200 of a small batch) is completed by the numpy loop's later rounds as
    the general path completes its own: draws until a few such rounds have come, each
    draw the numpy sampler's bit for bit."""
    ring = Ring(2, 50)
    reference, fused = two_samplers(monkeypatch, ring.capacity)
    ring.last_id = 130  # wrapped
    ids = np.arange(ring.oldest_id * 2, 131 * 2, dtype=np.int64)
    priorities = np.where(np.arange(len(ids)) % 9 == 0, 1.0, 0.3)
    for sampler in (reference, fused):
        sampler.on_add(ring, 0, 131)
        sampler.update_priorities(ring, ids, priorities)
        sampler._accept_min = 0.0  # reject however few are kept
    short = []

    def continued(*args):
        short.append(args[-1])  # (how many the first round kept)
        return fused_rejection.continued(*args)

    monkeypatch.setattr(step_draws, "continued", continued)
    for _ in range(3000):
        with monkeypatch.context() as m:
            m.setattr(tree_kernels, "AVAILABLE", False)
            want = reference.sample_steps(ring, 8)
        got = fused.sample_steps(ring, 8)
        assert_same_steps(want, got)
        assert reference._rng.bit_generator.state == fused._rng.bit_generator.state
        if len(short) >= 3:
            break
    assert len(short) >= 3 and all(0 <= k < 8 for k in short)


def test_other_generators_and_buffer_normalization_take_the_general_path(monkeypatch):
    """normalize="buffer", and a bit generator no kernel can call, are drawn by the
    general path (the same bits as the numpy sampler's)."""
    ring = Ring(1, 40)
    ring.last_id = 59
    for normalize, bit_generator in (("buffer", None), ("batch", "other")):
        reference, fused = two_samplers(monkeypatch, ring.capacity, normalize=normalize)
        if bit_generator == "other":  # a subclass: not one of numpy's own classes
            class Other(np.random.PCG64):
                pass
            for sampler in (reference, fused):
                sampler._rng = np.random.Generator(Other(3))
        ids = np.arange(20, 60, dtype=np.int64)
        values = np.random.default_rng(0).lognormal(0.0, 3.0, 40)
        for sampler in (reference, fused):
            sampler.on_add(ring, 0, 60)
            sampler.update_priorities(ring, ids, values)
        with monkeypatch.context() as m:
            m.setattr(tree_kernels, "AVAILABLE", False)
            want = reference.sample_steps(ring, 64)
        got = fused.sample_steps(ring, 64)
        assert fused._step_source is None or normalize == "buffer"
        assert_same_steps(want, got)
        assert reference._rng.bit_generator.state == fused._rng.bit_generator.state


@pytest.mark.parametrize("clone", ["pickle", "deepcopy"])
@pytest.mark.parametrize("accept_min", [2.0, 0.0])
def test_a_sampler_that_drew_still_copies_and_its_copy_draws_its_own(monkeypatch, clone,
                                                                     accept_min):
    """A sampler keeps its generator's C source (its lock and state's address) after
    the first draw: a pickle or deepcopy of it must still work, and the copy must draw
    from its own generator (the same draws as the original from the same state),
    never advancing the original's."""
    ring, _, sampler = filled(monkeypatch, 2, 30, 70, accept_min, 2.0, 0.2, 5, False)
    sampler.sample_steps(ring, 64)
    copied = pickle.loads(pickle.dumps(sampler)) if clone == "pickle" \
        else copy.deepcopy(sampler)
    before = sampler._rng.bit_generator.state
    got = copied.sample_steps(ring, 64)
    assert sampler._rng.bit_generator.state == before  # the original's untouched
    assert_same_steps(sampler.sample_steps(ring, 64), got)
    assert copied._rng.bit_generator.state == sampler._rng.bit_generator.state
