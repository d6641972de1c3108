"""The CPU torch storage's gather (storage/torch_storage.py) and its from_numpy.

On the CPU the torch storage reads through the numpy storage it holds (the one copy of
the record layout) and wraps each leaf with ``torch.from_numpy``: each tensor must hold
what a numpy storage's gather gives, byte for byte, in the leaf's dtype and shape, for
positions of any shape (taken modulo the capacity); and no returned tensor may share
memory with the storage or with another batch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.specs import ArraySpec  # noqa: E402
from replaybuffer.storage.numpy_storage import PACK_MAX_BYTES, NumpyStorage  # noqa: E402
from replaybuffer.storage.torch_storage import TorchStorage  # noqa: E402

DTYPES = [np.bool_, np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32,
          np.float64]
shapes = st.lists(st.integers(0, 3), max_size=2).map(tuple)
specs_strategy = st.lists(st.tuples(st.sampled_from(DTYPES), shapes), min_size=1,
                          max_size=5).map(lambda s: [ArraySpec(sh, d) for d, sh in s])


@pytest.fixture(autouse=True)
def warn_always():
    """torch warns once per process of a tensor over read-only memory; these tests
    turn that warning into an error, so it must come every time."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


def filled(specs, capacity, rng):
    """A torch storage and a numpy storage holding the same random data."""
    ours, reference = TorchStorage(specs, capacity), NumpyStorage(specs, capacity)
    leaves = [rng.integers(0, 250, (capacity,) + s.shape).astype(s.dtype) for s in specs]
    ours.write(0, leaves)
    reference.write(0, leaves)
    return ours, reference


def assert_same(got, want):
    assert isinstance(got, torch.Tensor)
    assert tuple(got.shape) == want.shape
    assert got.numpy().dtype == want.dtype
    assert got.numpy().tobytes() == np.ascontiguousarray(want).tobytes()


@settings(max_examples=60, deadline=None)
@given(specs=specs_strategy, capacity=st.integers(1, 9),
       outer=st.lists(st.integers(1, 4), max_size=2).map(tuple), seed=st.integers(0, 2**16))
def test_gather_matches_numpy_storage_byte_for_byte(specs, capacity, outer, seed):
    """Any specs (all packed or not), positions of shape ``outer`` (0-d too), in range,
    past the capacity and negative: the same leaves as the numpy storage's gather, and
    as the general path (``which`` every leaf)."""
    rng = np.random.default_rng(seed)
    ours, reference = filled(specs, capacity, rng)
    positions = rng.integers(-2 * capacity, 3 * capacity, outer)
    want = reference.gather(positions)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps read-only memory
        got = ours.gather(positions)
        general = ours.gather(positions, list(range(len(specs))))
        from_tensor = ours.gather(torch.from_numpy(positions))  # a CPU sampler's
    assert len(got) == len(want) == len(from_tensor) == len(specs)
    for g, w, a, t in zip(got, want, general, from_tensor):
        assert_same(g, np.asarray(w))
        assert_same(a, np.asarray(w))
        assert_same(t, np.asarray(w))


@pytest.mark.parametrize("first_leaf", [3, PACK_MAX_BYTES + 1])  # packed, or its own
@pytest.mark.parametrize("which", [None, [0, 1, 2]])
def test_batches_never_share_memory_with_each_other_or_the_storage(first_leaf, which):
    """The first batch is unchanged by a second gather, by writes into the storage and
    by writes into the second batch; and writing into a batch leaves the storage: for
    leaves all packed in records and for a leaf in an array of its own, by the usual
    read and by ``which``."""
    specs = [ArraySpec((first_leaf,), np.float32), ArraySpec((), np.float32),
             ArraySpec((), np.int32)]
    ours, _ = filled(specs, 8, np.random.default_rng(0))
    positions = np.array([0, 1, 2, 3])
    first = ours.gather(positions, which)
    kept = [t.clone() for t in first]
    second = ours.gather(positions, which)
    for t in second:
        t.fill_(7)
    ours.write(0, [np.full((8, first_leaf), -1, np.float32), np.full(8, -1, np.float32),
                   np.full(8, -1, np.int32)])
    for t, k in zip(first, kept):
        assert torch.equal(t, k)
    for t in first:
        t.fill_(5)
    assert all((t == -1).all() for t in ours.gather(positions, which))


def test_get_next_on_torch_storage_gives_the_numpy_storage_batch():
    """A seeded uniform buffer draws the same batch on either storage: every leaf, ids
    and probabilities as tensors of the same dtypes and values, windows too."""
    spec = {"observation": ArraySpec((4,), np.float32), "reward": ArraySpec((), np.float32),
            "step_type": ArraySpec((), np.int32)}
    rng = np.random.default_rng(1)
    data = {k: rng.standard_normal((1, 20) + s.shape).astype(s.dtype)
            for k, s in spec.items()}
    buffers = {}
    for storage in ("numpy", "torch"):
        buffers[storage] = rb.UniformReplayBuffer(spec, batch_size=1, max_length=16,
                                                  storage=storage, seed=3)
        buffers[storage].extend(data)
    for num_steps in (None, 3):
        (want, want_info), (got, got_info) = (b.get_next(5, num_steps)
                                              for b in buffers.values())
        for key in spec:
            assert_same(got[key], want[key])
        assert_same(got_info.ids, want_info.ids)
        assert_same(got_info.probabilities, want_info.probabilities)


def test_from_numpy_wraps_fresh_arrays_and_copies_the_rest():
    storage = TorchStorage([ArraySpec((), np.float32), ArraySpec((), np.int32)], 4)
    fresh = np.arange(5, dtype=np.int64)
    assert np.shares_memory(storage.from_numpy(fresh).numpy(), fresh)
    strided = np.arange(10, dtype=np.float32)[::2]
    out = storage.from_numpy(strided)
    assert out.tolist() == strided.tolist() and not np.shares_memory(out.numpy(), strided)
    frozen = np.arange(3, dtype=np.float32)
    frozen.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps a read-only array
        out = storage.from_numpy(frozen)
    assert out.tolist() == [0, 1, 2] and not np.shares_memory(out.numpy(), frozen)
    scalar = storage.from_numpy(np.int64(4))
    assert scalar.shape == () and scalar.dtype == torch.int64 and scalar.item() == 4
    tensor = torch.ones(2)
    assert storage.from_numpy(tensor) is tensor


@pytest.mark.parametrize("first_leaf", [3, PACK_MAX_BYTES + 1])
def test_the_tensors_are_views_of_the_numpy_storage_held(first_leaf):
    """One copy of the layout: each stored tensor is the held numpy storage's array
    (same address, shape and strides), so its gather reads what the tensors hold."""
    specs = [ArraySpec((first_leaf,), np.float32), ArraySpec((), np.float32),
             ArraySpec((), np.int32)]
    ours, _ = filled(specs, 5, np.random.default_rng(2))
    held = ours._records.arrays
    for tensor, array in zip(ours.arrays, held):
        assert tensor.data_ptr() == array.ctypes.data
        assert tuple(tensor.shape) == array.shape
        assert tuple(tensor.stride()) == tuple(n // array.itemsize for n in array.strides)
    ours.arrays[1][2] = 42.0
    assert ours.gather(np.array([2]))[1].item() == 42.0
