"""A seeded ``torch.Generator`` on a sampler's device, with its state in a state dict.

Device-side samplers (:mod:`replaybuffer.sampling.torch_uniform`,
:mod:`replaybuffer.sampling.torch_prioritized`) draw with it so that indices are born
on the device the data lives on: no host round trip per batch. Its state is saved as
a uint8 numpy array, so a restored sampler draws bit for bit what the original would
have on the same device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class DeviceGenerator:
    """A ``torch.Generator`` on ``device`` seeded from ``seed`` (``None``: fresh entropy).

    Args:
        device: where the draws are made (the storage's device).
        seed: a non-negative int, or ``None``.
    """

    def __init__(self, device: torch.device, seed: int | None = None):
        self.device = device
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(seed))

    def for_call(self, rng: np.random.Generator | None) -> torch.Generator:
        """This generator, or (``rng`` given: a dataset's per-element generator) a fresh
        one seeded from ``rng``, so that elements stay reproducible in any order."""
        if rng is None:
            return self.generator
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(rng.integers(0, 2**63 - 1)))
        return generator

    def state(self) -> np.ndarray:
        """The generator's state, uint8 ``[n]`` (a copy)."""
        state: np.ndarray = self.generator.get_state().numpy().copy()
        return state

    def restore(self, state: dict[str, Any], rng: np.random.Generator) -> None:
        """Restore the :meth:`state` saved as ``state["device_rng"]``; from a state without
        one (a host sampler's), or one of another kind of device, seed from ``rng``
        (the sampler's restored host generator) instead, reproducibly."""
        saved = state.get("device_rng")
        if saved is not None:
            try:
                self.generator.set_state(torch.from_numpy(np.array(saved, np.uint8)))
                return
            except RuntimeError:  # another device type's generator (CPU vs CUDA)
                pass
        self.generator.manual_seed(int(rng.integers(0, 2**63 - 1)))


def refuse_episodes(episodes: Any) -> None:
    """Device samplers draw no windows within episodes: the episode index lives on the
    host. Raises ``ValueError`` when ``episodes`` (an EpisodeIndex) is given."""
    if episodes is not None:
        raise ValueError("within_episodes sampling runs on the host: build the buffer "
                         "with sample_on_device=False")
