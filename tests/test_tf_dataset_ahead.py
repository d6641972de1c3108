"""The TensorFlow buffer's plain random dataset draws the next element ahead of the pull
(issue 26 item 3): what a draw ahead may hand out, checked at the pull.

The draws ahead run on tf.data's prefetch thread. To make their order against the
test's clears and adds certain, a gate (a ``tf.py_function`` around the buffer's draw
ahead) holds each draw until the test lets it go and says when it is done.
"""

import itertools
import threading

import numpy as np
import pytest

import replaybuffer as rb
from conftest import to_np

tf = pytest.importorskip("tensorflow")

from replaybuffer.tf import TFUniformReplayBuffer  # noqa: E402

WAIT = 60  # seconds: a guard against a hung test, never a timing assertion


def counter(batch_size=2, max_length=6, adds=0, value=0, seed=3):
    """int64 scalars; each add writes ``value`` into every row."""
    buf = TFUniformReplayBuffer(rb.ArraySpec((), np.int64), batch_size, max_length,
                                seed=seed)
    add(buf, adds, value)
    return buf


def add(buf, steps, value):
    for _ in range(steps):
        buf.add_batch(np.full(buf.batch_size, value, np.int64))


class Gate:
    """Holds draw ``k`` ahead (the k-th call of the buffer's draw ahead) until
    ``release(k)``; ``drawn(k)`` waits until it is done."""

    def __init__(self, buf, monkeypatch):
        self.go = [threading.Event() for _ in range(64)]
        self.done = [threading.Event() for _ in range(64)]
        self.calls = 0
        state = buf._state
        original = state.ahead_sample_function

        def gated(sample_batch_size, num_steps):
            real = original(sample_batch_size, num_steps)

            def draw(key):
                key = tf.py_function(self._enter, [key], tf.int64)
                key.set_shape([2])
                out = real(key)
                flag = tf.py_function(self._leave, [out[0]], tf.bool)
                with tf.control_dependencies([flag]):
                    return tf.nest.map_structure(tf.identity, out)
            return draw

        monkeypatch.setattr(state, "ahead_sample_function", gated)

    def _enter(self, key):
        k, self.calls = self.calls, self.calls + 1
        self._current = k
        assert self.go[k].wait(WAIT), f"draw {k} was never released"
        return key

    def _leave(self, fresh):
        self.done[self._current].set()
        return fresh

    def release(self, *draws):
        for k in draws:
            self.go[k].set()

    def drawn(self, k):
        assert self.done[k].wait(WAIT), f"draw {k} did not finish"


def pulled_values(element):
    items, _ = element
    return set(to_np(items).ravel().tolist())


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
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(8))
    gate.release(0, 1)
    assert pulled_values(next(it)) == {1}
    gate.drawn(1)  # element 1 was drawn from the buffer of 1s
    buf.load_state_dict(saved)
    gate.release(2)
    assert pulled_values(next(it)) == {7}


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
