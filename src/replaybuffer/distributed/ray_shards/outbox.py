"""Writes on their way to shards: :class:`Outbox` (checked, numbered, bounded in flight)
and :class:`ShardWriter`, the picklable writer to one shard that collectors hold.

Items are checked against the spec in the caller's process before they leave, so bad
input raises there and reaches no shard. Each outbox numbers its writes per shard; the
shard applies them in that order (:meth:`~.shard.ShardActor.write`).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Callable

import numpy as np
import ray
from ray.exceptions import RayError, RayTaskError

from replaybuffer import nest
from replaybuffer.errors import SpecError
from replaybuffer.storage.numpy_storage import NumpyStorage


class Outbox:
    """Writes in flight to shards: items checked against the spec before they leave,
    at most ``max_in_flight`` outstanding, answers handed to ``settled(shard, answer)``
    (``None`` when the shard died), the first error a shard raised kept for the
    caller's next call."""

    def __init__(self, data_spec: Any, max_in_flight: int,
                 settled: Callable[[int, Any], None]):
        leaf_specs, self._structure = nest.flatten(data_spec)
        self._paths = nest.leaf_paths(data_spec)
        self._checker = NumpyStorage(leaf_specs, 1, pack=False)
        self._max = max_in_flight
        self._settled = settled
        self._pending: deque[tuple[int, Any]] = deque()
        self._error: BaseException | None = None
        self._writer = os.urandom(8).hex()  # this outbox's name in the shards
        self._seq: dict[int, int] = {}

    def check(self, items: Any, outer: int, method: str) -> None:
        """Raise :class:`SpecError` (naming the leaf) unless ``items`` match the spec
        with ``outer`` leading dimensions."""
        leaves, structure = nest.flatten(items)
        if structure != self._structure:
            raise SpecError(f"{method}: items do not match the data_spec structure: "
                            f"expected {nest.describe(self._structure)}, got "
                            f"{nest.describe(structure)}")
        shape = np.shape(leaves[0])[:outer]
        self._checker.convert(leaves, self._paths, tuple(shape),
                              f"[{', '.join(map(str, shape))}]")

    def send(self, shard: int, actor: Any, method: str, args: tuple[Any, ...],
             kwargs: dict[str, Any], keys: list[int | None]) -> None:
        """Call ``method`` on ``shard``'s buffer, numbered so the shard applies this
        outbox's writes in the order sent."""
        seq = self._seq.get(shard, 0)
        self._seq[shard] = seq + 1
        ref = actor.write.remote(method, args, kwargs, keys, self._writer, seq)
        self._pending.append((shard, ref))
        while len(self._pending) > self._max:
            self._settle()
        self.raise_error()

    def _settle(self) -> None:
        shard, ref = self._pending.popleft()
        try:
            answer = ray.get(ref)
        except RayTaskError as exc:
            self._error = self._error or exc.as_instanceof_cause()
            return
        except RayError:
            answer = None
        self._settled(shard, answer)

    def raise_error(self) -> None:
        """Raise (once) the first error a shard raised on a write, if any."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def flush(self) -> None:
        """Wait for every write in flight; raise the first error one of them met."""
        while self._pending:
            self._settle()
        self.raise_error()


class ShardWriter:
    """Writes to one shard (from :meth:`RayReplayBuffer.writer`): ``add_batch``,
    ``extend``, ``add``, ``flush`` as the buffer's, asynchronously, checked against the
    spec first. Pickles (the actor handle, the shard and the spec), so a collector
    actor can hold one. A write to a shard that died is dropped (the shard's loss)."""

    def __init__(self, actor: Any, shard: int, data_spec: Any, max_in_flight: int = 8):
        self._actor, self.shard, self._data_spec = actor, shard, data_spec
        self._max_in_flight = max_in_flight
        self._outbox = Outbox(data_spec, max_in_flight, self._written)
        self.dropped = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return ShardWriter, (self._actor, self.shard, self._data_spec, self._max_in_flight)

    def _written(self, shard: int, answer: Any) -> None:
        if answer is None:
            self.dropped += 1

    def add_batch(self, items: Any) -> None:
        """Append one step to every row of the shard (leaves ``[batch_size, ...]``)."""
        self._outbox.check(items, 1, "add_batch")
        self._outbox.send(self.shard, self._actor, "add_batch", (items,), {}, [])

    def extend(self, items: Any) -> None:
        """Append ``T`` steps (leaves ``[batch_size, T, ...]``) to the shard."""
        self._outbox.check(items, 2, "extend")
        self._outbox.send(self.shard, self._actor, "extend", (items,), {}, [])

    def add(self, *args: Any, **kwargs: Any) -> None:
        """``add`` on the shard's buffer (transition buffers)."""
        self._outbox.send(self.shard, self._actor, "add", args, kwargs, [])

    def flush(self) -> None:
        """Wait for this writer's writes in flight."""
        self._outbox.flush()
