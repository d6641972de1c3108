"""Episodes in a shared buffer: windows of ``get_next(..., within_episodes=True)``
never cross an episode start, in any writer's rows.

An episode starts at a step whose ``step_type`` leaf is ``FIRST`` (0), as the local
buffers define it (:mod:`replaybuffer.sampling.episodes`): a row's held steps split
into segments, from its oldest held step or an episode start up to the next start
(or its head), and a window of ``T`` steps is within an episode when no step after
its first is a start. A boundary step (``LAST -> FIRST`` in a
:class:`~replaybuffer.collect.Trajectory`) belongs to the episode it ends.

The starts are the step types themselves, in shared memory with the data and
published by the same version protocol, so nothing beside the data is written and
rows of several writer processes need no coordination. A read finds the starts with
one vectorised pass over the step types (``O(capacity)``, a compare and a
``flatnonzero`` over contiguous memory), splits each row's held steps into segments at
them (``O(E)`` in the starts held), draws among the windows within episodes (uniformly
by segment, or by the priority tree with draws that cross a start drawn again and
probabilities over the valid starts' priority mass),
and, once the windows are copied whole, checks their copied step types again: a window whose steps were rewritten between the scan and the
copy is drawn again (as a torn one is), so what is returned never crosses a start.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.priorities import SharedPriorities
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.row_marks import RowMarks
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.sampling import flat_tree
from replaybuffer.sampling.episodes import no_window_error

FIRST = 0
"""The ``step_type`` of an episode's first step (:class:`~replaybuffer.collect.StepType`)."""

_KEY = np.int64(1) << 40
"""Segment keys ``row * 2**40 + id`` sort by row, then id."""


def step_type_leaf(paths: list[str]) -> int:
    """The index of the top-level ``step_type`` leaf among the leaf ``paths``
    (``"['step_type']"`` or ``".step_type"``).

    Raises:
        SpecError: there is none (naming the leaves there are).
    """
    for i, path in enumerate(paths):
        if path in ("['step_type']", ".step_type"):
            return i
    raise SpecError(f"track_episodes needs a step_type leaf (a Trajectory, or a dict key "
                    f"'step_type'); the data_spec's leaves are {paths}")


class EpisodeWindows:
    """The windows within one episode of a shared buffer's rows (a
    :class:`~replaybuffer.distributed.shared.windows.WindowChoice`).

    Args:
        layout: the buffer's control arrays.
        marks: its row floors.
        lock: its process lock (held while the priority tree is read).
        step_types: the storage's ``step_type`` leaf, ``[capacity]`` (position
            ``slot * num_rows + row``).
        leaf: that leaf's index among the storage's leaves.
        num_rows, max_length: the buffer's shape.
        priorities: the prioritized tree's draws (prioritized buffers).
    """

    def __init__(self, layout: SharedLayout, marks: RowMarks, lock: ProcessLock,
                 step_types: np.ndarray, leaf: int, num_rows: int, max_length: int,
                 priorities: SharedPriorities | None = None):
        self._next_id = layout.next_id
        self._tree = layout.tree if layout.prioritized else None
        self._priorities = priorities
        self._ends = np.zeros(0, np.int64)
        self._marks = marks
        self._lock = lock
        self._step_types = step_types.reshape(-1)
        self._leaf = leaf
        self._rows_total, self._length = num_rows, max_length

    def segments(self, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, firsts, windows)``, int64 ``[M]``: every segment of the held steps
        (from a row's oldest held step or an episode start to the next start or the
        row's head), ordered by row then id, and how many windows of ``steps`` each
        holds. Read without a lock: a step rewritten meanwhile may be misjudged, which
        :meth:`keeps` catches. One pass over the step types, then ``O(E)`` in the
        episode starts held."""
        rows_total, length = self._rows_total, self._length
        heads = self._next_id.copy()
        oldest = self._marks.oldest(heads)
        marked = np.flatnonzero(self._step_types == FIRST)
        rows, slots = marked % rows_total, marked // rows_total
        ids = oldest[rows] + (slots - oldest[rows]) % length  # the id held at each slot
        held = ids < heads[rows]  # (never-written slots hold zeros: FIRST, not held)
        everyone = np.arange(rows_total, dtype=np.int64)
        # Sorted by a merge sort, which finds the few ordered runs (slot order is id
        # order but for each row's wrap); a start at a row's oldest step is one key.
        keys = np.sort(np.concatenate((rows[held] * _KEY + ids[held],
                                       everyone * _KEY + oldest)), kind="stable")
        keys = keys[np.append(True, keys[1:] != keys[:-1])]
        rows, firsts = keys // _KEY, keys % _KEY
        same_row_next = np.append(rows[1:] == rows[:-1], False)
        self._ends = np.where(same_row_next, np.append(firsts[1:], 0), heads[rows])
        return rows, firsts, np.maximum(self._ends - firsts - steps + 1, 0)

    def valid_starts(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, starts)``, int64 ``[W]``: every window of ``steps`` within one
        episode among the steps held now, row by row, oldest first."""
        rows, firsts, windows = self.segments(steps)
        segment = np.repeat(np.arange(len(rows)), windows)
        offset = np.arange(len(segment)) - np.repeat(np.cumsum(windows) - windows, windows)
        return rows[segment], firsts[segment] + offset

    def positions(self, count: int, steps: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._tree is None:
            rows, firsts, windows = self.segments(steps)
            ends = np.cumsum(windows)
            total = int(ends[-1]) if len(ends) else 0
            if total == 0:
                raise no_window_error(steps)
            draws = rng.integers(0, total, count)
            segment = np.searchsorted(ends, draws, side="right")
            starts = firsts[segment] + draws - (ends[segment] - windows[segment])
            return rows[segment], starts, np.full(count, 1.0 / total)
        return self._by_priority(count, steps, rng)

    def _by_priority(self, count: int, steps: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draws by the tree, those not within an episode turned into redraws (p = 0);
        probabilities relative to the priority mass of the valid starts: the tree's
        total less the starts that cannot begin a window (each segment's last
        ``steps - 1`` steps, ``O(E steps)``)."""
        assert self._tree is not None and self._priorities is not None
        seg_rows, firsts, windows = self.segments(steps)
        lengths = self._ends - firsts
        invalid = lengths - windows  # per segment: its last starts, or all of a short one
        segment = np.repeat(np.arange(len(firsts)), invalid)
        offset = np.arange(len(segment)) - np.repeat(np.cumsum(invalid) - invalid, invalid)
        ids = firsts[segment] + windows[segment] + offset
        positions = (ids % self._length) * self._rows_total + seg_rows[segment]
        with self._lock:
            total = float(self._tree[1])
            lost = float(flat_tree.leaves_of(self._tree, positions).sum())
        mass = total - lost
        if not windows.sum():
            raise no_window_error(steps)
        if not mass > 1e-12 * total:  # (rounding may leave a sliver of the subtraction)
            raise EmptyBufferError(f"get_next: no window of num_steps={steps} within one "
                                   "episode has a positive priority")
        rows, starts, p = self._priorities.draw(count, steps, rng)
        keys = seg_rows * _KEY + firsts
        k = np.maximum(np.searchsorted(keys, rows * _KEY + starts, side="right") - 1, 0)
        within = (seg_rows[k] == rows) & (starts >= firsts[k]) & \
            (starts - firsts[k] < windows[k])
        return rows, starts, np.where(within, p * (total / mass), 0.0)

    def keeps(self, leaves: list[np.ndarray]) -> np.ndarray | None:
        """No window whose copied steps after the first hold an episode start."""
        kept: np.ndarray = (leaves[self._leaf][:, 1:] != FIRST).all(axis=1)
        return kept
