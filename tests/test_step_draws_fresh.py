"""The contract of ``PrioritizedSampler.sample_steps`` that torch storage's
``wraps_fresh`` relies on (``sampling/step_draws.py``): its ids, probabilities and
weights are fresh numpy arrays, C-contiguous, aligned and writeable, of exactly int64,
float32 and float32, sharing memory with nothing of the sampler's and with no earlier
call's results, on the compiled and the numpy path (numba's kernels switched off, and
``REPLAYBUFFER_NUMBA=0`` in a child process), by rejection and descent, with a min
tree (``normalize="buffer"``), beta annealed, rows and item ids with a base."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring

DTYPES = (np.dtype(np.int64), np.dtype(np.float32), np.dtype(np.float32))


def state_arrays(obj, seen=None, depth=0):
    """Every numpy array reachable from ``obj`` through attributes, lists, tuples and
    dicts (the sampler's trees, kept rows, scratch and pending updates)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return []
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type) and \
            type(obj).__module__.startswith("replaybuffer"):
        items = list(vars(obj).values())
    else:
        return []
    return [a for item in items for a in state_arrays(item, seen, depth + 1)]


def assert_fresh(steps, sampler, earlier):
    """``steps`` (sample_steps' result) keeps the contract; ``earlier``: arrays handed
    out before, which none may share memory with."""
    handed = (steps[0], steps[2], steps[3])
    for array, dtype in zip(handed, DTYPES):
        assert type(array) is np.ndarray and array.dtype == dtype and array.ndim == 1
        flags = array.flags
        assert flags.c_contiguous and flags.aligned and flags.writeable
    kept = state_arrays(sampler)
    assert kept  # (the walk finds the trees: it would pass vacuously otherwise)
    for k, array in enumerate(handed):
        for other in kept + list(earlier) + list(handed[k + 1:]):
            assert not np.may_share_memory(array, other)


def sampler_over(batch_size, max_length, adds, cleared, normalize, beta_final, sigma,
                 seed):
    """A sampler (on whatever path the kernels' switch gives) over a ring of ``adds``
    steps per row, log-normal priorities, a clear and refill first when ``cleared``."""
    ring = Ring(batch_size, max_length)
    sampler = PrioritizedSampler(ring.capacity, seed=seed, normalize=normalize,
                                 beta_final=beta_final, beta_steps=5)
    rng = np.random.default_rng(seed)
    for round_ in range(2 if cleared else 1):
        if round_:
            sampler.on_clear(ring)
            ring.last_id = -1
        ring.last_id = adds - 1
        sampler.on_add(ring, 0, adds)
        base = sampler.key_base
        item_ids = np.arange((base + ring.oldest_id) * batch_size,
                             (base + adds) * batch_size, dtype=np.int64)
        sampler.update_priorities(ring, item_ids,
                                  rng.lognormal(0.0, sigma, len(item_ids)))
    return ring, sampler


@settings(max_examples=60, deadline=None)
@given(batch_size=st.integers(1, 3), max_length=st.integers(1, 40),
       adds=st.integers(1, 90), count=st.integers(1, 300), seed=st.integers(0, 2**16),
       cleared=st.booleans(), normalize=st.sampled_from(["batch", "buffer"]),
       beta_final=st.sampled_from([None, 1.0]), sigma=st.sampled_from([0.2, 3.0]),
       accept_min=st.sampled_from([None, 0.0, 2.0]), compiled=st.booleans())
def test_sample_steps_hands_out_fresh_arrays(batch_size, max_length, adds, count, seed,
                                             cleared, normalize, beta_final, sigma,
                                             accept_min, compiled):
    """Every path's ids, probabilities and weights keep the contract over several
    draws, and writing into them changes no later draw."""
    if compiled and not tree_kernels.AVAILABLE:
        compiled = False
    with pytest.MonkeyPatch.context() as m:
        if not compiled:
            m.setattr(tree_kernels, "AVAILABLE", False)
        pair = [sampler_over(batch_size, max_length, adds, cleared, normalize,
                             beta_final, sigma, seed) for _ in range(2)]
        if accept_min is not None:  # rejection (0.0) or the descent (2.0) forced
            for _, sampler in pair:
                sampler._accept_min = accept_min
        (ring, sampler), (twin_ring, twin) = pair
        earlier: list[np.ndarray] = []
        for _ in range(3):
            steps = sampler.sample_steps(ring, count)
            want = twin.sample_steps(twin_ring, count)
            assert_fresh(steps, sampler, earlier)
            for got, expected in zip(steps, want):
                assert got.tobytes() == expected.tobytes()
            earlier += [steps[0], steps[2], steps[3]]
            for array in (steps[0], steps[2], steps[3]):  # scribbled on by a consumer
                array[...] = 7


NUMPY_ONLY = """
import numpy as np
from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.ring import Ring
assert not tree_kernels.AVAILABLE
ring = Ring(2, 50)
ring.last_id = 79
for normalize in ("batch", "buffer"):
    sampler = PrioritizedSampler(ring.capacity, seed=3, normalize=normalize)
    sampler.on_add(ring, 0, 80)
    ids = np.arange(ring.oldest_id * 2, 160, dtype=np.int64)
    sampler.update_priorities(ring, ids, np.random.default_rng(0).lognormal(0, 2, len(ids)))
    state = [sampler._sum.leaves] + [v for v in vars(sampler).values()
                                     if isinstance(v, np.ndarray)]
    seen = []
    for _ in range(4):
        ids_, _, probabilities, weights = sampler.sample_steps(ring, 64)
        for array, dtype in ((ids_, np.int64), (probabilities, np.float32),
                             (weights, np.float32)):
            assert type(array) is np.ndarray and array.dtype == dtype, array.dtype
            assert array.flags.c_contiguous and array.flags.aligned
            assert array.flags.writeable
            assert not any(np.may_share_memory(array, s) for s in state + seen)
            seen.append(array)
print("fresh")
"""


def test_sample_steps_is_fresh_without_numba():
    """With ``REPLAYBUFFER_NUMBA=0`` (the trees and draws numpy's from import on)."""
    env = dict(os.environ, REPLAYBUFFER_NUMBA="0",
               PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    done = subprocess.run([sys.executable, "-c", NUMPY_ONLY], env=env, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fresh"


def test_torch_storage_wraps_fresh_arrays_with_plain_from_numpy():
    """Torch storage on the CPU says it wraps fresh arrays with ``torch.from_numpy``
    (the prioritized short path then calls that alone), sharing their memory; its
    device layout (the CPU twin of a GPU's) keeps its ``from_numpy``."""
    torch = pytest.importorskip("torch")
    from replaybuffer import PrioritizedReplayBuffer
    from replaybuffer.storage.torch_storage import TorchStorage

    spec = {"obs": np.zeros(3, np.float32), "done": np.bool_(False)}
    buffer = PrioritizedReplayBuffer(spec, 1, 20, storage="torch", seed=0)
    assert buffer._storage.wraps_fresh is torch.from_numpy
    assert buffer._direct_backend is torch.from_numpy
    fresh = np.arange(4, dtype=np.int64)
    wrapped = buffer._storage.wraps_fresh(fresh)
    fresh[0] = 9
    assert int(wrapped[0]) == 9  # no copy
    buffer.add_batch({"obs": np.ones((1, 3), np.float32), "done": np.ones(1, bool)})
    _, info = buffer.get_next(5)
    assert info.ids.dtype == torch.int64 and info.weights.dtype == torch.float32
    with pytest.MonkeyPatch.context() as m:
        m.setattr(TorchStorage, "numpy_views", False)
        device_layout = TorchStorage([buffer._storage.specs[0]], 4)
    assert device_layout.wraps_fresh == device_layout.from_numpy
