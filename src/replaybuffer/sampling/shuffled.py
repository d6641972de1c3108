"""Sampling without replacement, in epochs over the stored windows.

An epoch is a random permutation of every valid window (start id, row) at the moment
it begins. Samples take the next windows of the permutation; when it runs out, a new
epoch over what is stored then begins, and a batch that straddles two epochs takes
the rest of the old one and the start of the new one. Windows overwritten during an
epoch are skipped; steps added during an epoch join the next one. Asking for another
``num_steps`` starts a new epoch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices, make_rng


class ShuffledSampler:
    """Each window once per epoch, in random order.

    ``probabilities`` are ``1 / windows_in_epoch``. ``epoch`` counts epochs begun.

    Args:
        seed: seed of the generator that shuffles each epoch.
    """

    def __init__(self, seed: int | None = None):
        self._rng = make_rng(seed)
        self.epoch = 0
        self.key_base = 0
        self._order = np.zeros(0, np.int64)  # keys (key_base + id) * B + row, epoch order
        self._cursor = 0
        self._num_steps = 0

    def _new_epoch(self, ring: Ring, num_steps: int, rng: np.random.Generator) -> None:
        lo, hi = ring.valid_start_range(num_steps)
        n = (hi - lo) * ring.batch_size
        self._order = (self.key_base + lo) * ring.batch_size + rng.permutation(n)
        self._cursor = 0
        self._num_steps = num_steps
        self.epoch += 1

    def _take(self, ring: Ring, count: int) -> np.ndarray:
        """Up to ``count`` live keys from the current epoch."""
        B = ring.batch_size
        out = []
        while count > 0 and self._cursor < len(self._order):
            chunk = self._order[self._cursor:self._cursor + count]
            self._cursor += len(chunk)
            live = chunk[chunk // B - self.key_base >= ring.oldest_id]
            out.append(live)
            count -= len(live)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None, episodes: Any = None
               ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        if episodes is not None:
            raise ValueError("within_episodes is not supported by sampling without replacement reading")
        rng = rng or self._rng
        lo, hi = ring.valid_start_range(num_steps)
        if (hi - lo) * ring.batch_size < sample_batch_size:
            raise EmptyBufferError(
                f"sampling without replacement needs {sample_batch_size} windows of "
                f"num_steps={num_steps}; the buffer holds {(hi - lo) * ring.batch_size}")
        if num_steps != self._num_steps or self._cursor >= len(self._order):
            self._new_epoch(ring, num_steps, rng)
        keys = self._take(ring, sample_batch_size)
        if len(keys) < sample_batch_size:  # the epoch ran out: continue in a new one
            self._new_epoch(ring, num_steps, rng)
            keys = np.concatenate([keys, self._take(ring, sample_batch_size - len(keys))])
        B = ring.batch_size
        ids = keys // B - self.key_base
        positions = ring.positions(ids, keys % B)
        probabilities = np.full(sample_batch_size, 1.0 / len(self._order), np.float32)
        return SampleIndices(ids, positions), {"probabilities": probabilities}

    def spawn_rng(self) -> np.random.Generator:
        return make_rng(int(self._rng.integers(0, 2**63 - 1)))

    def on_add(self, ring: Ring, first_id: int, num_steps: int) -> None:
        pass

    def on_clear(self, ring: Ring) -> None:
        self.key_base += ring.last_id + 1
        self._order = np.zeros(0, np.int64)
        self._cursor = 0

    def state_dict(self) -> dict[str, Any]:
        """The generator, the epoch's order (int64 ``[n]``, a copy) and its cursor."""
        return {"rng": self._rng.bit_generator.state, "epoch": self.epoch,
                "key_base": self.key_base, "order": self._order.copy(),
                "cursor": self._cursor, "num_steps": self._num_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: later reads are the original's."""
        self._rng.bit_generator.state = state["rng"]
        self.epoch = int(state["epoch"])
        self.key_base = int(state["key_base"])
        self._order = np.asarray(state["order"], np.int64)
        self._cursor = int(state["cursor"])
        self._num_steps = int(state["num_steps"])
