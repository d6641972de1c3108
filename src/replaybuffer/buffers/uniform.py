"""The uniform replay buffer: TF-Agents' layout and API over any storage backend."""

from __future__ import annotations

import os
from typing import Any

from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.buffers.captured_reads import CapturedReads
from replaybuffer.buffers.device_sampling import (captures_samples, device_choices,
                                                  samples_on_device)
from replaybuffer.rate_limiter import RateLimiter
from replaybuffer.sampling import UniformSampler
from replaybuffer.storage.base import Storage


class UniformReplayBuffer(CapturedReads, ReplayBuffer):
    """A replay buffer that samples every valid window with equal probability.

    ``batch_size`` rows of ``max_length`` steps; capacity ``batch_size * max_length``.
    A sample is a uniformly drawn (start, row) pair; ``BufferInfo.probabilities`` is
    ``1 / (valid_starts * batch_size)``.

    Args:
        data_spec: a nest of :class:`~replaybuffer.ArraySpec` (or spaces / tensor specs).
        batch_size: rows (parallel environments); each add has this leading dim.
        max_length: steps kept per row.
        storage: ``"numpy"`` returns numpy arrays; ``"torch"`` returns tensors on ``device``;
            ``"tensorflow"`` keeps the data in TensorFlow variables and returns
            ``tf.Tensor`` s, with the ring in Python (eager use only; datasets are this
            library's Python iterators). This is always this class: for a buffer whose
            whole state is TensorFlow's, usable inside ``tf.function``, with ``tf.data``
            datasets, name :class:`replaybuffer.tf.TFUniformReplayBuffer`. Or a storage
            object of your own (see :class:`ReplayBuffer`).
        device: torch device for ``storage="torch"``; TensorFlow device for
            ``storage="tensorflow"``.
        seed: seeds sampling, making ``get_next`` and ``as_dataset`` reproducible.
        track_episodes: allow ``within_episodes=True`` reads (see :class:`ReplayBuffer`).
        frame_stack, stack_axis: store the named stacked-frame leaf deduplicated (see
            :class:`ReplayBuffer`).
        sample_on_device: draw samples on the torch storage's device (ids and
            probabilities come back as tensors there, with no host round trip); default
            ``None``: for torch storage on a GPU (without ``track_episodes``). See
            :mod:`replaybuffer.buffers.device_sampling`.
        capture_samples: serve ``get_next`` on the device from a recorded draw and
            gather per ``(sample_batch_size, num_steps)`` (a CUDA graph: one replay
            and one copy out per call; the same batches as without), see
            :mod:`replaybuffer.buffers.captured_reads`; ``True`` records, ``None``
            (the default) and ``False`` keep every draw eager. ``True`` where the
            buffer cannot record is a ``ValueError``.
        rate_limiter: a :class:`~replaybuffer.RateLimiter` pacing inserts and samples
            (the same as setting :attr:`rate_limiter` afterwards).

    Example:
        >>> import numpy as np, replaybuffer as rb
        >>> buf = rb.UniformReplayBuffer(rb.ArraySpec((3,), np.float32), batch_size=2,
        ...                              max_length=10, seed=0)
        >>> buf.add_batch(np.ones((2, 3), np.float32))
        >>> items, info = buf.get_next(sample_batch_size=4)
        >>> items.shape, info.probabilities.tolist()
        ((4, 3), [0.5, 0.5, 0.5, 0.5])
    """

    def __init__(self, data_spec: Any, batch_size: int = 1, max_length: int = 1000, *,
                 storage: str | Storage = "numpy", device: Any = None, seed: int | None = None,
                 track_episodes: bool = False, frame_stack: str | None = None,
                 stack_axis: int = 0, path: str | os.PathLike[str] | None = None,
                 sample_on_device: bool | None = None,
                 rate_limiter: RateLimiter | None = None,
                 capture_samples: bool | None = None):
        super().__init__(data_spec, batch_size, max_length, storage=storage, device=device,
                         sampler=UniformSampler(seed), track_episodes=track_episodes,
                         frame_stack=frame_stack, stack_axis=stack_axis, path=path,
                         rate_limiter=rate_limiter)
        on_device = samples_on_device(self.storage, device, sample_on_device, track_episodes)
        if on_device:
            from replaybuffer.sampling.torch_uniform import TorchUniformSampler

            self._sampler = TorchUniformSampler(self.device, seed)
        if captures_samples(capture_samples, on_device, self.device):
            self.record_samples(capture_samples is True)
        self._seed = seed
        self._saved_choices = {"frame_stack": frame_stack, "stack_axis": stack_axis,
                               **device_choices(sample_on_device, on_device,
                                                capture_samples)}
        self._files_ready()

    def constructor_config(self) -> dict[str, Any]:
        return {"seed": self._seed, "track_episodes": self._episodes is not None,
                **self._saved_choices}
