"""Which windows a shared buffer's read may draw, when that is more than "any window
below a row's head": :class:`WindowChoice`, the seam of
:meth:`~replaybuffer.distributed.shared.sampling.SharedSampler.draw`, and
:class:`HeldWindows`, the windows rows hold since a clear.

A choice gives the window starts to read (``positions``) and, once the sampler has
copied them and checked their versions, may turn some down by their contents
(``keeps``, e.g. a window holding an episode start); turned-down and torn windows are
drawn again, as the sampler does for torn ones.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.priorities import SharedPriorities
from replaybuffer.distributed.shared.row_marks import RowMarks
from replaybuffer.errors import EmptyBufferError


class WindowChoice(Protocol):
    """The windows a read draws (see the module docstring)."""

    def positions(self, count: int, steps: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows and first step ids (int64 ``[count]`` each) of ``count`` windows of
        ``steps``, and their probabilities (float64 ``[count]``; 0 marks a draw to
        make again)."""

    def keeps(self, leaves: list[np.ndarray]) -> np.ndarray | None:
        """Bool ``[n]``: which of ``n`` windows copied whole (the storage's leaves,
        ``[n, steps, *shape]``) the read may return; ``None``: all of them."""


class HeldWindows:
    """Windows among the steps the rows hold since their floors (a cleared buffer):
    uniformly, or by priority (``priorities`` given: the tree's draw, with windows
    starting below a floor turned into redraws; a clear zeroed their priorities, so
    only rounding lands there)."""

    def __init__(self, layout: SharedLayout, marks: RowMarks,
                 priorities: SharedPriorities | None):
        self._next_id = layout.next_id
        self._marks = marks
        self._priorities = priorities

    def positions(self, count: int, steps: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._priorities is not None:
            rows, starts, p = self._priorities.draw(count, steps, rng)
            p[starts < self._marks.floor[rows]] = 0.0
            return rows, starts, p
        heads = self._next_id.copy()
        oldest = self._marks.oldest(heads)
        windows = np.maximum(heads - oldest - steps + 1, 0)
        ends = np.cumsum(windows)
        total = int(ends[-1])
        if total == 0:
            raise EmptyBufferError(f"get_next: no row holds {steps} step(s) yet (the most "
                                   f"any row holds: {int((heads - oldest).max())})")
        draws = rng.integers(0, total, count)
        rows = np.searchsorted(ends, draws, side="right")
        starts = oldest[rows] + draws - (ends[rows] - windows[rows])
        return rows, starts, np.full(count, 1.0 / total)

    def keeps(self, leaves: list[np.ndarray]) -> np.ndarray | None:
        return None
