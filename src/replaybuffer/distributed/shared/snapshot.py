"""A consistent copy of what a shared buffer holds, taken while writers go on:
:func:`take_snapshot`, laid out as a local buffer's ring (:class:`RowSnapshot`).

Under the lock the row heads, floors, read cursors, rate-limiter counters and largest
priority are read; without it, every held step below those heads is copied between two
reads of its version (the read path's protocol, :mod:`.sampling`). A writer goes on
meanwhile and may overwrite a row's oldest steps as they are copied: such steps are
torn, and since a row is overwritten oldest first, each row keeps the newest run of
steps copied whole.

The version loads and the copy are ordered as a read's are, with the same fences
(:func:`~.memory_fences.order_fence`, the one helper :mod:`.sampling` uses): one after
the first version loads, so that no data load is performed before them, and one after
the copy (and the frames' rebuild), so that the second version loads come after every
data load. Without them a processor that reorders loads (aarch64, POWER, RISC-V; x86
does not) could copy a byte of a later write and still see both versions even, and a
checkpoint would keep a torn step as whole.

A local buffer's rows advance together (one ``last_id``), a shared buffer's do not. The
snapshot keeps the rows that hold steps, each with its newest ``K`` steps, ``K`` the
fewest any of them holds, so that it is a local ring of ``K`` steps per row: rows
written unevenly lose their steps beyond the ``K`` newest (none once every row in use
has filled, the steady state), and rows that never held a step are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replaybuffer.distributed.shared.counters import ADMITTED_INSERTS, ADMITTED_SAMPLES
from replaybuffer.distributed.shared.frame_ring import SharedFrameRing
from replaybuffer.distributed.shared.layout import INSERTS, SAMPLES, SharedLayout
from replaybuffer.distributed.shared.memory_fences import order_fence
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.row_marks import DROPPED, RowMarks
from replaybuffer.sampling import flat_tree
from replaybuffer.storage.shared_storage import SharedStorage


@dataclass
class RowSnapshot:
    """What a save writes.

    Attributes:
        rows: int64 ``[R']``, the shared rows kept, in order (local row ``i`` is
            shared row ``rows[i]``).
        heads, floors, cursors: int64 ``[num_rows]``, every row's head, floor and read
            cursor when the snapshot began.
        kept: ``K``, the steps kept per row: local step ``k`` of local row ``i`` is
            shared step ``heads[rows[i]] - K + k``.
        leaves: the storage's leaves ``[K * R', *shape]``, local position
            ``k * R' + i`` (a local ring's ``slot * batch_size + row``).
        priorities: float64 ``[K * R']``, ``priority ** alpha`` at the same positions
            (prioritized buffers; otherwise ``None``); ``max_priority`` the largest seen.
        control: int64, the shared control block (rate-limiter counters).
        dropped: steps a ``Queue`` buffer's reads skipped.
    """

    rows: np.ndarray
    heads: np.ndarray
    floors: np.ndarray
    cursors: np.ndarray
    kept: int
    leaves: list[np.ndarray]
    priorities: np.ndarray | None
    max_priority: float
    control: np.ndarray
    dropped: int


def take_snapshot(layout: SharedLayout, marks: RowMarks, storage: SharedStorage,
                  lock: ProcessLock, num_rows: int, max_length: int,
                  frames: SharedFrameRing | None = None) -> RowSnapshot:
    """The snapshot of the module docstring; with ``frames``, the stacked leaf is
    rebuilt as stacks (between the version loads, as a read does)."""
    with lock:
        heads = layout.next_id.copy()
        floors, cursors = marks.floor.copy(), marks.cursor.copy()
        control = layout.control.copy()
        # The admitted counts live per process (:mod:`.counters`): their totals stand in
        # the control block's fields for the checkpoint.
        totals = layout.counters[:int(layout.counter_owners[0]) + 1].sum(0)
        control[INSERTS] = totals[ADMITTED_INSERTS]
        control[SAMPLES] = totals[ADMITTED_SAMPLES]
        max_priority = float(layout.max_priority[0])
        dropped = int(marks.counts[DROPPED])
    oldest = np.maximum(np.maximum(heads - max_length, 0), floors)
    held = heads - oldest
    k = np.arange(max_length, dtype=np.int64)
    ids = oldest[:, None] + k  # [R, L], row by row, oldest first
    positions = (ids % max_length) * num_rows + np.arange(num_rows)[:, None]
    expected = 2 * ids + 2
    before = layout.version[positions]
    order_fence()  # the versions before the data (a read's first fence)
    copied = storage.gather(positions.reshape(-1))
    if frames is not None:
        copied[frames.leaf] = frames.decode(copied[frames.leaf],
                                            positions.reshape(-1) % num_rows)
    order_fence()  # the data before the versions again (a read's second fence)
    whole = (before == expected) & (layout.version[positions] == expected)
    torn = (k < held[:, None]) & ~whole
    # Each row keeps its newest steps after the last torn one.
    last_torn = np.where(torn.any(axis=1),
                         max_length - 1 - np.argmax(torn[:, ::-1], axis=1), -1)
    whole_run = np.where(last_torn >= 0, held - 1 - last_torn, held)
    rows = np.nonzero(whole_run > 0)[0].astype(np.int64)
    kept = int(whole_run[rows].min()) if len(rows) else 0
    # Local step k of local row i: the row's column held - K + k.
    columns = (held[rows] - kept)[None, :] + np.arange(kept)[:, None]  # [K, R']
    flat = (rows[None, :] * max_length + columns).reshape(-1)
    leaves = [np.ascontiguousarray(leaf[flat]) for leaf in copied]
    priorities = None
    if layout.prioritized:
        with lock:
            priorities = flat_tree.leaves_of(layout.tree, positions.reshape(-1)[flat])
    return RowSnapshot(rows, heads, floors, cursors, kept, leaves, priorities, max_priority,
                       control, dropped)
