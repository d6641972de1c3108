"""Emptying a shared buffer while its writers and samplers go on:
:class:`Clearing`, the ``clear()`` of
:class:`~replaybuffer.distributed.SharedReplayBuffer`.

Under the buffer's lock a clear moves every row's floor
(:mod:`.row_marks`) to its head, zeroes the rows' ``held`` counts and, prioritized, the
priority tree (and the largest priority back to 1, as a local buffer's clear does).
Versions are left as they are: uniform writers publish without the lock, so a clear
that rewrote them could hide a step published while it ran. Step ids keep growing: a
writer's next step is its row's first after the clear, and an id from before it is
below its row's floor, so it names no held step (reads draw ids from the floors up, and
``update_priorities`` ignores ids below them). A step being written while the clear runs has its
id at or above the new floor, so it is held once published: it is a step after the
clear, never a mix of old and new. A sampler that drew before the clear and copies
after it sees versions that no longer match and draws again among the steps held
then; ``len()`` counts per row only the steps since its floor. Rate-limiter counters
are kept, as a local buffer's clear keeps them. A process killed inside a clear leaves
it done or not begun, as far as reads and ``len()`` can tell (crash point
``shared.clear.floors``).
"""

from __future__ import annotations

from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.row_marks import CLEARS, RowMarks


class Clearing:
    """``clear()`` over a shared buffer's layout and marks (see the module docstring)."""

    _layout: SharedLayout
    _marks: RowMarks
    _lock: ProcessLock

    def _check_open(self) -> None: ...

    def clear(self, zero_storage: bool = False) -> None:
        """Forget every step, for every process: ``len()`` is 0 after, reads raise
        :class:`~replaybuffer.EmptyBufferError` until steps come again, and writers go
        on adding to their rows (their next steps are the rows' first).

        Args:
            zero_storage: accepted for the local buffers' signature; the data is not
                zeroed (versions hide it; the next writes overwrite it).

        Raises:
            BufferClosedError: the buffer was closed.
        """
        self._check_open()
        layout, marks = self._layout, self._marks
        with self._lock:
            # Crash-consistent in this order: once the count says floors apply and the
            # floors moved, nothing from before is drawn or counted; the rest tidies.
            marks.counts[CLEARS] += 1
            heads = layout.next_id.copy()
            marks.floor[:] = heads
            marks.cursor[:] = heads
            if layout.prioritized:
                layout.tree[:] = 0.0
                layout.max_priority[0] = 1.0
            if ARMED is not None:
                crash_point("shared.clear.floors")
            layout.held[:] = 0
