"""One shard of a :class:`~replaybuffer.distributed.RayReplayBuffer`: the Ray actor
that holds a buffer, applies each writer's writes in order, samples, and saves
checkpoints it restarts from.

Ids leave a shard as its buffer's local ids; the client tags them with the shard and
the shard's incarnation (a number per start): ``incarnation << INCARNATION_SHIFT |
local_id * num_shards + shard``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np
import ray

from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.persist import checkpoints, load
from replaybuffer.rate_limiter import RateLimiterStats

if TYPE_CHECKING:
    from replaybuffer.buffers.prioritized import PrioritizedMixin
    from replaybuffer.buffers.transitions import TransitionReplayBuffer

INCARNATION_SHIFT = 48
"""Ids carry the shard's incarnation from this bit up."""
LOCAL_MASK = (1 << INCARNATION_SHIFT) - 1
"""The bits of an id below its incarnation."""
GAP_S = 5.0
"""How long a shard holds a writer's early writes for a missing earlier one."""


class ShardActor:
    """One shard's actor (wrapped by ``ray.remote`` in
    :class:`~replaybuffer.distributed.RayReplayBuffer`): a buffer made by ``factory``,
    restored from the shard's last checkpoint under ``root`` when there is one.

    Args:
        factory: makes the shard's buffer (a :class:`~replaybuffer.ReplayBuffer`).
        index: the shard's index.
        root: the buffer's checkpoint directory (``None``: no saves).
        checkpoint_every: inserted steps between saves.
    """

    def __init__(self, factory: Callable[[], Any], index: int, root: str | None,
                 checkpoint_every: int | None):
        self.index = index
        self.home = None if root is None else Path(root) / f"shard-{index:03d}"
        self.root = None if self.home is None else self.home / "checkpoints"
        self.checkpoint_every = checkpoint_every
        buffer = factory()
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(f"buffer_factory returned {type(buffer).__name__}, not a "
                            "replaybuffer buffer")
        self.incarnation = self._next_incarnation()
        self.restored_last_id = -1
        if self.root is not None and self.root.is_dir() and checkpoints(self.root):
            restored = load(self.root)
            limiter = buffer.rate_limiter
            buffer.rate_limiter = None
            restored.rate_limiter = limiter  # limiters are not saved: the factory's
            buffer = restored
            self.restored_last_id = buffer.last_id
        self.buffer = buffer
        self.saved_last_id = buffer.last_id
        self.next_seq: dict[str, int] = {}
        self.held: dict[str, dict[int, tuple[str, tuple[Any, ...], dict[str, Any]]]] = {}
        self.hold_since: dict[str, float] = {}

    def _next_incarnation(self) -> int:
        """1, 2, 3, ... per start when the shard has a checkpoint directory (a counter
        file there; after 32767 it wraps to 1); a random number in [1, 32767] otherwise.
        Ids carry it in their top 15 bits."""
        if self.home is None:
            return (int.from_bytes(os.urandom(2), "little") & 0x7FFF) or 1
        self.home.mkdir(parents=True, exist_ok=True)
        counter = self.home / "incarnation"
        value = int(counter.read_text()) + 1 if counter.exists() else 1
        tmp = counter.with_suffix(".tmp")
        tmp.write_text(str(value))
        os.replace(tmp, counter)
        return (value - 1) % 0x7FFF + 1

    def describe(self, num_steps: int = 1) -> dict[str, Any]:
        """The shard's ``index``, ``incarnation``, ``last_id``, ``size``, ``capacity``,
        ``mass`` (for windows of ``num_steps``), ``restored_last_id``, ``class``,
        ``data_spec``, ``beta`` and ``saved_last_id``."""
        b = self.buffer
        return {"index": self.index, "incarnation": self.incarnation, "last_id": b.last_id,
                "size": b.num_frames(), "capacity": b.capacity, "mass": b.window_mass(num_steps),
                "restored_last_id": self.restored_last_id, "class": type(b).__name__,
                "data_spec": b.data_spec, "beta": getattr(b, "beta", None),
                "saved_last_id": self.saved_last_id}

    def masses(self, keys: list[int | None]) -> dict[int | None, float]:
        """The sampling mass for windows of each of ``keys`` steps (``None``: 1)."""
        return {k: self.buffer.window_mass(k or 1) for k in keys}

    @ray.method(concurrency_group="writes")
    def write(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
              keys: list[int | None], writer: str, seq: int
              ) -> tuple[int, dict[int | None, float]]:
        """Apply writer ``writer``'s write number ``seq`` in its order: a threaded
        actor may receive calls out of order, so a write that arrives early is held
        until the ones before it came. A writer's numbers start at 0; if the write a
        held one waits for has not come within :data:`GAP_S` (it went to this shard's
        previous incarnation and was lost), the held ones are applied from the
        lowest."""
        held = self.held.setdefault(writer, {})
        held[seq] = (method, args, kwargs)
        expected = self.next_seq.get(writer, 0)
        if held and expected not in held:
            since = self.hold_since.setdefault(writer, time.monotonic())
            if time.monotonic() - since > GAP_S or min(held) < expected:
                expected = min(held)
        while expected in held:
            name, call_args, call_kwargs = held.pop(expected)
            getattr(self.buffer, name)(*call_args, **call_kwargs)
            expected += 1
            self.hold_since.pop(writer, None)
        self.next_seq[writer] = expected
        last_id = self.buffer.last_id
        if self.root is not None and self.checkpoint_every and \
                last_id - self.saved_last_id >= self.checkpoint_every:
            # ray.method types save as a remote method; in the actor it is a plain one.
            self.save()  # type: ignore[operator]
        return last_id, self.masses(keys)

    def draw(self, method: str, count: int, num_steps: int | None,
             timeout: float) -> tuple[Any, ...]:
        """``count`` samples by ``method`` (``get_next`` or a transition buffer's
        ``sample``): ``(items, ids, probabilities, mass, incarnation)``."""
        if method == "get_next":
            items, info = self.buffer.get_next(count, num_steps, timeout=timeout)
        else:  # asked of transition buffers only
            items, info = cast("TransitionReplayBuffer", self.buffer).sample(count,
                                                                             timeout=timeout)
        return (items, np.asarray(info.ids), np.asarray(info.probabilities),
                self.buffer.window_mass(num_steps or 1), self.incarnation)

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray,
                          keys: list[int | None]) -> tuple[int, dict[int | None, float]]:
        """Set the priorities of local ``ids``: how many applied, and the masses."""
        prioritized = cast("PrioritizedMixin", self.buffer)  # asked of prioritized ones only
        return prioritized.update_priorities(ids, priorities), self.masses(keys)

    @ray.method(concurrency_group="writes")
    def clear(self) -> dict[str, Any]:
        """Forget every step, as a new incarnation (ids drawn before are stale); with a
        checkpoint directory, save the empty buffer so that a restart does not bring
        the steps back. Returns :meth:`describe`."""
        self.buffer.clear()
        self.incarnation = self._next_incarnation()
        self.restored_last_id = -1
        self.saved_last_id = self.buffer.last_id
        if self.root is not None:
            self.save()  # type: ignore[operator]
        return self.describe()

    def stats(self) -> RateLimiterStats | None:
        """The shard buffer's rate-limiter counters (``None`` without a limiter)."""
        return self.buffer.stats()

    @ray.method(concurrency_group="writes")
    def save(self) -> int:
        """Save a checkpoint now (``keep=2``); the ``last_id`` saved."""
        if self.root is None:
            return self.saved_last_id
        self.buffer.save(self.root, keep=2)
        self.saved_last_id = self.buffer.last_id
        return self.saved_last_id
