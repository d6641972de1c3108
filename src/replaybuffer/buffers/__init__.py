"""The public buffer classes: thin compositions of a storage and a sampler."""

from replaybuffer.protocols import BufferInfo
from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.buffers.her import HERBuffer, HERTransitions
from replaybuffer.buffers.prioritized import PrioritizedReplayBuffer
from replaybuffer.buffers.queue import FIFOReplayBuffer, ShuffledReplayBuffer
from replaybuffer.buffers.rollout import RolloutBatch, RolloutBuffer
from replaybuffer.buffers.transitions import (PrioritizedTransitionReplayBuffer,
                                              TransitionReplayBuffer, Transitions)
from replaybuffer.buffers.uniform import UniformReplayBuffer

__all__ = ["BufferInfo", "FIFOReplayBuffer", "HERBuffer", "HERTransitions",
           "PrioritizedReplayBuffer", "PrioritizedTransitionReplayBuffer", "ReplayBuffer",
           "RolloutBatch", "RolloutBuffer", "ShuffledReplayBuffer", "TransitionReplayBuffer",
           "Transitions", "UniformReplayBuffer"]
