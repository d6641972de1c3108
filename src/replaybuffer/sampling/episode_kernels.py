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

import math

import numpy as np

from replaybuffer.sampling import tree_kernels

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
    return base + (sorted_values[base] <= key)


@tree_kernels.compile_kernel
def number_windows(raw: np.ndarray, total: int, row_ends: np.ndarray,
                   interior_start: np.ndarray, row_base: np.ndarray, per_row: np.ndarray,
                   offset: np.ndarray, cumulative: np.ndarray, head: np.ndarray,
                   last_start: np.ndarray, oldest: int, max_length: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Uniform raw draws (uint64 ``[K]``) to windows within episodes: each is reduced
    modulo ``total`` to a window number, mapped as
    :meth:`EpisodeIndex.sample <replaybuffer.sampling.episodes.EpisodeIndex.sample>`
    maps it (the layout's int64 arrays, module ``episodes``' ``_Layout``), and returns
    ``(start_ids, positions)``, int64 ``[K]`` each."""
    count = raw.shape[0]
    rows_count = row_ends.shape[0]
    ids = np.empty(count, np.int64)
    positions = np.empty(count, np.int64)
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
    return ids, positions


@tree_kernels.compile_kernel
def draw_within_round(nodes: np.ndarray, runs: np.ndarray, root_width: int, height: int,
                      limit: float, u: np.ndarray, total: float, keys: np.ndarray,
                      batch_size: int, max_length: int, oldest: int, last_id: int,
                      num_steps: int, need: int, valid_mass: float, floor: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                 np.ndarray, bool]:
    """One round of :func:`~replaybuffer.sampling.episode_draws.draw_within`'s
    rejection in one call: ``u`` (float64 ``[P]``, the generator's ``random(P)``) is
    scaled by ``total`` in place, searched in the tree
    (:func:`~replaybuffer.sampling.tree_kernels.descend`), and the first ``need``
    starts whose window of ``num_steps`` stays inside one episode are kept (``keys``:
    the sorted start keys).

    Returns ``(positions, ids, values, probabilities, ratios, ok)``: int64, int64 and
    float64 ``[kept]``, and when ``kept == need`` the float32 probabilities and weight
    ratios (:mod:`~replaybuffer.sampling.importance`, for ``valid_mass`` and
    ``floor``), else empty. ``ok`` is false when a target was odd (at or past
    ``limit``, or on a slot of 0): the caller then redoes the round on the numpy path
    from the scaled ``u``.
    """
    count = u.shape[0]
    t = np.empty(count, np.float64)
    for k in range(count):
        x = u[k] * total
        u[k] = x
        t[k] = x
    no_i = np.empty(0, np.int64)
    no_f = np.empty(0, np.float32)
    for k in range(count):
        if t[k] >= limit:
            return no_i, no_i, np.empty(0, np.float64), no_f, no_f, False
    node = tree_kernels.descend(nodes, runs[1:], runs, root_width, height, t)
    size = nodes.shape[0] >> 1
    for k in range(count):
        if nodes[node[k]] == 0.0:
            return no_i, no_i, np.empty(0, np.float64), no_f, no_f, False
    positions = np.empty(need, np.int64)
    ids = np.empty(need, np.int64)
    values = np.empty(need, np.float64)
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
            positions[kept] = position
            ids[kept] = i
            values[kept] = nodes[node[k]]
            kept += 1
    if kept < need:
        return positions[:kept], ids[:kept], values[:kept], no_f, no_f, True
    probabilities = np.empty(need, np.float32)
    low = values[0]
    for k in range(need):
        v = values[k]
        probabilities[k] = v / valid_mass
        low = v if v < low else low
    if not math.isnan(floor):
        low = floor
    ratios = np.empty(need, np.float32)
    for k in range(need):
        ratios[k] = low / values[k]
    return positions, ids, values, probabilities, ratios, True
