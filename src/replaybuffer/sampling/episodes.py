"""Where episodes start in each row, so that windows can stay inside one episode.

The buffer records the ids at which a row's step has ``step_type == FIRST``. The
retained steps of a row then split into *segments*: from the oldest retained step
or an episode start up to the next start (or the write head). A window of ``T``
steps is *within an episode* when it lies inside one segment, i.e. no episode starts
after its first step. A boundary step (``LAST -> FIRST``) belongs to the episode it
ends, so the window ``[last real step, boundary]`` is valid and carries the true
final observation, while any window reaching into the next episode is not.

Everything is integer arithmetic over the starts held, ``E`` of them. A row's
segments are its *interior* ones (from one start to the next: fixed while no start is
added or evicted) and two at its ends (from the oldest step to the first start, and
from the last start to the write head), which every add moves. The interior ones and
their window counts are cached and rebuilt (``O(E)``: the starts held are merged with
the new ones) only when starts come or go, about once per episode; the end segments
are recomputed per ring state (``O(B)``). So a
training loop that adds a step and samples ``K`` windows pays ``O(B + K log E)``;
nothing depends on the capacity.

The steps that cannot start a window of ``T`` (the last ``T - 1`` steps of every
segment, :meth:`EpisodeIndex.outside_parts`) split the same way: those of the interior
segments are cached with them, those of the end segments are recomputed per ring
state (``O(B T)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.episode_kernels import KEY_STRIDE, number_windows
from replaybuffer.sampling.ring import Ring

_ROW = np.int64(KEY_STRIDE)  # key = row * _ROW + id orders starts by row, then id


class _Interior:
    """What depends on the retained starts alone (cached until they change).

    For ``B`` rows: ``keys`` (sorted int64 ``row * _ROW + id``), per row whether it has
    a start, its first and last start id (int64 ``[B]``), and the interior segments
    (from a start to the row's next start): ``firsts``, ``lengths``, ``rows``
    (int64 ``[M]``), with window counts per ``num_steps`` in ``windows``.
    """

    def __init__(self, keys: np.ndarray, batch_size: int):
        self.keys = keys
        rows, ids = keys // _ROW, keys % _ROW
        self.has_start = np.zeros(batch_size, bool)
        self.has_start[rows] = True
        self.first_start = np.zeros(batch_size, np.int64)
        self.last_start = np.zeros(batch_size, np.int64)
        # keys are sorted, so the last write per row wins for last and the reversed
        # order's last write wins for first.
        self.last_start[rows] = ids
        self.first_start[rows[::-1]] = ids[::-1]
        # The oldest id at which the ring reaches some row's first start (and this
        # goes stale): one int compare per read instead of three calls over [B].
        self.stale_at = int(ids.min()) if len(ids) else np.iinfo(np.int64).max
        inner = rows[1:] == rows[:-1]  # a start followed by one in the same row
        self.firsts = ids[:-1][inner]
        self.lengths = ids[1:][inner] - self.firsts
        self.rows = rows[:-1][inner]
        self.batch_size = batch_size
        self.windows: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.outside: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.layouts: dict[tuple[int, int, int], _Layout] = {}

    def counts(self, num_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(offset, cumulative, per_row, row_base)``, int64: over the interior
        segments, their first id minus the windows before them (with a trailing
        sentinel, ``[M + 1]``) and the running sum of their window counts ``[M]``; per
        row ``[B]``, its interior windows and those of the rows before it."""
        cached = self.windows.get(num_steps)
        if cached is None:
            per_segment = np.maximum(self.lengths - num_steps + 1, 0)
            per_row = np.bincount(self.rows, weights=per_segment,
                                  minlength=self.batch_size).astype(np.int64)
            cumulative = np.cumsum(per_segment)
            cached = (np.append(self.firsts - (cumulative - per_segment), 0), cumulative,
                      per_row, np.cumsum(per_row) - per_row)
            self.windows[num_steps] = cached
        return cached

    def outside_steps(self, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, rows)``, int64 ``[S]``: the last ``num_steps - 1`` steps of every
        interior segment (the same arrays while this object lives)."""
        cached = self.outside.get(num_steps)
        if cached is None:
            cached = self.outside[num_steps] = _last_steps(self.firsts, self.lengths,
                                                          self.rows, num_steps - 1)
        return cached


class _Layout:
    """How windows of ``num_steps`` are numbered for one ring state: row by row, and
    within a row its head segment (oldest step to first start), its interior
    segments, then its tail segment (last start to the write head).

    All int64 ``[B]``: ``head`` and ``per_row`` (windows in the head and the interior
    segments of each row), ``interior_start`` (the number of each row's first
    interior window), ``row_ends`` (running sum of the rows' window counts),
    ``row_base`` (interior windows of the rows before), ``last_start``; and over the
    interior segments, ``cumulative`` (running window count) and ``offset`` (first
    id minus the windows before it, with a trailing sentinel).
    """

    def __init__(self, ring: Ring, num_steps: int, interior: _Interior):
        oldest, end = ring.oldest_id, ring.last_id + 1
        # Everything over the interior segments comes from their cache, so a layout
        # costs O(B) per ring state.
        self.offset, self.cumulative, self.per_row, self.row_base = \
            interior.counts(num_steps)
        self.oldest = oldest
        self.last_start = interior.last_start
        self._has_start, self._first_start = interior.has_start, interior.first_start
        self._end, self._num_steps = end, num_steps
        self._end_outside: tuple[np.ndarray, np.ndarray] | None = None
        if end <= oldest:  # empty
            self.head = np.zeros(interior.batch_size, np.int64)
            self.row_ends = self.interior_start = self.head
            self.total = 0
            return
        head_end = np.where(interior.has_start, interior.first_start, end)
        self.head = np.maximum(head_end - oldest - num_steps + 1, 0)
        tail = np.where(interior.has_start,
                        np.maximum(end - interior.last_start - num_steps + 1, 0), 0)
        totals = self.head + self.per_row + tail
        self.row_ends = np.cumsum(totals)
        self.interior_start = self.row_ends - totals + self.head
        self.total = int(self.row_ends[-1])

    def end_outside(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, rows)``, int64: the last ``num_steps - 1`` steps of each row's end
        segments (oldest step to first start, last start to the write head; the
        whole row if it has no start), ``O(B num_steps)``, cached with the layout."""
        if self._end_outside is None:
            oldest, end, has = self.oldest, self._end, self._has_start
            rows = np.arange(len(has), dtype=np.int64)
            firsts = np.concatenate((np.full(len(rows), oldest), self.last_start[has]))
            ends = np.concatenate((np.where(has, self._first_start, end),
                                   np.full(len(firsts) - len(rows), end)))
            # [segments, num_steps - 1] candidates, the last steps before each end.
            ids = ends[:, None] + np.arange(1 - self._num_steps, 0)
            keep = ids >= firsts[:, None]
            rows = np.concatenate((rows, rows[has]))
            self._end_outside = ids[keep], rows.repeat(keep.sum(axis=1))
        return self._end_outside


def _last_steps(firsts: np.ndarray, lengths: np.ndarray, rows: np.ndarray, count: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, rows)``, int64: the last ``min(length, count)`` ids of each segment given
    by ``firsts``, ``lengths`` and ``rows`` (int64 ``[M]``), segment by segment."""
    tail = np.minimum(lengths, count)
    total = int(tail.sum())
    segment = np.repeat(np.arange(len(firsts)), tail)
    offset = np.arange(total) - np.repeat(np.cumsum(tail) - tail, tail)
    ids = firsts[segment] + lengths[segment] - tail[segment] + offset
    return ids, rows[segment]


class EpisodeIndex:
    """Episode starts of every row, and the windows that stay within one episode."""

    def __init__(self) -> None:
        self._keys = np.zeros(0, np.int64)   # row * _ROW + id of recorded starts, any order
        self._new: list[np.ndarray] = []
        self._interior: _Interior | None = None
        self._segments: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._segments_key: tuple[int, int, int] | None = None

    def record(self, first_id: int, starts: np.ndarray, oldest_id: int) -> None:
        """Steps ``first_id + t`` were written; ``starts`` (bool ``[T, B]``) marks FIRST ones.

        ``oldest_id`` is the oldest step still held: starts before it are forgotten when
        the pending records are merged, which happens every so often even if no read
        asks for the segments, so memory stays bounded by the starts held.
        """
        t, rows = np.nonzero(starts)
        if len(t):
            self._new.append(rows.astype(np.int64) * _ROW + first_id + t)
            self._interior = None
        if len(self._new) >= 256:
            keys = np.concatenate([self._keys, *self._new])
            self._new.clear()
            self._keys = keys[keys % _ROW >= oldest_id]

    def clear(self) -> None:
        """Forget every start (the buffer was emptied)."""
        self._keys = np.zeros(0, np.int64)
        self._new.clear()
        self._interior = None
        self._segments = None

    # ------------------------------------------------------------- persistence
    # Checkpointable: state_dict/load_state_dict, as every sampler. The buffer saves the
    # compact form instead, state(ring): only the starts the ring still holds, which
    # needs the ring (a state_dict takes no arguments). load() reads either.
    def state_dict(self) -> dict[str, Any]:
        """``{"starts": int64 [E]}``: every recorded start as a key (``row * 2**40 +
        id``), sorted, a copy; starts the ring has evicted may be among them until
        they are next merged away (they change no result)."""
        keys = np.concatenate([self._keys, *self._new]) if self._new else self._keys
        return {"starts": np.sort(keys, kind="stable")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: every later call answers as the original's
        would (the caches are rebuilt from the starts)."""
        self.load(state["starts"])

    def state(self, ring: Ring) -> np.ndarray:
        """The starts ``ring`` retains, int64 keys ``[E]`` (``row * 2**40 + id``, sorted;
        a copy): the compact form a buffer's checkpoint holds."""
        keys: np.ndarray = self._current(ring).keys.copy()
        return keys

    def load(self, keys: np.ndarray) -> None:
        """Replace the starts by ``keys`` (int64 ``[E]``, from :meth:`state` or a
        :meth:`state_dict`'s ``"starts"``)."""
        self.clear()
        self._keys = np.asarray(keys, np.int64)

    def _current(self, ring: Ring) -> _Interior:
        """The interior segments for the starts ``ring`` retains: starts after its
        oldest step (one at the oldest step begins the row's first segment anyway)."""
        interior = self._interior
        if interior is not None and interior.batch_size == ring.batch_size:
            # Still valid unless the oldest step has reached a row's first start.
            if ring.oldest_id < interior.stale_at:
                return interior
        if self._new:
            self._keys = np.concatenate([self._keys, *self._new])
            self._new.clear()
        ids = self._keys % _ROW
        # The held keys are sorted already and new ones come after them (or, with
        # several rows, in a few runs): a merge sort finds the runs and merges them in
        # O(E), where numpy's default quicksort spent O(E log E) (1.5 ms against 40 us
        # at 47,000 starts). Keys are distinct, so the order is the same.
        self._keys = np.sort(self._keys[(ids > ring.oldest_id) & (ids <= ring.last_id)],
                             kind="stable")
        self._interior = _Interior(self._keys, ring.batch_size)
        return self._interior

    def _layout(self, ring: Ring, num_steps: int) -> _Layout:
        """The window numbering for ``ring`` now (cached until the ring moves)."""
        interior = self._current(ring)
        key = (ring.oldest_id, ring.last_id, num_steps)
        layout = interior.layouts.get(key)
        if layout is None:
            if len(interior.layouts) > 8:  # the ring moved on: old keys are dead
                interior.layouts.clear()
            layout = interior.layouts[key] = _Layout(ring, num_steps, interior)
        return layout

    def segments(self, ring: Ring) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(first_ids, lengths, rows)`` of every segment, ordered by row then id."""
        key = (ring.oldest_id, ring.last_id, ring.batch_size)
        interior = self._current(ring)
        if self._segments is not None and self._segments_key == key:
            return self._segments
        oldest, last, batch = ring.oldest_id, ring.last_id, ring.batch_size
        heads = np.arange(batch, dtype=np.int64) * _ROW + oldest  # each row's oldest step
        keys = np.sort(np.concatenate([interior.keys, heads]))
        rows, firsts = keys // _ROW, keys % _ROW
        same_row_next = np.append(rows[1:] == rows[:-1], False)
        ends = np.where(same_row_next, np.append(firsts[1:], 0), last + 1)
        self._segments, self._segments_key = (firsts, ends - firsts, rows), key
        return self._segments

    def count(self, ring: Ring, num_steps: int) -> int:
        """Windows of ``num_steps`` that stay within one episode."""
        return self._layout(ring, num_steps).total

    def sample(self, ring: Ring, num_steps: int, draws: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Map uniform integer ``draws`` in ``[0, count)`` to ``(start_ids, rows)``.

        ``count`` is :meth:`count` for the same ring and ``num_steps``. Windows are
        numbered row by row, and by start id within a row.
        """
        layout = self._layout(ring, num_steps)
        if len(layout.row_ends) == 1:
            rows = np.zeros(len(draws), np.int64)
            past_head = draws - layout.interior_start[0]  # < 0: in the head segment
            interior = past_head  # row_base is 0
            per_row = layout.per_row[0]
        else:
            rows = np.searchsorted(layout.row_ends, draws, side="right")
            past_head = draws - layout.interior_start[rows]
            interior = past_head + layout.row_base[rows]
            per_row = layout.per_row[rows]
        ids = layout.offset[np.searchsorted(layout.cumulative, interior, side="right")]
        ids += interior
        head = past_head < 0
        if head.any():
            ids[head] = (layout.oldest + layout.head[rows[head]]) + past_head[head]
        tail = past_head >= per_row
        if tail.any():
            r = rows[tail]
            ids[tail] = layout.last_start[r] + past_head[tail] - layout.per_row[r]
        return ids, rows

    def sample_starts(self, ring: Ring, num_steps: int, raw: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Uniform raw draws (uint64 ``[K]``, a bit generator's ``random_raw``) to
        windows within episodes: each reduced modulo :meth:`count` (> 0) and mapped by
        :meth:`sample`. Returns ``(start_ids, positions)``, int64 ``[K]`` each; one
        compiled call with numba (:func:`~replaybuffer.sampling.episode_kernels.
        number_windows`, the same numbers), :meth:`sample` and the ring otherwise."""
        layout = self._layout(ring, num_steps)
        if tree_kernels.AVAILABLE:
            out = np.empty((2, len(raw)), np.int64)  # filled in place
            number_windows(raw, layout.total, layout.row_ends, layout.interior_start,
                           layout.row_base, layout.per_row, layout.offset, layout.cumulative,
                           layout.head, layout.last_start, layout.oldest, ring.max_length,
                           out)
            return out[0], out[1]
        ids, rows = self.sample(ring, num_steps, (raw % np.uint64(layout.total)).view(np.int64))
        return ids, ring.positions(ids, rows)

    def start_keys(self, ring: Ring) -> np.ndarray:
        """The starts ``ring`` retains as sorted int64 keys ``[E]`` (``row *
        KEY_STRIDE + id``; the index's own array, read-only by contract)."""
        keys: np.ndarray = self._current(ring).keys
        return keys

    def within(self, ring: Ring, start_ids: np.ndarray, rows: np.ndarray,
               num_steps: int) -> np.ndarray:
        """Bool ``[K]``: whether each window ``[start, start + num_steps)`` stays in one
        segment (no episode starts after its first step, and it ends by the write head)."""
        keys = self._current(ring).keys
        k = np.searchsorted(keys, rows * _ROW + start_ids, side="right")
        following = keys[np.minimum(k, len(keys) - 1)] if len(keys) else np.zeros_like(k)
        same_row = (k < len(keys)) & (following // _ROW == rows)
        end = np.where(same_row, following % _ROW, ring.last_id + 1)
        return start_ids + num_steps <= end

    def outside_parts(self, ring: Ring, num_steps: int
                      ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """The stored steps that cannot start a window of ``num_steps`` within an
        episode (the last ``num_steps - 1`` steps of every segment), as two disjoint
        ``(ids, rows)`` pairs of int64 arrays: those of the interior segments, which
        are the very same array objects until an episode start comes or goes (so a
        caller may key a cache on them), and those of the end segments
        (``O(B num_steps)``, cached per ring state)."""
        layout = self._layout(ring, num_steps)  # brings the interior up to date
        interior = self._interior
        assert interior is not None
        return interior.outside_steps(num_steps), layout.end_outside()

    def outside(self, ring: Ring, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, rows)`` of every stored step that cannot start a window within an
        episode (both parts of :meth:`outside_parts`)."""
        (ids, rows), (end_ids, end_rows) = self.outside_parts(ring, num_steps)
        return np.concatenate((ids, end_ids)), np.concatenate((rows, end_rows))


def no_window_error(num_steps: int) -> EmptyBufferError:
    """What a read of windows within episodes raises when none fits: every episode held
    (or the part of it still held) is shorter than ``num_steps``, or nothing is."""
    return EmptyBufferError(f"no window of num_steps={num_steps} lies within one episode: "
                            f"every episode (or part of one) the buffer holds is shorter "
                            f"than {num_steps} steps, or it holds none. Ask for fewer "
                            "num_steps, or add longer episodes first.")
