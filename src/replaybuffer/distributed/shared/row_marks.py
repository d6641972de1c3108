"""Per-row marks of a shared buffer beside its layout: where each row's steps begin
since the last :meth:`~replaybuffer.distributed.SharedReplayBuffer.clear`, and where
each row's next unread window begins (the ``Queue`` limiter's reads).

The layout (:mod:`.layout`) says which steps a row has written: ids below its head
``next_id``, the newest ``max_length`` of them in the ring. These marks narrow that to
the steps the buffer *holds*: ``[max(head - max_length, floor), head)``. A clear moves
every row's floor to its head, so ids keep growing through a clear and an id names
one step for the buffer's whole life (a priority update for an id from before the
clear can never reach a later step).

Arrays, ``.npy`` files in the buffer's directory, made with the layout (so the
creator's allocation of the directory covers them):

- ``floor`` int64 ``[num_rows]``: the first step id each row holds since the last
  clear (0 before any);
- ``cursor`` int64 ``[num_rows]``: (``Queue`` limiter) the step id where each row's
  next unread window starts;
- ``marks`` int64 ``[4]``: the fields named below.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.storage.shared_storage import SharedStorage

CLEARS, DROPPED = range(2)
"""Fields of the shared ``marks`` array: clears so far; steps a ``Queue`` buffer's
reads skipped because they were overwritten before they were read."""


class RowMarks:
    """The ``floor``, ``cursor`` and ``marks`` arrays of a shared buffer, made
    (``create``) or attached in ``storage``'s directory (see the module docstring).

    Attributes:
        floor, cursor: int64 ``[num_rows]``, mapped shared.
        counts: int64 ``[4]``, mapped shared (``CLEARS``, ``DROPPED``).
    """

    def __init__(self, storage: SharedStorage, num_rows: int, max_length: int):
        self.floor = storage.map("floor", (num_rows,), np.int64)
        self.cursor = storage.map("cursor", (num_rows,), np.int64)
        self.counts = storage.map("marks", (4,), np.int64)
        self._length = max_length

    @property
    def cleared(self) -> bool:
        """Whether the buffer was ever cleared (or restored from a checkpoint that
        holds fewer steps than its rows wrote): only then do floors narrow the rows."""
        return bool(self.counts[CLEARS])

    def oldest(self, heads: np.ndarray) -> np.ndarray:
        """The oldest step id each row holds, int64 ``[num_rows]``, for row heads
        ``heads`` (int64 ``[num_rows]``, read by the caller)."""
        oldest: np.ndarray = np.maximum(np.maximum(heads - self._length, 0), self.floor)
        return oldest

    def items_held(self, held: np.ndarray, heads: np.ndarray) -> int:
        """Items a sample can return: per row ``held`` (int64 ``[num_rows]``, the
        steps a row holds whole: :meth:`~.layout.SharedLayout.held_by_versions`, or the
        writers' counts), after a clear capped by the steps since the row's floor
        (``heads``: int64 ``[num_rows]``, the row heads)."""
        if not self.cleared:
            return int(held.sum())
        return int(np.maximum(np.minimum(held, heads - self.floor), 0).sum())
