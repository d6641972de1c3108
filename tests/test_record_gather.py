"""NumpyStorage's gather of packed records (the block typed without ``.view``, and the
short path for a gather of every leaf when all are packed) against plain per-leaf
arrays: the same bytes, dtypes and shapes for any positions (wrapped, windows, empty),
any subset of leaves, and fresh writable copies that never alias the storage."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.numpy_storage import PACK_MAX_BYTES, NumpyStorage

LEAVES = [ArraySpec((), np.int64), ArraySpec((4,), np.float32), ArraySpec((), np.float32),
          ArraySpec((3,), np.uint8), ArraySpec((2, 2), np.int16), ArraySpec((), np.bool_),
          ArraySpec((), np.float64)]
BIG = ArraySpec((PACK_MAX_BYTES + 8,), np.uint8)


def _filled(specs, capacity, seed):
    """A storage and the per-leaf arrays it holds (the reference), random bytes."""
    storage = NumpyStorage(specs, capacity)
    rng = np.random.default_rng(seed)
    plain = []
    for spec in specs:
        raw = rng.integers(0, 256, capacity * spec.nbytes, dtype=np.uint8)
        leaf = raw.view(spec.dtype).reshape((capacity,) + spec.shape)
        if spec.dtype == np.bool_:
            leaf = leaf & True
        if spec.dtype.kind == "f":  # (no NaN bit patterns: compared by bytes anyway)
            leaf = np.nan_to_num(leaf)
        plain.append(leaf.copy())
    storage.load(plain)
    return storage, plain


@settings(max_examples=120, deadline=None)
@given(picks=st.lists(st.integers(0, len(LEAVES) - 1), min_size=2, max_size=6, unique=True),
       big=st.booleans(), capacity=st.integers(1, 50),
       shape=st.sampled_from([(0,), (1,), (7,), (3, 4)]), which=st.booleans(),
       seed=st.integers(0, 2**16))
def test_a_gather_reads_the_bytes_of_plain_per_leaf_arrays(picks, big, capacity, shape,
                                                           which, seed):
    specs = [LEAVES[i] for i in picks] + ([BIG] if big else [])
    storage, plain = _filled(specs, capacity, seed)
    assert len(storage.packed) == len(picks)
    rng = np.random.default_rng(seed + 1)
    positions = rng.integers(0, 2 * capacity, shape)  # past the capacity: wrapped
    leaves = list(range(len(specs)))
    if which:
        leaves = [int(i) for i in rng.permutation(len(specs))[:rng.integers(1, len(specs) + 1)]]
    got = storage.gather(positions, leaves if which else None)
    assert len(got) == len(leaves)
    for out, i in zip(got, leaves):
        want = plain[i][positions % capacity]
        assert out.dtype == want.dtype and out.shape == want.shape
        assert out.tobytes() == want.tobytes()
        assert out.flags.writeable and not np.shares_memory(out, storage.arrays[i])
        if out.size:  # strides a multiple of the item size (torch.from_numpy needs it)
            assert all(s % out.dtype.itemsize == 0 for s in out.strides)


def test_the_usual_gather_is_a_copy_each_time():
    """Two gathers of every packed leaf share no memory with each other or the storage,
    and writing into one changes neither."""
    storage, plain = _filled(LEAVES[:3], 10, 0)
    positions = np.array([3, 1, 3])
    first, second = storage.gather(positions), storage.gather(positions)
    for a, b in zip(first, second):
        assert not np.shares_memory(a, b)
        a[...] = 0
    for b, leaf, stored in zip(second, plain, storage.arrays):
        assert b.tobytes() == leaf[positions].tobytes()
        assert stored.tobytes() == leaf.tobytes()
