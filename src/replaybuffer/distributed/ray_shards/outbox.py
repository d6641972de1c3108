"""Writes on their way to shards: :class:`Outbox` (checked, numbered, bounded in flight).

Items are checked against the spec (and the shards' row count) in the caller's
process before they leave, so bad input raises there and reaches no shard. Each outbox
numbers its chunks of writes per shard; the shard applies them in that order
(:mod:`.ordering`). A chunk whose answer was lost with a shard process that died is
reported, by number, with the outbox's next call to that shard, which counts its steps
lost unless a process of the shard applied it (its
:attr:`~.shard.ShardActor.steps_lost`, which the client reports in ``losses``). So is a
chunk a shard process answered "held" (it came ahead of an earlier one) once an answer
shows that process gone: it may have died holding it.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Callable

import numpy as np
import ray
from ray.exceptions import RayError, RayTaskError

from replaybuffer import nest
from replaybuffer.distributed.ray_shards.shard import Op
from replaybuffer.errors import SpecError
from replaybuffer.storage.numpy_storage import NumpyStorage


RELEASE_TRIES = 20
"""How many times ``flush`` asks a restarting shard to take its report (about 15 s);
a report it never took is sent with the next write to that shard."""


class Outbox:
    """Chunks of writes in flight to shards: at most ``max_in_flight`` outstanding,
    answers handed to ``settled(shard, answer)`` (``None`` when the shard died), the
    first error a shard raised kept for the caller's next call.

    Args:
        data_spec: the shards' data spec.
        rows: the shards' buffers' ``batch_size`` (``None``: not checked).
        max_in_flight: chunks outstanding before a send waits for the oldest.
        settled: called with each answer, in the order sent.
        settle_half: when a send goes over ``max_in_flight``, wait for the oldest half
            of the chunks in flight with one ``ray.get`` (a ``ray.get`` costs the
            caller about what a small remote call does), not for the oldest alone. For
            a collector's writer; a client that also samples waits for the oldest
            alone, so that its write never waits for a chunk that a shard's rate
            limiter holds until that client samples.
    """

    def __init__(self, data_spec: Any, rows: int | None, max_in_flight: int,
                 settled: Callable[[int, Any], None], settle_half: bool = False):
        leaf_specs, self._structure = nest.flatten(data_spec)
        self._paths = nest.leaf_paths(data_spec)
        self._checker = NumpyStorage(leaf_specs, 1, pack=False)
        self._rows = rows
        self._max = max_in_flight
        self._settled = settled
        self._settle_half = settle_half
        # (shard, seq, steps, answer, lost chunks reported with it)
        self._pending: deque[tuple[int, int, int, Any, list[tuple[int, int]] | None]] = \
            deque()
        self._error: BaseException | None = None
        self.writer = os.urandom(8).hex()  # this outbox's name in the shards
        self._seq: dict[int, int] = {}
        self._in_flight: dict[int, deque[int]] = {}
        self._actors: dict[int, Any] = {}
        self._release: set[int] = set()  # shards holding chunks of ours
        # Chunks whose answers were lost, per shard, not yet reported to it: (seq, steps).
        self._lost: dict[int, list[tuple[int, int]]] = {}
        # Per shard, the incarnation that answered "held" and the chunks it answered so
        # for (seq, steps), each held there or applied after an earlier one came.
        self._held: dict[int, tuple[int, list[tuple[int, int]]]] = {}
        self.steps_dropped = 0

    def check(self, items: Any, outer: int, method: str) -> list[np.ndarray]:
        """``items``' leaves, converted to the spec's dtypes; raise :class:`SpecError`
        (naming the leaf) unless they match the spec with ``outer`` leading dimensions,
        the first the shards' ``batch_size``."""
        leaves, structure = nest.flatten(items)
        if structure != self._structure:
            raise SpecError(f"{method}: items do not match the data_spec structure: "
                            f"expected {nest.describe(self._structure)}, got "
                            f"{nest.describe(structure)}")
        shape = np.shape(leaves[0])[:outer]
        if self._rows is not None and len(shape) == outer and shape[0] != self._rows:
            raise SpecError(f"{method}: items have {shape[0]} rows (the leading dimension "
                            f"of {self._paths[0]}), but the shards' buffers have "
                            f"batch_size={self._rows}")
        return list(self._checker.convert(leaves, self._paths, tuple(shape),
                                          f"[{', '.join(map(str, shape))}]"))

    def send(self, shard: int, actor: Any, ops: list[Op], steps: int,
             keys: list[int | None], round_robin: bool = False) -> None:
        """Send one chunk (``ops``, ``steps`` steps in all) to ``shard``, numbered so
        the shard applies this outbox's chunks in the order sent; ``round_robin``: the
        writer's next steps go to other shards (the shard then refuses windows)."""
        seq = self._seq.get(shard, 0)
        self._seq[shard] = seq + 1
        flying = self._in_flight.setdefault(shard, deque())
        flying.append(seq)
        self._actors[shard] = actor
        lost = self._lost.pop(shard, None)
        ref = actor.write.remote((ops, keys, self.writer, seq, flying[0], lost, round_robin))
        self._pending.append((shard, seq, steps, ref, lost))
        if len(self._pending) > self._max:
            keep = max(1, self._max // 2) if self._settle_half else self._max
            self._settle_oldest(len(self._pending) - keep)
        self.raise_error()

    def _settle_oldest(self, count: int) -> None:
        """Settle the ``count`` oldest chunks, in order, fetching their answers at once."""
        try:
            answers: list[Any] | None = ray.get([self._pending[k][3] for k in range(count)])
        except RayError:  # one failed: each is fetched on its own to tell which
            answers = None
        for k in range(count):
            self._settle(None if answers is None else (answers[k],))

    def _settle(self, fetched: tuple[Any] | None = None) -> None:
        """Settle the oldest chunk (``fetched``: its answer, already fetched)."""
        shard, seq, steps, ref, reported = self._pending.popleft()
        self._in_flight[shard].popleft()
        try:
            answer = ray.get(ref) if fetched is None else fetched[0]
        except RayTaskError as exc:  # a write refused in the shard; the others applied
            self._error = self._error or exc.as_instanceof_cause()
            self._release.add(shard)
            return
        except RayError:  # the shard process died with it (having applied it or not),
            # and with the losses it carried, which the next call reports again
            self._lost.setdefault(shard, []).extend([*(reported or []), (seq, steps)])
            self.steps_dropped += steps
            self._release.add(shard)
            self._settled(shard, None)
            return
        self._note_held(shard, answer[3][0], answer[2] > 0, (seq, steps))
        if answer[2]:
            self._release.add(shard)
        self._settled(shard, answer)

    def _note_held(self, shard: int, incarnation: int, holding: bool,
                   chunk: tuple[int, int] | None = None) -> None:
        """An answer of ``shard``'s ``incarnation``: whether it holds chunks of ours
        after taking ``chunk`` in. Chunks an earlier incarnation answered "held" went
        with its process if it never applied them: they are reported with the next
        call as lost (the shard counts those that no process of it applied, by the
        applied-chunk table in its home). An answer holding none from the same
        incarnation means every chunk it held is applied."""
        known = self._held.get(shard)
        if known is not None and known[0] != incarnation:
            self._lost.setdefault(shard, []).extend(known[1])
            known = None
        if holding:
            chunks = [] if known is None else known[1]
            if chunk is not None:
                chunks.append(chunk)
            self._held[shard] = (incarnation, chunks)
        else:
            self._held.pop(shard, None)

    def raise_error(self) -> None:
        """Raise (once) the first error a shard raised on a write, if any."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def flush(self) -> None:
        """Wait for every chunk in flight; have each shard that holds chunks of ours
        apply them (any missing before them are lost: all ours are settled) and count
        the steps lost; raise the first error a write met."""
        while self._pending:
            self._settle()
        for attempt in range(RELEASE_TRIES):
            shards = sorted(self._release | set(self._lost))
            if not shards:
                break
            calls = []
            for shard in shards:
                lost = self._lost.pop(shard, [])
                calls.append((shard, lost,
                              self._actors[shard].release.remote(self.writer, lost)))
            self._release.clear()
            for shard, lost, ref in calls:
                try:
                    status = ray.get(ref)
                except RayError:  # restarting: ask again (its new process holds nothing
                    # of ours, but must hear of the steps lost)
                    self._lost.setdefault(shard, []).extend(lost)
                    continue
                # Released: nothing of ours is held there now; chunks held by an
                # earlier process of it are reported lost in the next round.
                self._note_held(shard, status[0], False)
            if self._lost:
                time.sleep(0.1 * min(attempt + 1, 10))
        self.raise_error()
