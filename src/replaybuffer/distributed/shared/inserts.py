"""A shared buffer's inserts: :class:`Inserting`, the ``add_batch``, ``extend`` and
``claim_rows`` of :class:`~replaybuffer.distributed.SharedReplayBuffer`, from the
caller's items to published steps.

Every insert goes the same way, and in this order, so that a call that fails leaves
the buffer as it was:

1. the buffer is open, ``timeout`` is valid;
2. the items are checked against the spec and converted (:mod:`.items`): a wrong
   structure, shape or dtype raises here, with nothing claimed, counted or written;
3. this process's rows are claimed (its first insert) or matched (:mod:`.writer`);
4. the rate limiter admits the items (one that can hold inserts back: :mod:`.admission`);
5. the steps are written under the version protocol (:mod:`.writer`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.arguments import check_timeout
from replaybuffer.distributed.shared.admission import SharedAdmission
from replaybuffer.distributed.shared.items import ItemChecker
from replaybuffer.distributed.shared.writer import SharedWriter


class Inserting:
    """The inserts of a shared buffer (see the module docstring)."""

    _items: ItemChecker
    _writer: SharedWriter
    _next_id: np.ndarray
    # The rate limiter's admission where it can hold inserts back (it admits them before
    # the write); None otherwise (none, or a MinSize: the writer counts at the commit).
    _insert_admission: SharedAdmission | None

    def _check_open(self) -> None: ...

    @property
    def rows(self) -> tuple[int, int] | None:
        """``(first row, count)`` this process writes to, once it has added."""
        return self._writer.rows

    def steps_written(self) -> np.ndarray:
        """Steps written so far to each row, int64 ``[num_rows]`` (a copy): the next
        step of a row gets this id."""
        steps: np.ndarray = self._next_id.copy()
        return steps

    def claim_rows(self, count: int) -> tuple[int, int]:
        """The rows this process writes, ``(first, count)``: claimed by its first add
        (or this call) as ``count`` adjacent rows that no live process owns and whose
        step counts agree. Later calls return the same rows.

        Raises:
            SpecError: this process owns a different number of rows, or ``count`` is
                less than 1 or more than the buffer has.
            ValueError: no such rows are free now.
        """
        return self._writer.claim_rows(count, "claim_rows")

    def add_batch(self, items: Any, *, timeout: float | None = None,
                  block: bool = True) -> bool:
        """Append one step to each of this process's rows.

        Args:
            items: a nest matching ``data_spec``, leaves ``[B, *spec.shape]``; the first
                call claims ``B`` rows for this process, later calls must keep ``B``.
            timeout, block: as :meth:`replaybuffer.ReplayBuffer.add_batch`, with the
                rate limiter.

        Returns:
            ``True`` once written; ``False`` with ``block=False`` when held back.

        Raises:
            SpecError: wrong structure, shape, dtype or batch size (naming the leaf;
                a batch of 0 items too); nothing is written.
            RateLimitedError: ``timeout`` passed with the insert held back.
            BufferClosedError: the buffer was closed.
        """
        self._check_open()
        if timeout is not None:  # (None, the usual, skips a call on the hot path)
            check_timeout(timeout)
        arrays, count = self._items.batch(items)
        writer = self._writer
        first, _ = writer.claim_rows(count)
        admission = self._insert_admission
        if admission is not None and not admission.admit(True, count, timeout, block):
            return False
        writer.write_step(first, count, arrays)
        return True

    def extend(self, items: Any, *, timeout: float | None = None,
               block: bool = True) -> bool:
        """Append ``T`` steps to each of this process's rows: leaves ``[B, T, *shape]``
        (the rate limiter admits ``B * T`` items at once). As :meth:`add_batch`."""
        self._check_open()
        check_timeout(timeout)
        arrays, (count, steps) = self._items.arrays(items, "extend", 2)
        writer = self._writer
        first, _ = writer.claim_rows(count, "extend")
        admission = self._insert_admission
        if admission is not None and not admission.admit(True, count * steps, timeout, block):
            return False
        writer.write_steps(first, count, ([a[:, t] for a in arrays] for t in range(steps)))
        return True

    def flush(self) -> None:
        """Nothing to wait for: a write is in shared memory when ``add_batch`` returns
        (here for the buffer surface, where the Ray buffer's writes are asynchronous)."""
