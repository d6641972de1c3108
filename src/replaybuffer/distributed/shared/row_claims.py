"""Which rows of a shared buffer a process's first write claims, and what a claim
repairs of the rows an ended writer left.

A process's first write of ``B`` items claims ``B`` adjacent rows, under the buffer's
lock: rows no process held first (a new writer starts on rows of its own), then rows of
ended writers (however they ended), whose steps it continues, all with equal step
counts. A writer killed while publishing a step may have moved some of its rows' heads
and not others: a claim first moves each head of an ended writer's row past the steps
written whole (:func:`repair_heads`), and last takes rows whose heads still differ by
one, setting them back to the lowest (:func:`roll_back`: the step published on some
rows only is written again, so no row is left with a hole that ``len()`` would count).
"""

from __future__ import annotations

import numpy as np

from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.distributed.shared.held_steps import held_steps
from replaybuffer.distributed.shared.layout import SharedLayout
from replaybuffer.distributed.shared.priorities import SharedPriorities
from replaybuffer.distributed.shared.process_lock import process_ended


def claim_adjacent_rows(layout: SharedLayout, priorities: SharedPriorities | None,
                        count: int, pid: int) -> int:
    """Mark ``count`` adjacent free rows as process ``pid``'s (the buffer's lock held)
    and return the first; see the module docstring for which.

    Raises:
        ValueError: no such rows are free now (naming the processes that own rows).
    """
    owner, heads = layout.owner, layout.next_id
    rows_total = len(heads)
    free = [owner[r] == 0 or owner[r] == pid or process_ended(int(owner[r]))
            for r in range(rows_total)]
    repair_heads(layout, [r for r in range(rows_total) if free[r] and owner[r]])
    unowned = [bool(owner[r] == 0) for r in range(rows_total)]
    ended = [free[r] and bool(owner[r]) and owner[r] != pid for r in range(rows_total)]
    for usable, spread in ((unowned, 0), (free, 0), (ended, 1)):
        for first in range(rows_total - count + 1):
            block = slice(first, first + count)
            if not all(usable[block]):
                continue
            low = int(heads[block].min())
            if int(heads[block].max()) - low > spread:
                continue
            if spread:
                roll_back(layout, priorities, first, count, low)
            owner[block] = pid
            if ARMED is not None:
                crash_point("shared.claim")
            return first
    raise ValueError(f"add_batch: no {count} adjacent free rows (with equal step "
                     f"counts) among {rows_total}; rows are owned by processes "
                     f"{sorted({int(p) for p in owner if p})}: give the buffer more "
                     "rows, or end a writer")


def roll_back(layout: SharedLayout, priorities: SharedPriorities | None, first: int,
              count: int, head: int) -> None:
    """Set the heads of rows ``first .. first + count - 1`` (of ended writers, the
    lock held) to ``head``, and recount what each holds: a step at ``head`` that
    some rows had published is no longer held there (its position holds no step
    older than ``head`` any more)."""
    version, next_id = layout.version, layout.next_id
    rows_total = len(next_id)
    length = len(version) // rows_total
    rows = np.arange(first, first + count)
    next_id[rows] = head
    position = (head % length) * rows_total + rows
    if priorities is not None:  # the step some rows published is not drawn
        published = position[version[position] == 2 * head + 2]
        priorities.set(published, np.zeros(len(published)))
    layout.held[rows] = held_steps(version, next_id.copy(), length, rows)


def repair_heads(layout: SharedLayout, rows: list[int]) -> None:
    """Advance the head of each of ``rows`` (of ended writers, the lock held) past a
    step written whole whose head update its writer did not finish: a writer killed
    while publishing a step may have moved some of its rows' heads and not others. Then
    recount the steps each holds (a killed writer may have left ``held`` short). A
    block of steps (:mod:`.step_blocks`) killed after publishing its versions moves
    the head past each of them."""
    version, next_id = layout.version, layout.next_id
    rows_total = len(next_id)
    length = len(version) // rows_total
    for row in rows:
        head = int(next_id[row])
        for _ in range(length):
            position = (head % length) * rows_total + row
            if version[position] != 2 * head + 2:
                break
            head += 1
        next_id[row] = head
    if rows:
        layout.held[rows] = held_steps(version, next_id.copy(), length, np.array(rows))
