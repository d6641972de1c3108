"""Every storage part and the rate limiter implement ``Checkpointable`` publicly: the
state comes out as plain data, and a part built the same way behaves as the original
once it is put back."""

import numpy as np
import pytest
import torch

from replaybuffer.protocols import Checkpointable
from replaybuffer.rate_limiter import MinSize, Queue, RateLimiter, SampleToInsertRatio
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.frames import FrameStackCodec
from replaybuffer.storage.frozen import CopyOnWriteStorage, FrozenRows
from replaybuffer.storage.mmap_storage import LAST_ID, MmapStorage
from replaybuffer.storage.numpy_storage import NumpyStorage
from replaybuffer.storage.side_store import SideStore
from replaybuffer.storage.torch_storage import TorchStorage

SPECS = [ArraySpec((3,), np.uint8), ArraySpec((), np.float32), ArraySpec((600,), np.uint8),
         ArraySpec((2, 2), np.int64)]


def _filled(storage, rng, n=None):
    n = storage.capacity if n is None else n
    leaves = [rng.integers(0, 100, (n,) + s.shape).astype(s.dtype) for s in storage.specs]
    storage.load(leaves)
    return leaves


def _numpy(leaves):
    return [np.asarray(leaf.cpu() if isinstance(leaf, torch.Tensor) else leaf) for leaf in leaves]


BUILDERS = {
    "numpy": lambda tmp: NumpyStorage(SPECS, 10),
    "numpy-unpacked": lambda tmp: NumpyStorage(SPECS, 10, pack=False),
    "torch": lambda tmp: TorchStorage(SPECS, 10),
    "mmap": lambda tmp: MmapStorage(SPECS, 10, tmp / "files"),
}


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_storage_state_round_trips_and_is_a_copy(kind, tmp_path):
    rng = np.random.default_rng(0)
    storage = BUILDERS[kind](tmp_path / "a")
    assert isinstance(storage, Checkpointable)
    leaves = _filled(storage, rng)
    state = storage.state_dict()
    assert state["capacity"] == 10
    for got, want, spec in zip(state["leaves"], leaves, SPECS):
        assert type(got) is np.ndarray and got.dtype == spec.dtype
        np.testing.assert_array_equal(got, want)
    _filled(storage, rng)  # the state does not alias the storage's memory
    for got, want in zip(state["leaves"], leaves):
        np.testing.assert_array_equal(got, want)
    other = BUILDERS[kind](tmp_path / "b")
    other.load_state_dict(state)
    positions = np.array([0, 3, 9, 12])
    for got, want in zip(_numpy(other.gather(positions)), leaves):
        np.testing.assert_array_equal(got, want[positions % 10])


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_storage_state_of_another_shape_is_refused_before_any_write(kind, tmp_path):
    storage = BUILDERS[kind](tmp_path / "a")
    before = _numpy(storage.gather(np.arange(10)))
    state = NumpyStorage(SPECS, 10).state_dict()
    state["leaves"][1] = np.ones(10, np.float64)
    with pytest.raises(ValueError, match=r"storage state leaf 1: expected shape \(10,\) dtype "
                                         r"float32, got shape \(10,\) dtype float64"):
        storage.load_state_dict(state)
    with pytest.raises(ValueError, match="capacity 11 with 4 leaves for a storage of capacity "
                                         "10 with 4 leaves"):
        storage.load_state_dict(NumpyStorage(SPECS, 11).state_dict())
    for got, want in zip(_numpy(storage.gather(np.arange(10))), before):
        np.testing.assert_array_equal(got, want)


def test_mmap_storage_state_carries_the_committed_last_id_and_epoch(tmp_path):
    storage = MmapStorage(SPECS, 10, tmp_path / "a")
    storage.write(0, [np.ones((2,) + s.shape, s.dtype) for s in SPECS])
    storage.commit(1)
    storage.commit(0)  # ids going back: a clear, a new epoch
    state = storage.state_dict()
    assert (state["last_id"], state["epoch"]) == (0, 1)
    other = MmapStorage(SPECS, 10, tmp_path / "b")
    other.write(5, [np.ones((1,) + s.shape, s.dtype) for s in SPECS])  # staged, dropped
    other.load_state_dict(state)
    assert other.header[LAST_ID] == 0 and other.epoch == 1
    other.commit(1)  # nothing staged is applied
    np.testing.assert_array_equal(other.gather(np.arange(10))[1], state["leaves"][1])
    other.release()
    with pytest.raises(ValueError, match="is closed"):
        other.load_state_dict(state)


def test_a_state_loaded_during_a_snapshot_leaves_the_snapshot_as_it_was():
    rng = np.random.default_rng(1)
    storage = NumpyStorage(SPECS, 10)
    leaves = _filled(storage, rng)
    frozen = FrozenRows(lambda p: storage.gather(p), 10, SPECS, [str(i) for i in range(4)])
    wrapped = CopyOnWriteStorage(storage, frozen)
    other = NumpyStorage(SPECS, 10)
    _filled(other, rng)
    wrapped.load_state_dict(other.state_dict())
    for got, want in zip(frozen.read(0, 10), leaves):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(storage.gather(np.arange(10)), other.state_dict()["leaves"]):
        np.testing.assert_array_equal(got, want)


def test_side_store_state_round_trips():
    specs = [ArraySpec((2,), np.float32)]
    store = SideStore(specs, capacity=4)
    slots = store.put([np.arange(10, dtype=np.float32).reshape(5, 2)])  # grows to 8
    store.free(slots[:2])
    other = SideStore(specs)
    other.load_state_dict(store.state_dict())
    assert len(other) == len(store) == 3
    np.testing.assert_array_equal(other.take(slots[2:])[0], store.take(slots[2:])[0])
    np.testing.assert_array_equal(other.put([np.zeros((3, 2), np.float32)]),
                                  store.put([np.zeros((3, 2), np.float32)]))


def test_frame_codec_state_and_ring_round_trip():
    spec = ArraySpec((3, 2, 2), np.uint8)
    codec = FrameStackCodec(spec, 0, 1, 5, "obs")
    frames = np.arange(1, 9, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)
    stacks = np.stack([frames[t:t + 3] for t in range(6)])
    refs = []
    for t in range(6):
        step_refs, writes = codec.encode(t, stacks[t:t + 1])
        refs.append(step_refs.copy())
        codec.commit(writes, t, 1)
    other = FrameStackCodec(spec, 0, 1, 5, "obs")
    ring = codec.frozen_frames().read(0, len(codec.frames) - 1)[0]
    other.load_frames(0, ring)
    other.load_state_dict(codec.state_dict())
    rows = np.zeros(1, np.int64)
    for t in range(2, 6):
        np.testing.assert_array_equal(other.decode(refs[t], rows), stacks[t:t + 1])
    following = np.stack([frames[5:8]])  # the next step slides on: same references
    np.testing.assert_array_equal(other.encode(6, following)[0], codec.encode(6, following)[0])


@pytest.mark.parametrize("make", [lambda: MinSize(2), lambda: SampleToInsertRatio(2.0, 3, 6.0),
                                  lambda: Queue(4)])
def test_rate_limiter_counters_round_trip(make):
    limiter = make()
    assert isinstance(limiter, Checkpointable)
    limiter.inserted(3)
    limiter.sampled(2)
    limiter.inserts_blocked, limiter.insert_blocked_s = 2, 0.25
    state = limiter.state_dict()
    assert state == {"inserts": 3, "samples": 2, "insert_blocked_s": 0.25,
                     "sample_blocked_s": 0.0, "inserts_blocked": 2, "samples_blocked": 0,
                     "largest_insert": 3, "largest_sample": 2}
    restored = make()
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.stats(5) == limiter.stats(5)
    for n, size in [(1, 5), (4, 5), (1, 1)]:
        assert restored.can_insert(n, size) == limiter.can_insert(n, size)
        assert restored.can_sample(n, size) == limiter.can_sample(n, size)


@pytest.mark.parametrize("bad", [{"inserts": -1}, {"samples": 1.5}, {"inserts": True},
                                 {"insert_blocked_s": float("nan")}, {"largest_insert": None},
                                 {"samples": "3"}])
def test_rate_limiter_refuses_a_malformed_state_and_changes_nothing(bad):
    limiter = RateLimiter(1.0, 1, -10.0, 10.0)
    limiter.inserted(2)
    state = {**limiter.state_dict(), **bad}
    (name, value), = bad.items()
    with pytest.raises(ValueError, match=f"rate limiter state: {name} must be a non-negative"):
        limiter.load_state_dict(state)
    assert limiter.inserts == 2 and limiter.samples == 0
