"""The write half of :class:`~replaybuffer.distributed.RayReplayBuffer`
(:class:`ShardWrites`): the client's own writes, round-robin or to one shard, and the
:class:`~.writer.ShardWriter` it hands to collectors."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.arguments import check_timeout
from replaybuffer.distributed.errors import (NotSupportedError, ShardsUnavailableError,
                                             not_supported)
from replaybuffer.distributed.ray_shards.health import ShardHealth
from replaybuffer.distributed.ray_shards.outbox import Outbox
from replaybuffer.distributed.ray_shards.priority_updates import PriorityUpdates
from replaybuffer.distributed.ray_shards.sampling import ShardSampler
from replaybuffer.distributed.ray_shards.writer import CHUNK_STEPS, ShardWriter


class ShardWrites:
    """``add_batch``, ``extend``, ``add``, ``flush`` and ``writer`` of a Ray buffer.

    Attributes (set by the buffer):
        num_shards: shards.
        _actors: their handles; _up: which answer; _outbox: the client's writes in
        flight; _updates: its priority updates in flight; _sampler: its masses;
        _health: incarnations and losses; _data_spec,
        _rows (the shards' ``batch_size``), _max_in_flight, _queued (shards have a
        ``Queue`` limiter), _next_shard (round-robin).
    """

    num_shards: int
    _actors: list[Any]
    _up: list[bool]
    _outbox: Outbox
    _updates: PriorityUpdates
    _sampler: ShardSampler
    _health: ShardHealth
    _data_spec: Any
    _rows: int | None
    _max_in_flight: int
    _queued: bool
    _next_shard: int

    def _probe(self, interval: float = 0.2) -> None:
        self._health.probe(interval)

    def flush(self) -> None:
        """Wait for every write and priority update in flight to be applied (or lost
        with a shard that died); raise the first error one of them met."""
        self._updates.flush()
        self._outbox.flush()
        self._updates.raise_error()

    def _settled(self) -> Exception | None:
        """:meth:`flush`, its error returned rather than raised: a call that settles
        first (``clear``, ``checkpoint``) does its own work, then raises it."""
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - raised by the caller once done
            return exc
        return None

    def add_batch(self, items: Any, *, shard: int | None = None,
                  timeout: float | None = None, block: bool = True) -> bool:
        """Append one step to every row of one shard (round-robin, or ``shard``).
        Checked here against the spec; written asynchronously (see :meth:`flush`).

        An error a priority update sent without waiting met in a shard
        (``update_priorities(..., block=False)``) is raised by the next write once it
        has come back, after the write is sent (as :meth:`clear` does its work first).

        Round-robin suits items whole on their own (transitions); steps that form
        windows (``get_next(num_steps=T)``) must go to one shard per writer:
        ``shard=`` or a :meth:`writer`. A shard that took round-robin writes refuses
        windows of more than one step (they would skip steps) with a
        :class:`~replaybuffer.distributed.NotSupportedError`, until it is cleared.

        Args:
            timeout: passed to the shard's ``add_batch`` (its rate limiter's
                :class:`~replaybuffer.RateLimitedError` surfaces at a later call).
            block: only ``True``: an asynchronous write cannot say it was held back.

        Returns:
            ``True``: the write was sent.
        """
        self._check_write(block, timeout, "add_batch", shard)
        self._outbox.check(items, 1, "add_batch")
        self._write("add_batch", (items,), _timeout(timeout), 1, shard)
        return True

    def extend(self, items: Any, *, shard: int | None = None,
               timeout: float | None = None, block: bool = True) -> bool:
        """``extend`` on one shard (leaves ``[batch_size, T, ...]``), as :meth:`add_batch`."""
        self._check_write(block, timeout, "extend", shard)
        leaves = self._outbox.check(items, 2, "extend")
        self._write("extend", (items,), _timeout(timeout), int(np.shape(leaves[0])[1]),
                    shard)
        return True

    def add(self, *args: Any, shard: int | None = None, **kwargs: Any) -> None:
        """``add`` on one shard (transition buffers); its errors surface at the next
        call or :meth:`flush` (a priority update's error pending: as :meth:`add_batch`)."""
        check_timeout(kwargs.get("timeout"))
        self._write("add", args, kwargs, 1, shard)

    def _check_write(self, block: bool, timeout: Any, method: str,
                     shard: int | None) -> None:
        if not block:
            raise not_supported(type(self), f"{method}(block=False)",
                                "use timeout= (a shard's rate limiter paces the call)")
        check_timeout(timeout)
        if shard is None and self._queued and self.num_shards > 1:
            raise NotSupportedError(
                f"{type(self).__name__} does not support round-robin {method} into shards "
                "with a Queue rate limiter: each shard's Queue counts its own items, so "
                "no queue bounds the whole; write through shard= or writer(i)")

    def _write(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
               steps: int, shard: int | None) -> None:
        self._outbox.raise_error()
        self._probe()
        round_robin = shard is None and self.num_shards > 1
        if shard is None:
            shard = self._pick_writer()
        elif not 0 <= shard < self.num_shards:
            raise ValueError(f"shard must be in [0, {self.num_shards}), got {shard}")
        self._outbox.send(shard, self._actors[shard], [(method, args, kwargs)], steps,
                          self._sampler.mass_keys(), round_robin)
        # A priority update sent without waiting that a shard refused surfaces here
        # too (once), after the write is sent: the write is no part of that error.
        self._updates.collect()
        self._updates.raise_error()

    def _pick_writer(self) -> int:
        for _ in range(self.num_shards):
            shard = self._next_shard
            self._next_shard = (self._next_shard + 1) % self.num_shards
            if self._up[shard]:
                return shard
        raise ShardsUnavailableError(f"all {self.num_shards} shards are down")

    def _written(self, shard: int, answer: tuple[Any, ...] | None) -> None:
        """A write settled: its shard's masses and status (``None``: shard down)."""
        if answer is None:
            self._health.down(shard)
            return
        self._sampler.set_masses(shard, answer[1])
        self._health.observe(shard, answer[3])

    def writer(self, shard: int, *, chunk_steps: int = CHUNK_STEPS,
               chunk_seconds: float = 0.05
               ) -> ShardWriter:
        """A writer to ``shard`` alone, which pickles: hand it to a collector (a Ray
        actor, a process) so its steps stay one sequence in one shard. It sends steps
        in chunks of ``chunk_steps`` (or after ``chunk_seconds``, at an episode's end,
        at ``flush()``/``close()``; see :class:`ShardWriter`)."""
        if not 0 <= shard < self.num_shards:
            raise ValueError(f"shard must be in [0, {self.num_shards}), got {shard}")
        return ShardWriter(self._actors[shard], shard, self._data_spec, self._max_in_flight,
                           self._rows, chunk_steps, chunk_seconds)


def _timeout(timeout: float | None) -> dict[str, Any]:
    return {} if timeout is None else {"timeout": timeout}
