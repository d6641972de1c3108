"""TF-Agents' python buffer names (items 25-31, with the fixes documented in the module)."""

import numpy as np
import pytest

import replaybuffer as rb
from conftest import to_np
from replaybuffer.compat import tf_agents


def spec():
    return {"obs": tf_agents.ArraySpec((15, 15, 4), np.int32, "obs"),
            "action": tf_agents.BoundedArraySpec((), np.int32, 0, 1)}


def item(k, n=1):
    frames = np.stack([np.full((15, 15), k + c, np.int32) for c in range(4)], -1)
    return {"obs": np.repeat(frames[None], n, 0), "action": np.full(n, k % 2, np.int32)}


def filled(capacity=32, adds=96):
    buf = tf_agents.PyUniformReplayBuffer(spec(), capacity, seed=12345)
    for k in range(adds):
        buf.add_batch(item(k))
    return buf


def test_size_grows_to_capacity():  # item 25
    buf = tf_agents.PyUniformReplayBuffer(spec(), 32)
    assert buf.size == 0 and buf.capacity == 32
    for k in range(40):
        buf.add_batch(item(k))
        assert buf.size == min(k + 1, 32)


def test_only_the_last_capacity_items_are_returned():  # item 26
    items, info = filled().get_next(sample_batch_size=200)
    assert items["obs"][:, 0, 0, 0].min() >= 64
    for c in range(1, 4):  # stacks intact
        np.testing.assert_array_equal(items["obs"][..., c], items["obs"][..., 0] + c)
    assert info.probabilities.shape == (200,)


def test_samples_do_not_cross_the_head():  # item 27
    buf = tf_agents.PyUniformReplayBuffer(tf_agents.ArraySpec((), np.int64), 10, seed=12345)
    buf.add_batch(np.zeros(5, np.int64))  # a batch of 5 in one call
    buf.add_batch(np.arange(10))
    first, second = buf.get_next(10000, num_steps=2, time_stacked=False)[0]
    assert not ((first == 9) & (second == 0)).any()
    counts = np.bincount(first, minlength=10)
    assert counts[9] == 0
    assert np.all(np.abs(counts[:9] - 10000 / 9) < 150)


@pytest.mark.parametrize("S,T,shape", [(5, None, (5, 15, 15, 4)), (5, 3, (5, 3, 15, 15, 4)),
                                       (None, 3, (3, 15, 15, 4))])
def test_dataset_shapes(S, T, shape):  # item 28
    items, info = next(iter(filled().as_dataset(sample_batch_size=S, num_steps=T)))
    assert items["obs"].shape == shape
    assert items["action"].shape == shape[:-3]


def test_empty_buffer_raises_and_parallel_calls_work():  # item 29 (fixed)
    buf = tf_agents.PyUniformReplayBuffer(spec(), 4)
    with pytest.raises(rb.EmptyBufferError, match="is empty"):
        buf.get_next()
    buf.add_batch(item(0))
    it = iter(buf.as_dataset(2, num_parallel_calls=2))
    assert next(it)[0]["obs"].shape == (2, 15, 15, 4)
    it.close()


def test_gather_all_is_chronological_and_only_valid():  # item 30 (fixed)
    buf = filled(capacity=32, adds=40)
    obs = buf.gather_all()["obs"]
    assert obs.shape == (1, 32, 15, 15, 4)
    assert obs[0, :, 0, 0, 0].tolist() == list(range(8, 40))
    assert tf_agents.PyUniformReplayBuffer(spec(), 4).gather_all()["obs"].shape == (1, 0, 15, 15, 4)


def test_checkpoint_round_trip(tmp_path):  # item 31
    buf = filled()
    buf.save(tmp_path / "py")
    again = rb.load(tmp_path / "py")
    assert type(again) is tf_agents.PyUniformReplayBuffer and again.size == 32
    items, _ = again.get_next(200)
    assert items["obs"][:, 0, 0, 0].min() >= 64
    np.testing.assert_array_equal(to_np(again.gather_all()["obs"]), buf.gather_all()["obs"])


def test_add_batch_takes_any_leading_dimension():
    buf = tf_agents.PyUniformReplayBuffer(tf_agents.ArraySpec((), np.int64), 6)
    buf.add_batch(np.arange(4))
    buf.add_batch(np.arange(4, 13))  # more than capacity in one call
    buf.add_batch(np.arange(0))
    assert buf.gather_all()[0].tolist() == list(range(7, 13)) and buf.last_id == 12


def test_buffer_info_is_the_same_class():
    assert tf_agents.BufferInfo is rb.BufferInfo


def test_add_batch_errors_speak_of_add_batch():
    buf = tf_agents.PyUniformReplayBuffer(tf_agents.ArraySpec((3,), np.float32), 4)
    with pytest.raises(rb.SpecError, match=r"leaf <root>: expected shape \(2, 3\) .*\[n=2\].*got \(2, 4\)"):
        buf.add_batch(np.ones((2, 4), np.float32))
    with pytest.raises(rb.SpecError, match=r"add_batch: leaf <root>: expected leading dimensions \[n\]"):
        buf.add_batch(np.float32(1.0))
    assert buf.size == 0


@pytest.mark.parametrize("cls", [tf_agents.PyUniformReplayBuffer,
                                 tf_agents.PyHashedReplayBuffer])
@pytest.mark.parametrize("capacity", [-4, 0, 2.5, True, "3"])
def test_a_bad_capacity_is_named_as_written(cls, capacity):
    """The user wrote capacity (the core calls it max_length): the error names capacity
    and the class the user built."""
    data_spec = tf_agents.Trajectory(*[tf_agents.ArraySpec((), np.float32)] * 7) \
        if cls is tf_agents.PyHashedReplayBuffer else spec()
    with pytest.raises(ValueError) as caught:
        cls(data_spec, capacity=capacity)
    message = str(caught.value)
    assert f"{cls.__name__}: capacity must be a positive int, got {capacity!r}" == message
    assert "max_length" not in message
