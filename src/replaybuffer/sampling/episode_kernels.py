"""Compiled draws within episodes (numba, the ``fast`` extra), one call per batch.

The numpy paths of :mod:`~replaybuffer.sampling.episodes` (uniform draws: window
numbers to ids) and :mod:`~replaybuffer.sampling.episode_draws` (prioritized draws:
search, ids, the within-an-episode test) are a dozen or more calls each, whose fixed
costs were most of a ``get_next(256)`` beside the gather. These kernels do the same
integer arithmetic (``searchsorted(side="right")`` as a binary search for the first
entry greater than the key) and the same float arithmetic, so they give the same ids,
positions and values, and the callers' generators draw the same numbers. Callers use
them only when :data:`~replaybuffer.sampling.tree_kernels.AVAILABLE`.

Start keys: an episode start of row ``r`` at id ``i`` is the key ``r * KEY_STRIDE + i``
(int64), so sorted keys order starts by row, then id.
"""

from __future__ import annotations


import numpy as np

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.importance import weigh_into

#: Row stride of an episode start's key (module docstring): ids stay below 2 ** 40.
KEY_STRIDE = 1 << 40


@tree_kernels.compile_kernel
def first_above(sorted_values: np.ndarray, key: int) -> int:
    """``np.searchsorted(sorted_values, key, side="right")`` for one int64 key.

    Branch-free, as the tree's root search (:func:`~replaybuffer.sampling.tree_kernels.
    descend`): the answer stays in ``[base, base + n]`` while ``n`` halves, so the
    steps for random keys are data, not branches a predictor would miss half the time.
    """
    n = sorted_values.shape[0]
    if n == 0:
        return 0
    base = 0
    while n > 1:
        half = n >> 1
        base += half * (sorted_values[base + half - 1] <= key)
        n -= half
    found: int = base + (sorted_values[base] <= key)
    return found


@tree_kernels.compile_kernel
def number_windows(raw: np.ndarray, total: int, row_ends: np.ndarray,
                   interior_start: np.ndarray, row_base: np.ndarray, per_row: np.ndarray,
                   offset: np.ndarray, cumulative: np.ndarray, head: np.ndarray,
                   last_start: np.ndarray, oldest: int, max_length: int, out: np.ndarray
                   ) -> None:
    """Uniform raw draws (uint64 ``[K]``) to windows within episodes: each is reduced
    modulo ``total`` to a window number, mapped as
    :meth:`EpisodeIndex.sample <replaybuffer.sampling.episodes.EpisodeIndex.sample>`
    maps it (the layout's int64 arrays, module ``episodes``' ``_Layout``), into
    ``out`` (int64 ``[2, K]``: start ids, positions; filled in place, since a returned
    array costs about a microsecond to box)."""
    count = raw.shape[0]
    rows_count = row_ends.shape[0]
    ids = out[0]
    positions = out[1]
    n = np.uint64(total)
    for k in range(count):
        draw = np.int64(raw[k] % n)
        row = 0 if rows_count == 1 else first_above(row_ends, draw)
        past_head = draw - interior_start[row]
        if past_head < 0:  # the row's head segment
            i = oldest + head[row] + past_head
        elif past_head >= per_row[row]:  # its tail segment
            i = last_start[row] + past_head - per_row[row]
        else:
            interior = past_head + row_base[row]
            i = offset[first_above(cumulative, interior)] + interior
        ids[k] = i
        positions[k] = (i % max_length) * rows_count + row


@tree_kernels.compile_kernel
def draw_within_round(nodes: np.ndarray, runs: np.ndarray, root_width: int, height: int,
                      limit: float, u: np.ndarray, total: float, keys: np.ndarray,
                      batch_size: int, max_length: int, oldest: int, last_id: int,
                      num_steps: int, need: int, valid_mass: float, floor: float,
                      indices: np.ndarray, weighed: np.ndarray) -> int:
    """One round of :func:`~replaybuffer.sampling.episode_draws.draw_within`'s
    rejection in one call: ``u`` (float64 ``[P]``, the generator's ``random(P)``) is
    scaled by ``total`` in place, searched in the tree
    (:func:`~replaybuffer.sampling.tree_kernels.descend`), and the first ``need``
    starts whose window of ``num_steps`` stays inside one episode are kept (``keys``:
    the sorted start keys).

    Fills ``indices`` (int64 ``[2, need]``: ids, positions) with the ``kept`` starts
    and, when ``kept == need``, ``weighed`` (float32 ``[2, need]``) with their
    probabilities and weight ratios (:mod:`~replaybuffer.sampling.importance`, for
    ``valid_mass`` and ``floor``). Returns ``kept``, or -1 when a target was odd (at
    or past ``limit``, or on a slot of 0): the caller then redoes the round on the
    numpy path from the scaled ``u``.
    """
    count = u.shape[0]
    t = np.empty(count, np.float64)
    for k in range(count):
        x = u[k] * total
        u[k] = x
        t[k] = x
    for k in range(count):
        if t[k] >= limit:
            return -1
    node = tree_kernels.descend(nodes, runs[1:], runs, root_width, height, t)
    size = nodes.shape[0] >> 1
    for k in range(count):
        if nodes[node[k]] == 0.0:
            return -1
    values = t  # (the targets are spent)
    shift = oldest % max_length
    nkeys = keys.shape[0]
    kept = 0
    for k in range(count):
        if kept == need:
            break
        position = node[k] - size
        row = position % batch_size
        slot = position // batch_size
        i = slot if oldest == 0 else (slot - shift) % max_length + oldest
        # EpisodeIndex.within: the window ends by the row's next start or the head.
        j = first_above(keys, row * KEY_STRIDE + i)
        end = last_id + 1
        if j < nkeys and keys[j] // KEY_STRIDE == row:
            end = keys[j] % KEY_STRIDE
        if i + num_steps <= end:
            indices[0, kept] = i
            indices[1, kept] = position
            values[kept] = nodes[node[k]]
            kept += 1
    if kept < need:
        return kept
    weigh_into(values, need, valid_mass, floor, weighed)
    return kept
