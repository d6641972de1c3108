"""FIFO and without-replacement (shuffled epoch) reading."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from conftest import to_np

SPEC = rb.ArraySpec((), np.int64)


def add(buf, ts):
    for t in ts:
        buf.add_batch(np.arange(buf.batch_size, dtype=np.int64) * 100 + t)


def test_fifo_reads_every_window_once_oldest_first(storage):
    buf = rb.FIFOReplayBuffer(SPEC, 2, 10, **storage)
    add(buf, range(5))
    assert buf.unread() == 10 and buf.unread(2) == 4
    first, info = buf.get_next(3)
    assert to_np(first).tolist() == [0, 100, 1]
    assert to_np(info.probabilities).tolist() == [1.0, 1.0, 1.0]
    assert to_np(buf.get_next(7)[0]).tolist() == [101, 2, 102, 3, 103, 4, 104]
    with pytest.raises(rb.EmptyBufferError, match="FIFO: 0 unread window"):
        buf.get_next(1)
    add(buf, range(5, 9))
    windows = to_np(buf.get_next(4, num_steps=2)[0]).tolist()
    assert windows == [[5, 6], [105, 106], [7, 8], [107, 108]]  # no overlap


def test_fifo_counts_what_it_lost_and_restarts_after_clear(storage):
    buf = rb.FIFOReplayBuffer(SPEC, 1, 4, **storage)
    add(buf, range(10))  # 0..5 overwritten unread
    assert to_np(buf.get_next(2)[0]).tolist() == [6, 7] and buf.dropped == 6
    buf.clear()
    add(buf, [50, 51])
    assert to_np(buf.get_next(2)[0]).tolist() == [50, 51]


def test_fifo_state_survives_save_and_load(tmp_path):
    buf = rb.FIFOReplayBuffer(SPEC, 2, 6)
    add(buf, range(4))
    buf.get_next(3)
    buf.save(tmp_path / "q")
    again = rb.load(tmp_path / "q")
    assert isinstance(again, rb.FIFOReplayBuffer) and again.unread() == 5
    np.testing.assert_array_equal(again.get_next(5)[0], buf.get_next(5)[0])


def test_shuffled_visits_each_window_once_per_epoch(storage):
    buf = rb.ShuffledReplayBuffer(SPEC, 2, 10, seed=0, **storage)
    add(buf, range(6))  # 12 windows of one step
    seen = np.concatenate([to_np(buf.get_next(4)[0]) for _ in range(3)])
    expected = sorted((np.arange(2)[:, None] * 100 + np.arange(6)).ravel().tolist())
    assert sorted(seen.tolist()) == expected and buf.epoch == 1
    nxt, info = buf.get_next(4)
    assert buf.epoch == 2 and to_np(info.probabilities)[0] == pytest.approx(1 / 12)
    pairs = to_np(buf.get_next(6, num_steps=2)[0])  # another num_steps: a new epoch
    assert buf.epoch == 3 and (pairs[:, 0] + 1 == pairs[:, 1]).all()


def test_shuffled_straddles_epochs_and_skips_overwritten_windows():
    buf = rb.ShuffledReplayBuffer(SPEC, 1, 4, seed=1)
    add(buf, range(4))
    buf.get_next(3)  # one window left in epoch 1
    add(buf, [4, 5])  # overwrites 0 and 1
    batch = buf.get_next(3)[0].tolist()
    assert min(batch) >= 2 and buf.epoch == 2
    with pytest.raises(rb.EmptyBufferError, match="needs 9 windows"):
        buf.get_next(9)


def test_shuffled_is_reproducible_and_saved(tmp_path):
    def run():
        buf = rb.ShuffledReplayBuffer(SPEC, 1, 20, seed=5)
        add(buf, range(20))
        buf.get_next(7)
        return buf
    a, b = run(), run()
    np.testing.assert_array_equal(a.get_next(9)[0], b.get_next(9)[0])
    a.save(tmp_path / "s")
    again = rb.load(tmp_path / "s")
    np.testing.assert_array_equal(again.get_next(10)[0], a.get_next(10)[0])
    assert again.epoch == a.epoch


@settings(max_examples=60, deadline=None)
@given(batch_size=st.integers(1, 3), max_length=st.integers(2, 8),
       ops=st.lists(st.tuples(st.sampled_from(["add", "sample"]), st.integers(1, 5)),
                    max_size=30))
def test_shuffled_never_repeats_within_an_epoch(batch_size, max_length, ops):
    buf = rb.ShuffledReplayBuffer(SPEC, batch_size, max_length, seed=0)
    t = 0
    seen_in_epoch: dict[int, set] = {}
    for op, n in ops:
        if op == "add":
            add(buf, range(t, t + n))
            t += n
            continue
        if buf.num_frames() < n:
            continue
        before = buf.epoch
        items, info = buf.get_next(n)
        oldest = max(0, t - max_length)
        assert (items % 100 >= oldest).all()  # never an overwritten step
        if buf.epoch == before:  # no epoch began: nothing repeats
            pairs = set(zip(info.ids.tolist(), (items // 100).tolist()))
            assert len(pairs) == n
            assert not (pairs & seen_in_epoch.setdefault(buf.epoch, set()))
            seen_in_epoch[buf.epoch] |= pairs
        else:
            seen_in_epoch = {}


def test_fifo_datasets_read_on_pull():
    buf = rb.FIFOReplayBuffer(SPEC, 1, 10)
    add(buf, range(6))
    with pytest.raises(ValueError, match="samples on pull"):
        buf.as_dataset(2, num_parallel_calls=2)
    it = iter(buf.as_dataset(2))
    assert [next(it)[0].tolist() for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]


# ----------------------------------------------------------- the Checkpointable seam
def _samplers():
    """Every sampler kind (and the episode index), built alike twice: ``(name, make)``."""
    from replaybuffer.sampling.fifo import FIFOSampler
    from replaybuffer.sampling.prioritized import PrioritizedSampler
    from replaybuffer.sampling.shuffled import ShuffledSampler
    from replaybuffer.sampling.uniform import UniformSampler

    made = [("uniform", lambda: UniformSampler(seed=7)),
            ("fifo", FIFOSampler),
            ("shuffled", lambda: ShuffledSampler(seed=7)),
            ("prioritized", lambda: PrioritizedSampler(40, seed=7)),
            ("prioritized-buffer", lambda: PrioritizedSampler(40, seed=7, normalize="buffer"))]
    try:
        from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler
        from replaybuffer.sampling.torch_uniform import TorchUniformSampler
        import torch
    except ImportError:  # torch is optional
        return made
    return made + [("torch-uniform", lambda: TorchUniformSampler(torch.device("cpu"), seed=7)),
                   ("torch-prefix", lambda: TorchPrioritizedSampler(40, seed=7)),
                   ("torch-tree", lambda: TorchPrioritizedSampler(40, seed=7, search="tree"))]


@pytest.mark.parametrize("name,make", _samplers(), ids=[n for n, _ in _samplers()])
def test_every_sampler_is_checkpointable_and_restores_bit_exact(name, make):
    """The protocol's ``state_dict``/``load_state_dict``, public on every sampler: a fresh
    sampler loaded with a state draws exactly what the original draws after it."""
    from replaybuffer.protocols import Checkpointable
    from replaybuffer.sampling import Ring

    ring = Ring(4, 10)
    original = make()
    assert isinstance(original, Checkpointable)
    ring.last_id = 12
    original.on_add(ring, 0, 13)
    if hasattr(original, "update_priorities"):
        ids = np.arange(8, 40, dtype=np.int64)
        original.update_priorities(ring, ids, np.linspace(0.5, 4.0, len(ids)))
    original.sample(ring, 5, 2)
    state = original.state_dict()
    restored = make()
    restored.load_state_dict(state)
    for _ in range(3):
        (ids_a, pos_a), info_a = original.sample(ring, 3, 2)
        (ids_b, pos_b), info_b = restored.sample(ring, 3, 2)
        assert to_np(ids_a).tolist() == to_np(ids_b).tolist()
        assert to_np(pos_a).tolist() == to_np(pos_b).tolist()
        for key in info_a:
            assert to_np(info_a[key]).tobytes() == to_np(info_b[key]).tobytes()


def test_the_episode_index_is_checkpointable_and_restores_bit_exact():
    from replaybuffer.protocols import Checkpointable
    from replaybuffer.sampling import Ring
    from replaybuffer.sampling.episodes import EpisodeIndex

    ring = Ring(3, 8)
    index = EpisodeIndex()
    assert isinstance(index, Checkpointable)
    starts = np.random.default_rng(0).random((20, 3)) < 0.3
    index.record(0, starts, 0)
    ring.last_id = 19
    index.segments(ring)  # caches built, as in use
    restored = EpisodeIndex()
    restored.load_state_dict(index.state_dict())
    for got, want in zip(restored.segments(ring), index.segments(ring)):
        assert got.tolist() == want.tolist()
    draws = np.arange(index.count(ring, 2))
    for got, want in zip(restored.sample(ring, 2, draws), index.sample(ring, 2, draws)):
        assert got.tolist() == want.tolist()
    assert restored.state(ring).tolist() == index.state(ring).tolist()
