"""Gates for the TensorFlow buffer's draws ahead of a pull (tests/test_tf_dataset_*.py).

The draws ahead run on tf.data's prefetch thread. To make their order against a
test's clears, adds and restores certain, :class:`Gate` (a ``tf.py_function`` around the
buffer's draw ahead) holds each draw until the test lets it go and says when it is
done; :class:`HoldAfterReads` holds a draw inside the buffer's critical section.
"""

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
    ``release(k)``; ``drawn(k)`` waits until it is done.

    ``check_after_next_draw``: the pull of element ``k`` checks its draw only once draw
    ``k + 1`` is done, where that one is released (it starts as element ``k`` is
    taken, so otherwise the two race)."""

    def __init__(self, buf, monkeypatch, check_after_next_draw=False):
        self.go = [threading.Event() for _ in range(64)]
        self.done = [threading.Event() for _ in range(64)]
        self.calls = self.pulls = 0
        state = buf._state
        original = state.ahead_sample_function
        if check_after_next_draw:
            stamp, current = state.stamp, state.stamp.current

            def checked_later(drawn_with):
                waited = tf.py_function(self._wait_next_draw, [], tf.bool)
                with tf.control_dependencies([waited]):
                    return current(tf.identity(drawn_with))

            monkeypatch.setattr(stamp, "current", checked_later)

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

    def _wait_next_draw(self):
        k, self.pulls = self.pulls, self.pulls + 1
        if self.go[k + 1].is_set():
            self.drawn(k + 1)
        return True

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



class HoldAfterReads:
    """Holds the ``call``-th read of the storage (in a draw, after its gathers, inside
    the critical section) until ``go`` is set; ``reached`` is set when it holds."""

    def __init__(self, buf, monkeypatch, call):
        self.call, self.calls = call, 0
        self.reached, self.go = threading.Event(), threading.Event()
        storage = buf._state.storage
        real = storage.take

        def take(positions, which=None):
            leaves = real(positions, which)
            with tf.control_dependencies(leaves):
                held = tf.py_function(self._hold, [], tf.bool)
            with tf.control_dependencies([held]):
                return [tf.identity(leaf) for leaf in leaves]

        monkeypatch.setattr(storage, "take", take)

    def _hold(self):
        k, self.calls = self.calls, self.calls + 1
        if k == self.call:
            self.reached.set()
            assert self.go.wait(WAIT), f"read {k} was never released"
        return True


def pulled_values_of(element):
    """The values of an element of a dict-spec buffer."""
    items, _ = element
    return set(np.concatenate([to_np(x).ravel() for x in items.values()]).tolist())


def pulled_one_drew_the_next(buf, monkeypatch, value):
    """Gate ``buf``'s plain ``as_dataset(8)``: its first element pulled (all ``value``)
    and the second drawn ahead from the buffer as it is now, not yet pulled (release
    element 2 to pull it). Returns ``(gate, iterator)``."""
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(8))
    gate.release(0, 1)
    assert pulled_values(next(it)) == {value}
    gate.drawn(1)
    return gate, it
