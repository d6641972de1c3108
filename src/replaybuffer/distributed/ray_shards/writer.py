"""The picklable writer to one shard that collectors hold (:class:`ShardWriter`), and
the chunk it gathers steps in (:class:`Chunk`).

A remote call costs far more than writing a step, so a writer gathers steps into a
chunk, one array per leaf ``[batch_size, chunk_steps, ...]`` written in place, and
sends the chunk, packed into one byte buffer (:mod:`.packing`), as one ``extend`` when
it holds ``chunk_steps`` steps, when ``chunk_seconds`` have passed since its first
step (checked at each write), at an episode's end (a leaf named ``step_type`` or ``next_step_type`` holding
:attr:`~replaybuffer.collect.StepType.LAST`), and at :meth:`ShardWriter.flush` and
:meth:`ShardWriter.close`. The shard applies a writer's chunks in the order sent.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from replaybuffer import nest
from replaybuffer.distributed.ray_shards.outbox import Outbox
from replaybuffer.distributed.ray_shards.packing import ChunkPacking
from replaybuffer.distributed.ray_shards.shard import PACKED_EXTEND, Op

LAST = 2
"""``StepType.LAST``: a step that ends an episode."""

CHUNK_STEPS = 256
"""A writer's steps per chunk by default.

Each chunk is one remote call, whose fixed cost (Ray's, in the shard and the
collector) dwarfs writing its steps: on the control workload (``bench --ray``,
collectors paced at 40,000 steps/s together, 1 and 4 shards, 2026-11-28, a 2-core
machine shared with other jobs) chunks of 256 steps cost a shard 1.5-2.7 us of its
writes thread per step against 5.4-6.2 us for 64, and a collector 5.9-6.4 us per step
against 10.5-12.1. How long a step waits to be sent stays bounded by
``chunk_seconds`` whatever the chunk's size (checked at every write): below 256
steps per ``chunk_seconds`` (5,120 steps/s at 0.05 s) chunks go by time, as often at
either size."""


def packed_extend(packing: ChunkPacking, leaves: list[np.ndarray], steps: int) -> Op:
    """The op that ``extend``s the shard by the first ``steps`` steps of ``leaves``
    (``[rows, >= steps, ...]``), packed into one byte buffer."""
    return (PACKED_EXTEND, (packing.pack(leaves, steps), len(leaves[0]), steps), {})


class Chunk:
    """Steps gathered for one send: ``[rows, capacity, ...]`` per leaf.

    Args:
        data_spec: the shard's data spec.
        rows: the shard's ``batch_size``.
        capacity: steps per chunk.
    """

    def __init__(self, data_spec: Any, rows: int, capacity: int):
        specs = nest.flatten(data_spec)[0]
        self.packing = ChunkPacking(data_spec)
        self._arrays = [np.empty((rows, capacity) + tuple(s.shape), s.dtype) for s in specs]
        paths = nest.leaf_paths(data_spec)
        self._ends = [i for i, p in enumerate(paths)
                      if p.rstrip("']").endswith("step_type")]
        self.capacity = capacity
        self.steps = 0

    def room(self) -> int:
        """Steps that still fit."""
        return self.capacity - self.steps

    def put(self, leaves: list[np.ndarray], count: int) -> bool:
        """Copy ``count`` steps (leaves ``[rows, count, ...]``) in; whether one of them
        ends an episode."""
        for array, leaf in zip(self._arrays, leaves):
            array[:, self.steps:self.steps + count] = leaf
        self.steps += count
        return any(bool((leaves[i] == LAST).any()) for i in self._ends)

    def take(self) -> Op:
        """The gathered steps as one packed ``extend`` (one byte buffer, see
        :mod:`.packing`), and an empty chunk."""
        n, self.steps = self.steps, 0
        return packed_extend(self.packing, self._arrays, n)


class ShardWriter:
    """Writes to one shard (from :meth:`RayReplayBuffer.writer`): ``add_batch``,
    ``extend``, ``add``, ``flush``, ``close``, checked against the spec first and sent
    in chunks (see the module docstring), asynchronously, at most ``max_in_flight``
    chunks outstanding (one more waits for the oldest half of them, fetched at once). Pickles (the actor handle, the shard, the spec and the
    settings), so a collector actor can hold one; a copy starts with an empty chunk.

    Args:
        actor: the shard's actor handle.
        shard: its index.
        data_spec: the shards' data spec.
        max_in_flight: chunks outstanding before a write waits for the oldest.
        rows: the shard's ``batch_size`` (``None``: a transition buffer; ``add``
            calls are then gathered as they are).
        chunk_steps: steps per chunk (1: every write is sent at once; default
            :data:`CHUNK_STEPS`, 256).
        chunk_seconds: the longest a step waits in a chunk, checked at each write.

    Attributes:
        steps_dropped: steps of chunks whose answer was lost with a shard process that
            died, applied there or not (the buffer's ``losses`` count each lost step
            once: by the shard's mark if a process applied it, else by this report).
    """

    def __init__(self, actor: Any, shard: int, data_spec: Any, max_in_flight: int = 8,
                 rows: int | None = None, chunk_steps: int = CHUNK_STEPS,
                 chunk_seconds: float = 0.05):
        if isinstance(chunk_steps, bool) or not isinstance(chunk_steps, int) or \
                chunk_steps < 1:
            raise ValueError(f"chunk_steps must be a positive int, got {chunk_steps!r}")
        if not (isinstance(chunk_seconds, (int, float)) and chunk_seconds >= 0):
            raise ValueError(f"chunk_seconds must be a number of seconds >= 0, got "
                             f"{chunk_seconds!r}")
        self._actor, self.shard, self._data_spec = actor, shard, data_spec
        self._max_in_flight, self._rows = max_in_flight, rows
        self.chunk_steps, self.chunk_seconds = chunk_steps, float(chunk_seconds)
        self._outbox = Outbox(data_spec, rows, max_in_flight, lambda shard, answer: None,
                             settle_half=True)
        self._chunk = None if rows is None else Chunk(data_spec, rows, chunk_steps)
        self._ops: list[Op] = []  # add() calls, and chunks taken, not yet sent
        self._steps = 0
        self._since: float | None = None  # when the oldest unsent step came

    def __reduce__(self) -> tuple[Any, ...]:
        return ShardWriter, (self._actor, self.shard, self._data_spec,
                             self._max_in_flight, self._rows, self.chunk_steps,
                             self.chunk_seconds)

    @property
    def steps_dropped(self) -> int:
        return self._outbox.steps_dropped

    def add_batch(self, items: Any) -> None:
        """Append one step to every row of the shard (leaves ``[batch_size, ...]``)."""
        leaves = self._outbox.check(items, 1, "add_batch")
        self._gather([leaf[:, None] for leaf in leaves], 1)

    def extend(self, items: Any) -> None:
        """Append ``T`` steps (leaves ``[batch_size, T, ...]``) to the shard."""
        leaves = self._outbox.check(items, 2, "extend")
        self._gather(leaves, int(np.shape(leaves[0])[1]))

    def add(self, *args: Any, **kwargs: Any) -> None:
        """``add`` on the shard's buffer (transition buffers)."""
        if self._chunk is not None and self._chunk.steps:
            self._send()  # the gathered steps go first, in order
        self._ops.append(("add", args, kwargs))
        self._steps += 1
        self._send_if_due(False)

    def _gather(self, leaves: list[np.ndarray], count: int) -> None:
        chunk = self._chunk
        assert chunk is not None  # rows is known for buffers with add_batch
        if count > chunk.room():
            self._send()  # sent at once: the chunk's arrays are reused
        if count >= chunk.capacity:  # a long extend goes at once, in one op
            self._ops.append(packed_extend(chunk.packing, leaves, count))
            self._steps += count
            self._send()
            return
        ended = chunk.put(leaves, count)
        self._send_if_due(ended)

    def _take_chunk(self) -> None:
        if self._chunk is not None and self._chunk.steps:
            self._steps += self._chunk.steps
            self._ops.append(self._chunk.take())

    def _send_if_due(self, ended: bool) -> None:
        chunk = self._chunk
        gathered = self._steps + (0 if chunk is None else chunk.steps)
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if ended or gathered >= self.chunk_steps or now - self._since >= self.chunk_seconds:
            self._send()

    def _send(self) -> None:
        self._take_chunk()
        self._since = None
        if self._ops:
            ops, steps, self._ops, self._steps = self._ops, self._steps, [], 0
            self._outbox.send(self.shard, self._actor, ops, steps, [])

    def flush(self) -> None:
        """Send the gathered steps and wait until every chunk is applied (or lost with
        a shard that died); raise the first error a write met in the shard."""
        self._send()
        self._outbox.flush()

    def close(self) -> None:
        """:meth:`flush` (the writer may be used again afterwards)."""
        self.flush()
