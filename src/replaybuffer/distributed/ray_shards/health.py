"""Shards that die and come back: which are up, probing the down ones, and the loss
accounting (:class:`ShardLoss`) when a restarted shard answers again.

A shard actor that dies (``ray.kill``, a crash) is restarted by Ray from its last
checkpoint; meanwhile the client samples from the others. When the shard answers again
the client records how many steps it had that its checkpoint did not (writes in flight
to it when it died are counted too).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import ray
from ray.exceptions import RayError, RayTaskError


@dataclass
class ShardLoss:
    """Steps a shard lost when it died: those written after its last checkpoint.

    Attributes:
        shard: its index.
        steps_lost: ``last_id`` before the failure minus the restored ``last_id``
            (every step when there was no checkpoint).
        restored_last_id: the ``last_id`` it came back with (-1: empty).
        incarnation: its new incarnation.
        at: ``time.time()`` when the client saw it back.
    """

    shard: int
    steps_lost: int
    restored_last_id: int
    incarnation: int
    at: float


class ShardHealth:
    """Which shards answer, their incarnations and ``last_id``s, and the losses of
    those that came back.

    Args:
        actors: the shard actor handles (the buffer's list, emptied on close).
        incarnations, last_ids: each shard's, as it first described itself.
        on_back: called when a shard answers again (the buffer forgets its masses).

    Attributes:
        up: per shard, whether it answered last (the buffer's reads consult it).
        incarnation, last_id: per shard, its current incarnation and the largest
            ``last_id`` a write's answer reported.
        losses: every :class:`ShardLoss` seen, in order.
    """

    def __init__(self, actors: list[Any], incarnations: list[int], last_ids: list[int],
                 on_back: Callable[[], None]):
        self._actors = actors
        self.up = [True] * len(actors)
        self.incarnation = incarnations
        self.last_id = last_ids
        self.losses: list[ShardLoss] = []
        self._on_back = on_back
        self._last_ping = [0.0] * len(actors)
        self._pings: dict[int, Any] = {}
        self._lock = threading.Lock()

    def down(self, shard: int) -> None:
        """Mark ``shard`` down (its call failed); it is pinged until it answers."""
        if self.up[shard]:
            self.up[shard] = False
            self._last_ping[shard] = time.monotonic()

    def ask(self, method: str, *args: Any) -> dict[int, Any]:
        """Call ``method`` on every shard that is up and wait for the answers, by shard;
        a shard that does not answer is marked down and left out."""
        refs = {i: getattr(actor, method).remote(*args)
                for i, actor in enumerate(self._actors) if self.up[i]}
        answers = {}
        for i, ref in refs.items():
            try:
                answers[i] = ray.get(ref)
            except RayError:
                self.down(i)
        return answers

    def probe(self, interval: float = 0.2) -> None:
        """Ping down shards (at most every ``interval`` s, without waiting); one that
        answers is up again, and its loss is recorded."""
        if all(self.up) and not self._pings:
            return
        with self._lock:  # prefetch threads probe too
            self._probe_locked(interval)

    def _probe_locked(self, interval: float) -> None:
        now = time.monotonic()
        for i in range(len(self.up)):
            if self.up[i]:
                continue
            ref = self._pings.get(i)
            if ref is None:
                if now - self._last_ping[i] >= interval:
                    self._pings[i] = self._actors[i].describe.remote()
                    self._last_ping[i] = now
                continue
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue
            del self._pings[i]
            try:
                info = ray.get(ref)
            except RayError:
                continue  # still restarting (or gone): ping again later
            self.up[i] = True
            self._on_back()
            if info["incarnation"] != self.incarnation[i]:
                self.losses.append(ShardLoss(i, max(0, self.last_id[i] -
                                                    info["restored_last_id"]),
                                             info["restored_last_id"],
                                             info["incarnation"], time.time()))
                self.incarnation[i] = info["incarnation"]
                self.last_id[i] = info["last_id"]


def failure_cause(exc: BaseException) -> str:
    """What went wrong in a shard, in one line: the original exception of a task
    error, or the last line of an actor's death report (its creation's exception)."""
    if isinstance(exc, RayTaskError):
        cause = exc.as_instanceof_cause()
        return f"{type(cause).__name__}: {cause}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
