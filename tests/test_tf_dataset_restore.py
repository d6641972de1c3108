"""Restores between a draw ahead of the pull and the pull (issue 26 item 3): the
TensorFlow buffer's plain ``as_dataset`` sees every restore, whichever way it comes (the
buffer's own checkpoint, a ``tf.train.Checkpoint`` of ``variables()``, or of the buffer
object as TF-Agents writes it), through the content stamp of ``replaybuffer.tf.stamp``.
"""

import threading

import numpy as np
import pytest

import replaybuffer as rb
from conftest import to_np

tf = pytest.importorskip("tensorflow")

from replaybuffer.tf import TFUniformReplayBuffer  # noqa: E402
from tf_draw_gates import (  # noqa: E402
    WAIT, Gate, HoldAfterReads, add, counter, pulled_one_drew_the_next, pulled_values,
    pulled_values_of)


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
    gate, it = pulled_one_drew_the_next(buf, monkeypatch, 1)
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
    gate, it = pulled_one_drew_the_next(buf, monkeypatch, 2)
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
    gate, it = pulled_one_drew_the_next(buf, monkeypatch, 8)
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


def test_a_restore_of_variables_in_their_order_around_a_draw_is_seen(monkeypatch):
    # As a tf.train.Checkpoint of the tuple restores it (up to six leaves): one
    # variable at a time, in order. The draw runs after the data and before last_id
    # and the stamp: it reads the new data at the old last_id, a state that never was.
    source = counter(adds=3, value=7)  # rows of 3 steps; the slots after them hold 0
    buf = counter(adds=6, value=1)
    gate = Gate(buf, monkeypatch)
    it = iter(buf.as_dataset(8))
    gate.release(0)
    assert pulled_values(next(it)) == {1}
    targets, values = buf.variables(), [v.read_value() for v in source.variables()]
    targets[0].assign(values[0])  # the data
    gate.release(1)
    gate.drawn(1)
    for target, value in zip(targets[1:], values[1:]):  # last_id, generator, stamp
        target.assign(value)
    gate.release(2)
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



def test_a_checkpoint_of_variables_without_the_stamp_still_loads(tmp_path):
    old = counter(adds=6, value=7)
    path = tf.train.Checkpoint(variables=list(old.variables()[:-1])).write(
        str(tmp_path / "old"))  # the variables() of a buffer before the stamp
    buf = counter()
    tf.train.Checkpoint(variables=list(buf.variables())).read(path)
    assert buf.last_id == 5
    assert set(to_np(buf.gather_all()).ravel().tolist()) == {7}
    assert buf.variables()[-1].dtype == tf.int64 and buf.variables()[-1].shape == ()



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
    gate, it = pulled_one_drew_the_next(buf, monkeypatch, 1)
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
    waited = restore.is_alive()  # for the critical section the draw holds
    hold.go.set()
    restore.join(WAIT)
    assert waited and not restore.is_alive()
    assert pulled_values_of(next(it)) == {7}



def test_a_checkpoint_of_another_layout_is_refused_naming_the_variable(tmp_path):
    path = tf.train.Checkpoint(replay_buffer=counter(max_length=4, adds=2, value=7)).write(
        str(tmp_path / "ckpt"))
    buf = counter(max_length=6, adds=3, value=1)
    before = to_np(buf.gather_all())
    with pytest.raises(ValueError, match=r"data_0 must be int64\[12\], got int64\[8\]"):
        tf.train.Checkpoint(replay_buffer=buf).read(path)
    assert buf.last_id == 2
    np.testing.assert_array_equal(to_np(buf.gather_all()), before)


def test_generation_changes_with_clears_and_restores_and_not_with_adds(tmp_path):
    buf = counter(adds=3, value=1)
    before = buf.generation
    add(buf, 2, 1)
    assert buf.generation == before  # adds never change it
    path = tf_save(buf, tmp_path)
    tf_restore(buf, path)  # TensorFlow assigns the saved stamp: the same contents
    assert buf.generation == before
    buf.clear()
    cleared = buf.generation
    assert cleared != before
    tf.function(buf.clear)()  # a clear in a graph, where no Python code runs
    assert buf.generation not in (before, cleared)
    tf_restore(buf, path)
    assert buf.generation == before
    other = counter(adds=3, value=1)  # built alike: another salt
    assert other.generation != before
    saved = buf.save(tmp_path / "own")
    buf.clear()
    loaded = rb.load(saved)
    assert loaded.generation != buf.generation
