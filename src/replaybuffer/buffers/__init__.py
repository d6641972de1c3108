"""The public buffer classes: thin compositions of a storage and a sampler."""

from replaybuffer.buffers.base import BufferInfo, ReplayBuffer
from replaybuffer.buffers.prioritized import PrioritizedReplayBuffer
from replaybuffer.buffers.uniform import UniformReplayBuffer

__all__ = ["BufferInfo", "PrioritizedReplayBuffer", "ReplayBuffer", "UniformReplayBuffer"]
