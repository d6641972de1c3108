"""Uniform sampling with replacement over every valid window of every row."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.sampling.episodes import EpisodeIndex, no_window_error
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices, check_seed, make_rng


class UniformSampler:
    """Each valid ``(start id, row)`` pair with probability ``1 / (starts * batch_size)``.

    One integer draw per sample picks both the start and the row, so a sample
    costs one call into the generator.

    Args:
        seed: seed of the generator (``None``: fresh entropy).
    """

    def __init__(self, seed: int | None = None):
        # Checked here so that a bad seed= is named, not left to numpy's SeedSequence.
        self._rng = make_rng(None if seed is None else check_seed(seed))

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None,
               episodes: EpisodeIndex | None = None
               ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        if episodes is not None:
            return self._sample_within(ring, sample_batch_size, num_steps, rng, episodes)
        lo, hi = ring.valid_start_range(num_steps)
        batch, length = ring.batch_size, ring.max_length
        n = (hi - lo) * batch
        # Raw 64-bit draws reduced modulo n: half the cost of Generator.integers, with a
        # bias below n / 2**64 (under 1e-13 for a billion windows).
        raw = (rng or self._rng).bit_generator.random_raw(sample_batch_size)
        draws = (raw % np.uint64(n)).view(np.int64)
        # Valid starts are the slots lo % L, ..., in slot-major order, so the draw is an
        # offset from the first valid position; only a range that wraps needs a modulo.
        if batch == 1:
            ids = draws + lo if lo else draws
            positions = ids % length if hi > length else ids
        else:
            ids = draws // batch
            ids += lo
            positions = draws + (lo % length) * batch
            if (lo % length) * batch + n > ring.capacity:
                np.remainder(positions, ring.capacity, out=positions)
        probabilities = np.empty(sample_batch_size, np.float32)
        probabilities.fill(1.0 / n)  # empty + fill: half the cost of np.full
        return SampleIndices(ids, positions), {"probabilities": probabilities}

    def _sample_within(self, ring: Ring, sample_batch_size: int, num_steps: int,
                       rng: np.random.Generator | None, episodes: EpisodeIndex
                       ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        """Uniform over the windows that stay within one episode (exact, no rejection)."""
        n = episodes.count(ring, num_steps)
        if n == 0:
            raise no_window_error(num_steps)
        raw = (rng or self._rng).bit_generator.random_raw(sample_batch_size)
        ids, positions = episodes.sample_starts(ring, num_steps, raw)
        probabilities = np.empty(sample_batch_size, np.float32)
        probabilities.fill(1.0 / n)  # empty + fill: half the cost of np.full
        return SampleIndices(ids, positions), {"probabilities": probabilities}

    def spawn_rng(self) -> np.random.Generator:
        return make_rng(int(self._rng.integers(0, 2**63 - 1)))

    def on_add(self, ring: Ring, first_id: int, num_steps: int) -> None:
        pass

    def on_clear(self, ring: Ring) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """``{"rng": the generator's state}`` (a fresh dict)."""
        return {"rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: later draws are the original's."""
        self._rng.bit_generator.state = state["rng"]
