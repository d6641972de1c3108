"""Priority updates from one client to the shards (:class:`PriorityUpdates`): each id
routed to the shard and incarnation it names, sent with or without waiting, applied by
each shard in the order sent.

Routing. An id carries its shard and the shard's incarnation (``incarnation << 48 |
local_id * num_shards + shard``); each shard gets its local ids with the incarnation
they were drawn from and ignores them when it is another incarnation now (a restart or
a clear the client has not noticed yet), as it ignores overwritten steps. Ids of a
shard the client knows is down, or knows restarted since, are not sent.

Without waiting (``block=False``, Ape-X's learner). The call checks its arguments,
sends one call per shard its ids name and returns; at most ``max_in_flight`` calls
(of :meth:`PriorityUpdates.send`) stay unsettled, the oldest awaited when one more is
sent. Their answers (applied counts, masses, statuses: the restarts they reveal) are
taken as they settle, at the client's next call and at :meth:`PriorityUpdates.flush`;
the first error a shard raised is kept and raised by the next call or ``flush()``. A
call that raises has sent nothing.

Order. The shards' ``update_priorities`` run in a concurrency group of their own (one
thread, beside the draws), and Ray does not promise that a threaded actor starts calls
in the order they were sent, so every call is numbered per shard and the shard applies
one client's calls in their order (:class:`~.ordering.WriteOrder`, as writes are
ordered): of two updates of one id, the later wins. A call numbered after one lost
with a shard process is held until the client reports everything before it settled
(:meth:`PriorityUpdates.flush`), or :data:`~.ordering.GAP_S` at most.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayError, RayTaskError

from replaybuffer.buffers.prioritized import checked_priorities
from replaybuffer.distributed.ray_shards.health import ShardHealth
from replaybuffer.distributed.ray_shards.sampling import ShardSampler
from replaybuffer.distributed.ray_shards.shard import INCARNATION_SHIFT, LOCAL_MASK

Call = tuple[int, int, Any]
"""One shard's part of an update in flight: ``(shard, number, ref)``."""


class PriorityUpdates:
    """One client's priority updates: routed, numbered per shard, in flight.

    Used from one thread (the learner's), as the buffer's other calls are.

    Args:
        actors: the shard actor handles (the buffer's list).
        health: which shards are up, their incarnations (updated from the answers).
        sampler: keeps the shards' masses (updated from the answers).
        max_in_flight: unsettled :meth:`send` calls before one waits for the oldest.

    Attributes:
        applied: priorities applied by the updates settled so far (sent with or
            without waiting; ids of another incarnation and overwritten steps are not
            counted).
    """

    def __init__(self, actors: list[Any], health: ShardHealth, sampler: ShardSampler,
                 max_in_flight: int):
        self._actors = actors
        self._health = health
        self._sampler = sampler
        self._num_shards = len(actors)
        self._max = max_in_flight
        self.client = os.urandom(8).hex()  # this client's name in the shards' order
        self._next: dict[int, int] = {}  # per shard, the number of its next call
        # Per shard, the numbers sent and not yet settled, in order (dicts as ordered sets).
        self._unsettled: dict[int, dict[int, None]] = {}
        self._pending: deque[list[Call]] = deque()  # per send, its calls, oldest first
        self._held: set[int] = set()  # shards that said they hold a call of ours
        self._error: BaseException | None = None
        self.applied = 0

    def in_flight(self) -> int:
        """:meth:`send` calls not yet settled."""
        return len(self._pending)

    def send(self, ids: Any, priorities: Any, block: bool) -> int | None:
        """Route ``ids`` (int64 ``[S]``, ``[S, T]`` or a T-tuple: the buffer's
        ``BufferInfo.ids``) and ``priorities`` (``[S]``, finite, >= 0) to their shards.

        Returns:
            With ``block``: how many priorities this call applied (its answers waited
            for, after every earlier call's). Without: ``None`` at once.

        Raises:
            ValueError: mismatched shapes, or a NaN, infinite or negative priority;
                nothing sent.
            The first error a shard raised on an earlier update (nothing sent).
        """
        id_array, values, _ = checked_priorities(ids, priorities)
        if block:
            if self._pending or self._held:
                self.flush()  # every earlier call applied first: this count is its own
        else:
            self.collect()
            while self._pending and len(self._pending) >= self._max:  # room for this one
                self._settle(self._pending.popleft())
        self.raise_error()
        calls = self._route(id_array, values)
        if not block:
            if calls:
                self._pending.append(calls)
            return None
        before = self.applied
        self._settle(calls)
        self.raise_error()
        return self.applied - before

    def _route(self, id_array: np.ndarray, values: np.ndarray) -> list[Call]:
        incarnations = id_array >> INCARNATION_SHIFT
        local_ids, shards = np.divmod(id_array & LOCAL_MASK, self._num_shards)
        groups = incarnations * self._num_shards + shards  # one per (incarnation, shard)
        keys = self._sampler.mass_keys()
        calls = []
        for group in np.unique(groups):
            incarnation, i = (int(v) for v in divmod(int(group), self._num_shards))
            if not self._health.up[i] or incarnation != self._health.incarnation[i]:
                continue  # stale for sure: the shard would ignore them
            mine = groups == group
            seq = self._next.get(i, 0)
            self._next[i] = seq + 1
            unsettled = self._unsettled.setdefault(i, {})
            unsettled[seq] = None
            base = next(iter(unsettled))  # every number below it is settled
            ref = self._actors[i].update_priorities.remote(
                (local_ids[mine], values[mine], incarnation, keys, self.client, seq, base))
            calls.append((i, seq, ref))
        return calls

    def collect(self) -> None:
        """Take the answers that have come (of calls in flight), without waiting."""
        if not self._pending:
            return
        refs = [ref for calls in self._pending for _, _, ref in calls]
        ready = ray.wait(refs, num_returns=len(refs), timeout=0)[0]
        if not ready:
            return
        done = set(ready)
        left: deque[list[Call]] = deque()
        for calls in self._pending:
            settled = [call for call in calls if call[2] in done]
            if settled:
                self._settle(settled)
            rest = [call for call in calls if call[2] not in done]
            if rest:
                left.append(rest)
        self._pending = left

    def _settle(self, calls: list[Call]) -> None:
        for i, seq, ref in calls:
            try:
                count, masses, status, held = ray.get(ref)
            except RayTaskError as exc:  # raised in the shard: kept for the next call
                self._error = self._error or exc.as_instanceof_cause()
                self._held.add(i)  # it may have failed before its number was taken in
                continue
            except RayError:  # the shard process died with it: a later call that its
                self._health.down(i)  # restarted process got may wait for this number
                self._held.add(i)
                continue
            finally:
                self._unsettled[i].pop(seq, None)
            self._health.observe(i, status)
            self._sampler.set_masses(i, masses)
            self.applied += count
            if held:
                self._held.add(i)

    def flush(self) -> None:
        """Wait for every update in flight, then have each shard that held calls of
        ours (numbered after one lost or refused) apply them. An error is kept for
        :meth:`raise_error`, not raised here."""
        while self._pending:
            self._settle(self._pending.popleft())
        keys = self._sampler.mass_keys()
        refs = [(i, self._actors[i].release_priorities.remote(self.client, keys))
                for i in sorted(self._held) if self._health.up[i]]
        self._held.difference_update(i for i, _ in refs)  # a shard down: when back
        for i, ref in refs:
            try:
                count, masses, status = ray.get(ref)
            except RayTaskError as exc:
                self._error = self._error or exc.as_instanceof_cause()
                continue
            except RayError:  # restarting: its new process holds nothing of ours
                self._health.down(i)
                continue
            self._health.observe(i, status)
            self._sampler.set_masses(i, masses)
            self.applied += count

    def raise_error(self) -> None:
        """Raise (once) the first error a shard raised on an update, if any."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
