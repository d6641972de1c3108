"""Where episodes start in each row, so that windows can stay inside one episode.

The buffer records the ids at which a row's step has ``step_type == FIRST``. The
retained steps of a row then split into *segments*: from the oldest retained step
or an episode start up to the next start (or the write head). A window of ``T``
steps is *within an episode* when it lies inside one segment, i.e. no episode starts
after its first step. A boundary step (``LAST -> FIRST``) belongs to the episode it
ends, so the window ``[last real step, boundary]`` is valid and carries the true
final observation, while any window reaching into the next episode is not.

Everything is integer arithmetic over the starts held, ``E`` of them: building the
segments costs ``O(E log E)`` once per change of the buffer (cached), sampling
``O(K log E)``; neither depends on the capacity.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling.ring import Ring

_ROW = np.int64(1) << 40  # key = row * _ROW + id orders starts by row, then id


class EpisodeIndex:
    """Episode starts of every row, and the windows that stay within one episode."""

    def __init__(self) -> None:
        self._keys = np.zeros(0, np.int64)   # row * _ROW + id of recorded starts, any order
        self._new: list[np.ndarray] = []
        self._cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._cache_key: tuple[int, int, int] | None = None

    def record(self, first_id: int, starts: np.ndarray, oldest_id: int) -> None:
        """Steps ``first_id + t`` were written; ``starts`` (bool ``[T, B]``) marks FIRST ones.

        ``oldest_id`` is the oldest step still held: starts before it are forgotten when
        the pending records are merged, which happens every so often even if no read
        asks for the segments, so memory stays bounded by the starts held.
        """
        t, rows = np.nonzero(starts)
        if len(t):
            self._new.append(rows.astype(np.int64) * _ROW + first_id + t)
            self._cache = None
        if len(self._new) >= 256:
            keys = np.concatenate([self._keys, *self._new])
            self._new.clear()
            self._keys = keys[keys % _ROW >= oldest_id]

    def clear(self) -> None:
        self._keys = np.zeros(0, np.int64)
        self._new.clear()
        self._cache = None

    def state(self, ring: Ring) -> np.ndarray:
        """The retained episode starts as int64 keys, for saving."""
        self.segments(ring)
        keys: np.ndarray = self._keys.copy()
        return keys

    def load(self, keys: np.ndarray) -> None:
        self.clear()
        self._keys = np.asarray(keys, np.int64)

    def segments(self, ring: Ring) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(first_ids, lengths, rows)`` of every segment, ordered by row then id."""
        key = (ring.oldest_id, ring.last_id, ring.batch_size)
        if self._cache is not None and self._cache_key == key:
            return self._cache
        if self._new:
            self._keys = np.concatenate([self._keys, *self._new])
            self._new.clear()
        oldest, last, batch = ring.oldest_id, ring.last_id, ring.batch_size
        ids = self._keys % _ROW
        self._keys = np.sort(self._keys[(ids > oldest) & (ids <= last)])  # forget the evicted
        heads = np.arange(batch, dtype=np.int64) * _ROW + oldest  # each row's oldest step
        keys = np.sort(np.concatenate([self._keys, heads]))
        rows, firsts = keys // _ROW, keys % _ROW
        same_row_next = np.append(rows[1:] == rows[:-1], False)
        ends = np.where(same_row_next, np.append(firsts[1:], 0), last + 1)
        self._cache, self._cache_key = (firsts, ends - firsts, rows), key
        return self._cache

    def count(self, ring: Ring, num_steps: int) -> int:
        """Windows of ``num_steps`` that stay within one episode."""
        _, lengths, _ = self.segments(ring)
        return int(np.maximum(lengths - num_steps + 1, 0).sum())

    def sample(self, ring: Ring, num_steps: int, draws: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Map uniform integer ``draws`` in ``[0, count)`` to ``(start_ids, rows)``.

        ``count`` is :meth:`count` for the same ring and ``num_steps``.
        """
        firsts, lengths, rows = self.segments(ring)
        per_segment = np.maximum(lengths - num_steps + 1, 0)
        cumulative = np.cumsum(per_segment)
        j = np.searchsorted(cumulative, draws, side="right")
        return firsts[j] + draws - (cumulative[j] - per_segment[j]), rows[j]

    def within(self, ring: Ring, start_ids: np.ndarray, rows: np.ndarray,
               num_steps: int) -> np.ndarray:
        """Bool ``[K]``: whether each window ``[start, start + num_steps)`` stays in one segment."""
        firsts, lengths, seg_rows = self.segments(ring)
        j = np.searchsorted(seg_rows * _ROW + firsts, rows * _ROW + start_ids, side="right") - 1
        inside: np.ndarray = start_ids + num_steps <= firsts[j] + lengths[j]
        return inside

    def outside(self, ring: Ring, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, rows)`` of stored steps that cannot start a window within an episode:
        the last ``num_steps - 1`` steps of every segment."""
        firsts, lengths, rows = self.segments(ring)
        tail = np.minimum(lengths, num_steps - 1)
        count = int(tail.sum())
        segment = np.repeat(np.arange(len(firsts)), tail)
        offset = np.arange(count) - np.repeat(np.cumsum(tail) - tail, tail)
        ids = firsts[segment] + lengths[segment] - tail[segment] + offset
        return ids, rows[segment]


def no_window_error(num_steps: int) -> EmptyBufferError:
    return EmptyBufferError(f"no window of num_steps={num_steps} lies within one episode. "
                            "Make sure to add items before sampling the buffer.")
