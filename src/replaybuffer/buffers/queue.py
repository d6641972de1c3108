"""Buffer variants that read without replacement: a FIFO queue and shuffled epochs."""

from __future__ import annotations

import os
from typing import Any

from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.rate_limiter import RateLimiter
from replaybuffer.sampling.fifo import FIFOSampler
from replaybuffer.sampling.shuffled import ShuffledSampler


class FIFOReplayBuffer(ReplayBuffer):
    """Reads every stored window once, oldest first, like a queue.

    Same layout and API as :class:`~replaybuffer.UniformReplayBuffer`. ``get_next(S, T)``
    returns the ``S`` oldest unread windows (start id, then row; a row's next window
    starts ``T`` steps later) and raises ``EmptyBufferError`` when fewer are unread.
    Steps overwritten before they were read are skipped and counted in
    :attr:`dropped`. Useful to hand on-policy data to a learner in order.
    ``as_dataset`` reads on pull: prefetch workers would consume windows out of order.

    Args:
        data_spec, batch_size, max_length, storage, device, path: as for
            :class:`~replaybuffer.ReplayBuffer`.
        rate_limiter: a :class:`~replaybuffer.RateLimiter` pacing inserts and samples
            (as setting :attr:`rate_limiter`).
    """

    _sampler: FIFOSampler

    def __init__(self, data_spec: Any, batch_size: int = 1, max_length: int = 1000, *,
                 storage: str = "numpy", device: Any = None,
                 path: str | os.PathLike[str] | None = None,
                 rate_limiter: RateLimiter | None = None):
        super().__init__(data_spec, batch_size, max_length, storage=storage, device=device,
                         sampler=FIFOSampler(), path=path, rate_limiter=rate_limiter)
        self._files_ready()

    @property
    def dropped(self) -> int:
        """Steps (summed over rows) overwritten before they were read."""
        return self._sampler.dropped

    def unread(self, num_steps: int = 1) -> int:
        """How many windows of ``num_steps`` are waiting to be read."""
        with self._lock:
            return self._sampler.unread(self._ring, num_steps)


class ShuffledReplayBuffer(ReplayBuffer):
    """Samples without replacement, in epochs over the stored windows.

    Each epoch visits every window stored when it began exactly once, in random order;
    see :mod:`replaybuffer.sampling.shuffled`. ``BufferInfo.probabilities`` are
    ``1 / windows_in_epoch``.

    Args:
        seed: seeds the shuffles.
        rate_limiter: a :class:`~replaybuffer.RateLimiter` pacing inserts and samples
            (as setting :attr:`rate_limiter`).
    """

    _sampler: ShuffledSampler

    def __init__(self, data_spec: Any, batch_size: int = 1, max_length: int = 1000, *,
                 storage: str = "numpy", device: Any = None, seed: int | None = None,
                 path: str | os.PathLike[str] | None = None,
                 rate_limiter: RateLimiter | None = None):
        super().__init__(data_spec, batch_size, max_length, storage=storage, device=device,
                         sampler=ShuffledSampler(seed), path=path, rate_limiter=rate_limiter)
        self._seed = seed
        self._files_ready()

    @property
    def epoch(self) -> int:
        """Epochs begun so far."""
        return self._sampler.epoch

    def constructor_config(self) -> dict[str, Any]:
        return {"seed": self._seed}
