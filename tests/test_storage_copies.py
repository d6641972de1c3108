"""``copy.deepcopy`` and pickling of numpy and torch storage (``__getstate__`` /
``__setstate__``): a copy reads its own writes (the packed leaves' field views and the
gather's byte view are made anew over the copied records; on fdeea8f they were
copied apart from them, so the copy's writes never showed in its reads), holds what
the original held when copied, and neither sees the other's later writes; storage
in files mapped in memory refuses to be copied, naming why, and stays usable."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.specs import ArraySpec
from replaybuffer.storage.base import to_numpy
from replaybuffer.storage.numpy_storage import NumpyStorage

# Small leaves (packed into records) and one large one (an array of its own).
SPECS = [ArraySpec((3,), np.float32), ArraySpec((), np.int64), ArraySpec((), np.bool_),
         ArraySpec((2, 2), np.uint8), ArraySpec((130,), np.float32)]
CAPACITY = 12
KINDS = ["numpy", "numpy unpacked", "torch", "torch device layout"]
CLONES = {"deepcopy": copy.deepcopy, "pickle": lambda s: pickle.loads(pickle.dumps(s))}


def make(kind: str, monkeypatch: pytest.MonkeyPatch):
    if kind.startswith("numpy"):
        return NumpyStorage(SPECS, CAPACITY, pack=kind == "numpy")
    pytest.importorskip("torch")
    from replaybuffer.storage.torch_storage import TorchStorage
    if kind == "torch device layout":  # the CPU twin of a GPU's packed blocks
        monkeypatch.setattr(TorchStorage, "numpy_views", False)
    if kind == "torch cuda":
        import torch
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        return TorchStorage(SPECS, CAPACITY, "cuda")
    return TorchStorage(SPECS, CAPACITY, "cpu")


def leaves(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    return [rng.integers(0, 200, (count,) + s.shape).astype(s.dtype) for s in SPECS]


def put(storage, start: int, data: list[np.ndarray]) -> None:
    """``data`` written at ``start`` as a buffer writes (converted first)."""
    count = len(data[0])
    storage.write(start, storage.convert(data, [f"l{i}" for i in range(len(SPECS))],
                                         (count,), "[B]"))


def read(storage) -> list[np.ndarray]:
    """Every position through the storage's gather, as numpy arrays."""
    return [np.array(to_numpy(a)) for a in storage.gather(np.arange(CAPACITY))]


def read_leaves(storage) -> list[np.ndarray]:
    """Every position through the storage's ``arrays`` (the views writes go through)."""
    return [np.array(to_numpy(a)) for a in storage.arrays]


def assert_holds(storage, model: list[np.ndarray]) -> None:
    for got in (read(storage), read_leaves(storage)):
        for leaf, want in zip(got, model):
            assert leaf.dtype == want.dtype and leaf.tobytes() == want.tobytes()


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(KINDS), clone=st.sampled_from(sorted(CLONES)),
       writes=st.lists(st.tuples(st.booleans(), st.integers(0, CAPACITY - 1),
                                 st.integers(1, 4), st.integers(0, 2**16)),
                       min_size=1, max_size=8),
       seed=st.integers(0, 2**16))
def test_a_copy_reads_its_own_writes_and_the_original_is_unaffected(kind, clone, writes,
                                                                   seed):
    """Against a model of each (numpy arrays, ``[capacity, *shape]`` a leaf): filled,
    copied, then writes to either in any order; each reads its own, through its gather
    and its leaf arrays, and its layout is the original's."""
    with pytest.MonkeyPatch.context() as m:
        original = make(kind, m)
        first = leaves(np.random.default_rng(seed), CAPACITY)
        put(original, 0, first)
        copied = CLONES[clone](original)
    assert type(copied) is type(original)
    assert len(copied.arrays) == len(SPECS)
    if kind.startswith("numpy"):
        assert copied.packed == original.packed
    else:
        assert (copied.packing is None) == (original.packing is None)
        assert copied.device == original.device
    models = {id(original): [a.copy() for a in first], id(copied): [a.copy() for a in first]}
    assert_holds(copied, models[id(copied)])
    for to_copy, start, count, data_seed in writes:
        target = copied if to_copy else original
        count = min(count, CAPACITY - start)
        new = leaves(np.random.default_rng(data_seed), count)
        put(target, start, new)
        for model_leaf, leaf in zip(models[id(target)], new):
            model_leaf[start:start + count] = leaf
        assert_holds(original, models[id(original)])
        assert_holds(copied, models[id(copied)])


@pytest.mark.parametrize("kind", KINDS + ["torch cuda"])
@pytest.mark.parametrize("clone", sorted(CLONES))
def test_a_copys_zero_and_load_reach_its_reads(kind, clone, monkeypatch):
    """``zero`` and ``load`` (restores) of a copy are its own too."""
    original = make(kind, monkeypatch)
    data = leaves(np.random.default_rng(1), CAPACITY)
    put(original, 0, data)
    copied = CLONES[clone](original)
    copied.zero()
    assert all(not a.any() for a in read(copied))
    assert_holds(original, data)
    other = leaves(np.random.default_rng(2), CAPACITY)
    copied.load(other)
    assert_holds(copied, other)
    assert_holds(original, data)


@pytest.mark.parametrize("kind", ["MmapStorage", "SharedStorage"])
@pytest.mark.parametrize("clone", sorted(CLONES))
def test_storage_in_mapped_files_refuses_to_be_copied(kind, clone, tmp_path):
    from replaybuffer.storage.mmap_storage import MmapStorage
    from replaybuffer.storage.shared_storage import SharedStorage

    if kind == "MmapStorage":
        storage = MmapStorage(SPECS, CAPACITY, tmp_path / "buffer")
    else:
        storage = SharedStorage(SPECS, CAPACITY, tmp_path, create=True)
    data = leaves(np.random.default_rng(3), CAPACITY)
    storage.load(data)  # (its write stages for a commit; load writes in place)
    with pytest.raises(TypeError, match=f"{kind} cannot be copied or pickled: its "
                                        "arrays are files mapped in memory"):
        CLONES[clone](storage)
    assert_holds(storage, data)  # unchanged, and still written through
    row = [np.full((1,) + s.shape, 7, s.dtype) for s in SPECS]
    storage.load(row)
    for leaf, want in zip(read(storage), row):
        assert leaf[:1].tobytes() == want.tobytes()
