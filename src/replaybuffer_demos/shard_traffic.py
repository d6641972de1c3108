"""The Ray demo's calls into a :class:`~replaybuffer.distributed.RayReplayBuffer`: how an
actor sends its steps (:func:`send_steps`), how the learner draws its batches
(:func:`sample_stream`) and sets their priorities (:func:`send_priorities`).

They are kept here, and nowhere else in the demo, so that switching them to the
buffer's pipelined reads (``as_dataset(..., prefetch=N)`` keeping ``N`` batches in
flight), chunked writers and priority updates sent without waiting (issue 25) is a
change of these bodies.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from replaybuffer.protocols import BufferInfo

PREFETCH = 2
"""Batches the learner's stream draws ahead of the train step."""


def send_steps(writer: Any, steps: Any, priorities: np.ndarray | None = None) -> None:
    """Send ``T`` consecutive steps (leaves ``[1, T, ...]``) through a
    :class:`~replaybuffer.distributed.ShardWriter` to its shard: ``extend`` for uniform
    shards; with ``priorities`` (float ``[T]``), the shard buffer's ``add(steps,
    priorities)`` (:class:`~replaybuffer_demos.apex.ActorPrioritizedBuffer`), which
    writes the steps and their priorities in one call."""
    if priorities is None:
        writer.extend(steps)
    else:
        writer.add(steps, priorities)


def sample_stream(buffer: Any, sample_batch_size: int, num_steps: int
                  ) -> Iterator[tuple[Any, BufferInfo]]:
    """The learner's endless stream of ``(items, BufferInfo)`` batches of
    ``sample_batch_size`` windows of ``num_steps`` steps, :data:`PREFETCH` of them drawn
    ahead (their calls in flight to the shards) while the learner trains. The iterator
    has ``close()``: it ends the stream (a pending ``next`` raises ``StopIteration``)."""
    stream: Iterator[tuple[Any, BufferInfo]] = iter(buffer.as_dataset(
        sample_batch_size, num_steps, num_parallel_calls=1, prefetch=PREFETCH))
    return stream


def send_priorities(buffer: Any, ids: np.ndarray, priorities: np.ndarray) -> None:
    """Set the priorities (float ``[S]``) of the learner's last batch (``ids``: its
    ``BufferInfo.ids``) without waiting for the shards, as Ape-X's learner does: the
    call returns once the updates are sent (a bounded number stay in flight), so the
    next batch may be drawn before they land; a shard's error raises at a later call."""
    buffer.update_priorities(ids, priorities, block=False)
