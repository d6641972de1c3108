"""Reseeding a buffer: its sampler's generators put where a buffer built with
``seed=s`` starts.

An algorithm that seeds itself after building its buffer (Stable-Baselines3's
``model.set_random_seed``) hands the seed on with :meth:`Seeding.reseed`, so one seed
reproduces a run whenever it is given.
"""

from __future__ import annotations

from replaybuffer.buffers.wiring import BufferParts
from replaybuffer.sampling.sampler import check_seed, reseeded_state


class Seeding(BufferParts):
    """``reseed(seed)`` for :class:`~replaybuffer.ReplayBuffer` and its kinds."""

    def reseed(self, seed: int) -> None:
        """Draw from now on as a buffer built with ``seed=seed`` (and the same steps,
        priorities and reads) would: the sampler's generators (host, and device for
        samplers that draw on a torch device) restart from ``seed``. What was already
        drawn stays drawn: a sampler without replacement keeps the order of its epoch in
        progress (the next epoch's comes from ``seed``); dataset streams already made
        keep their own generators. Nothing else changes (steps, priorities, counters).

        Args:
            seed: an int in ``[0, 2**64)``.

        Raises:
            TypeError, ValueError: ``seed`` is not such an int (the buffer is unchanged).
        """
        seed = check_seed(seed)
        with self._lock:
            state = reseeded_state(self._sampler.state_dict(), seed)
            if "device_rng" in state:  # only device samplers have one, so torch is there
                import torch

                from replaybuffer.sampling.torch_generator import DeviceGenerator

                device = torch.device(getattr(self._storage, "device", "cpu"))  # where it draws
                state["device_rng"] = DeviceGenerator(device, seed).state()
            self._sampler.load_state_dict(state)
            self._reseed_own(seed)

    def _reseed_own(self, seed: int) -> None:
        """Restart generators a subclass keeps beside the sampler (called under the lock)."""
