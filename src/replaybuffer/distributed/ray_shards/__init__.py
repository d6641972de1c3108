"""Replay sharded over Ray actors: :class:`RayReplayBuffer` (:mod:`.buffer`) and its
parts. Imports ray (the ``ray`` extra)."""

from replaybuffer.distributed.errors import (NotSupportedError, ShardsUnavailableError,
                                             ShardStartError)
from replaybuffer.distributed.ray_shards.buffer import RayReplayBuffer
from replaybuffer.distributed.ray_shards.health import ShardLoss
from replaybuffer.distributed.ray_shards.writer import ShardWriter
from replaybuffer.distributed.ray_shards.sampling import MASS_REFRESH_S, SHARD_WAIT_S
from replaybuffer.distributed.ray_shards.ordering import GAP_S
from replaybuffer.distributed.ray_shards.pipeline import ShardStream
from replaybuffer.distributed.ray_shards.shard import INCARNATION_SHIFT, LOCAL_MASK

__all__ = ["RayReplayBuffer", "ShardWriter", "ShardLoss", "ShardsUnavailableError",
           "ShardStartError", "NotSupportedError", "MASS_REFRESH_S", "SHARD_WAIT_S",
           "GAP_S", "INCARNATION_SHIFT", "LOCAL_MASK", "ShardStream"]
