"""Uniform sampling with replacement over every valid window of every row."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices, make_rng


class UniformSampler:
    """Each valid ``(start id, row)`` pair with probability ``1 / (starts * batch_size)``.

    One integer draw per sample picks both the start and the row, so a sample
    costs one call into the generator.

    Args:
        seed: seed of the generator (``None``: fresh entropy).
    """

    def __init__(self, seed: int | None = None):
        self._rng = make_rng(seed)

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None
               ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        lo, hi = ring.valid_start_range(num_steps)
        batch = ring.batch_size
        n = (hi - lo) * batch
        draws = (rng or self._rng).integers(0, n, size=sample_batch_size, dtype=np.int64)
        if batch == 1:
            starts, rows = draws + lo, np.zeros_like(draws)
        else:
            starts, rows = np.divmod(draws, batch)
            starts += lo
        probabilities = np.full(sample_batch_size, 1.0 / n, dtype=np.float32)
        return SampleIndices(starts, rows), {"probabilities": probabilities}

    def spawn_rng(self) -> np.random.Generator:
        return make_rng(int(self._rng.integers(0, 2**63 - 1)))

    def on_add(self, ring: Ring, first_id: int, num_steps: int) -> None:
        pass

    def on_clear(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["rng"]
