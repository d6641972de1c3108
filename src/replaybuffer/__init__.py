"""replaybuffer: experience replay for reinforcement learning.

Quick start::

    import numpy as np
    import replaybuffer as rb

    spec = (rb.ArraySpec((3,), np.float32, "action"),
            (rb.ArraySpec((5,), np.float32, "lidar"),
             rb.ArraySpec((3, 2), np.float32, "camera")))
    buffer = rb.UniformReplayBuffer(spec, batch_size=32, max_length=1000)
    buffer.add_batch(...)                       # leaves shaped [32, *spec.shape]
    items, info = buffer.get_next(sample_batch_size=4, num_steps=2)
    for items, info in buffer.as_dataset(sample_batch_size=4, num_steps=2): ...

``import replaybuffer`` needs only numpy and optree; torch, gymnasium and the rest
are imported by the parts that use them.
"""

from replaybuffer.buffers import (BufferInfo, FIFOReplayBuffer, HERBuffer, HERTransitions,
                                  PrioritizedReplayBuffer, PrioritizedTransitionReplayBuffer,
                                  ReplayBuffer, RolloutBatch, RolloutBuffer,
                                  ShuffledReplayBuffer, TransitionReplayBuffer, Transitions,
                                  UniformReplayBuffer)
# The collection flow's names, as TF-Agents users reach for them (no gymnasium import:
# the drivers take whatever env they are given).
from replaybuffer.collect import EpisodeDriver, StepDriver, StepType, Trajectory
from replaybuffer.errors import CheckpointError, EmptyBufferError, ReplayBufferError, SpecError
from replaybuffer.persist import checkpoints, load, reopen
from replaybuffer.protocols import Buffer, Checkpointable, PrioritizedBuffer
from replaybuffer.rate_limiter import (
    MinSize,
    Queue,
    RateLimitedError,
    RateLimiter,
    RateLimiterStats,
    SampleToInsertRatio,
)
from replaybuffer.specs import (
    ArraySpec,
    BoundedArraySpec,
    as_data_spec,
    spec_from_example,
    spec_from_space,
    spec_from_tensor_spec,
)

__version__ = "0.1.0"

__all__ = [
    "ArraySpec",
    "BoundedArraySpec",
    "Buffer",
    "Checkpointable",
    "PrioritizedBuffer",
    "BufferInfo",
    "CheckpointError",
    "EmptyBufferError",
    "FIFOReplayBuffer",
    "HERBuffer",
    "HERTransitions",
    "PrioritizedReplayBuffer",
    "PrioritizedTransitionReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferError",
    "RolloutBatch",
    "RolloutBuffer",
    "ShuffledReplayBuffer",
    "SpecError",
    "TransitionReplayBuffer",
    "Transitions",
    "UniformReplayBuffer",
    "as_data_spec",
    "load",
    "checkpoints",
    "reopen",
    "StepDriver",
    "EpisodeDriver",
    "Trajectory",
    "StepType",
    "RateLimiter",
    "MinSize",
    "SampleToInsertRatio",
    "Queue",
    "RateLimitedError",
    "RateLimiterStats",
    "spec_from_example",
    "spec_from_space",
    "spec_from_tensor_spec",
]
