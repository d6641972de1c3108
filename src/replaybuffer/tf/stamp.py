"""The stamp that tells whether a sample drawn ahead of its pull is still the buffer's.

The TensorFlow buffer's plain random dataset draws the next batch on a prefetch thread
(:func:`replaybuffer.tf.pipelines.ahead_stream`); what happens to the buffer between
that draw and the pull must be told at the pull. Adds only are fine (the batch holds
the buffer as it was when drawn, as ``tf.data``'s own prefetch hands it out); a
``clear()`` or any restore is not. A restore may come through the buffer's checkpoint
or by assigning ``variables()`` from a ``tf.train.Checkpoint``, which runs none of the
buffer's code, so the mark must travel with the data: a checkpointed variable.

:class:`ContentStamp` keeps it:

- ``variable`` (int64 scalar, checkpointed: the last of the buffer's ``variables()``)
  names a point of the buffer's history. Every draw ahead, ``clear()`` and restore
  through the buffer's checkpoint sets a value it never had (:meth:`renew`); adds and
  reads leave it; a restore of ``variables()`` writes the value saved with the data.
  While it holds the value a draw set, the buffer's contents are those of that draw
  plus adds: a checkpoint saved before the draw holds another value, and one saved
  after it that still holds it was saved with only adds since.
- The value is ``salt + count``: ``count`` (``made``, not checkpointed, so that no
  restore brings an old count back) never repeats in this buffer, and ``salt`` (62
  random bits, never from ``seed=``) keeps a checkpoint of a buffer built alike, with
  as many draws made, from holding this buffer's values.
- ``link`` (int64 ``[2]``, not checkpointed) is ``(stamp before, stamp after)`` of the
  latest draw. The next draw ahead always renews the stamp before (or while) the
  previous batch is pulled; ``link`` says that it found the previous batch's stamp, so
  that batch is still current (:meth:`current`). Without it every batch would be
  drawn again at its pull.

A restore of ``variables()`` writes them in their order, the stamp last (one
``tf.train.Checkpoint`` of the tuple, eagerly, on one host): a draw sets its stamp
before it reads anything, so a restore that overlaps the draw leaves its own value,
and the pull draws again.
"""

from __future__ import annotations

import secrets
from typing import Any

import tensorflow as tf

from replaybuffer.tf.ring import INT


class ContentStamp:
    """The stamp of a :class:`~replaybuffer.tf.state.TFRingState`'s contents.

    Build it inside the state's device and name scope; call :meth:`renew` inside the
    state's critical section.

    Attributes:
        variable: int64 scalar ``tf.Variable`` (checkpointed), named ``stamp``.
        made: int64 scalar ``tf.Variable``, stamps made so far (not checkpointed).
        link: int64 ``[2]`` ``tf.Variable``, ``(found, set)`` by the latest draw
            ahead (not checkpointed; ``(-1, -1)`` before any: stamps are ``>= 0``).
    """

    def __init__(self) -> None:
        self._salt = secrets.randbits(62)
        self.variable = tf.Variable(tf.constant(self._salt, INT), trainable=False,
                                    name="stamp")
        self.made = tf.Variable(tf.constant(0, INT), trainable=False, name="stamps_made")
        self.link = tf.Variable(tf.constant([-1, -1], INT), trainable=False,
                                name="stamp_link")

    def renew(self, draw: bool = False) -> tf.Tensor:
        """Set the stamp to a value it never had in this buffer and return it (int64
        scalar; graph code). ``draw``: a draw ahead, which also records
        ``(stamp found, new stamp)`` in :attr:`link`; ``clear()`` and restores leave
        the link, so that no batch drawn before them passes :meth:`current`."""
        value = self._salt + self.made.assign_add(1).read_value()
        before = []
        if draw:
            found = self.variable.read_value()
            before.append(self.link.assign(tf.stack([found, value]), read_value=False))
        with tf.control_dependencies(before):
            written = self.variable.assign(value, read_value=False)
        with tf.control_dependencies([written]):
            return tf.identity(value)

    def current(self, drawn_with: tf.Tensor) -> tf.Tensor:
        """Whether a batch drawn with the stamp ``drawn_with`` (int64 scalar) still
        holds the buffer's contents (bool scalar): the stamp is still its own, or it
        is the one a later draw set on finding it (:attr:`link`).

        No lock is needed: the stamp is read before the link, and a draw writes the
        link before the stamp, so a link read here whose second value equals the
        stamp read is the link of the draw that set that stamp."""
        now = self.variable.read_value()
        with tf.control_dependencies([now]):
            link = self.link.read_value()
        chained = tf.logical_and(tf.equal(now, link[1]), tf.equal(link[0], drawn_with))
        return tf.logical_or(tf.equal(now, drawn_with), chained)


class StampedGeneration:
    """``generation`` for a buffer whose clears and restores run in TensorFlow (a
    ``tf.function`` clear, or a ``tf.train.Checkpoint`` assigning its variables), where
    no Python counter sees them: the value of its state's :class:`ContentStamp`, which
    each of them changes (and so does each batch a plain dataset draws ahead; adds
    never do). A base listed before the buffer's own, so that it serves ``generation``.
    """

    _state: Any  # a TFRingState

    @property
    def generation(self) -> int:
        """Changes with every clear and restore: what was read before it changed may
        no longer be what the buffer holds (an int; not a count)."""
        return int(self._state.stamp.variable.numpy())
