"""Reads across shards: each batch split over the shards by their sampling masses,
and priority updates routed to the shards their ids name.

A read splits the batch over the shards that are up by a multinomial draw in
proportion to each shard's sampling mass (windows it holds for uniform buffers, its
priority total for prioritized ones), as one buffer holding all the shards' items would
draw. The masses are those each shard reported with its last answer (to a draw, a write
once settled, or a priority update), and all are asked again every
:data:`MASS_REFRESH_S`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayError, RayTaskError

from replaybuffer.buffers.prioritized import checked_priorities
from replaybuffer.distributed.errors import ShardsUnavailableError
from replaybuffer.distributed.ray_shards.batches import combine, concat
from replaybuffer.distributed.ray_shards.health import ShardHealth
from replaybuffer.distributed.ray_shards.shard import INCARNATION_SHIFT, LOCAL_MASK
from replaybuffer.errors import EmptyBufferError
from replaybuffer.protocols import BufferInfo
from replaybuffer.rate_limiter import RateLimitedError

MASS_REFRESH_S = 1.0
"""Each shard's sampling mass is asked again at least this often (collectors writing
through their own ShardWriters change it without the client seeing their answers)."""
SHARD_WAIT_S = 0.2
"""How long a shard's rate limiter may hold a part of a sample back before the client
draws that part from the other shards (or, all held back, asks again)."""


class ShardSampler:
    """Draws batches from the shards and routes priority updates to them.

    Args:
        actors: the shard actor handles (the buffer's list).
        health: which shards are up, and their incarnations.
        beta: the importance-sampling exponent of prioritized shards (``None``:
            uniform).
    """

    def __init__(self, actors: list[Any], health: ShardHealth, beta: float | None):
        self._actors = actors
        self._health = health
        self._up, self._incarnation = health.up, health.incarnation
        self._num_shards = len(actors)
        self._beta = beta
        self._mass: dict[int | None, np.ndarray] = {}
        self._mass_at: dict[int | None, float] = {}

    def mass_keys(self) -> list[int | None]:
        """The window lengths whose masses are kept (a write's answer reports them)."""
        return list(self._mass)

    def forget_masses(self) -> None:
        """Drop every kept mass (a shard came back: ask again)."""
        self._mass.clear()

    def draw(self, method: str, count: int, num_steps: int | None,
             rng: np.random.Generator, timeout: float | None = None
             ) -> tuple[Any, BufferInfo]:
        """``count`` samples by ``method`` (``get_next`` windows of ``num_steps``, or a
        transition buffer's ``sample``), split over the shards that are up by their
        masses and combined (:func:`~.batches.combine`).

        Raises:
            EmptyBufferError: no shard holds a sample.
            ShardsUnavailableError: every shard is down.
            RateLimitedError: every shard's rate limiter held its part back for
                ``timeout`` seconds.
        """
        key = num_steps
        if key not in self._mass or \
                time.monotonic() - self._mass_at.get(key, 0.0) > MASS_REFRESH_S:
            self.refresh(key)
        parts: dict[int, tuple[Any, ...]] = {}
        todo = count
        held = np.zeros(self._num_shards, bool)  # shards whose rate limiter held a part back
        deadline = None if timeout is None else time.monotonic() + timeout
        while todo:
            if held.any() and not (self._mass[key] * np.array(self._up) * ~held).sum() > 0:
                # Every shard with mass held its part back: ask all again, with fresh
                # masses (writers elsewhere may have filled the others meanwhile).
                if deadline is not None and time.monotonic() >= deadline:
                    raise RateLimitedError(f"{method}: every shard's rate limiter held the "
                                           f"sample back for {timeout} s")
                self.refresh(key)
                held[:] = False
            mass = self._mass[key] * np.array(self._up) * ~held
            if not mass.sum() > 0:
                if not any(self._up):
                    raise ShardsUnavailableError(f"all {self._num_shards} shards are down")
                self._mass[key] = mass = self.masses(num_steps) * np.array(self._up)
                if not mass.sum() > 0:
                    raise EmptyBufferError(f"{method}: no shard holds a sample of "
                                           f"{num_steps or 1} step(s)")
            split = rng.multinomial(todo, mass / mass.sum())
            refs = {i: self._actors[i].draw.remote(method, int(n), num_steps, SHARD_WAIT_S)
                    for i, n in enumerate(split) if n}
            todo = 0
            for i, ref in refs.items():
                try:
                    got = ray.get(ref)
                except RayTaskError as exc:
                    cause = exc.as_instanceof_cause()
                    if isinstance(cause, EmptyBufferError):  # its mass was stale
                        self._mass[key][i] = 0.0
                        todo += int(split[i])
                        continue
                    if isinstance(cause, RateLimitedError):  # the others take its part
                        held[i] = True
                        todo += int(split[i])
                        continue
                    raise cause from None
                except RayError:
                    self._health.down(i)
                    todo += int(split[i])
                    continue
                self._mass[key][i] = got[3]
                self._incarnation[i] = got[4]
                if i in parts:  # a second round for a shard: append
                    parts[i] = tuple(concat([a, b]) if k < 3 else b
                                     for k, (a, b) in enumerate(zip(parts[i], got)))
                else:
                    parts[i] = got
        return combine(parts, self._mass[num_steps], self._incarnation, self._beta, rng)

    def refresh(self, key: int | None) -> None:
        """Ask every shard that is up for its mass for windows of ``key`` steps."""
        self._mass[key] = self.masses(key)
        self._mass_at[key] = time.monotonic()

    def masses(self, num_steps: int | None) -> np.ndarray:
        """Each shard's mass for windows of ``num_steps`` (0 for a shard down)."""
        mass = np.zeros(self._num_shards)
        refs = {i: a.describe.remote(num_steps or 1) for i, a in enumerate(self._actors)
                if self._up[i]}
        for i, ref in refs.items():
            try:
                info = ray.get(ref)
            except RayError:
                self._health.down(i)
                continue
            mass[i] = info["mass"]
            self._incarnation[i] = info["incarnation"]
        return mass

    def update_priorities(self, ids: Any, priorities: Any) -> int:
        """Route each id's priority to its shard; returns how many were applied (ids of
        a shard's earlier incarnation, and overwritten steps, are ignored)."""
        id_array, values, _ = checked_priorities(ids, priorities)
        incarnations = id_array >> INCARNATION_SHIFT
        local = id_array & LOCAL_MASK
        local_ids, shards = np.divmod(local, self._num_shards)
        refs = {}
        for i in np.unique(shards):
            mine = (shards == i) & (incarnations == self._incarnation[int(i)])
            if mine.any() and self._up[int(i)]:
                refs[int(i)] = self._actors[int(i)].update_priorities.remote(
                    local_ids[mine], values[mine], list(self._mass))
        applied = 0
        for i, ref in refs.items():
            try:
                count, masses = ray.get(ref)
                applied += count
                self.set_masses(i, masses)
            except RayTaskError as exc:
                raise exc.as_instanceof_cause() from None
            except RayError:
                self._health.down(i)
        return applied

    def set_masses(self, shard: int, masses: dict[int | None, float]) -> None:
        """A shard's sampling masses as it reported them with an answer."""
        for key, value in masses.items():
            cached = self._mass.get(key)
            if cached is not None:
                cached[shard] = value
