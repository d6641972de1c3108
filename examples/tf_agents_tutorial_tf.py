"""The TF-Agents replay-buffer tutorial's TFUniformReplayBuffer cells, run on replaybuffer.

Only the import lines differ from the tutorial (docs/tutorials/5_replay_buffers_tutorial):
``tf_uniform_replay_buffer`` is ``replaybuffer.compat.tf_agents``, whose
``TFUniformReplayBuffer`` keeps its data in TensorFlow variables. Run it with::

    pip install 'replaybuffer[tensorflow]'
    python examples/tf_agents_tutorial_tf.py

It prints what the tutorial prints: ``2`` (a sample is ``(items, info)``), the
shapes of three dataset elements, ``[4, 2, ...]``, and the shapes of ``gather_all``.
The tutorial's notebook shows ``[32, 46, ...]`` there because its cells had been run
several times (40 more adds); run once, as here, the buffer holds 6 steps per row.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TensorFlow's start-up logs

import tensorflow as tf
import numpy as np

# was: from tf_agents.replay_buffers import tf_uniform_replay_buffer
from replaybuffer.compat import tf_agents as tf_uniform_replay_buffer

tf.compat.v1.enable_v2_behavior()

# In [4]
data_spec =  (
        tf.TensorSpec([3], tf.float32, 'action'),
        (
            tf.TensorSpec([5], tf.float32, 'lidar'),
            tf.TensorSpec([3, 2], tf.float32, 'camera')
        )
)

batch_size = 32
max_length = 1000

replay_buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
    data_spec,
    batch_size=batch_size,
    max_length=max_length)

# In [6]
action = tf.constant(1 * np.ones(
    data_spec[0].shape.as_list(), dtype=np.float32))
lidar = tf.constant(
    2 * np.ones(data_spec[1][0].shape.as_list(), dtype=np.float32))
camera = tf.constant(
    3 * np.ones(data_spec[1][1].shape.as_list(), dtype=np.float32))

values = (action, (lidar, camera))
values_batched = tf.nest.map_structure(lambda t: tf.stack([t] * batch_size),
                                       values)

replay_buffer.add_batch(values_batched)

# In [16]
for _ in range(5):
  replay_buffer.add_batch(values_batched)
sample = replay_buffer.get_next(sample_batch_size=10, num_steps=1)

print(len(sample))

# Convert the replay buffer to a tf.data.Dataset and iterate through it
dataset = replay_buffer.as_dataset(
    sample_batch_size=4,
    num_steps=2)

iterator = iter(dataset)
print("Iterator trajectories:")
trajectories = []
for _ in range(3):
  t, _ = next(iterator)
  trajectories.append(t)

print(tf.nest.map_structure(lambda t: t.shape, trajectories))

# Read all elements in the replay buffer:
trajectories = replay_buffer.gather_all()

print("Trajectories from gather all:")
print(tf.nest.map_structure(lambda t: t.shape, trajectories))
