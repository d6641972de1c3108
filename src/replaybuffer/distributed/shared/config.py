"""What a shared buffer is made of, checked once: :class:`SharedConfig`.

The configuration is also the buffer's handle: it is what a pickled
:class:`~replaybuffer.distributed.SharedReplayBuffer` carries to another process,
which maps the files under ``path`` with it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replaybuffer.distributed.shared.frame_ring import FrameOptions
from replaybuffer.rate_limiter import Queue, RateLimiter
from replaybuffer.specs import as_data_spec


@dataclass(frozen=True)
class SharedConfig:
    """A shared buffer's arguments, checked (see
    :class:`~replaybuffer.distributed.SharedReplayBuffer` for each), and the directory
    of its files (``path``)."""

    data_spec: Any
    num_rows: int
    max_length: int
    prioritized: bool
    alpha: float
    beta: float
    rate_limiter: RateLimiter | None
    seed: int | None
    path: str
    frames: FrameOptions | None = None
    """Frame dedup of a stacked leaf (:mod:`.frame_ring`); ``None``: none."""

    @classmethod
    def checked(cls, data_spec: Any, num_rows: int, max_length: int, prioritized: bool,
                alpha: float, beta: float, rate_limiter: RateLimiter | None,
                path: str | os.PathLike[str] | None, seed: int | None,
                frames: tuple[str | None, int, int] = (None, 0, 16)
                ) -> tuple["SharedConfig", bool]:
        """The configuration, and whether its directory is a temporary one (made here
        under ``/dev/shm`` when ``path`` is ``None``; a given path is made if missing).
        ``frames``: ``(frame_stack, stack_axis, side_frames)`` (:class:`FrameOptions`).

        Raises:
            ValueError: a bad size, exponent or limiter (a ``Queue``, or a
                ``min_size_to_sample`` above the capacity), or a path in use; bad
                frame options (:meth:`FrameOptions.checked`, also ``SpecError``).
        """
        for name, value in (("num_rows", num_rows), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name, number in (("alpha", alpha), ("beta", beta)):
            if not (isinstance(number, (int, float)) and np.isfinite(number) and number >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {number!r}")
        if rate_limiter is not None:
            if not isinstance(rate_limiter, RateLimiter):
                raise ValueError(f"rate_limiter must be a RateLimiter, got "
                                 f"{type(rate_limiter).__name__}")
            if isinstance(rate_limiter, Queue):
                raise ValueError("a Queue rate limiter needs reads that consume items "
                                 "(FIFOReplayBuffer); a SharedReplayBuffer's samples do not")
            rate_limiter.check_capacity(int(num_rows) * int(max_length))
        data_spec = as_data_spec(data_spec)
        frame_stack, stack_axis, side_frames = frames
        options = None if frame_stack is None else FrameOptions.checked(
            data_spec, frame_stack, stack_axis, side_frames)
        if path is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            directory, temporary = Path(tempfile.mkdtemp(prefix="replaybuffer-", dir=shm)), True
        else:
            directory, temporary = Path(path), False
            if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
                raise ValueError(f"{directory} is not a new or empty directory")
            directory.mkdir(parents=True, exist_ok=True)
        config = cls(data_spec, int(num_rows), int(max_length), bool(prioritized),
                     float(alpha), float(beta), rate_limiter, seed, str(directory), options)
        return config, temporary
