"""Ring bookkeeping in TensorFlow ops: :mod:`replaybuffer.sampling.ring` for graphs.

The same ring (``last_id``, valid ranges, which ``(id, row)`` pair a draw stands for),
written with int64 tensor ops so that it runs inside ``tf.function`` with ``last_id``
read from a ``tf.Variable``. Every function takes int64 tensors (or Python ints) and
returns int64 tensors; the layout constants ``batch_size`` (B) and ``max_length`` (L)
are Python ints.

Storage is row-major, TF-Agents' ``Table`` layout: step ``id`` of row ``b`` lives at
position ``b * L + id % L`` (TF-Agents' physical row index), so each row is ``L``
consecutive positions. ``gather_all`` then reads every row as one block (a roll of the
``[B, L]`` table, where the numpy storage's slot-major ``[L, B]`` needs a transpose
too), and a window's steps are neighbours. One add writes ``B`` positions ``L`` apart,
as TF-Agents' does. Checkpoints keep the numpy storage's slot-major order:
:func:`slot_major_to_positions` maps it here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

INT = tf.int64


def items_per_row(last_id: Any, max_length: int) -> tf.Tensor:
    """How many steps each row holds: ``min(last_id + 1, max_length)``."""
    return tf.minimum(last_id + 1, max_length)


def oldest_id(last_id: Any, max_length: int) -> tf.Tensor:
    """The id of the oldest retained step (0 until the ring wraps)."""
    return tf.maximum(tf.constant(0, INT), last_id + 1 - max_length)


def valid_start_range(last_id: Any, max_length: int, num_steps: int
                      ) -> tuple[tf.Tensor, tf.Tensor]:
    """Half-open range ``[lo, hi)`` of start ids of ``num_steps`` windows (``hi <= lo``:
    none). See :func:`replaybuffer.sampling.ring.valid_start_range`."""
    lo = oldest_id(last_id, max_length)
    return lo, tf.maximum(lo, last_id + 2 - num_steps)


def positions(ids: Any, rows: Any, max_length: int) -> tf.Tensor:
    """Storage positions of (id, row) pairs, ``row * max_length + id % max_length``
    (TF-Agents' physical row index, its ``BufferInfo.ids`` in a deterministic pass);
    ``ids`` and ``rows`` broadcast."""
    return rows * max_length + ids % max_length


def draws_to_starts(draws: Any, lo: Any, batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Start ids and rows of uniform draws in ``[0, (hi - lo) * batch_size)``.

    Draw ``d`` is the ``(start, row)`` pair ``(lo + d // B, d % B)``: the pair
    :class:`~replaybuffer.sampling.UniformSampler` gives it (valid starts in the numpy
    storage's slot-major order), so a draw means the same item in every backend.
    """
    return lo + draws // batch_size, draws % batch_size


def write_positions(first_id: Any, num_steps: Any, max_length: int, batch_size: int
                    ) -> tuple[tf.Tensor, tf.Tensor]:
    """Where ``num_steps`` new steps (ids ``first_id, ...``) of every row go.

    Returns ``(skip, positions)``: the first ``skip = max(0, num_steps - L)`` steps
    would be overwritten within the same write and are not written at all (a scatter
    with repeated indices has no defined order); ``positions`` ``[B * (num_steps -
    skip)]`` are those of the rest, row by row, oldest step first (the order of
    ``items[:, skip:]`` flattened).
    """
    skip = tf.maximum(tf.constant(0, INT), num_steps - max_length)
    ids = tf.range(first_id + skip, first_id + num_steps, dtype=INT)
    rows = tf.range(batch_size, dtype=INT)
    return skip, tf.reshape(positions(ids[None, :], rows[:, None], max_length), [-1])


def slot_major_to_positions(slot_major: np.ndarray, max_length: int, batch_size: int
                            ) -> np.ndarray:
    """Positions here of the numpy storage's slot-major positions (``slot * B + row``:
    the order of checkpoints), int64 like the input."""
    slots, rows = np.divmod(slot_major, batch_size)
    out: np.ndarray = rows * max_length + slots
    return out
