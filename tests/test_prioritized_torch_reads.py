"""PrioritizedReplayBuffer.get_next's short path on torch storage drawn on the host
(``buffers/prioritized.py``, ``_direct_backend``; TensorFlow storage's too): the same
tensors as the general read path (``ReadPath.draw``) gives, byte for byte, with the
same dtypes, shapes and device, for items, ids, probabilities and weights; what it
does not serve goes the general way.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from replaybuffer import MinSize, PrioritizedReplayBuffer  # noqa: E402
from replaybuffer.errors import EmptyBufferError  # noqa: E402

SPEC = {"obs": np.zeros(3, np.float32), "act": np.int64(0), "done": np.bool_(False)}


def filled_pair(batch_size, max_length, adds, seed, cleared=False, normalize="batch"):
    """Two identical torch-storage buffers (``cleared``: the adds come after as many
    adds and a ``clear()``, so item ids carry a base)."""
    pair = []
    for _ in range(2):
        buf = PrioritizedReplayBuffer(SPEC, batch_size, max_length, storage="torch",
                                      seed=seed, normalize=normalize)
        rng = np.random.default_rng(seed)
        for lap in range(2 if cleared else 1):
            if lap:
                buf.clear()
            for _ in range(adds):
                buf.add_batch({"obs": rng.random((batch_size, 3), dtype=np.float32),
                               "act": rng.integers(0, 9, batch_size),
                               "done": rng.random(batch_size) < 0.5})
        pair.append(buf)
    return pair


def assert_same_tensor(got, want):
    assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
    assert got.dtype == want.dtype and got.device == want.device
    assert got.shape == want.shape
    assert got.contiguous().numpy().tobytes() == want.contiguous().numpy().tobytes()


def assert_same_read(got, want):
    (g_items, g_info), (w_items, w_info) = got, want
    assert set(g_items) == set(w_items) == set(SPEC)
    for key in SPEC:
        assert_same_tensor(g_items[key], w_items[key])
    assert g_info.weights is not None
    for g, w in zip(g_info, w_info):
        assert_same_tensor(g, w)


def general_draw_refused(*args, **kwargs):
    raise AssertionError("the short path drew through the general sampler.sample")


@settings(max_examples=40, deadline=None)
@given(batch_size=st.integers(1, 3), max_length=st.integers(1, 30),
       adds=st.integers(1, 70), count=st.integers(1, 300), seed=st.integers(0, 2**16),
       spread=st.sampled_from([0.2, 3.0]), cleared=st.booleans(),
       normalize=st.sampled_from(["batch", "buffer"]))
def test_the_short_get_next_gives_the_general_paths_tensors(
        batch_size, max_length, adds, count, seed, spread, cleared, normalize):
    """get_next(S) on torch storage (the short path: the general sampler.sample is
    never called) against the general read path: the same tensors byte for byte,
    dtypes and device included, and the generators in the same state, through updates
    of the sampled ids (given as tensors) with even or skewed priorities, on rings
    that wrap, after a clear, with either normalization."""
    short, general = filled_pair(batch_size, max_length, adds, seed, cleared, normalize)
    assert short._direct_backend is not None and not short._direct_reads
    short._sampler.sample = general_draw_refused  # (on this instance only)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        got = short.get_next(count)
        want = general.draw(count, None)
        assert_same_read(got, want)
        assert got[1].ids.device == short.device
        assert short._sampler._rng.bit_generator.state == \
            general._sampler._rng.bit_generator.state
        priorities = torch.from_numpy(rng.lognormal(0.0, spread, count))
        assert short.update_priorities(got[1].ids, priorities) == \
            general.update_priorities(want[1].ids, priorities)


def test_batches_share_no_memory_with_each_other_or_the_storage():
    """Two reads' tensors are separate, and writing into one changes neither the
    other nor what the buffer holds."""
    buf, _ = filled_pair(1, 20, 20, seed=4)
    first_items, first_info = buf.get_next(8)
    kept = {k: v.clone() for k, v in first_items.items()}
    kept_ids = first_info.ids.clone()
    second_items, second_info = buf.get_next(8)
    for t in (*second_items.values(), *second_info):
        t.fill_(0)
    for key in SPEC:
        assert torch.equal(first_items[key], kept[key])
    assert torch.equal(first_info.ids, kept_ids)
    held = buf.gather_all()
    for t in first_items.values():
        t.fill_(1)
    after = buf.gather_all()
    for key in SPEC:
        assert torch.equal(after[key], held[key])


def test_reads_the_short_path_leaves_go_the_general_way():
    """Nothing stored, a rate limiter, windows and single items on torch storage: the
    general path's results and errors (and its tensors)."""
    buf = PrioritizedReplayBuffer(SPEC, 2, 10, storage="torch", seed=1)
    with pytest.raises(EmptyBufferError, match="is empty"):
        buf.get_next(4)
    for _ in range(5):
        buf.add_batch({"obs": np.ones((2, 3), np.float32), "act": np.arange(2),
                       "done": np.zeros(2, np.bool_)})
    items, info = buf.get_next(4, num_steps=2)
    assert tuple(items["obs"].shape) == (4, 2, 3) and tuple(info.ids.shape) == (4, 2)
    items, info = buf.get_next()
    assert tuple(items["obs"].shape) == (3,) and tuple(info.weights.shape) == ()
    with pytest.raises(ValueError, match="sample_batch_size"):
        buf.get_next(0)
    buf.rate_limiter = MinSize(15)  # 10 stored
    assert buf.get_next(4, block=False) is None
    buf.rate_limiter = None
    items, info = buf.get_next(4)
    assert isinstance(info.ids, torch.Tensor) and info.ids.dtype == torch.int64
    assert info.probabilities.dtype == info.weights.dtype == torch.float32


def test_reads_during_a_save_take_the_short_path_of_the_storage_a_snapshot_wraps():
    """A save's snapshot wraps the storage and its release unwraps it: the short path
    follows (its wraps_fresh is the storage's each time), and reads meanwhile give a
    twin's tensors."""
    buf, twin = filled_pair(2, 10, 12, seed=6)
    with buf._lock:
        buf.snapshot()
    assert buf._direct_backend is not None and buf._direct_backend == \
        buf._storage.wraps_fresh
    buf._sampler.sample = general_draw_refused
    assert_same_read(buf.get_next(16), twin.get_next(16))
    with buf._lock:
        buf.release_snapshot()
    assert buf._direct_backend == buf._storage.wraps_fresh
    assert_same_read(buf.get_next(16), twin.get_next(16))


def test_tensorflow_storage_takes_the_short_path_with_the_general_paths_tensors():
    """The short path serves any storage whose from_numpy is not numpy's: TensorFlow
    storage's reads are the general path's tensors too."""
    tf = pytest.importorskip("tensorflow")
    pair = []
    for _ in range(2):
        buf = PrioritizedReplayBuffer(SPEC, 2, 8, storage="tensorflow", seed=5)
        rng = np.random.default_rng(5)
        for _ in range(11):
            buf.add_batch({"obs": rng.random((2, 3), dtype=np.float32),
                           "act": rng.integers(0, 9, 2), "done": rng.random(2) < 0.5})
        pair.append(buf)
    short, general = pair
    assert short._direct_backend is not None
    short._sampler.sample = general_draw_refused
    for _ in range(2):
        (g_items, g_info), (w_items, w_info) = short.get_next(32), general.draw(32, None)
        for g, w in zip([*g_items.values(), *g_info], [*w_items.values(), *w_info]):
            assert isinstance(g, tf.Tensor) and isinstance(w, tf.Tensor)
            assert g.dtype == w.dtype and g.shape == w.shape
            assert g.numpy().tobytes() == w.numpy().tobytes()
        short.update_priorities(g_info.ids, np.arange(1.0, 33.0))
        general.update_priorities(w_info.ids, np.arange(1.0, 33.0))
