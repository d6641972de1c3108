"""Uniform sampling drawn on the storage's device (torch): indices never visit the host.

The distribution and the index arithmetic are :class:`~replaybuffer.sampling.uniform.
UniformSampler`'s (one integer draw per sample picks start and row); the draws come
from a ``torch.Generator`` on the device, and ids, positions and probabilities are
device tensors that the torch storage gathers with directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from replaybuffer.sampling.episodes import EpisodeIndex
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices
from replaybuffer.sampling.torch_generator import DeviceGenerator, refuse_episodes
from replaybuffer.sampling.uniform import UniformSampler


class TorchUniformSampler(UniformSampler):
    """Each valid ``(start id, row)`` pair with probability ``1 / (starts * batch_size)``,
    drawn on ``device``.

    ``sample`` returns int64 ``[S]`` ids and positions and float32 ``[S]``
    probabilities, all tensors on ``device``. With one row the positions are the ids
    themselves, not yet taken modulo the capacity (the torch storage takes it as it
    gathers, once). Windows within episodes are not drawn
    here (the episode index lives on the host): buffers that track episodes sample on
    the host.

    Args:
        device: the storage's device.
        seed: seeds the device generator (``None``: fresh entropy).
    """

    def __init__(self, device: torch.device, seed: int | None = None):
        super().__init__(seed)  # its generator: spawn_rng (datasets' per-element ones)
        self.device = device
        self._generator = DeviceGenerator(device, seed)

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None,
               episodes: EpisodeIndex | None = None
               ) -> tuple[SampleIndices, dict[str, Any]]:
        refuse_episodes(episodes)
        lo, hi = ring.valid_start_range(num_steps)
        batch, length = ring.batch_size, ring.max_length
        n = (hi - lo) * batch
        generator = self._generator.for_call(rng)
        if batch == 1:
            # One kernel: randint(lo, lo + n) is randint(0, n) + lo, draw for draw. The
            # position is the id modulo the capacity, which the torch storage takes as
            # it gathers: the ids serve as positions (a kernel saved), as the read path
            # does for windows of one row.
            ids = torch.randint(lo, lo + n, (sample_batch_size,), generator=generator,
                                device=self.device)
            positions = ids
        else:
            draws = torch.randint(0, n, (sample_batch_size,), generator=generator,
                                  device=self.device)
            ids = draws // batch + lo
            positions = (draws + (lo % length) * batch) % ring.capacity
        probabilities = torch.full((sample_batch_size,), 1.0 / n, dtype=torch.float32,
                                   device=self.device)
        return SampleIndices(ids, positions), {"probabilities": probabilities}  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """The host generator's state and the device generator's (uint8 ``[n]``)."""
        # "rng" as the host sampler saves it, so either sampler restores the other's state.
        return {"rng": self._rng.bit_generator.state, "device_rng": self._generator.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (or a host sampler's: the device generator
        is then seeded from the restored host one): later draws are the original's."""
        self._rng.bit_generator.state = state["rng"]
        self._generator.restore(state, self._rng)
