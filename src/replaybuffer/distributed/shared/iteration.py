"""Iteration over a shared buffer: :class:`SharedIteration`, the ``as_dataset`` and
``spawn_rng`` of :class:`~replaybuffer.distributed.SharedReplayBuffer` (random streams
of ``get_next`` elements, :class:`~replaybuffer.dataset.RandomStream`)."""

from __future__ import annotations

from typing import Any, Iterable, cast

import numpy as np

from replaybuffer.arguments import positive_or_none
from replaybuffer.dataset import PacedSource, RandomStream
from replaybuffer.distributed.shared.queue import QueueWindows
from replaybuffer.distributed.shared.sampling import SharedSampler
from replaybuffer.distributed.shared.windows import WindowChoice
from replaybuffer.protocols import BufferInfo
from replaybuffer.sampling.sampler import make_rng


class SharedIteration:
    """Dataset streams of a shared buffer."""

    _sampler: SharedSampler
    _queue: QueueWindows | None

    def _window_choice(self, within_episodes: bool) -> WindowChoice | None: ...

    def spawn_rng(self) -> np.random.Generator:
        """A generator for a dataset stream, seeded from this process's generator."""
        return make_rng(np.random.SeedSequence(self._sampler.process_rng().integers(0, 2**63 - 1)))

    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None, prefetch: int | None = None, *,
                   within_episodes: bool = False) -> Iterable[tuple[Any, BufferInfo]]:
        """An endless stream of ``get_next(sample_batch_size, num_steps)`` elements,
        sampled ahead by ``num_parallel_calls`` threads of this process (see
        :class:`~replaybuffer.dataset.RandomStream`); with a ``Queue`` limiter read on
        pull (workers would consume windows out of order).

        Raises:
            ValueError: ``within_episodes`` on a buffer without ``track_episodes`` (or
                with a ``Queue``), at once rather than at the first pull.
        """
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        self._window_choice(within_episodes)
        if self._queue is not None:
            num_parallel_calls, prefetch = None, 0
        return RandomStream(cast(PacedSource, self), sample_batch_size, num_steps,
                            num_parallel_calls, prefetch, within_episodes)
