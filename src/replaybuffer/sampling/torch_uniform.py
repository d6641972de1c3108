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


# Draws are 62 random bits taken modulo the number of valid starts: one formula whether
# that number is a Python int (here) or a device tensor that a captured CUDA graph reads
# (captured_draws.py, where no Python int may be baked in), so both give the same
# starts for the same generator state. The modulo's bias is below n / 2**62.
DRAW_BITS = 1 << 62


def draw_bits(generator: torch.Generator, count: int, device: torch.device) -> torch.Tensor:
    """``count`` uniform int64 draws in ``[0, 2**62)`` from ``generator`` on ``device``."""
    return torch.randint(0, DRAW_BITS, (count,), generator=generator, device=device)


def starts_from_bits(bits: torch.Tensor, lo: int | torch.Tensor, n: int | torch.Tensor,
                     batch: int, length: int, capacity: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Start ids and positions (int64 ``[S]``) of the windows that ``bits``
    (:func:`draw_bits`, consumed in place) pick among the ``n`` valid ``(start, row)``
    pairs from start id ``lo`` of a ring of ``batch`` rows by ``length`` steps.

    ``lo`` and ``n`` are Python ints or 0-d int64 tensors on the bits' device (a
    captured graph's inputs): the same arithmetic, the same result. With one row the
    positions are the ids themselves, not yet taken modulo the capacity (the torch
    storage takes it as it gathers, once).
    """
    draws = bits.remainder_(n)
    if batch == 1:
        # Until the ring wraps the eager lo is 0: a launch saved.
        ids = draws.add_(lo) if isinstance(lo, torch.Tensor) or lo else draws
        return ids, ids
    ids = torch.div(draws, batch, rounding_mode="floor").add_(lo)
    positions = draws.add_((lo % length) * batch).remainder_(capacity)
    return ids, positions


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
        bits = draw_bits(self._generator.for_call(rng), sample_batch_size, self.device)
        ids, positions = starts_from_bits(bits, lo, n, batch, length, ring.capacity)
        probabilities = torch.full((sample_batch_size,), 1.0 / n, dtype=torch.float32,
                                   device=self.device)
        return SampleIndices(ids, positions), {"probabilities": probabilities}  # type: ignore[arg-type]

    @property
    def generator(self) -> torch.Generator:
        """The device generator the draws come from (a captured draw registers it with
        its CUDA graph: :mod:`replaybuffer.sampling.captured_draws`)."""
        return self._generator.generator

    def state_dict(self) -> dict[str, Any]:
        """The host generator's state and the device generator's (uint8 ``[n]``)."""
        # "rng" as the host sampler saves it, so either sampler restores the other's state.
        return {"rng": self._rng.bit_generator.state, "device_rng": self._generator.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (or a host sampler's: the device generator
        is then seeded from the restored host one): later draws are the original's."""
        self._rng.bit_generator.state = state["rng"]
        self._generator.restore(state, self._rng)
