"""The fused priority update (one compiled call: ids to positions, liveness, leaves and
paths) against the numpy path: after the same updates, stale ids, repeated ids, zeros
and refused bad values included, the stored priorities and the next draws are the
same bits; a refused update leaves the buffer as it was."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer.sampling import tree_kernels

pytestmark = pytest.mark.skipif(not tree_kernels.AVAILABLE, reason="needs numba")


def buffer(monkeypatch, compiled, batch_size, max_length, alpha, normalize):
    with monkeypatch.context() as m:
        m.setattr(tree_kernels, "AVAILABLE", compiled)
        return rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.float32), batch_size,
                                          max_length, alpha=alpha, seed=1,
                                          normalize=normalize)


def state_bits(buf) -> bytes:
    state = buf._sampler.state_dict()
    return state["priorities"].tobytes() + np.float64(state["max_priority"]).tobytes()


@settings(max_examples=60, deadline=None)
@given(batch_size=st.integers(1, 3), max_length=st.integers(1, 30),
       adds=st.integers(1, 80), alpha=st.sampled_from([0.0, 0.6, 1.0]),
       normalize=st.sampled_from(["batch", "buffer"]), seed=st.integers(0, 2**16))
def test_updates_leave_the_numpy_paths_priorities_and_draws(batch_size, max_length, adds,
                                                            alpha, normalize, seed):
    monkeypatch = pytest.MonkeyPatch()
    rng = np.random.default_rng(seed)
    bufs = {mode: buffer(monkeypatch, mode, batch_size, max_length, alpha, normalize)
            for mode in (False, True)}
    for buf in bufs.values():
        buf.extend(np.zeros((batch_size, adds), np.float32))
    newest = adds * batch_size - 1
    for step in range(6):
        count = int(rng.integers(1, 40))
        ids = rng.integers(max(0, newest - 2 * max_length * batch_size), newest + 1, count)
        if step == 3:
            ids[0] = newest  # a repeated id: the last value wins
            ids[-1] = newest
        values = rng.lognormal(0.0, 2.0, count) * (rng.random(count) < 0.8)
        bad = step == 4
        if bad:
            values[rng.integers(0, count)] = rng.choice([np.nan, -1.0, np.inf])
        for mode, buf in bufs.items():
            before = state_bits(buf)
            with monkeypatch.context() as m:
                m.setattr(tree_kernels, "AVAILABLE", mode)
                if bad:
                    with pytest.raises(ValueError, match="finite and >= 0"):
                        buf.update_priorities(ids, values)
                    assert state_bits(buf) == before
                else:
                    buf.update_priorities(ids, values)
        assert state_bits(bufs[False]) == state_bits(bufs[True])
        draws = []
        for mode, buf in bufs.items():
            with monkeypatch.context() as m:
                m.setattr(tree_kernels, "AVAILABLE", mode)
                try:
                    _, info = buf.get_next(64)
                except rb.EmptyBufferError:
                    draws.append(None)
                    continue
                draws.append(b"".join(np.ascontiguousarray(a).tobytes()
                                      for a in (info.ids, info.probabilities,
                                                info.weights)))
        assert draws[0] == draws[1]
    monkeypatch.undo()
