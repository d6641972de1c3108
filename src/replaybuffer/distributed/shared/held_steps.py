"""How many steps each row of a shared buffer holds whole, from its head and the
versions alone, when a block of several steps may be in flight.

A row's steps are the ids ``[max(0, head - max_length), head)``. A writer overwrites
them oldest first (one step, or a prioritized ``extend`` hiding the positions of ``T``
steps at once: :mod:`.step_blocks`), so the steps no longer whole are always a run at the
oldest end: the held count is the span less that run. With one step in flight the run
is at most one step long (what :meth:`~.layout.SharedLayout.held_by_versions` checks);
a block killed between hiding and publishing leaves a run of up to ``T``.
"""

from __future__ import annotations

import numpy as np


def held_steps(version: np.ndarray, heads: np.ndarray, max_length: int,
               rows: np.ndarray | None = None) -> np.ndarray:
    """Per row (int64 ``[len(rows)]``) the steps a sample can return: ``min(head,
    max_length)`` less the run of oldest steps whose position no longer holds them
    (being rewritten, or rewritten past the head).

    Args:
        version: the layout's int64 ``[num_rows * max_length]`` versions.
        heads: int64 ``[num_rows]`` row heads (a copy: they are read once).
        max_length: the ring's length.
        rows: int64 row indices to count (default: all).

    The loop runs once per step of the longest run (one or two in steady state: the
    rows still running shrink each pass).
    """
    num_rows = len(heads)
    if rows is None:  # all rows: the first pass as plain slices (the common call)
        rows, row_heads = np.arange(num_rows), heads
    else:
        rows = np.asarray(rows, np.int64)
        row_heads = heads[rows]
    span = np.minimum(row_heads, max_length)
    oldest = row_heads - span
    positions = (oldest % max_length) * num_rows + rows
    gone = ((span > 0) & (version[positions] != 2 * oldest + 2)).astype(np.int64)
    running = np.flatnonzero(gone)  # rows whose oldest is torn: is the next one too?
    running = running[gone[running] < span[running]]
    while len(running):
        ids = oldest[running] + gone[running]
        positions = (ids % max_length) * num_rows + rows[running]
        running = running[version[positions] != 2 * ids + 2]
        gone[running] += 1
        running = running[gone[running] < span[running]]
    held: np.ndarray = span - gone
    return held
