"""Ring bookkeeping in TensorFlow ops: :mod:`replaybuffer.sampling.ring` for graphs.

The same layout and the same formulas, written with int64 tensor ops so that they
run inside ``tf.function`` with ``last_id`` read from a ``tf.Variable``. Every
function takes int64 tensors (or Python ints) and returns int64 tensors; the
layout constants ``batch_size`` (B) and ``max_length`` (L) are Python ints.

Storage is slot-major: step ``id`` of row ``b`` lives at position
``(id % L) * B + b``, so one add writes ``B`` consecutive positions.
"""

from __future__ import annotations

from typing import Any

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


def positions(ids: Any, rows: Any, max_length: int, batch_size: int) -> tf.Tensor:
    """Storage positions of (id, row) pairs; ``ids`` and ``rows`` broadcast."""
    return (ids % max_length) * batch_size + rows


def window_positions(start_positions: Any, num_steps: int, max_length: int,
                     batch_size: int) -> tf.Tensor:
    """Positions ``[S, num_steps]`` of windows starting at ``start_positions`` ``[S]``:
    step ``k`` is ``k * batch_size`` positions later, wrapping at the capacity."""
    offsets = tf.range(0, num_steps * batch_size, batch_size, dtype=INT)
    return (start_positions[:, None] + offsets) % (max_length * batch_size)


def table_rows(ids: Any, rows: Any, max_length: int) -> tf.Tensor:
    """TF-Agents' physical row index ``row * max_length + id % max_length``."""
    return rows * max_length + ids % max_length


def draws_to_starts(draws: Any, lo: Any, max_length: int, batch_size: int
                    ) -> tuple[tf.Tensor, tf.Tensor]:
    """Start ids and positions of uniform draws in ``[0, (hi - lo) * batch_size)``.

    Draw ``d`` is the ``(start, row)`` pair ``(lo + d // B, d % B)``: valid starts are
    consecutive slots from ``lo % L`` in slot-major order, so its position is
    ``(lo % L) * B + d`` modulo the capacity (as :class:`~replaybuffer.sampling.UniformSampler`).
    """
    ids = lo + draws // batch_size
    starts = ((lo % max_length) * batch_size + draws) % (max_length * batch_size)
    return ids, starts


def write_positions(first_id: Any, num_steps: Any, max_length: int, batch_size: int
                    ) -> tuple[tf.Tensor, tf.Tensor]:
    """Where ``num_steps`` new steps (ids ``first_id, ...``) of every row go.

    Returns ``(skip, positions)``: the first ``skip = max(0, num_steps - L)`` steps
    would be overwritten within the same write and are not written at all (a scatter
    with repeated indices has no defined order); ``positions`` ``[(num_steps - skip) *
    B]`` are the slot-major positions of the rest, oldest step first.
    """
    skip = tf.maximum(tf.constant(0, INT), num_steps - max_length)
    ids = tf.range(first_id + skip, first_id + num_steps, dtype=INT)
    rows = tf.range(batch_size, dtype=INT)
    return skip, tf.reshape(positions(ids[:, None], rows[None, :], max_length, batch_size),
                            [-1])
