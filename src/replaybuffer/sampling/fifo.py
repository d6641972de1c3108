"""First-in-first-out reading: every window once, oldest first, like a queue.

Windows are read in order of start id, then row; consecutive windows of a row do not
overlap (the next one starts ``num_steps`` later), so every stored step is read once.
Steps overwritten before they were read are skipped and counted (over all rows) in
``dropped``. Reading is stateful, so datasets over it take no prefetch workers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices, make_rng


class FIFOSampler:
    """Reads the oldest unread windows; ``probabilities`` are 1 (nothing is random)."""

    consumes = True  # every read moves the cursor: prefetching would lose and reorder

    def __init__(self) -> None:
        self.next_start = 0   # logical id where the next unread window of next_row starts
        self.next_row = 0
        self.dropped = 0      # steps (over all rows) overwritten before they were read

    def unread(self, ring: Ring, num_steps: int) -> int:
        """How many windows of ``num_steps`` can be read now."""
        start, row = self._catch_up(ring, dry=True)
        last_start = ring.last_id - num_steps + 1  # the newest start a window may have
        if start > last_start:
            return 0
        return ((last_start - start) // num_steps + 1) * ring.batch_size - row

    def _catch_up(self, ring: Ring, dry: bool = False) -> tuple[int, int]:
        start, row = self.next_start, self.next_row
        if start < ring.oldest_id:  # the ring overwrote unread steps
            if not dry:
                skipped = (ring.oldest_id - start) * ring.batch_size - row
                self.dropped += max(0, skipped)
                self.next_start, self.next_row = ring.oldest_id, 0
            return ring.oldest_id, 0
        return start, row

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None, episodes: Any = None
               ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        if episodes is not None:
            raise ValueError("within_episodes is not supported by FIFO reading")
        available = self.unread(ring, num_steps)
        if available < sample_batch_size:
            raise EmptyBufferError(
                f"FIFO: {available} unread window(s) of num_steps={num_steps}, asked for "
                f"{sample_batch_size}. Make sure to add items before sampling the buffer.")
        start, row = self._catch_up(ring)
        batch = ring.batch_size
        k = np.arange(row, row + sample_batch_size, dtype=np.int64)
        ids = start + (k // batch) * num_steps
        rows = k % batch
        end = row + sample_batch_size
        self.next_start, self.next_row = start + (end // batch) * num_steps, end % batch
        probabilities = np.ones(sample_batch_size, np.float32)
        return SampleIndices(ids, ring.positions(ids, rows)), {"probabilities": probabilities}

    def spawn_rng(self) -> np.random.Generator:
        return make_rng(0)  # unused: the order is fixed

    def on_add(self, ring: Ring, first_id: int, num_steps: int) -> None:
        pass

    def on_clear(self, ring: Ring) -> None:
        self.next_start, self.next_row = 0, 0

    def state_dict(self) -> dict[str, Any]:
        """The read cursor and the count of dropped steps, ints."""
        return {"next_start": self.next_start, "next_row": self.next_row,
                "dropped": self.dropped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: later reads are the original's."""
        self.next_start = int(state["next_start"])
        self.next_row = int(state["next_row"])
        self.dropped = int(state["dropped"])
