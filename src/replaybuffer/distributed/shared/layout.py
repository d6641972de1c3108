"""The shared control block: the arrays beside the data that every process maps.

Next to the data (:class:`~replaybuffer.storage.shared_storage.SharedStorage`, one
position per ``slot * num_rows + row``) a shared buffer keeps, as ``.npy`` files in
its directory:

- ``version`` int64 ``[capacity]``: per position, ``2 * id + 1`` while step ``id`` is
  being written there, ``2 * id + 2`` once written (the seqlock readers check);
- ``heads`` int64 ``[num_rows, HEAD_WIDTH]`` (``heads.npy``), one row per 64-byte cache
  line (up to ``PADDED_ROWS`` rows; packed, width 2, above), read through two strided
  views:

  - ``next_id`` (column 0) int64 ``[num_rows]``: steps written to each row (the row's
    write head);
  - ``held`` (column 1) int64 ``[num_rows]``: steps of each row a sample can return,
    kept by its writer: ``min(next_id, max_length)``, less one while a full row's oldest step is
  rewritten (so a step a killed writer left half overwritten is never counted). A
  writer killed between its two stores (the count, the odd version) leaves it one
  short until its rows are claimed again; ``len()`` counts from the heads and
  versions instead (:meth:`SharedLayout.held_by_versions`), exact at every moment;

  Every writer stores to its rows' ``next_id`` and ``held`` at every step. Packed, eight
  rows' heads share a cache line, and writers on different cores, each storing to its
  own row, keep taking that line from one another (false sharing: on the 2-core test
  machine 1.4 ns against 0.3 ns a store, and with eight or twelve writers one line
  written millions of times a second, a serial section of its own). Padded, a writer's
  step stores to its own line only (both its fields in one). The padding stops at
  ``PADDED_ROWS``: a process with many envs owns a run of adjacent rows whose heads it
  stores together, and a sampler reads every row's head at every draw, a line per row
  when padded;
- ``owner`` int64 ``[num_rows]``: the pid writing each row (0: none; written once per
  claim, so packed);
- ``control`` int64 ``[16]``: the fields named below (the rate limiter's largest calls,
  blocked counts and waiting calls, closed flag, how many processes attached, the
  layout's version ``LAYOUT``: an attaching process whose ``LAYOUT_VERSION`` differs
  is refused with a :class:`~replaybuffer.errors.CheckpointError`);
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
from replaybuffer.errors import CheckpointError
from replaybuffer.sampling import flat_tree
from replaybuffer.storage.shared_storage import SharedStorage

(INSERTS, SAMPLES, LARGEST_INSERT, LARGEST_SAMPLE, INSERTS_BLOCKED, SAMPLES_BLOCKED,
 INSERT_BLOCKED_NS, SAMPLE_BLOCKED_NS, CLOSED, ATTACHED, WAITING_INSERT, WAITING_INSERT_NS,
 WAITING_SAMPLE, WAITING_SAMPLE_NS, LAYOUT) = range(15)
"""Fields of the shared int64 ``control`` array (``WAITING_*``: the smallest insert and
sample waiting on the rate limiter, and when their waiter last said so; see
:mod:`.admission`). ``INSERTS`` and ``SAMPLES`` are no longer written: the counts are
per process, in ``counters`` (:mod:`.counters`)."""

LAYOUT_VERSION = 2
"""The version of this layout, in ``control[LAYOUT]``: 2, the row heads padded to a
cache line each (``heads.npy``); layouts before it (separate ``next_id.npy`` and
``held.npy``) have 0 there."""

LINE_INT64 = 8
"""int64 values per 64-byte cache line."""

PADDED_ROWS = 64
"""Buffers of at most this many rows keep each row's heads in a cache line of its own
(see the module docstring for why not above)."""


def head_width(num_rows: int) -> int:
    """int64 columns of the ``heads`` array of a buffer of ``num_rows`` rows: a cache
    line (``LINE_INT64``) up to ``PADDED_ROWS`` rows, 2 (``next_id``, ``held``) above."""
    return LINE_INT64 if num_rows <= PADDED_ROWS else 2


TREE_DIRTY, TREE_START, TREE_COUNT, TREE_STEP = range(4)
"""Fields of the shared int64 ``tree_intent`` array (prioritized layouts)."""


class SharedLayout:
    """The control arrays of a shared buffer, made (``create``) or attached in
    ``storage``'s directory (see the module docstring for each array's shape and dtype).
    Made, the directory's files are then allocated (:meth:`SharedStorage.reserve`).

    Raises:
        StorageSpaceError: (made) the file system cannot hold the buffer's files.
        CheckpointError: (attached) the files were made with another layout version.

    Attributes:
        version, next_id, owner, held, control, counters, counter_owners: int64
            arrays, mapped shared (``next_id`` and ``held``: strided views of the
            padded ``heads``).
        heads: int64 ``[num_rows, head_width(num_rows)]``.
        prioritized: whether the layout has priorities.
        tree, max_priority: float64 arrays (prioritized layouts; otherwise an empty
            tree and a private ``[1.0]``, never read).
        tree_intent: int64 ``[4]`` (prioritized layouts; otherwise private zeros).
    """

    def __init__(self, storage: SharedStorage, num_rows: int, max_length: int,
                 prioritized: bool, create: bool):
        capacity = num_rows * max_length
        shared = storage.map
        self.control = shared("control", (16,), np.int64)
        if not create:  # before any other file: an older layout has other files
            _check_layout_version(int(self.control[LAYOUT]), storage)
        self.version = shared("version", (capacity,), np.int64)
        self.heads = shared("heads", (num_rows, head_width(num_rows)), np.int64)
        self.next_id: np.ndarray = self.heads[:, 0]
        self.held: np.ndarray = self.heads[:, 1]
        self.owner = shared("owner", (num_rows,), np.int64)
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
            self.control[LAYOUT] = LAYOUT_VERSION

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


def _check_layout_version(found: int, storage: SharedStorage) -> None:
    """Raises :class:`CheckpointError` unless ``found`` (an attached buffer's
    ``control[LAYOUT]``) is this module's ``LAYOUT_VERSION``."""
    if found != LAYOUT_VERSION:
        raise CheckpointError(
            f"the shared buffer in {storage.directory} has layout version {found} "
            f"(0: made before versions were kept); this process reads version "
            f"{LAYOUT_VERSION}: run the writers and samplers of one buffer with one "
            "version of replaybuffer")
