"""A plain model of a shared prioritized buffer's tree for the reference-model tests
(``test_shared_prioritized_batches.py``, ``_steps.py``, ``_blocks.py``): the priority
of every (row, step) the buffer holds, with alpha 1 (a leaf is the priority), new steps
at the largest priority seen; and the buffer those tests check against it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from replaybuffer.distributed import SharedReplayBuffer

ROWS_TOTAL = 3
"""Rows of the modelled buffer."""


@contextmanager
def modelled_buffer(spec: Any, count: int, max_length: int, seed: int) -> Iterator[
        tuple[SharedReplayBuffer, np.ndarray, "PriorityModel", np.random.Generator]]:
    """A prioritized shared buffer of :data:`ROWS_TOTAL` rows (alpha 1, ``seed``) with
    ``count`` of them claimed: ``(buffer, those rows, its PriorityModel, a generator
    seeded with seed)``."""
    with SharedReplayBuffer(spec, ROWS_TOTAL, max_length, prioritized=True, alpha=1.0,
                            seed=seed) as buffer:
        first, _ = buffer.claim_rows(count)
        yield (buffer, np.arange(first, first + count),
               PriorityModel(ROWS_TOTAL, max_length, buffer.capacity),
               np.random.default_rng(seed))


class PriorityModel:
    """Leaves of a buffer of ``rows_total`` rows of ``max_length`` steps, position
    ``(step % max_length) * rows_total + row``."""

    def __init__(self, rows_total: int, max_length: int, capacity: int):
        self.rows_total, self.max_length, self.capacity = rows_total, max_length, capacity
        self.priority: dict[tuple[int, int], float] = {}  # (row, step) -> leaf
        self.largest = 1.0

    def update(self, buffer, rng: np.random.Generator, size: int) -> None:
        """Sample ``size`` items of ``buffer`` and give them random priorities, in the
        buffer and here."""
        _, info = buffer.get_next(size)
        values = rng.exponential(2.0, size)
        buffer.update_priorities(info.ids, values)
        for item, value in zip(info.ids.tolist(), values.tolist()):
            self.priority[(item % self.rows_total, item // self.rows_total)] = value
        self.largest = max(self.largest, float(values.max()))

    def added(self, rows: np.ndarray, steps: range, written: int) -> range:
        """``steps`` of ``rows`` added at the largest priority; the steps retained once
        ``written`` steps were written (the others are forgotten)."""
        for step in steps:
            for row in rows.tolist():
                self.priority[(row, step)] = self.largest
        retained = range(max(0, written - self.max_length), written)
        self.priority = {k: v for k, v in self.priority.items() if k[1] in retained}
        return retained

    def leaves(self, steps: range | None = None) -> np.ndarray:
        """float64 ``[capacity]``: the leaves (of ``steps`` only, if given), 0 elsewhere."""
        leaves = np.zeros(self.capacity)
        for (row, step), value in self.priority.items():
            if steps is None or step in steps:
                leaves[(step % self.max_length) * self.rows_total + row] = value
        return leaves
