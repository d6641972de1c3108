"""TF-Agents' constructor options on the TensorFlow buffer (``tf/agents_options.py``):
those kept read back as given, ``_clear`` is ``clear``, those refused name the
option."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from replaybuffer.tf import TFUniformReplayBuffer  # noqa: E402


def test_kept_options_read_back_and_clear_all_variables_zeroes_the_storage():
    buf = TFUniformReplayBuffer(tf.TensorSpec([2], tf.float32), batch_size=1, max_length=4,
                                scope="mine", stateful_dataset=True)
    assert (buf.scope, buf.table_fn, buf.stateful_dataset) == ("mine", None, True)
    buf.add_batch(tf.ones([1, 2]))
    buf._clear()  # forgets the steps, keeps the bytes
    assert buf.last_id == -1
    assert np.asarray(buf.variables()[0]).sum() == 2.0
    buf.add_batch(tf.ones([1, 2]))
    buf._clear(clear_all_variables=True)
    assert buf.last_id == -1
    assert np.asarray(buf.variables()[0]).sum() == 0.0


@pytest.mark.parametrize("option, value, message", [
    ("storage", "numpy", "storage must be 'tensorflow', got 'numpy'"),
    ("table_fn", lambda: None, "table_fn is not supported"),
    ("frame_stack", "first", "frame_stack needs storage='numpy'"),
    ("track_episodes", True, "track_episodes keeps episode starts in Python")])
def test_options_it_cannot_honour_are_refused_by_name(option, value, message):
    with pytest.raises(ValueError, match=message):
        TFUniformReplayBuffer(tf.TensorSpec([2], tf.float32), **{option: value})
