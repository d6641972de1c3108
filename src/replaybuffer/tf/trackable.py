"""``tf.train.Checkpoint(replay_buffer=buffer)``: the TensorFlow buffer as a trackable.

TF-Agents checkpoints its buffer as an object of the checkpoint (its
``common.Checkpointer(..., replay_buffer=rb)`` builds ``tf.train.Checkpoint(**kwargs)``).
:class:`CheckpointedContents`, a base of
:class:`~replaybuffer.tf.TFUniformReplayBuffer`, makes the buffer such an object: it
saves the buffer's variables as TensorFlow saves any variable (the checkpoint reads
each when it writes it: save while no other thread adds, as with TF-Agents' buffer)
and restores them all at one instant, inside the buffer's critical section, so that
no add, sample or draw ahead of a pull sees half a restore. The keys are those of
:meth:`~replaybuffer.tf.checkpoint.TFCheckpoint.variables_by_key`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from replaybuffer.tf.checkpoint import TFCheckpoint


# TensorFlow's Trackable is untyped (Any); the two methods below are its documented
# hooks for objects that write their own tensors into a checkpoint.
class CheckpointedContents(tf.__internal__.tracking.Trackable):  # type: ignore[misc]
    """A trackable whose checkpoint is its ``_checkpoint``'s variables (a
    :class:`~replaybuffer.tf.checkpoint.TFCheckpoint`), restored atomically."""

    _checkpoint: TFCheckpoint

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # The variables, not values read now: a restore calls this too, for the keys.
        return self._checkpoint.variables_by_key()

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> None:
        self._checkpoint.assign(restored_tensors)
