"""UniformReplayBuffer against the reference checklist (items 1-16), on every backend."""

import numpy as np
import pytest
import torch

import replaybuffer as rb
from conftest import to_np

EMPTY = "is empty. Make sure to add items before sampling the buffer."


def tutorial_spec():
    return (rb.ArraySpec([3], np.float32, "action"),
            (rb.ArraySpec([5], np.float32, "lidar"), rb.ArraySpec([3, 2], np.float32, "camera")))


def tutorial_items(batch_size, scale=1.0):
    return (np.full((batch_size, 3), 1 * scale, np.float32),
            (np.full((batch_size, 5), 2 * scale, np.float32),
             np.full((batch_size, 3, 2), 3 * scale, np.float32)))


def counter_buffer(storage, batch_size, max_length, adds, **kwargs):
    """A buffer of int64 scalars where row b at add t holds 100 * b + t."""
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), batch_size, max_length,
                                 seed=0, **storage, **kwargs)
    for t in range(adds):
        buf.add_batch(np.arange(batch_size, dtype=np.int64) * 100 + t)
    return buf


def test_items_come_back_in_the_backend_type(storage):
    buf = rb.UniformReplayBuffer(tutorial_spec(), 2, 5, **storage)
    buf.add_batch(tutorial_items(2))
    items, info = buf.get_next(4)
    kind = {"numpy": np.ndarray, "torch": torch.Tensor}.get(storage["storage"])
    if storage["storage"] == "tensorflow":
        import tensorflow as tf

        kind = tf.Tensor
    assert isinstance(items[0], kind) and isinstance(info.ids, kind)
    assert isinstance(info.probabilities, kind)
    assert isinstance(buf.gather_all()[1][0], kind)


@pytest.mark.parametrize("batch_size", [1, 5])
def test_num_frames_and_capacity(storage, batch_size):  # item 1
    buf = counter_buffer(storage, batch_size, 12, 10)
    assert buf.capacity == 12 * batch_size and type(buf.capacity) is int
    assert buf.num_frames() == 10 * batch_size == len(buf)
    for t in range(10):
        buf.add_batch(np.zeros(batch_size, np.int64))
    assert buf.num_frames() == buf.capacity


def test_empty_buffer_raises_the_tf_agents_message(storage):  # item 3
    buf = rb.UniformReplayBuffer(tutorial_spec(), 2, 5, **storage)
    for call in (lambda: buf.get_next(), lambda: buf.get_next(3, 2),
                 lambda: next(iter(buf.as_dataset(4))),
                 lambda: next(iter(buf.as_dataset(4, num_parallel_calls=2)))):
        with pytest.raises(rb.EmptyBufferError, match=EMPTY):
            call()


@pytest.mark.parametrize("batch_size", [1, 5])
def test_one_add_then_get_next_returns_it(storage, batch_size):  # item 4
    buf = rb.UniformReplayBuffer(tutorial_spec(), batch_size, 10, **storage)
    buf.add_batch(tutorial_items(batch_size))
    items, info = buf.get_next()
    action, (lidar, camera) = to_np(items)
    assert action.shape == (3,) and lidar.shape == (5,) and camera.shape == (3, 2)
    assert (action == 1).all() and (lidar == 2).all() and (camera == 3).all()
    assert to_np(info.ids).shape == () and to_np(info.ids) == 0
    batch, _ = buf.get_next(sample_batch_size=3)
    action, (lidar, camera) = to_np(batch)
    assert action.shape == (3, 3) and camera.shape == (3, 3, 2) and (camera == 3).all()


def test_each_add_writes_every_row_at_one_id(storage):  # item 5
    buf = counter_buffer(storage, 3, 4, 0)
    assert buf.last_id == -1
    for t in range(6):
        buf.add_batch(np.arange(3) * 100 + t)
        assert buf.last_id == t
    _, info = buf.get_next(500)
    items, _ = buf.get_next(500)
    assert set(to_np(items) % 100) <= {2, 3, 4, 5}


def test_windows_are_consecutive_including_physical_wrap(storage):  # items 6, 12
    # TF-Agents' testGetNext: B=2, L=3 (odd), 4 adds of [t, t + 3].
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 2, 3, seed=1, **storage)
    for t in range(4):
        buf.add_batch(np.array([t, t + 3]))
    items, info = buf.get_next(256, num_steps=2)
    x, ids = to_np(items), to_np(info.ids)
    assert x.shape == (256, 2) and ids.shape == (256, 2)
    np.testing.assert_array_equal(x[:, 0] + 1, x[:, 1])
    np.testing.assert_array_equal(ids[:, 0] + 1, ids[:, 1])
    assert set(ids[:, 0].tolist()) == {1, 2}  # start ids in [last_id + 1 - L, last_id + 2 - T)
    row = (x[:, 0] >= 3).astype(int)
    np.testing.assert_array_equal(x[:, 0] - 3 * row, ids[:, 0])  # ids are the logical add ids


def test_windows_never_cross_the_write_head(storage):  # item 7
    buf = counter_buffer(storage, 1, 10, 15)  # ring wrapped: holds 5..14, head at slot 5
    items, _ = buf.get_next(4000, num_steps=2)
    x = to_np(items)
    assert not ((x[:, 0] == 14) & (x[:, 1] == 5)).any()
    assert x.min() >= 5
    np.testing.assert_array_equal(x[:, 0] + 1, x[:, 1])
    counts = np.bincount(x[:, 0] - 5, minlength=9)
    assert len(counts) == 9 and counts.min() > 4000 / 9 * 0.7


def test_num_steps_longer_than_stored_raises(storage):  # item 8
    buf = counter_buffer(storage, 2, 5, 3)
    before = to_np(buf.gather_all())
    with pytest.raises(rb.EmptyBufferError, match="num_steps=4.*holds 3 steps"):
        buf.get_next(2, num_steps=4)
    with pytest.raises(rb.EmptyBufferError, match="exceeds max_length=5"):
        buf.get_next(2, num_steps=6)
    with pytest.raises(rb.EmptyBufferError, match="exceeds max_length=5"):
        buf.as_dataset(2, num_steps=6)
    assert buf.get_next(2, num_steps=3)[0].shape == (2, 3)
    np.testing.assert_array_equal(to_np(buf.gather_all()), before)


@pytest.mark.parametrize("S,T,stacked,shape,ids_shape", [
    (None, None, True, (), ()),
    (4, None, True, (4,), (4,)),
    (None, 3, True, (3,), (3,)),
    (4, 3, True, (4, 3), (4, 3)),
    (4, 1, True, (4, 1), (4, 1)),
    (None, 1, True, (1,), (1,)),
])
def test_get_next_shapes(storage, S, T, stacked, shape, ids_shape):  # items 9, 12
    buf = rb.UniformReplayBuffer(tutorial_spec(), 2, 6, **storage)
    for _ in range(4):
        buf.add_batch(tutorial_items(2))
    items, info = buf.get_next(S, T, stacked)
    action, (lidar, camera) = items
    assert tuple(action.shape) == shape + (3,) and tuple(camera.shape) == shape + (3, 2)
    assert tuple(info.ids.shape) == ids_shape
    assert tuple(info.probabilities.shape) == (() if S is None else (S,))


@pytest.mark.parametrize("S", [None, 4])
def test_unstacked_steps_are_a_tuple(storage, S):  # item 9
    buf = counter_buffer(storage, 2, 6, 5)
    items, info = buf.get_next(S, 3, time_stacked=False)
    assert isinstance(items, tuple) and len(items) == 3 and isinstance(info.ids, tuple)
    steps = [to_np(x) for x in items]
    ids = [to_np(i) for i in info.ids]
    assert steps[0].shape == (() if S is None else (S,)) == ids[0].shape
    np.testing.assert_array_equal(steps[0] + 2, steps[2])
    np.testing.assert_array_equal(ids[0] + 1, ids[1])


def test_all_steps_of_a_sample_share_a_row_and_rows_are_uniform(storage):  # item 10
    buf = counter_buffer(storage, 4, 8, 8)
    items, _ = buf.get_next(4000, num_steps=3)
    x = to_np(items)
    rows = x // 100
    assert (rows == rows[:, :1]).all()
    counts = np.bincount(rows[:, 0], minlength=4)
    assert counts.min() > 1000 * 0.85


@pytest.mark.parametrize("batch_size", [1, 5])
def test_probabilities(storage, batch_size):  # item 11
    buf = counter_buffer(storage, batch_size, 4, 0)
    for i in (1, 2):
        buf.add_batch(np.zeros(batch_size, np.int64))
        _, info = buf.get_next(2)
        np.testing.assert_allclose(to_np(info.probabilities), [1 / (i * batch_size)] * 2,
                                   rtol=1e-6)
        assert to_np(info.probabilities).dtype == np.float32
    buf = counter_buffer(storage, batch_size, 3, 0)
    for i in range(1, 5):
        buf.add_batch(np.zeros(batch_size, np.int64))
        _, info = buf.get_next()
        assert to_np(info.probabilities) == pytest.approx(1 / min(i * batch_size, 3 * batch_size))
    _, info = buf.get_next(5, num_steps=2)  # 2 valid starts per row
    np.testing.assert_allclose(to_np(info.probabilities), 1 / (2 * batch_size), rtol=1e-6)


def test_random_dataset_sees_the_buffer_at_pull_time(storage):  # item 13
    buf = counter_buffer(storage, 2, 3, 0)
    iterator = iter(buf.as_dataset())
    for i in range(1, 5):
        buf.add_batch(np.zeros(2, np.int64))
        _, info = next(iterator)
        assert to_np(info.probabilities) == pytest.approx(1 / min(i * 2, 6))


def test_as_dataset_refuses_lists_in_the_spec(storage):  # item 14
    spec = [rb.ArraySpec((3,), np.float32), [rb.ArraySpec((5,), np.float32)]]
    buf = rb.UniformReplayBuffer(spec, 1, 4, **storage)
    buf.add_batch([np.zeros((1, 3)), [np.zeros((1, 5))]])  # lists work everywhere else
    assert isinstance(buf.get_next()[0], list)
    with pytest.raises(ValueError, match="tuples"):
        buf.as_dataset()


@pytest.mark.parametrize("batch_size", [1, 5])
def test_gather_all(storage, batch_size):  # item 15
    buf = counter_buffer(storage, batch_size, 10, 10)
    expected = np.arange(batch_size)[:, None] * 100 + np.arange(10)
    np.testing.assert_array_equal(to_np(buf.gather_all()), expected)
    buf = counter_buffer(storage, batch_size, 10, 15)
    expected = np.arange(batch_size)[:, None] * 100 + np.arange(5, 15)
    np.testing.assert_array_equal(to_np(buf.gather_all()), expected)
    empty = to_np(counter_buffer(storage, batch_size, 10, 0).gather_all())
    assert empty.shape == (batch_size, 0) and empty.dtype == np.int64


def test_gather_all_keeps_nests_and_trailing_dims(storage):
    buf = rb.UniformReplayBuffer(tutorial_spec(), 3, 4, **storage)
    for _ in range(6):
        buf.add_batch(tutorial_items(3))
    action, (lidar, camera) = buf.gather_all()
    assert tuple(action.shape) == (3, 4, 3) and tuple(camera.shape) == (3, 4, 3, 2)


def test_clear(storage):  # item 16
    buf = counter_buffer(storage, 2, 4, 0)
    fresh = to_np(buf.gather_all())
    for t in range(6):
        buf.add_batch(np.array([t + 1, t + 101]))
    buf.get_next()
    buf.clear()
    assert buf.last_id == -1 and buf.num_frames() == 0
    after = to_np(buf.gather_all())
    assert after.dtype == fresh.dtype and after.shape == fresh.shape
    with pytest.raises(rb.EmptyBufferError, match=EMPTY):
        buf.get_next()
    buf.add_batch(np.array([7, 8]))  # ids restart at 0
    assert buf.last_id == 0
    np.testing.assert_array_equal(to_np(buf.gather_all()), [[7], [8]])


def test_clear_can_zero_the_storage(storage):
    buf = counter_buffer(storage, 2, 4, 4)
    buf.clear(zero_storage=True)
    buf.add_batch(np.array([5, 6]))
    # Slots 1..3 were zeroed: only visible through the storage itself (whose layout
    # is the backend's: slot-major in numpy, row-major in TensorFlow's buffer).
    arrays = [to_np(a) for a in buf._storage.arrays]
    np.testing.assert_array_equal(np.sort(arrays[0]), [0, 0, 0, 0, 0, 0, 5, 6])


def test_extend_equals_repeated_add_batch(storage):
    a = counter_buffer(storage, 3, 5, 0)
    b = counter_buffer(storage, 3, 5, 0)
    block = np.arange(3)[:, None] * 100 + np.arange(12)  # [B, T] with T > L
    a.extend(block[:, :4])
    a.extend(block[:, 4:])
    for t in range(12):
        b.add_batch(block[:, t])
    assert a.last_id == b.last_id == 11
    np.testing.assert_array_equal(to_np(a.gather_all()), to_np(b.gather_all()))
    a.extend(block[:, :0])
    assert a.last_id == 11


def test_seed_makes_sampling_reproducible(storage):
    draws = []
    for _ in range(2):
        buf = counter_buffer(storage, 3, 10, 25)
        items, info = buf.get_next(64, num_steps=2)
        stream = buf.as_dataset(8, num_steps=2)
        first = [to_np(next(iter(stream))[0]) for _ in range(2)]
        draws.append((to_np(items), to_np(info.ids), first))
    np.testing.assert_array_equal(draws[0][0], draws[1][0])
    np.testing.assert_array_equal(draws[0][1], draws[1][1])
    np.testing.assert_array_equal(draws[0][2], draws[1][2])
    other = counter_buffer(storage, 3, 10, 25, )
    other._sampler.load_state_dict({"rng": np.random.PCG64(12345).state})
    assert not np.array_equal(to_np(other.get_next(64, num_steps=2)[0]), draws[0][0])


def test_repr_and_properties(storage):
    buf = counter_buffer(storage, 2, 3, 1)
    assert "steps=2/6" in repr(buf) and "frames=" not in repr(buf) and buf.storage == storage["storage"]
    assert buf.nbytes == 6 * 8 and buf.batch_size == 2 and buf.max_length == 3


def test_spec_from_gym_space_buffer(storage):
    import gymnasium as gym

    space = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (4,), np.float32),
                             "action": gym.spaces.Discrete(3)})
    buf = rb.UniformReplayBuffer(space, 2, 5, **storage)
    buf.add_batch({"obs": np.zeros((2, 4), np.float32), "action": np.array([0, 2])})
    items, _ = buf.get_next(3)
    assert tuple(items["obs"].shape) == (3, 4) and tuple(items["action"].shape) == (3,)
