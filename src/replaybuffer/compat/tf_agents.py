"""TF-Agents' replay-buffer names over replaybuffer's implementation.

Code written for ``tf_agents.replay_buffers.py_uniform_replay_buffer`` ports by
changing the import::

    from replaybuffer.compat.tf_agents import PyUniformReplayBuffer

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

``Trajectory``, ``StepType`` and the ``trajectory`` constructors (``first``, ``mid``,
``last``, ``single_step``, ``boundary``) keep TF-Agents' meaning. The drivers
``DynamicStepDriver``/``DynamicEpisodeDriver`` step gymnasium environments and keep
their state between ``run()`` calls; truncation keeps discount 1, termination 0.
"""

from __future__ import annotations

from typing import Any

from replaybuffer.buffers import BufferInfo, ReplayBuffer, UniformReplayBuffer
from replaybuffer.collect import trajectory
from replaybuffer.collect.driver import EpisodeDriver, StepDriver
from replaybuffer.collect.trajectory import StepType, Trajectory
from replaybuffer.specs import ArraySpec, BoundedArraySpec

# Drivers keep their environment state between runs, so run() takes no time_step and
# returns the number of steps (or episodes) collected.
DynamicStepDriver = StepDriver
DynamicEpisodeDriver = EpisodeDriver

__all__ = ["ArraySpec", "BoundedArraySpec", "BufferInfo", "DynamicEpisodeDriver",
           "DynamicStepDriver", "PyHashedReplayBuffer", "PyUniformReplayBuffer",
           "ReplayBuffer", "StepType", "Trajectory", "trajectory"]


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
        super().__init__(data_spec, batch_size=1, max_length=capacity, storage=storage,
                         device=device, seed=seed, track_episodes=track_episodes,
                         frame_stack=frame_stack, stack_axis=stack_axis)

    @classmethod
    def _construct(cls, data_spec: Any, batch_size: int, max_length: int, storage: str,
                   device: Any, config: dict[str, Any]) -> "PyUniformReplayBuffer":
        return cls(data_spec, max_length, storage=storage, device=device, **config)

    def add_batch(self, items: Any) -> None:
        """Append ``n`` items given with a leading dimension ``n`` (any ``n >= 0``)."""
        leaves = self._flatten_items(items, "add_batch")
        n = self._leading_dim(leaves, 0, "add_batch", "[n]")
        # One row: [n, ...] is already the time-major layout the ring writes.
        self._write_steps(self._convert(leaves, (n,), f"[n={n}]"), n)

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
