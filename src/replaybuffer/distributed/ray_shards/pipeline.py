"""A Ray buffer's dataset: batches kept in flight to the shards while the learner
trains (:class:`ShardStream`).

Iterating keeps ``prefetch`` batches requested ahead of the one handed out: their
calls run in the shards while the learner works on the last one, so a learner that
trains longer than a batch's round trip never waits for one. No thread is needed (Ray
runs the calls); the bound is the number of batches, so memory stays ``prefetch + 1``
batches (``prefetch + g`` with groups of ``g``, below). The order is the seed's: each
batch draws from a generator spawned, in order, from the stream's (see
:mod:`.sampling`), so a seeded buffer gives the same batches with any ``prefetch``
(with the shards' contents unchanged).

With ``batches_per_call`` ``g`` above 1 (``as_dataset``'s), batches are started ``g`` at
a time, as a sliding look-ahead: a pull that would leave fewer than ``prefetch``
batches requested ahead starts the next group first, so the next group's calls run
while the learner still has ``prefetch`` batches of the current one (or of earlier
groups) to take. The ones of a group that go to the same shard are drawn by one call
(:mod:`.draw_answers`), so with few shards, or one shard per batch, a call serves
several batches. ``prefetch`` keeps its meaning at any ``g``: while the learner
trains, ``prefetch`` to ``prefetch + g - 1`` batches are in flight, never fewer (the
depth does not drain at a group's turn), and ``prefetch + g`` batches are held at
most. Groups are always whole (``g`` batches, the first at the stream's start), so
the batches are the same with any ``prefetch``; without ``group_from_one_shard`` they
are also the same with any ``g``.

A batch that fails (every shard empty, every one down, rate limited past the timeout)
raises in its turn; the batches requested after it are dropped, and the next pull
starts afresh, seeing the shards as they are by then.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from replaybuffer.distributed.ray_shards.batches import shaped
from replaybuffer.protocols import BufferInfo

if TYPE_CHECKING:
    from replaybuffer.distributed.ray_shards.sampling import PendingBatch

    from replaybuffer.distributed.ray_shards.buffer import RayReplayBuffer

Element = tuple[Any, BufferInfo]


def dataset_depth(prefetch: int | None, num_parallel_calls: int | None, default: int,
                  consumed_by: str | None, batches_per_call: int,
                  group_from_one_shard: bool) -> int:
    """The batches a dataset keeps requested ahead: ``prefetch``, else ``default`` or
    ``num_parallel_calls`` when larger; 0 where the shards consume what they give
    (``consumed_by``: their buffer class's name), which are read on pull, one batch at
    a time, in order.

    Raises:
        ValueError: ``prefetch`` not a positive int or ``None``; on consuming shards,
            any ``prefetch`` or ``num_parallel_calls``, ``batches_per_call`` other than
            1 or ``group_from_one_shard`` (they would be ignored).
    """
    if prefetch is not None and (type(prefetch) is not int or prefetch < 1):
        raise ValueError(f"prefetch must be a positive int (batches in flight) or "
                         f"None, got {prefetch!r}")
    if consumed_by is None:
        return prefetch or max(default, num_parallel_calls or 0)
    if prefetch or num_parallel_calls:
        raise ValueError(f"{consumed_by} shards read each window once, in order: no "
                         "prefetch or num_parallel_calls")
    if batches_per_call != 1 or group_from_one_shard is not False:
        raise ValueError(
            f"{consumed_by} shards are read one batch at each pull: batches_per_call "
            f"must be 1 and group_from_one_shard False, got {batches_per_call!r} and "
            f"{group_from_one_shard!r}")
    return 0


class ShardStream:
    """An endless stream of ``get_next(sample_batch_size, num_steps)`` batches from a
    :class:`~replaybuffer.distributed.RayReplayBuffer`, ``prefetch`` in flight. Each
    ``iter()`` starts an iterator with a generator of its own, spawned from the
    buffer's; ``group``: batches started together (``as_dataset``'s
    ``batches_per_call``; 1: one at a time), the next group started when the batches
    requested ahead would fall below ``prefetch`` (see the module docstring);
    ``group_from_one_shard``: each group's batches all drawn from one shard, chosen
    by sampling mass (see :mod:`.sampling`).

    Raises:
        ValueError: ``group`` is not a positive int, ``group_from_one_shard`` not a
            bool (the buffer unchanged).
    """

    def __init__(self, buffer: "RayReplayBuffer", sample_batch_size: int | None,
                 num_steps: int | None, prefetch: int, within_episodes: bool = False,
                 group: int = 1, group_from_one_shard: bool = False):
        self.buffer = buffer
        self.sample_batch_size = sample_batch_size
        self.num_steps = num_steps
        self.prefetch = prefetch
        self.within_episodes = within_episodes
        if type(group) is not int or group < 1:
            raise ValueError(f"batches_per_call must be a positive int, got {group!r}")
        self.group = group
        if type(group_from_one_shard) is not bool:
            raise ValueError(f"group_from_one_shard must be a bool, got "
                             f"{group_from_one_shard!r}")
        self.group_from_one_shard = group_from_one_shard

    def __iter__(self) -> "ShardIterator":
        return ShardIterator(self)


class ShardIterator:
    """Batches of a :class:`ShardStream`, in the order of its generator."""

    def __init__(self, stream: ShardStream):
        self._stream = stream
        self._rng = stream.buffer.spawn_rng()
        self._pending: deque[PendingBatch] = deque()
        self._closed = False

    def __iter__(self) -> "ShardIterator":
        return self

    def __next__(self) -> Element:
        if self._closed:
            raise StopIteration
        s = self._stream
        # Before this pull hands one out: start groups until ``prefetch`` stay requested
        # after it (FIFO shards, prefetch 0: one batch at the pull).
        while len(self._pending) <= s.prefetch:
            self._pending.extend(s.buffer.start_batches(
                s.sample_batch_size or 1, s.num_steps, [self._rng] * s.group,
                s.within_episodes, one_shard=s.group_from_one_shard))
        try:
            items, info = s.buffer.finish_batch(self._pending.popleft())
        except BaseException:
            self._pending.clear()  # drawn from the shards as they were: start afresh
            raise
        return shaped(items, info, s.sample_batch_size, s.num_steps)

    def in_flight(self) -> int:
        """Batches requested and not yet handed out."""
        return len(self._pending)

    def close(self) -> None:
        """Stop: later pulls end the iteration; batches in flight are dropped."""
        self._closed = True
        self._pending.clear()

    def __enter__(self) -> "ShardIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
