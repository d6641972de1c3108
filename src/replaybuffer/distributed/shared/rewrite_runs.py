"""Which positions of a prioritized shared buffer are being rewritten, found from the row
heads and the versions alone: what a draw hides before it reads the tree
(:meth:`~.priorities.SharedPriorities.draw`).

A writer marks the positions it rewrites odd with no lock, in step order, starting at
its row's head (an ``add_batch`` step: the head's position; an ``extend`` block of
``T`` steps: the ``T`` positions from the head, :mod:`.step_blocks`), and publishes them
(even versions, then the head) in one lock section. So, seen under the lock, each row's
positions being rewritten are a run of odd versions from its head's position:

- a live writer's marking seen midway shows a shorter run (a draw that checked before
  the rest of the run turned odd may draw the old steps there: the versions' check
  rejects them, as for a step marked after the draw's check);
- a writer killed while marking or writing leaves the run it marked, from the head (its
  head never moved);
- a writer killed inside its publish section may leave odd positions after even ones
  (the versions go even in step order), but that section's span is recorded in
  ``tree_intent``, and the next holder of the lock zeroes their leaves
  (:meth:`~.priorities.SharedPriorities.repair`) before any draw reads the tree;
- the next claim of a killed writer's rows moves each head past the steps published
  (:mod:`.row_claims`), to the first odd position of the run that is left.

A row whose head's position is not odd costs one version load. With numba (the
``fast`` extra) the rows and runs are walked in one compiled loop (about 1 us for 64
rows, where the numpy path below costs 3-4 us with no run and 25-60 us with one);
without it, a run is read in windows that double (16 positions, then 32, ...), at most
``max_length`` positions.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.sampling import tree_kernels

FIRST_WINDOW = 16
"""Positions of a run read at once first (an ``extend`` of up to 16 steps: one pass)."""


def rewrite_runs(version: np.ndarray, heads: np.ndarray, row_numbers: np.ndarray,
                 max_length: int) -> np.ndarray:
    """The positions (int64 ``[n]``) of each row's run of odd versions from its head.

    Args:
        version: the layout's int64 ``[num_rows * max_length]`` versions.
        heads: int64 ``[num_rows]`` row heads (a copy, read under the lock).
        row_numbers: int64 ``[num_rows]``, ``0 .. num_rows - 1``.
        max_length: the ring's length.
    """
    if tree_kernels.AVAILABLE:
        out = np.empty(min(len(version), len(heads) * FIRST_WINDOW), np.int64)
        found = _compiled_runs(version, heads, max_length, out)
        if found > len(out):  # longer runs than the first guess: room for them all
            out = np.empty(found, np.int64)
            _compiled_runs(version, heads, max_length, out)
        runs: np.ndarray = out[:found]
        return runs
    return rewrite_runs_numpy(version, heads, row_numbers, max_length)


def rewrite_runs_numpy(version: np.ndarray, heads: np.ndarray, row_numbers: np.ndarray,
                       max_length: int) -> np.ndarray:
    """:func:`rewrite_runs` without numba: the heads' versions in one pass, then the
    runs of the rows whose head's is odd in windows that double."""
    num_rows = len(heads)
    positions = (heads % max_length) * num_rows + row_numbers
    rows = np.flatnonzero(version.take(positions) & 1)
    if not len(rows):
        return rows
    if max_length == 1:  # a run of one position at most
        heads_odd: np.ndarray = positions[rows]
        return heads_odd
    found = []
    ids, checked, width = heads[rows], 0, FIRST_WINDOW
    while len(rows) and checked < max_length:
        width = min(width, max_length - checked)
        window = ((ids[:, None] + np.arange(width)) % max_length) * num_rows \
            + rows[:, None]  # [rows, width]
        run = np.logical_and.accumulate((version.take(window) & 1).astype(bool),
                                       axis=1)
        found.append(window[run])
        full = run[:, -1]  # the run may go on past the window
        rows, ids = rows[full], ids[full] + width
        checked += width
        width *= 2
    hidden: np.ndarray = np.concatenate(found)
    return hidden


def rewrite_runs_python(version: np.ndarray, heads: np.ndarray, max_length: int,
                        out: np.ndarray) -> int:
    """:func:`rewrite_runs` as one loop (compiled where numba is): the runs' positions
    written to ``out`` (int64, as many as fit) and their count returned (more than
    ``len(out)``: call again with room for them)."""
    num_rows = len(heads)
    found = 0
    for row in range(num_rows):
        head = heads[row]
        for k in range(max_length):
            position = ((head + k) % max_length) * num_rows + row
            if version[position] & 1 == 0:
                break
            if found < len(out):
                out[found] = position
            found += 1
    return found


_compiled_runs = tree_kernels.compile_kernel(rewrite_runs_python)
