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


# ------------------------------------------ restores of variables() by tf.train.Checkpoint
def tf_save(buf, directory, name="ckpt"):
    """TF-Agents' way: the buffer's variables in a ``tf.train.Checkpoint``."""
    return tf.train.Checkpoint(variables=list(buf.variables())).write(str(directory / name))


def tf_restore(buf, path):
    tf.train.Checkpoint(variables=list(buf.variables())).read(path).assert_consumed()


def test_a_tf_train_checkpoint_restore_between_the_draw_and_the_pull_is_seen(
        monkeypatch, tmp_path):
    path = tf_save(counter(adds=6, value=7), tmp_path)
    buf = counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(8))
    gate.release(0, 1)
    assert pulled_values(next(it)) == {1}
    gate.drawn(1)  # element 1 was drawn from the buffer of 1s
    tf_restore(buf, path)
    gate.release(2)
    assert pulled_values(next(it)) == {7}


def test_a_restore_back_to_an_earlier_state_then_adds_past_the_draw_is_seen(
        monkeypatch, tmp_path):
    # Refutes an (epoch token, add count) check: the restore keeps the token, and the
    # adds after it bring the count past the draw's, with other data than before.
    buf = counter(batch_size=2, max_length=6, adds=3, value=1)
    path = tf_save(buf, tmp_path)  # 3 steps per row
    add(buf, 6, 2)  # 9 adds: the ring holds only 2s
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(8))
    gate.release(0, 1)
    assert pulled_values(next(it)) == {2}
    gate.drawn(1)
    tf_restore(buf, path)
    add(buf, 6, 3)  # 9 adds again, but these hold only 3s: no 2 is in the buffer
    gate.release(2)
    assert pulled_values(next(it)) == {3}


def test_restoring_the_same_checkpoint_twice_is_seen_the_second_time(monkeypatch,
                                                                     tmp_path):
    buf = counter(adds=6, value=7)
    path = tf_save(buf, tmp_path)
    tf_restore(buf, path)
    add(buf, 6, 8)  # the ring holds only 8s
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(8))
    gate.release(0, 1)
    assert pulled_values(next(it)) == {8}
    gate.drawn(1)
    tf_restore(buf, path)  # the same stamp as after the first restore
    gate.release(2)
    assert pulled_values(next(it)) == {7}


def test_a_restored_state_the_buffer_went_through_after_the_draw_keeps_the_draw(
        monkeypatch, tmp_path):
    # Saved after the draw with only adds between (the ring wrapped meanwhile): the
    # batch holds the buffer as it was drawn, as tf.data's own prefetch hands it out.
    buf = counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch, check_after_next_draw=True)
    it = iter(buf.as_dataset(8))
    gate.release(0, 1)
    assert pulled_values(next(it)) == {1}
    gate.drawn(1)
    add(buf, 6, 9)  # wraps: only 9s
    path = tf_save(buf, tmp_path)
    buf.clear()
    add(buf, 6, 5)
    tf_restore(buf, path)
    gate.release(2)  # its draw sets a new stamp before element 1's pull checks
    assert pulled_values(next(it)) == {1}


def test_a_checkpoint_of_a_buffer_built_alike_restored_into_another_is_seen(
        monkeypatch, tmp_path):
    # Same seed, same number of draws: the stamps still differ (a random salt each).
    source, buf = counter(adds=6, value=7), counter(adds=6, value=1)
    gates = [Gate(b, monkeypatch) for b in (source, buf)]
    its = [iter(b.as_dataset(8)) for b in (source, buf)]
    for gate, it in zip(gates, its):
        gate.release(0, 1)
        next(it)
        gate.drawn(1)
    tf_restore(buf, tf_save(source, tmp_path))
    gates[1].release(2)
    assert pulled_values(next(its[1])) == {7}


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


def test_a_restore_while_the_draw_is_in_its_critical_section_is_seen(monkeypatch,
                                                                     tmp_path):
    # The restore lands after the draw read the data and before it ends: a draw that
    # set its stamp after reading would overwrite the restored stamp and pass.
    path = tf_save(counter(adds=6, value=7), tmp_path)
    buf = counter(adds=6, value=1)
    hold = HoldAfterReads(buf, monkeypatch, call=1)  # read 0: element 0's draw
    it = iter(buf.as_dataset(8))
    assert pulled_values(next(it)) == {1}
    assert hold.reached.wait(WAIT)  # element 1's draw has read the 1s
    tf_restore(buf, path)
    hold.go.set()
    assert pulled_values(next(it)) == {7}


def test_the_stamp_works_in_graph_mode_pulls_and_restores(monkeypatch):
    source, buf = counter(adds=6, value=7), counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch)
    it = buf.as_dataset(8).tf_iterator()

    @tf.function
    def pull(iterator):
        return next(iterator)[0]

    @tf.function
    def restore():  # a restore inside a graph: every variable assigned
        for target, value in zip(buf.variables(), source.variables()):
            target.assign(value)

    @tf.function
    def clear_and_add():
        buf.clear()
        buf.add_batch(tf.fill([2], tf.constant(4, tf.int64)))

    gate.release(0, 1)
    assert set(to_np(pull(it)).tolist()) == {1}
    gate.drawn(1)
    restore()
    gate.release(2)
    assert set(to_np(pull(it)).tolist()) == {7}
    gate.drawn(2)  # element 2 drawn from the 7s
    clear_and_add()
    gate.release(3)
    assert set(to_np(pull(it)).tolist()) == {4}


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


def test_a_checkpoint_of_variables_without_the_stamp_still_loads(tmp_path):
    old = counter(adds=6, value=7)
    path = tf.train.Checkpoint(variables=list(old.variables()[:-1])).write(
        str(tmp_path / "old"))  # the variables() of a buffer before the stamp
    buf = counter()
    tf.train.Checkpoint(variables=list(buf.variables())).read(path)
    assert buf.last_id == 5
    assert set(to_np(buf.gather_all()).ravel().tolist()) == {7}
    assert buf.variables()[-1].dtype == tf.int64 and buf.variables()[-1].shape == ()


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


# ------------------------------------- tf.train.Checkpoint(replay_buffer=buffer), TF-Agents'
def test_a_checkpoint_of_the_buffer_object_round_trips_and_continues_alike(tmp_path):
    buf = counter(batch_size=3, max_length=5, adds=0, seed=4)
    for t in range(7):
        buf.add_batch(np.arange(3, dtype=np.int64) * 10 + t)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(replay_buffer=buf),
                                         str(tmp_path), max_to_keep=2)
    path = manager.save()
    restored = counter(batch_size=3, max_length=5, seed=9)
    tf.train.Checkpoint(replay_buffer=restored).restore(path).assert_consumed()
    assert restored.last_id == buf.last_id == 6
    np.testing.assert_array_equal(to_np(restored.gather_all()), to_np(buf.gather_all()))
    for b in (buf, restored):  # the generator came back too
        b.add_batch(np.full(3, 99, np.int64))
    for _ in range(3):
        np.testing.assert_array_equal(to_np(restored.get_next(6, 2)[0]),
                                      to_np(buf.get_next(6, 2)[0]))


def test_a_restore_of_the_buffer_object_between_the_draw_and_the_pull_is_seen(
        monkeypatch, tmp_path):
    path = tf.train.Checkpoint(replay_buffer=counter(adds=6, value=7)).write(
        str(tmp_path / "ckpt"))
    buf = counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(8))
    gate.release(0, 1)
    assert pulled_values(next(it)) == {1}
    gate.drawn(1)
    tf.train.Checkpoint(replay_buffer=buf).read(path).assert_consumed()
    gate.release(2)
    assert pulled_values(next(it)) == {7}


def test_a_restore_of_the_buffer_object_waits_for_a_draw_in_progress(monkeypatch,
                                                                     tmp_path):
    # Nine variables and more sort their checkpoint keys as strings ("0", "1", "10",
    # ...): a tf.train.Checkpoint of the variables() tuple would write the stamp before
    # the last data variables. The buffer object's restore is one atomic write instead.
    spec = {f"leaf{i}": rb.ArraySpec((), np.int64) for i in range(9)}

    def filled(value):
        b = TFUniformReplayBuffer(spec, 2, 6, seed=3)
        for _ in range(6):
            b.add_batch({k: np.full(2, value, np.int64) for k in spec})
        return b

    path = tf.train.Checkpoint(replay_buffer=filled(7)).write(str(tmp_path / "ckpt"))
    buf = filled(1)
    hold = HoldAfterReads(buf, monkeypatch, call=1)
    it = iter(buf.as_dataset(8))
    assert pulled_values_of(next(it)) == {1}
    assert hold.reached.wait(WAIT)  # element 1's draw holds the critical section
    restore = threading.Thread(
        target=lambda: tf.train.Checkpoint(replay_buffer=buf).read(path))
    restore.start()
    restore.join(1.0)
    assert restore.is_alive()  # it waits for the critical section the draw holds
    hold.go.set()
    restore.join(WAIT)
    assert not restore.is_alive()
    assert pulled_values_of(next(it)) == {7}


def pulled_values_of(element):
    items, _ = element
    return set(np.concatenate([to_np(x).ravel() for x in items.values()]).tolist())


def test_a_checkpoint_of_another_layout_is_refused_naming_the_variable(tmp_path):
    path = tf.train.Checkpoint(replay_buffer=counter(max_length=4, adds=2, value=7)).write(
        str(tmp_path / "ckpt"))
    buf = counter(max_length=6, adds=3, value=1)
    before = to_np(buf.gather_all())
    with pytest.raises(ValueError, match=r"data_0 must be int64\[12\], got int64\[8\]"):
        tf.train.Checkpoint(replay_buffer=buf).read(path)
    assert buf.last_id == 2
    np.testing.assert_array_equal(to_np(buf.gather_all()), before)
