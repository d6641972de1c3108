"""The TensorFlow backend: buffers whose state is TensorFlow variables.

Importing this package imports TensorFlow (``pip install 'replaybuffer[tensorflow]'``);
``import replaybuffer`` never does. Users name the buffer:
``replaybuffer.tf.TFUniformReplayBuffer`` or
``replaybuffer.compat.tf_agents.TFUniformReplayBuffer`` (the same class).

* :class:`TFUniformReplayBuffer`: the uniform buffer with ``last_id``, the data and
  the generator in TensorFlow state; works eagerly and inside ``tf.function``;
  ``as_dataset`` is a ``tf.data.Dataset``. Its parts: :mod:`replaybuffer.tf.state`
  (the state and its graph functions), :mod:`replaybuffer.tf.pipelines` (the
  ``tf.data`` pipelines), :mod:`replaybuffer.tf.checkpoint` (saves),
  :mod:`replaybuffer.tf.compiled` (graph functions called eagerly).
* :class:`TFStorage`: the variables; also the ``storage="tensorflow"`` of every
  buffer class built by name, ``UniformReplayBuffer`` included, whose ring stays in
  Python (eager use only).
* :mod:`replaybuffer.tf.ring`, :mod:`replaybuffer.tf.deterministic`: the index
  arithmetic of :mod:`replaybuffer.sampling` in TF ops, over TF-Agents' row-major
  layout.
"""

from replaybuffer.tf.buffer import TFUniformReplayBuffer
from replaybuffer.tf.dataset import ReplayDataset, ReplayIterator
from replaybuffer.tf.sampler import TFUniformSampler
from replaybuffer.tf.storage import TFStorage

__all__ = ["ReplayDataset", "ReplayIterator", "TFStorage", "TFUniformReplayBuffer",
           "TFUniformSampler"]
