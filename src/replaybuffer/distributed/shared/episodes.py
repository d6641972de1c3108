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
rows of several writer processes need no coordination. A read scans the step types
of every held step (``O(capacity)``, vectorised: about 1 ms per million steps here)
to number the windows within episodes, draws among them (uniformly, or in proportion
to the first step's priority), and, once the windows are copied whole, checks their
copied step types again: a window whose steps were rewritten between the scan and the
copy is drawn again (as a torn one is), so what is returned never crosses a start.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.row_marks import RowMarks
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.sampling import flat_tree
from replaybuffer.sampling.episodes import no_window_error

FIRST = 0
"""The ``step_type`` of an episode's first step (:class:`~replaybuffer.collect.StepType`)."""


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
    """

    def __init__(self, layout: SharedLayout, marks: RowMarks, lock: ProcessLock,
                 step_types: np.ndarray, leaf: int, num_rows: int, max_length: int):
        self._next_id = layout.next_id
        self._tree = layout.tree if layout.prioritized else None
        self._marks = marks
        self._lock = lock
        self._step_types = step_types.reshape(-1)
        self._leaf = leaf
        self._rows_total, self._length = num_rows, max_length

    def valid_starts(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, starts)``, int64 ``[W]``: every window of ``steps`` within one
        episode among the steps held now, row by row, oldest first (read without a
        lock: a step rewritten meanwhile may be misjudged, which :meth:`keeps` catches)."""
        rows_total, length = self._rows_total, self._length
        heads = self._next_id.copy()
        oldest = self._marks.oldest(heads)
        held = heads - oldest
        k = np.arange(length, dtype=np.int64)
        rows = np.arange(rows_total, dtype=np.int64)
        ids = oldest[:, None] + k  # [R, L], row by row, oldest first
        starts_episode = (self._step_types[(ids % length) * rows_total + rows[:, None]]
                          == FIRST) & (k < held[:, None])
        # starts after a window's first step: a difference of running counts.
        running = np.cumsum(starts_episode, axis=1)
        last = np.minimum(k + steps - 1, length - 1)
        valid = (k + steps <= held[:, None]) & (running[:, last] == running)
        row_of, offset = np.nonzero(valid)
        return row_of.astype(np.int64), ids[row_of, offset]

    def positions(self, count: int, steps: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows, starts = self.valid_starts(steps)
        if not len(rows):
            raise no_window_error(steps)
        if self._tree is None:
            pick = rng.integers(0, len(rows), count)
            return rows[pick], starts[pick], np.full(count, 1.0 / len(rows))
        positions = (starts % self._length) * self._rows_total + rows
        with self._lock:
            weights = flat_tree.leaves_of(self._tree, positions)
        total = float(weights.sum())
        if not total > 0:
            raise EmptyBufferError(f"get_next: no window of num_steps={steps} within one "
                                   "episode has a positive priority")
        ends = np.cumsum(weights)
        pick = np.minimum(np.searchsorted(ends, rng.random(count) * total, side="right"),
                          len(rows) - 1)
        return rows[pick], starts[pick], weights[pick] / total

    def keeps(self, leaves: list[np.ndarray]) -> np.ndarray | None:
        """No window whose copied steps after the first hold an episode start."""
        kept: np.ndarray = (leaves[self._leaf][:, 1:] != FIRST).all(axis=1)
        return kept
