"""Index plans for a single deterministic pass over a buffer's contents.

Pure functions: given the retained ids and the layout they yield ``(ids, rows)``
blocks of int64 arrays, one per dataset element, in TF-Agents' order:

* no batch, no num_steps: every step once, row by row, oldest first;
* ``num_steps=T``: per row, windows of ``T`` steps advancing by ``shift``
  (default ``T``); windows never cross rows;
* ``sample_batch_size=S``: rows in consecutive groups of ``S``; per group one
  element per step (or per window) holding that step of every row of the group,
  shape ``[S]`` (or ``[S, T]``).

Unlike TF-Agents, a window never straddles two row groups, and a trailing
partial window or group is kept unless ``drop_remainder``, so every retained
step is visited exactly once when ``shift == T``.
"""

from __future__ import annotations

from typing import Iterator, Union

import numpy as np

Index = Union[np.ndarray, np.int64]
"""The ids or rows of a block: int64 arrays, or numpy int64 scalars where an element has
no batch (rows) or no time (ids) dimension."""


def check_not_all_dropped(batch_size: int, max_length: int, sample_batch_size: int | None,
                          num_steps: int | None, drop_remainder: bool) -> None:
    """Raise ``ValueError`` when ``drop_remainder`` would drop every element."""
    if not drop_remainder:
        return
    if sample_batch_size is not None and sample_batch_size > batch_size:
        raise ValueError(
            f"sample_batch_size={sample_batch_size} is larger than the buffer's "
            f"batch_size={batch_size} and drop_remainder=True: ALL data will be dropped")
    if num_steps is not None and num_steps > max_length:
        raise ValueError(
            f"num_steps={num_steps} is larger than max_length={max_length} and "
            "drop_remainder=True: ALL data will be dropped")


def window_starts(num_frames: int, num_steps: int, shift: int,
                  drop_remainder: bool) -> list[tuple[int, int]]:
    """``(offset, length)`` of each window over ``num_frames`` steps.

    >>> window_starts(5, 2, 2, False)
    [(0, 2), (2, 2), (4, 1)]
    """
    out = []
    for start in range(0, num_frames, shift):
        length = min(num_steps, num_frames - start)
        if length < num_steps and drop_remainder:
            break
        out.append((start, length))
    return out


def plan(first_id: int, num_frames: int, batch_size: int, sample_batch_size: int | None,
         num_steps: int | None, shift: int | None = None, drop_remainder: bool = False
         ) -> Iterator[tuple[Index, Index]]:
    """Yield ``(ids, rows)`` per element; the arrays broadcast to the element shape.

    Args:
        first_id: id of the oldest retained step.
        num_frames: steps retained per row.
        batch_size: rows in the buffer.
        sample_batch_size: rows per element (``None``: one row, no batch dim).
        num_steps: steps per window (``None``: one step, no time dim).
        shift: steps between window starts (``None``: ``num_steps``).
        drop_remainder: skip partial windows and a partial last group.
    """
    if shift is None:
        shift = num_steps or 1
    groups: list[Index]
    if sample_batch_size is None:
        groups = [np.int64(b) for b in range(batch_size)]
    else:
        groups = []
        for g in range(0, batch_size, sample_batch_size):
            group = np.arange(g, min(g + sample_batch_size, batch_size), dtype=np.int64)
            if len(group) < sample_batch_size and drop_remainder:
                continue
            groups.append(group)
    if num_steps is None:
        ids = np.arange(first_id, first_id + num_frames, dtype=np.int64)
        for rows in groups:
            for i in ids:
                yield i, rows
        return
    windows = window_starts(num_frames, num_steps, shift, drop_remainder)
    for rows in groups:
        col_rows = rows[:, None] if isinstance(rows, np.ndarray) else rows
        for start, length in windows:
            yield np.arange(first_id + start, first_id + start + length, dtype=np.int64), col_rows
