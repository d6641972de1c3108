"""Replay beyond one process: :class:`SharedReplayBuffer` (processes on one machine,
shared memory; standard library and numpy only) and :class:`RayReplayBuffer` (shards
as Ray actors; imports ray, the ``ray`` extra)."""

from typing import Any

from replaybuffer.distributed.errors import (BufferClosedError, NotSupportedError,
                                             ShardsUnavailableError, ShardStartError)
from replaybuffer.distributed.shared import SharedReplayBuffer

__all__ = ["SharedReplayBuffer", "BufferClosedError", "NotSupportedError",
           "ShardsUnavailableError", "ShardStartError"]


def __getattr__(name: str) -> Any:  # Ray is imported only when its classes are asked for
    if name in ("RayReplayBuffer", "ShardWriter", "ShardLoss"):
        from replaybuffer.distributed import ray_shards

        return getattr(ray_shards, name)
    raise AttributeError(f"module 'replaybuffer.distributed' has no attribute {name!r}")
