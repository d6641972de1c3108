"""The TensorFlow buffer's plain random dataset draws the next element ahead of the pull
(issue 26 item 3): what a draw ahead may hand out, checked at the pull (clears, windows,
the seeded stream; restores are in test_tf_dataset_restore.py). The draws are ordered
against the test by the gates of tf_draw_gates.py.
"""

import itertools

import numpy as np
import pytest

import replaybuffer as rb
from conftest import to_np

tf = pytest.importorskip("tensorflow")

from tf_draw_gates import (  # noqa: E402
    Gate, add, counter, pulled_one_drew_the_next, pulled_values)


def test_a_clear_between_the_draw_and_the_pull_hands_out_no_earlier_data(monkeypatch):
    buf = counter(adds=6, value=1)
    twin = counter(adds=6, value=1)  # the same seed, sampling at the pull
    gate = Gate(buf, monkeypatch)
    it, at_pull = iter(buf.as_dataset(8, num_steps=2)), iter(twin.as_dataset(8, 2, prefetch=0))
    gate.release(0, 1)
    assert pulled_values(next(it)) == {1}
    next(at_pull)
    gate.drawn(1)  # element 1 was drawn from the buffer of 1s
    for b in (buf, twin):
        b.clear()
        add(b, 3, 2)
    gate.release(2)
    element = next(it)
    assert pulled_values(element) == {2}
    # Drawn again with its own key: the element sampling at the pull gives.
    expected = next(at_pull)
    for a, b in zip(tf.nest.flatten(element), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(to_np(a), to_np(b))


def test_a_restore_between_the_draw_and_the_pull_hands_out_no_earlier_data(monkeypatch):
    saved = counter(adds=4, value=7).state_dict()
    buf = counter(adds=6, value=1)
    gate, it = pulled_one_drew_the_next(buf, monkeypatch, 1)
    buf.load_state_dict(saved)
    gate.release(2)
    assert pulled_values(next(it)) == {7}



def test_a_loop_of_adds_and_pulls_never_draws_a_batch_again(monkeypatch):
    # Each draw ahead sets a new stamp, here always before the previous batch's pull
    # checks its own (left to the threads, now and then): the link keeps that batch.
    buf = counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch, check_after_next_draw=True)
    again = []
    state = buf._state
    original = state.sample_function

    def counted(*args):
        real = original(*args)

        def sample(key):
            key = tf.py_function(lambda k: again.append(1) or k, [key], tf.int64)
            key.set_shape([2])
            return real(key)
        return sample

    monkeypatch.setattr(state, "sample_function", counted)
    gate.release(*range(64))
    it = iter(buf.as_dataset(8, num_steps=2))
    for t in range(20):
        next(it)
        add(buf, 1, t)
    assert not again



@pytest.mark.parametrize("zero_storage", [False, True])
def test_a_draw_ahead_on_an_emptied_buffer_is_drawn_again_once_steps_came(monkeypatch,
                                                                        zero_storage):
    buf = counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(8, num_steps=2))
    gate.release(0)
    assert pulled_values(next(it)) == {1}
    buf.clear(zero_storage=zero_storage)
    gate.release(1)
    gate.drawn(1)  # element 1 was drawn from the empty buffer: no window, no error
    add(buf, 2, 5)
    gate.release(2)
    items, info = next(it)
    assert pulled_values((items, info)) == {5}
    np.testing.assert_allclose(to_np(info.probabilities), 1 / 2)  # 1 start x 2 rows


def test_a_draw_ahead_on_rows_too_short_for_num_steps_is_drawn_again(monkeypatch):
    buf = counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(4, num_steps=3))
    gate.release(0)
    next(it)
    buf.clear()
    add(buf, 1, 5)  # one step per row: no window of 3
    gate.release(1)
    gate.drawn(1)
    add(buf, 2, 6)
    gate.release(2)
    items, info = next(it)
    assert to_np(items).tolist() == [[5, 6, 6]] * 4  # the one window of each row
    assert to_np(info.ids).tolist() == [[0, 1, 2]] * 4


def test_a_pull_still_finding_no_window_raises_and_the_stream_recovers(monkeypatch):
    buf = counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(4, num_steps=2))
    gate.release(*range(64))
    next(it)
    buf.clear()
    add(buf, 1, 5)
    with pytest.raises(rb.EmptyBufferError, match="num_steps=2 is longer than a row"):
        next(it)
    add(buf, 1, 6)
    assert to_np(next(it)[0]).tolist() == [[5, 6]] * 4


def test_drawing_ahead_keeps_the_seeded_stream_of_sampling_at_the_pull():
    def first(**kwargs):
        buf = counter(batch_size=3, max_length=20, adds=0, seed=11)
        for t in range(20):
            buf.add_batch(np.arange(3, dtype=np.int64) * 100 + t)
        it = iter(buf.as_dataset(16, num_steps=2, **kwargs))
        out = [(to_np(items), to_np(info.ids)) for items, info in itertools.islice(it, 6)]
        it.close()
        return out

    ahead, at_pull = first(), first(prefetch=0)
    for (a, ia), (b, ib) in zip(ahead, at_pull):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ia, ib)
    assert not np.array_equal(ahead[0][0], ahead[1][0])


def test_the_elements_drawn_ahead_are_those_of_tf_data_s_own_iterator_and_tf_function():
    bufs = [counter(adds=6, value=0) for _ in range(3)]
    for b in bufs:
        for t in range(4):
            b.add_batch(np.array([t, 10 + t], np.int64))
    fast = [to_np(x[0]) for x in itertools.islice(iter(bufs[0].as_dataset(5, 2)), 3)]
    generic = [to_np(x[0]) for x in itertools.islice(bufs[1].as_dataset(5, 2).tf_iterator(), 3)]

    @tf.function
    def first_three(dataset):
        it = iter(dataset)
        return [next(it)[0] for _ in range(3)]

    graph = [to_np(x) for x in first_three(bufs[2].as_dataset(5, 2))]
    for a, b, c in zip(fast, generic, graph):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
