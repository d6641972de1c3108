"""Deterministic-pass plans in TensorFlow ops: :mod:`replaybuffer.sampling.deterministic`
for ``tf.data``.

The numpy plan is a Python generator; here the same order is a table of
``(group, start, length)`` rows computed from ``num_frames`` (a tensor read when
iteration starts), one row per dataset element. Row groups depend only on the
buffer's ``batch_size`` and ``sample_batch_size``, so they are Python ints.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from replaybuffer.tf.ring import INT


def row_groups(batch_size: int, sample_batch_size: int | None, drop_remainder: bool
               ) -> list[tuple[int, int]]:
    """``(first_row, rows)`` of each element's rows, in order.

    Without ``sample_batch_size`` every row is its own group; otherwise rows go in
    consecutive groups of ``sample_batch_size``, the last one smaller unless
    ``drop_remainder`` drops it.
    """
    if sample_batch_size is None:
        return [(b, 1) for b in range(batch_size)]
    groups = []
    for first in range(0, batch_size, sample_batch_size):
        rows = min(sample_batch_size, batch_size - first)
        if rows < sample_batch_size and drop_remainder:
            continue
        groups.append((first, rows))
    return groups


def window_table(num_frames: Any, num_steps: int | None, shift: int | None,
                 drop_remainder: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """``(offsets, lengths)`` ``[W]`` of the windows over ``num_frames`` steps of a row.

    As :func:`replaybuffer.sampling.deterministic.window_starts`; without
    ``num_steps`` every step is a window of length 1 (``shift`` is ignored).
    """
    if num_steps is None:
        offsets = tf.range(num_frames, dtype=INT)
        return offsets, tf.ones_like(offsets)
    offsets = tf.range(0, num_frames, shift or num_steps, dtype=INT)
    lengths = tf.minimum(tf.constant(num_steps, INT), num_frames - offsets)
    if drop_remainder:
        keep = lengths >= num_steps
        offsets, lengths = offsets[keep], lengths[keep]
    return offsets, lengths


def plan(num_frames: Any, num_groups: int, num_steps: int | None, shift: int | None,
         drop_remainder: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(group, offset, length)`` ``[num_groups * W]``: one entry per element, group by
    group, windows oldest first within a group."""
    offsets, lengths = window_table(num_frames, num_steps, shift, drop_remainder)
    count = tf.size(offsets, out_type=INT)
    groups = tf.repeat(tf.range(num_groups, dtype=INT), count)
    return groups, tf.tile(offsets, [num_groups]), tf.tile(lengths, [num_groups])


def block(first_id: Any, group: Any, offset: Any, length: Any,
          groups: list[tuple[int, int]], sample_batch_size: int | None,
          num_steps: int | None) -> tuple[tf.Tensor, tf.Tensor]:
    """``(ids, rows)`` of one element, broadcasting to its shape.

    Shapes: ``()`` / ``()`` per step; ``[T]`` / ``()`` with ``num_steps``; ``()`` /
    ``[S]`` with ``sample_batch_size``; ``[T]`` / ``[S, 1]`` with both.
    """
    table = tf.constant([[first, rows] for first, rows in groups], INT)
    first_row, rows = table[group, 0], table[group, 1]
    row = first_row if sample_batch_size is None else first_row + tf.range(rows, dtype=INT)
    if num_steps is None:
        return first_id + offset, row
    ids = first_id + offset + tf.range(length, dtype=INT)
    return ids, (row if sample_batch_size is None else row[:, None])
