"""Replay sharded over Ray actors: :class:`RayReplayBuffer`.

Each shard is a Ray actor holding a buffer of its own, made by ``buffer_factory()``
(any class: uniform, prioritized, transitions, with a rate limiter). The client has
the buffer's API:

- writes (``add_batch``, ``extend``, ``add``) go to one shard each, round-robin (or
  ``shard=``), asynchronously with at most ``max_in_flight`` outstanding; ``flush()``
  waits for them. ``add_batch``/``extend`` items are checked against the spec in the
  caller's process first, so bad input raises there and reaches no shard.
- reads (``get_next``, ``sample``) split the batch over the shards that are up by a
  multinomial draw in proportion to each shard's sampling mass (windows it holds for
  uniform buffers, its priority total for prioritized ones), as one buffer holding all
  the shards' items would draw; probabilities (and importance weights) are rescaled to
  the whole. The masses are those each shard reported with its last answer (to a
  draw, a write once settled, or a priority update), and all are asked again every
  :data:`MASS_REFRESH_S`: writes in flight, or from other writers since, are not
  counted yet.
- ``update_priorities`` routes each id to its shard. Ids carry the shard and the
  shard's incarnation (``incarnation << 48 | local_id * num_shards + shard``): an id
  from before a shard's restart is stale and ignored, as an overwritten one is.

Fault tolerance. With ``checkpoint_dir``, each shard saves a checkpoint
(``buffer.save``, ``keep=2``) every ``checkpoint_every`` inserted steps. A shard actor
that dies (``ray.kill``, a crash) is restarted by Ray (``max_restarts``) from its last
checkpoint; meanwhile the client samples from the others. When the shard answers
again the client records a :class:`ShardLoss`: how many steps the shard had that its
checkpoint did not (writes in flight to it when it died are counted too).

Batches travel through Ray's object store as numpy arrays (pickle protocol 5, out of
band): a shard's sample is written once into the store, and ``ray.get`` maps it
without a copy; the client then concatenates the shards' parts (one copy).

Parts: :mod:`.shard` (the shard actor), :mod:`.outbox` (writes in flight,
:class:`ShardWriter`), :mod:`.health` (shards down and back, :class:`ShardLoss`),
:mod:`.batches` (one batch from the shards' parts). What the buffer surface
(:class:`~replaybuffer.protocols.Buffer`) asks and the shards cannot do yet
(``save(path)``, ``block=False``, ``time_stacked=False``, episodes) is refused with an
error that names it (issue 25).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, NoReturn

import numpy as np
import ray
from ray.exceptions import RayError

from replaybuffer import nest
from replaybuffer.arguments import check_timeout, positive_or_none
from replaybuffer.dataset import RandomStream
from replaybuffer.distributed.errors import (ShardsUnavailableError, ShardStartError,
                                             not_supported)
from replaybuffer.distributed.ray_shards.batches import map_leaves
from replaybuffer.distributed.ray_shards.health import ShardHealth, failure_cause
from replaybuffer.distributed.ray_shards.outbox import Outbox, ShardWriter
from replaybuffer.distributed.ray_shards.sampling import (ShardSampler)
from replaybuffer.distributed.ray_shards.shard import (ShardActor)
from replaybuffer.errors import SpecError
from replaybuffer.protocols import BufferInfo
from replaybuffer.rate_limiter import RateLimiterStats
from replaybuffer.sampling.sampler import make_rng

if TYPE_CHECKING:
    from replaybuffer.protocols import Buffer, PrioritizedBuffer

class RayReplayBuffer:
    """A buffer whose items live in ``num_shards`` Ray actors (see the module docstring).

    Args:
        buffer_factory: makes one shard's buffer (it runs in the shard's process; it
            must pickle: a module-level function or ``functools.partial``).
        num_shards: shards (actors).
        checkpoint_dir: where shards save (``shard-NNN/checkpoints`` each, beside an
            ``incarnation`` counter); ``None``: no saves, a
            restarted shard starts empty.
        checkpoint_every: inserted steps between a shard's saves.
        max_restarts: restarts Ray gives each shard actor.
        max_in_flight: writes outstanding before a write waits for the oldest.
        seed: seeds the client's split of samples over shards.
        actor_options: extra ``ray.remote`` options for the shards (``num_cpus``...).

    Raises:
        ShardStartError: a shard could not start (the cause named).
        SpecError: the shards' data specs differ.
    """

    def __init__(self, buffer_factory: Callable[[], Any], num_shards: int, *,
                 checkpoint_dir: str | os.PathLike[str] | None = None,
                 checkpoint_every: int | None = None, max_restarts: int = 3,
                 max_in_flight: int = 8, seed: int | None = None,
                 actor_options: dict[str, Any] | None = None):
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
        if checkpoint_every is not None and (not isinstance(checkpoint_every, int)
                                             or checkpoint_every < 1):
            raise ValueError(f"checkpoint_every must be a positive int or None, got "
                             f"{checkpoint_every!r}")
        if checkpoint_every is not None and checkpoint_dir is None:
            raise ValueError("checkpoint_every needs a checkpoint_dir")
        # Threaded shards: writes (and saves) run one at a time in the order sent, in
        # their own thread, so a write held back by the shard's rate limiter waits
        # while samples go on in the others.
        options = {"num_cpus": 0, "max_restarts": max_restarts, "max_task_retries": 0,
                   "max_concurrency": 4}
        options.update(actor_options or {})
        # ray.remote's overloads list task options only; concurrency_groups is an actor's.
        shard_class = ray.remote(  # type: ignore[call-overload]
            concurrency_groups={"writes": 1})(ShardActor).options(**options)
        root = None if checkpoint_dir is None else str(Path(checkpoint_dir).resolve())
        self.num_shards = num_shards
        self._actors = [shard_class.remote(buffer_factory, i, root, checkpoint_every)
                        for i in range(num_shards)]
        self._rng = make_rng(seed)
        self._max_in_flight = max_in_flight
        self._next_shard = 0
        described = []
        for i, actor in enumerate(self._actors):
            try:
                described.append(ray.get(actor.describe.remote()))
            except RayError as exc:
                self.close()
                raise ShardStartError(f"shard {i} could not start: {failure_cause(exc)}"
                                      ) from exc
        specs = [d["data_spec"] for d in described]
        for i, spec in enumerate(specs[1:], 1):
            if nest.flatten(spec)[1] != nest.flatten(specs[0])[1] or \
                    nest.flatten(spec)[0] != nest.flatten(specs[0])[0]:
                self.close()
                raise SpecError(f"shard {i}'s data_spec differs from shard 0's: "
                                f"{spec} vs {specs[0]}")
        self._data_spec = specs[0]
        self._outbox = Outbox(self._data_spec, max_in_flight, self._written)
        self._health = ShardHealth(self._actors, [d["incarnation"] for d in described],
                                   [d["last_id"] for d in described],
                                   self._forget_masses)
        self._sampler = ShardSampler(self._actors, self._health, described[0]["beta"])
        # The health's lists, read and written in place on every call.
        self._up, self._last_id = self._health.up, self._health.last_id
        self.losses = self._health.losses
        self._capacity = sum(int(d["capacity"]) for d in described)
        self.buffer_class = described[0]["class"]

    # -------------------------------------------------------------- properties
    @property
    def data_spec(self) -> Any:
        return self._data_spec

    @property
    def capacity(self) -> int:
        """Items all shards hold at most together (the sum of their capacities)."""
        return self._capacity

    @property
    def rate_limiter(self) -> None:
        """Rate limiters live in the shards (the factory's buffers)."""
        return None

    paced = True
    """Prefetch threads sample in short rounds: a shard's limiter may hold them back."""

    def shards_up(self) -> list[bool]:
        """Which shards answered last (a restarted one is up once it answers again)."""
        self._probe()
        return list(self._up)

    def describe(self) -> list[dict[str, Any] | None]:
        """Each shard's ``index``, ``incarnation``, ``last_id``, ``size``, ``mass`` (None
        for a shard that is down)."""
        out: list[dict[str, Any] | None] = []
        for i, actor in enumerate(self._actors):
            try:
                info = ray.get(actor.describe.remote())
                info.pop("data_spec")
                out.append(info)
            except RayError:
                self._down(i)
                out.append(None)
        return out

    @property
    def actors(self) -> tuple[Any, ...]:
        """The shards' Ray actor handles, in shard order (for tools that measure a
        shard alone; the buffer's methods are the way to use them)."""
        return tuple(self._actors)

    def __len__(self) -> int:
        """Items the shards that answer hold now (writes in flight not counted)."""
        return sum(d["size"] for d in self.describe() if d is not None)

    # ----------------------------------------------------------------- writing
    def add_batch(self, items: Any, *, shard: int | None = None,
                  timeout: float | None = None, block: bool = True) -> bool:
        """Append one step to every row of one shard (round-robin, or ``shard``).
        Checked here against the spec; written asynchronously (see :meth:`flush`).

        Round-robin suits items whole on their own (transitions); steps that form
        windows (``get_next(num_steps=T)``) must go to one shard per writer:
        ``shard=`` or a :meth:`writer`.

        Args:
            timeout: passed to the shard's ``add_batch`` (its rate limiter's
                :class:`~replaybuffer.RateLimitedError` surfaces at a later call).
            block: only ``True``: an asynchronous write cannot say it was held back.

        Returns:
            ``True``: the write was sent.
        """
        self._check_block(block, "add_batch")
        self._outbox.check(items, 1, "add_batch")
        self._write("add_batch", (items,), {} if timeout is None else {"timeout": timeout},
                    shard)
        return True

    def extend(self, items: Any, *, shard: int | None = None,
               timeout: float | None = None, block: bool = True) -> bool:
        """``extend`` on one shard (leaves ``[batch_size, T, ...]``), as :meth:`add_batch`."""
        self._check_block(block, "extend")
        self._outbox.check(items, 2, "extend")
        self._write("extend", (items,), {} if timeout is None else {"timeout": timeout},
                    shard)
        return True

    def _check_block(self, block: bool, method: str) -> None:
        if not block:
            raise not_supported(type(self), f"{method}(block=False)",
                                "use timeout= (a shard's rate limiter paces the call)")

    def add(self, *args: Any, shard: int | None = None, **kwargs: Any) -> None:
        """``add`` on one shard (transition buffers); its errors surface at the next
        call or :meth:`flush`."""
        self._write("add", args, kwargs, shard)

    def _write(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
               shard: int | None) -> None:
        self._outbox.raise_error()
        self._probe()
        if shard is None:
            shard = self._pick_writer()
        elif not 0 <= shard < self.num_shards:
            raise ValueError(f"shard must be in [0, {self.num_shards}), got {shard}")
        self._outbox.send(shard, self._actors[shard], method, args, kwargs, self._sampler.mass_keys())

    def _pick_writer(self) -> int:
        for _ in range(self.num_shards):
            shard = self._next_shard
            self._next_shard = (self._next_shard + 1) % self.num_shards
            if self._up[shard]:
                return shard
        raise ShardsUnavailableError(f"all {self.num_shards} shards are down")

    def _written(self, shard: int, answer: tuple[int, dict[int | None, float]] | None
                 ) -> None:
        """A write settled: its shard's ``last_id`` and masses (``None``: shard down)."""
        if answer is None:
            self._down(shard)
            return
        last_id, masses = answer
        self._last_id[shard] = max(self._last_id[shard], last_id)
        self._sampler.set_masses(shard, masses)

    def flush(self) -> None:
        """Wait for every write in flight; raise the first error one of them met."""
        self._outbox.flush()

    def writer(self, shard: int) -> ShardWriter:
        """A writer to ``shard`` alone, which pickles: hand it to a collector (a Ray
        actor, a process) so its steps stay one sequence in one shard."""
        if not 0 <= shard < self.num_shards:
            raise ValueError(f"shard must be in [0, {self.num_shards}), got {shard}")
        return ShardWriter(self._actors[shard], shard, self._data_spec, self._max_in_flight)

    # ---------------------------------------------------------------- reading
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, timeout: float | None = None,
                 block: bool = True) -> tuple[Any, BufferInfo]:
        """``get_next`` over all shards (shapes as the shards' buffers give).

        A shard whose rate limiter holds its part back for :data:`SHARD_WAIT_S` has
        that part drawn from the others; when every shard holds back, the draw waits
        (up to ``timeout`` seconds, then :class:`~replaybuffer.RateLimitedError`);
        ``block=False`` is refused (:class:`NotSupportedError`)."""
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        check_timeout(timeout)
        return self.draw(sample_batch_size, num_steps, time_stacked, timeout=timeout,
                         block=block)

    def sample(self, batch_size: int, *, timeout: float | None = None
               ) -> tuple[Any, BufferInfo]:
        """``sample`` over all shards (transition buffers), paced as :meth:`get_next`."""
        return self._draw("sample", int(batch_size), None, self._rng, timeout)

    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo]:
        """:meth:`get_next` after its argument checks, splitting with ``rng`` (default:
        the buffer's); the :class:`~replaybuffer.protocols.SampleSource` seam."""
        self._check_block(block, "get_next")
        if within_episodes:
            raise ValueError("within_episodes is not supported across shards")
        if not time_stacked:
            raise ValueError("time_stacked=False is not supported across shards")
        items, info = self._draw("get_next", sample_batch_size or 1, num_steps,
                                 rng or self._rng, timeout)
        if sample_batch_size is None:
            items = map_leaves(lambda a: a[0], items)
            info = BufferInfo(info.ids[0], info.probabilities[0],
                              None if info.weights is None else info.weights[0])
        return items, info

    def _draw(self, method: str, count: int, num_steps: int | None,
              rng: np.random.Generator, timeout: float | None = None
              ) -> tuple[Any, BufferInfo]:
        self._outbox.raise_error()
        self._probe()
        return self._sampler.draw(method, count, num_steps, rng, timeout)

    def update_priorities(self, ids: Any, priorities: Any) -> int:
        """Route each id's priority to its shard; returns how many were applied (ids of
        a shard's earlier incarnation, and overwritten steps, are ignored).

        Raises:
            ValueError: mismatched shapes, or a NaN, infinite or negative priority.
        """
        self._outbox.raise_error()
        return self._sampler.update_priorities(ids, priorities)

    # -------------------------------------------------------------- failures
    def _forget_masses(self) -> None:
        self._sampler.forget_masses()

    def _down(self, shard: int) -> None:
        self._health.down(shard)

    def _probe(self, interval: float = 0.2) -> None:
        self._health.probe(interval)

    def wait_for_shards(self, timeout: float = 60.0) -> None:
        """Block until every shard answers (after restarts), or raise
        :class:`ShardsUnavailableError` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not all(self._up) and time.monotonic() < deadline:
            self._probe(interval=0.1)
            time.sleep(0.05)
        if not all(self._up):
            down = [i for i, up in enumerate(self._up) if not up]
            raise ShardsUnavailableError(f"shards {down} did not come back in {timeout} s")

    def checkpoint(self) -> list[int]:
        """Save every shard now; the ``last_id`` each saved (down shards: skipped)."""
        self.flush()
        refs = {i: a.save.remote() for i, a in enumerate(self._actors) if self._up[i]}
        return [ray.get(ref) for ref in refs.values()]

    # -------------------------------------------------------------- iteration
    def spawn_rng(self) -> np.random.Generator:
        """A generator for a dataset stream, seeded from the buffer's."""
        return make_rng(np.random.SeedSequence(self._rng.integers(0, 2**63 - 1)))

    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None,
                   prefetch: int | None = None) -> Iterable[tuple[Any, BufferInfo]]:
        """An endless stream of ``get_next`` elements, prefetched from the shards by
        ``num_parallel_calls`` threads (see :class:`~replaybuffer.dataset.RandomStream`)."""
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        return RandomStream(self, sample_batch_size, num_steps, num_parallel_calls, prefetch)

    def stats(self) -> RateLimiterStats | None:
        """The shards' rate-limiter counters, summed over the shards that answer
        (``None`` when no shard has a rate limiter). A restarted shard's counters
        start again from 0 (issue 25)."""
        found = [s for s in self._health.ask("stats").values() if s is not None]
        return RateLimiterStats(*(sum(column) for column in zip(*found))) if found else None

    def clear(self) -> None:
        """Empty every shard (after the writes in flight from this client land); each
        comes back as a new incarnation, so ids drawn before are ignored by
        :meth:`update_priorities`. Writes in flight from other writers
        (:meth:`writer`) may land after it.

        Raises:
            ShardsUnavailableError: a shard was down (it keeps its steps).
        """
        self.flush()
        answers = self._health.ask("clear")
        for i, info in answers.items():
            self._health.incarnation[i] = info["incarnation"]
            self._last_id[i] = info["last_id"]
        self._sampler.forget_masses()
        missed = [i for i in range(self.num_shards) if i not in answers]
        if missed:
            raise ShardsUnavailableError(f"clear: shards {missed} were down and keep "
                                         "their steps")

    def save(self, path: str | os.PathLike[str], keep: int = 1) -> NoReturn:
        """Refused (issue 25): raises :class:`NotSupportedError`; shards save to the
        ``checkpoint_dir`` (:meth:`checkpoint`)."""
        raise not_supported(type(self), "save(path)", "give checkpoint_dir= and call "
                            "checkpoint(); each shard saves there")

    def close(self) -> None:
        """Kill the shard actors (their checkpoints stay)."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors.clear()

    def __enter__(self) -> "RayReplayBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


if TYPE_CHECKING:  # the buffer surface, checked by mypy
    def _is_a_buffer(buffer: RayReplayBuffer) -> Buffer:
        return buffer

    def _is_a_prioritized_buffer(buffer: RayReplayBuffer) -> PrioritizedBuffer:
        return buffer
