"""The shared control block: the arrays beside the data that every process maps.

Next to the data (:class:`~replaybuffer.storage.shared_storage.SharedStorage`, one
position per ``slot * num_rows + row``) a shared buffer keeps, as ``.npy`` files in
its directory:

- ``version`` int64 ``[capacity]``: per position, ``2 * id + 1`` while step ``id`` is
  being written there, ``2 * id + 2`` once written (the seqlock readers check);
- ``next_id`` int64 ``[num_rows]``: steps written to each row (the row's write head);
- ``owner`` int64 ``[num_rows]``: the pid writing each row (0: none);
- ``held`` int64 ``[num_rows]``: steps of each row a sample can return, kept by its
  writer: ``min(next_id, max_length)``, less one while a full row's oldest step is
  rewritten (so a step a killed writer left half overwritten is never counted). A
  writer killed between its two stores (the count, the odd version) leaves it one
  short until its rows are claimed again; ``len()`` counts from the heads and
  versions instead (:meth:`SharedLayout.held_by_versions`), exact at every moment;
- ``control`` int64 ``[16]``: the fields named below (the rate limiter's largest calls,
  blocked counts and waiting calls, closed flag, how many processes attached);
- ``counters`` int64 ``[SLOTS + 1, COLUMNS]`` and ``counter_owners`` int64 ``[SLOTS + 1]``:
  the rate limiter's insert and sample counts, one slot per process
  (:mod:`.counters`);
- prioritized buffers only: ``priorities`` float64, a flat sum tree of
  ``priority ** alpha`` over the positions (:mod:`replaybuffer.sampling.flat_tree`),
  ``max_priority`` float64 ``[1]``, and ``tree_intent`` int64 ``[4]``: what the holder
  of the lock is changing in the tree (``TREE_DIRTY``: 1 while it does; the span of
  positions a writer is hiding or publishing, ``TREE_STEP`` steps of it), so that the
  next holder repairs what a holder killed midway left (:mod:`.priorities`).

Writers and readers of the uniform path share these arrays without a lock; the order of
their loads and stores is argued in :mod:`.writer` and :mod:`.sampling`.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.distributed.shared.counters import COLUMNS, SLOTS
from replaybuffer.distributed.shared.held_steps import held_steps
from replaybuffer.sampling import flat_tree
from replaybuffer.storage.shared_storage import SharedStorage

(INSERTS, SAMPLES, LARGEST_INSERT, LARGEST_SAMPLE, INSERTS_BLOCKED, SAMPLES_BLOCKED,
 INSERT_BLOCKED_NS, SAMPLE_BLOCKED_NS, CLOSED, ATTACHED, WAITING_INSERT, WAITING_INSERT_NS,
 WAITING_SAMPLE, WAITING_SAMPLE_NS) = range(14)
"""Fields of the shared int64 ``control`` array (``WAITING_*``: the smallest insert and
sample waiting on the rate limiter, and when their waiter last said so; see
:mod:`.admission`). ``INSERTS`` and ``SAMPLES`` are no longer written: the counts are
per process, in ``counters`` (:mod:`.counters`)."""

TREE_DIRTY, TREE_START, TREE_COUNT, TREE_STEP = range(4)
"""Fields of the shared int64 ``tree_intent`` array (prioritized layouts)."""


class SharedLayout:
    """The control arrays of a shared buffer, made (``create``) or attached in
    ``storage``'s directory (see the module docstring for each array's shape and dtype).
    Made, the directory's files are then allocated (:meth:`SharedStorage.reserve`).

    Raises:
        StorageSpaceError: (made) the file system cannot hold the buffer's files.

    Attributes:
        version, next_id, owner, held, control, counters, counter_owners: int64
            arrays, mapped shared.
        prioritized: whether the layout has priorities.
        tree, max_priority: float64 arrays (prioritized layouts; otherwise an empty
            tree and a private ``[1.0]``, never read).
        tree_intent: int64 ``[4]`` (prioritized layouts; otherwise private zeros).
    """

    def __init__(self, storage: SharedStorage, num_rows: int, max_length: int,
                 prioritized: bool, create: bool):
        capacity = num_rows * max_length
        shared = storage.map
        self.version = shared("version", (capacity,), np.int64)
        self.next_id = shared("next_id", (num_rows,), np.int64)
        self.owner = shared("owner", (num_rows,), np.int64)
        self.held = shared("held", (num_rows,), np.int64)
        self.control = shared("control", (16,), np.int64)
        self.counters = shared("counters", (SLOTS + 1, COLUMNS), np.int64)
        self.counter_owners = shared("counter_owners", (SLOTS + 1,), np.int64)
        self.prioritized = prioritized
        self.tree: np.ndarray = np.zeros(0)
        self.max_priority: np.ndarray = np.ones(1)
        self.tree_intent: np.ndarray = np.zeros(4, np.int64)
        if prioritized:
            self.tree = shared("priorities", (flat_tree.tree_nodes(capacity),), np.float64)
            self.max_priority = shared("max_priority", (1,), np.float64)
            self.tree_intent = shared("tree_intent", (4,), np.int64)
            if create:
                self.max_priority[0] = 1.0
        if create:  # the last file is made: allocate them all, or refuse (no SIGBUS later)
            storage.reserve()

    def held_by_versions(self) -> np.ndarray:
        """Per row (int64 ``[num_rows]``) the steps a sample can return, from the row
        heads and the versions alone (:func:`~.held_steps.held_steps`):
        ``min(head, max_length)`` less the run of oldest steps whose positions no longer
        hold them (being rewritten, one step or a prioritized ``extend``'s block, or
        rewritten by a writer that has not moved the head yet). The ``held`` counts the
        writers keep say the same while they live; this stays exact whatever a killed
        writer left between its stores."""
        return held_steps(self.version, self.next_id.copy(),
                          len(self.version) // len(self.next_id))
