"""Twin prioritized samplers for the compiled paths' tests: one on the numpy path (the
reference), one on the compiled path, seeded alike, filled alike, compared bit for bit
(``tests/test_fused_descent.py``, ``tests/test_prioritized_fast_path.py``)."""

from __future__ import annotations

import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring


def bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def two_samplers(monkeypatch, capacity, **kwargs):
    """A sampler on the numpy path (trees and draws) and one on the compiled path."""
    with monkeypatch.context() as m:
        m.setattr(tree_kernels, "AVAILABLE", False)
        reference = PrioritizedSampler(capacity, seed=7, **kwargs)
    fused = PrioritizedSampler(capacity, seed=7, **kwargs)
    assert not reference._sum.compiled and fused._sum.compiled
    return reference, fused


def filled_twins(monkeypatch, batch_size, max_length, adds, accept_min, sigma, zeros,
                 seed, normalize):
    """``(ring, reference, fused)``: twins over a ring of ``adds`` steps per row whose
    priorities are log-normal (``sigma``), a share ``zeros`` of them 0; ``accept_min``
    forces rejection (0.0) or the descent (2.0)."""
    ring = Ring(batch_size, max_length)
    reference, fused = two_samplers(monkeypatch, ring.capacity, normalize=normalize)
    for sampler in (reference, fused):
        sampler._accept_min = accept_min
    rng = np.random.default_rng(seed)
    ring.last_id = adds - 1
    for sampler in (reference, fused):
        sampler.on_add(ring, 0, adds)
    item_ids = np.arange(ring.oldest_id * batch_size, adds * batch_size, dtype=np.int64)
    priorities = rng.lognormal(0.0, sigma, len(item_ids)) * (
        rng.random(len(item_ids)) >= zeros)
    for sampler in (reference, fused):
        sampler.update_priorities(ring, item_ids, priorities)
    return ring, reference, fused


def assert_same(want, got, reference, fused):
    """Two samples (``(indices, info)``) bit for bit, and the generators in one state."""
    (w_idx, w_info), (g_idx, g_info) = want, got
    assert bits(w_idx.start_ids) == bits(g_idx.start_ids)
    assert bits(w_idx.start_positions) == bits(g_idx.start_positions)
    for key in ("probabilities", "weights"):
        assert w_info[key].dtype == g_info[key].dtype == np.float32
        assert bits(w_info[key]) == bits(g_info[key]), key
    assert reference._rng.bit_generator.state == fused._rng.bit_generator.state
