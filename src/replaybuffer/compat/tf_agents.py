"""TF-Agents' replay-buffer names over replaybuffer's implementation.

Code written for ``tf_agents.replay_buffers.py_uniform_replay_buffer`` or
``tf_uniform_replay_buffer`` ports by changing the import::

    from replaybuffer.compat.tf_agents import PyUniformReplayBuffer
    from replaybuffer.compat.tf_agents import TFUniformReplayBuffer  # imports tensorflow

``TFUniformReplayBuffer(data_spec, batch_size, max_length=1000)`` takes a nest of
``tf.TensorSpec`` s and keeps its state in TensorFlow variables (it is
:class:`replaybuffer.tf.TFUniformReplayBuffer`, loaded on first use so that importing
this module never imports TensorFlow). Its ``as_dataset`` is a ``tf.data.Dataset``.

Differences from TF-Agents, each a fix of a reported problem:

* ``get_next`` and dataset elements return ``(items, BufferInfo)`` as the TF buffer
  does, not bare items (tensorflow/agents#797).
* ``add_batch`` accepts any leading batch dimension ``n`` and stores the ``n`` items
  in order, instead of raising for ``n != 1`` (tensorflow/agents#198).
* ``gather_all`` returns only stored items, oldest first, ``[1, size, ...]``, rather
  than every slot in storage order.
* Sampling an empty buffer raises ``EmptyBufferError`` instead of returning
  uninitialised arrays; ``num_frames()`` works; ``as_dataset`` supports
  ``num_parallel_calls`` and the single deterministic pass.

``TFUniformReplayBuffer`` differs from TF-Agents' in the fixes the numpy buffer makes
(see the README): the deterministic pass keeps rows apart after the ring wraps with
``batch_size > 1``, keeps partial windows and groups unless ``drop_remainder`` and never
lets a window straddle two row groups; ``num_steps`` longer than a row raises
``EmptyBufferError`` saying so (in a graph, ``InvalidArgumentError`` with that message);
``capacity`` is a Python int and ``data_spec`` holds :class:`ArraySpec` s; bad items
raise ``SpecError`` naming the leaf (when a ``tf.function`` is traced) instead of a
scatter error. Its variables go where TensorFlow places them unless ``device=`` names
one (TF-Agents pins ``"cpu:*"``), sampling is seeded with ``seed=``, and ``table_fn``
is not supported.

``Trajectory``, ``StepType`` and the ``trajectory`` constructors (``first``, ``mid``,
``last``, ``single_step``, ``boundary``) keep TF-Agents' meaning. The drivers
``DynamicStepDriver``/``DynamicEpisodeDriver`` step gymnasium environments and keep
their state between ``run()`` calls; truncation keeps discount 1, termination 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.buffers import BufferInfo, ReplayBuffer, UniformReplayBuffer
from replaybuffer.collect import trajectory
from replaybuffer.collect.driver import EpisodeDriver, StepDriver
from replaybuffer.collect.trajectory import StepType, Trajectory
from replaybuffer.specs import ArraySpec, BoundedArraySpec

# Drivers keep their environment state between runs, so run() takes no time_step and
# returns the number of steps (or episodes) collected.
DynamicStepDriver = StepDriver
DynamicEpisodeDriver = EpisodeDriver

# TFUniformReplayBuffer is left out of __all__: a star import would import tensorflow.
__all__ = ["ArraySpec", "BoundedArraySpec", "BufferInfo", "DynamicEpisodeDriver",
           "DynamicStepDriver", "PyHashedReplayBuffer", "PyUniformReplayBuffer",
           "ReplayBuffer", "StepType", "Trajectory", "trajectory"]


def __getattr__(name: str) -> Any:
    # TFUniformReplayBuffer imports tensorflow, so it is loaded when first asked for.
    if name == "TFUniformReplayBuffer":
        from replaybuffer.tf.buffer import TFUniformReplayBuffer

        return TFUniformReplayBuffer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PyUniformReplayBuffer(UniformReplayBuffer):
    """A numpy-backed uniform buffer of ``capacity`` items in one row.

    Args:
        data_spec: a nest of :class:`ArraySpec`.
        capacity: items kept; older items are overwritten first.
        seed: seeds sampling.
    """

    def __init__(self, data_spec: Any, capacity: int, *, seed: int | None = None,
                 storage: str = "numpy", device: Any = None, track_episodes: bool = False,
                 frame_stack: str | None = None, stack_axis: int = 0):
        # The core names its own argument (max_length); the user wrote capacity.
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or capacity < 1:
            raise ValueError(f"{type(self).__name__}: capacity must be a positive int, "
                             f"got {capacity!r}")
        super().__init__(data_spec, batch_size=1, max_length=capacity, storage=storage,
                         device=device, seed=seed, track_episodes=track_episodes,
                         frame_stack=frame_stack, stack_axis=stack_axis)

    @classmethod
    def rebuild(cls, data_spec: Any, batch_size: int, max_length: int, storage: str,
                   device: Any, config: dict[str, Any]) -> "PyUniformReplayBuffer":
        return cls(data_spec, max_length, storage=storage, device=device, **config)

    # TF-Agents' signature: any number of items, nothing returned (no timeout or block).
    def add_batch(self, items: Any) -> None:  # type: ignore[override]
        """Append ``n`` items given with a leading dimension ``n`` (any ``n >= 0``)."""
        leaves = self.flatten_items(items, "add_batch")
        n = self.leading_dim(leaves, 0, "add_batch", "[n]")
        # One row: [n, ...] is already the time-major layout the ring writes.
        self.write_steps(self.convert_leaves(leaves, (n,), f"[n={n}]"), n)

    @property
    def size(self) -> int:
        """Items held."""
        return self.num_frames()


class PyHashedReplayBuffer(PyUniformReplayBuffer):
    """TF-Agents' frame-deduplicating python buffer: a :class:`Trajectory` whose
    ``observation`` stacks frames on its last axis (``[H, W, K]``) keeps each frame once.

    Unlike TF-Agents' version (a dict of frames keyed by Python's salted ``hash``), frames
    live in a ring next to the steps, so a restored buffer deduplicates as before, and
    equal hashes cannot alias different frames; see :mod:`replaybuffer.storage.frames`.
    """

    def __init__(self, data_spec: Any, capacity: int, *, seed: int | None = None,
                 stack_axis: int = -1, **kwargs: Any):
        if not isinstance(data_spec, Trajectory):
            raise ValueError("PyHashedReplayBuffer needs a Trajectory data_spec, got "
                             f"{type(data_spec).__name__}")
        kwargs.pop("frame_stack", None)
        super().__init__(data_spec, capacity, seed=seed, frame_stack="observation",
                         stack_axis=stack_axis, **kwargs)
