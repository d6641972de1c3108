"""The public buffer classes: thin compositions of a storage and a sampler."""

from replaybuffer.buffers.base import BufferInfo, ReplayBuffer
from replaybuffer.buffers.prioritized import PrioritizedReplayBuffer
from replaybuffer.buffers.queue import FIFOReplayBuffer, ShuffledReplayBuffer
from replaybuffer.buffers.transitions import (PrioritizedTransitionReplayBuffer,
                                              TransitionReplayBuffer, Transitions)
from replaybuffer.buffers.uniform import UniformReplayBuffer

__all__ = ["BufferInfo", "FIFOReplayBuffer", "PrioritizedReplayBuffer",
           "PrioritizedTransitionReplayBuffer", "ReplayBuffer", "ShuffledReplayBuffer",
           "TransitionReplayBuffer", "Transitions", "UniformReplayBuffer"]
