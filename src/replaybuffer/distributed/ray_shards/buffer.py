"""Replay sharded over Ray actors: :class:`RayReplayBuffer`.

Each shard is a Ray actor holding a buffer of its own, made by ``buffer_factory()``
(any class: uniform, prioritized, transitions, with a rate limiter). The client has
the buffer's API:

- writes (``add_batch``, ``extend``, ``add``) go to one shard each, round-robin (or
  ``shard=``), asynchronously with at most ``max_in_flight`` outstanding; ``flush()``
  waits for them. Items are checked against the spec and the shards' ``batch_size``
  in the caller's process first, so bad input raises there and reaches no shard.
  Collectors write through :meth:`RayReplayBuffer.writer` (a :class:`ShardWriter`,
  which sends steps in chunks).
- reads (``get_next``, ``sample``, ``as_dataset``) draw each batch from every shard
  or from ``shards_per_batch`` of them, chosen by sampling mass (:mod:`.sampling`);
  probabilities (and importance weights) are those of the whole buffer. Datasets keep
  ``prefetch`` batches in flight (:mod:`.pipeline`).
- ``update_priorities`` routes each id to its shard, waiting for the answers or
  (``block=False``) not (:mod:`.priority_updates`). Ids carry the shard and the
  shard's incarnation (``incarnation << 48 | local_id * num_shards + shard``): an id
  from before a shard's restart is stale and ignored by the shard, as an overwritten
  one is.

Fault tolerance. With ``checkpoint_dir``, each shard saves a checkpoint (with its
rate limiter's counters) every ``checkpoint_every`` inserted steps. A shard actor that
dies is restarted by Ray (``max_restarts``) from its last checkpoint; meanwhile the
client samples from the others, and at its next answer from the shard records a
:class:`ShardLoss` (:mod:`.health`).

Parts: :mod:`.shard` (the shard actor), :mod:`.shard_home` (its files),
:mod:`.ordering` (each writer's order), :mod:`.outbox` (writes in flight),
:mod:`.writer` (:class:`ShardWriter`), :mod:`.packing` (a chunk as one byte buffer),
:mod:`.health` (shards down and back),
:mod:`.sampling` (which shards, batches in flight), :mod:`.batches` (one batch from
the parts), :mod:`.pipeline` (datasets), :mod:`.priority_updates` (updates in
flight). What the buffer surface (:class:`~replaybuffer.protocols.Buffer`) asks and
shards cannot do (``save(path)``, ``block=False`` of reads and writes, one ``Queue``
across shards) is refused with a :class:`~replaybuffer.distributed.NotSupportedError`
that names it.
Windows over round-robin writes would skip steps (consecutive steps went to different
shards): a shard that took them refuses windows of more than one step, by name, until
cleared; write sequences through ``shard=`` or :meth:`RayReplayBuffer.writer`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, NoReturn, overload

import numpy as np
import ray
from ray.exceptions import RayError

from replaybuffer import nest
from replaybuffer.arguments import check_timeout, positive_or_none
from replaybuffer.distributed.errors import (ShardsUnavailableError,
                                             ShardStartError, not_supported)
from replaybuffer.distributed.ray_shards.batches import shaped
from replaybuffer.distributed.ray_shards.health import (ShardHealth, close_shards,
                                                        failure_cause)
from replaybuffer.distributed.ray_shards.outbox import Outbox
from replaybuffer.distributed.ray_shards.pipeline import ShardStream, dataset_depth
from replaybuffer.distributed.ray_shards.priority_updates import PriorityUpdates
from replaybuffer.distributed.ray_shards.sampling import PendingBatch, ShardSampler
from replaybuffer.distributed.ray_shards.shard import ShardActor
from replaybuffer.distributed.ray_shards.writes import ShardWrites
from replaybuffer.errors import SpecError
from replaybuffer.protocols import BufferInfo
from replaybuffer.rate_limiter import RateLimiterStats
from replaybuffer.sampling.sampler import make_rng

if TYPE_CHECKING:
    from replaybuffer.protocols import Buffer, PrioritizedBuffer

DEFAULT_PREFETCH = 2
"""Batches a dataset keeps in flight unless told."""


class RayReplayBuffer(ShardWrites):
    """A buffer whose items live in ``num_shards`` Ray actors (see the module docstring).

    Args:
        buffer_factory: makes one shard's buffer (it runs in the shard's process; it
            must pickle: a module-level function or ``functools.partial``).
        num_shards: shards (actors).
        checkpoint_dir: where shards save (``shard-NNN/checkpoints`` each, beside an
            ``incarnation`` counter); ``None``: no saves, a restarted shard starts empty.
        checkpoint_every: inserted steps between a shard's saves.
        max_restarts: restarts Ray gives each shard actor.
        max_in_flight: writes outstanding before a write waits for the oldest (and
            ``update_priorities(block=False)`` calls before one waits for the oldest).
        seed: seeds the client's choice of shards and the seeds they draw with.
        actor_options: extra ``ray.remote`` options for the shards (``num_cpus``...).
        shards_per_batch: shards each batch is drawn from, chosen by sampling mass
            (``1``: Ape-X's one shard per batch); ``None`` (the default): every shard,
            exactly as one buffer would draw (see :mod:`.sampling`).

    Raises:
        ShardStartError: a shard could not start (the cause named).
        SpecError: the shards' data specs differ.
    """

    def __init__(self, buffer_factory: Callable[[], Any], num_shards: int, *,
                 checkpoint_dir: str | os.PathLike[str] | None = None,
                 checkpoint_every: int | None = None, max_restarts: int = 3,
                 max_in_flight: int = 8, seed: int | None = None,
                 actor_options: dict[str, Any] | None = None,
                 shards_per_batch: int | None = None):
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
        if checkpoint_every is not None and (not isinstance(checkpoint_every, int)
                                             or checkpoint_every < 1):
            raise ValueError(f"checkpoint_every must be a positive int or None, got "
                             f"{checkpoint_every!r}")
        if checkpoint_every is not None and checkpoint_dir is None:
            raise ValueError("checkpoint_every needs a checkpoint_dir")
        shards_per_batch = positive_or_none(shards_per_batch, "shards_per_batch")
        # Threaded shards: writes (and saves) run one at a time in their own thread, so
        # a write held back by the shard's rate limiter waits while samples go on;
        # priority updates in another (one: their order kept in one place), so that a
        # learner's update never waits behind a write its own sampling would release.
        options = {"num_cpus": 0, "max_restarts": max_restarts, "max_task_retries": 0,
                   "max_concurrency": 4}
        options.update(actor_options or {})
        # ray.remote's overloads list task options only; concurrency_groups is an actor's.
        shard_class = ray.remote(  # type: ignore[call-overload]
            concurrency_groups={"writes": 1, "priorities": 1})(ShardActor).options(**options)
        root = None if checkpoint_dir is None else str(Path(checkpoint_dir).resolve())
        self.num_shards = num_shards
        token = os.urandom(6).hex()
        self._actors = [shard_class.remote(buffer_factory, i, root, checkpoint_every, token)
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
        self._rows = described[0]["rows"]
        self._queued = described[0]["limiter"] == "Queue"
        self._consumes = bool(described[0]["consumes"])
        self._outbox = Outbox(self._data_spec, self._rows, max_in_flight, self._written)
        self._health = ShardHealth(self._actors, [d["incarnation"] for d in described],
                                   [d["last_id"] for d in described], self._forget_masses)
        self._sampler = ShardSampler(self._actors, self._health, described[0]["beta"],
                                     self._data_spec, shards_per_batch)
        self._updates = PriorityUpdates(self._actors, self._health, self._sampler,
                                        max_in_flight)
        self._up = self._health.up  # the health's list, read in place on every call
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

    @property
    def shards_per_batch(self) -> int | None:
        """Shards each batch is drawn from (``None``: every shard); settable."""
        return self._sampler.shards_per_batch

    @shards_per_batch.setter
    def shards_per_batch(self, value: int | None) -> None:
        self._sampler.shards_per_batch = positive_or_none(value, "shards_per_batch")

    def shards_up(self) -> list[bool]:
        """Which shards answered last (a restarted one is up once it answers again)."""
        self._probe()
        return list(self._up)

    def describe(self) -> list[dict[str, Any] | None]:
        """Each shard's ``index``, ``incarnation``, ``last_id``, ``size``, ``mass``... (see
        :meth:`~.shard.ShardActor.describe`; None for a shard that is down)."""
        out: list[dict[str, Any] | None] = []
        refs = [actor.describe.remote() for actor in self._actors]
        for i, ref in enumerate(refs):
            try:
                info = ray.get(ref)
            except RayError:
                self._health.down(i)
                out.append(None)
                continue
            info.pop("data_spec")
            self._health.observe(i, info["status"])
            out.append(info)
        return out

    @property
    def actors(self) -> tuple[Any, ...]:
        """The shards' Ray actor handles, in shard order (for tools that measure a
        shard alone; the buffer's methods are the way to use them)."""
        return tuple(self._actors)

    def __len__(self) -> int:
        """Items the shards that answer hold now (writes in flight not counted)."""
        return sum(d["size"] for d in self.describe() if d is not None)

    # ---------------------------------------------------------------- reading
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None, block: bool = True) -> tuple[Any, BufferInfo]:
        """``get_next`` over the shards (shapes as the shards' buffers give).

        A shard whose rate limiter holds its part back for :data:`SHARD_WAIT_S` has
        that part drawn from the others; when every shard holds back, the draw waits
        (up to ``timeout`` seconds, then :class:`~replaybuffer.RateLimitedError`);
        ``block=False`` is refused (:class:`NotSupportedError`). Every shard empty
        (FIFO shards all read, say): :class:`~replaybuffer.EmptyBufferError`."""
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        check_timeout(timeout)
        return self.draw(sample_batch_size, num_steps, time_stacked, None, within_episodes,
                         timeout, block)

    def sample(self, batch_size: int, *, timeout: float | None = None
               ) -> tuple[Any, BufferInfo]:
        """``sample`` over the shards (transition buffers), paced as :meth:`get_next`."""
        check_timeout(timeout)
        return self._sampler.draw("sample", int(batch_size), None, self._rng, timeout)

    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo]:
        """:meth:`get_next` after its argument checks, with ``rng`` (default: the
        buffer's); the :class:`~replaybuffer.protocols.SampleSource` seam."""
        if not block:
            raise not_supported(type(self), "get_next(block=False)",
                                "use timeout= (a shard's rate limiter paces the call)")
        items, info = self.finish_batch(self.start_batches(
            sample_batch_size or 1, num_steps, [rng or self._rng], within_episodes,
            timeout)[0])
        return shaped(items, info, sample_batch_size, num_steps, time_stacked)

    def start_batches(self, count: int, num_steps: int | None,
                      rngs: list[np.random.Generator], within_episodes: bool = False,
                      timeout: float | None = None, one_shard: bool = False
                      ) -> list[PendingBatch]:
        """Send the calls for one batch of ``count`` per generator of ``rngs`` (see
        :meth:`finish_batch`), those that go to one shard in one call; ``one_shard``:
        all of them from one shard, chosen by mass (:mod:`.sampling`)."""
        self._outbox.raise_error()
        self._updates.collect()
        self._updates.raise_error()
        self._probe()
        return self._sampler.start_many("get_next", count, num_steps, rngs, timeout,
                                        within_episodes, one_shard)

    def finish_batch(self, batch: PendingBatch) -> tuple[Any, BufferInfo]:
        """A batch :meth:`start_batches` sent for, once its parts are in."""
        return self._sampler.finish(batch)

    @overload
    def update_priorities(self, ids: Any, priorities: Any,
                          *, block: Literal[True] = ...) -> int: ...
    @overload
    def update_priorities(self, ids: Any, priorities: Any, *, block: Literal[False]) -> None: ...
    @overload
    def update_priorities(self, ids: Any, priorities: Any, *, block: bool) -> int | None: ...

    def update_priorities(self, ids: Any, priorities: Any, *, block: bool = True
                          ) -> int | None:
        """Route each id's priority to its shard (``ids``: ``BufferInfo.ids``, int64
        ``[S]`` or ``[S, T]``; ``priorities``: ``[S]``, finite, >= 0), applied in the
        order sent (the later of two updates of one id wins); ids of a shard's earlier
        incarnation, and overwritten steps, are ignored (:mod:`.priority_updates`).

        ``block=True``: returns how many were applied. ``block=False`` (Ape-X's
        learner): returns ``None`` at once; at most ``max_in_flight`` such calls
        outstanding, their counts summed in :attr:`priorities_applied` as they settle
        or at :meth:`flush`; a shard's error raised by the next call or ``flush()``.

        Raises:
            ValueError: mismatched shapes, or a NaN, infinite or negative priority;
                raised before anything is sent (no shard changes).
        """
        self._outbox.raise_error()
        return self._updates.send(ids, priorities, block)

    @property
    def priorities_applied(self) -> int:
        """Priorities applied by the updates settled so far (blocking ones included)."""
        return self._updates.applied

    # -------------------------------------------------------------- failures
    def _forget_masses(self) -> None:
        self._sampler.forget_masses()

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
        """Save every shard now; the ``last_id`` each saved (down shards: skipped). An
        error a write or update in flight met is raised after the save."""
        pending = self._settled()
        saved = list(self._health.ask("save").values())
        if pending is not None:
            raise pending
        return saved

    # -------------------------------------------------------------- iteration
    def spawn_rng(self) -> np.random.Generator:
        """A generator for a dataset stream, seeded from the buffer's."""
        return make_rng(np.random.SeedSequence(self._rng.integers(0, 2**63 - 1)))

    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None, prefetch: int | None = None,
                   within_episodes: bool = False, batches_per_call: int = 1,
                   group_from_one_shard: bool = False) -> ShardStream:
        """An endless stream of ``get_next(sample_batch_size, num_steps)`` batches with
        ``prefetch`` batches in flight to the shards while the learner works on the
        last one (:class:`~.pipeline.ShardStream`; default :data:`DEFAULT_PREFETCH`, or
        ``num_parallel_calls`` when larger), started ``batches_per_call`` at a time (the
        next group when fewer than ``prefetch`` would stay requested ahead: ``prefetch``
        to ``prefetch + batches_per_call - 1`` in flight); ``group_from_one_shard``:
        each such group drawn from one shard chosen by mass.
        FIFO shards (which consume what they give) are read on pull: no prefetch.

        Raises:
            ValueError: ``prefetch`` or ``batches_per_call`` below 1 (or not an int),
                ``group_from_one_shard`` not a bool, a bad size; on FIFO shards any
                prefetch, ``batches_per_call`` other than 1 or ``group_from_one_shard``.
        """
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        num_parallel_calls = positive_or_none(num_parallel_calls, "num_parallel_calls")
        depth = dataset_depth(prefetch, num_parallel_calls, DEFAULT_PREFETCH,
                              self.buffer_class if self._consumes else None,
                              batches_per_call, group_from_one_shard)
        return ShardStream(self, sample_batch_size, num_steps, depth, within_episodes,
                           batches_per_call, group_from_one_shard)

    def stats(self) -> RateLimiterStats | None:
        """The shards' rate-limiter counters, summed over the shards that answer
        (``None`` when no shard has a rate limiter). A restarted shard's counters are
        those saved with its checkpoint."""
        found = [s for s in self._health.ask("stats").values() if s is not None]
        return RateLimiterStats(*(sum(column) for column in zip(*found))) if found else None

    def clear(self) -> None:
        """Empty every shard (after the writes in flight from this client land); each
        comes back as a new incarnation, so ids drawn before are ignored by
        :meth:`update_priorities`. Writes in flight from other writers
        (:meth:`writer`) may land after it.

        Raises:
            ShardsUnavailableError: a shard was down (it keeps its steps).
            Exception: the first error a write or update in flight met, raised once
                the shards are cleared.
        """
        pending = self._settled()
        answers = self._health.ask("clear")
        for i, info in answers.items():
            self._health.renamed(i, info["incarnation"], info["last_id"])
        self._sampler.forget_masses()
        missed = [i for i in range(self.num_shards) if i not in answers]
        if missed:
            raise ShardsUnavailableError(f"clear: shards {missed} were down and keep "
                                         "their steps") from pending
        if pending is not None:
            raise pending

    def save(self, path: str | os.PathLike[str], keep: int = 1) -> NoReturn:
        """Refused: raises :class:`NotSupportedError`; shards save to the
        ``checkpoint_dir`` (:meth:`checkpoint`)."""
        raise not_supported(type(self), "save(path)", "give checkpoint_dir= and call "
                            "checkpoint(); each shard saves there")

    def close(self) -> None:
        """Kill the shard actors (their checkpoints stay; temporary files go).

        Each shard removes its temporary files and the acknowledgements of losses still
        in flight are read, within 5 s together; a removal that failed in a shard, or a
        shard that did not answer in time, is a ``RuntimeWarning`` naming the shard and
        the cause, given once every shard is killed. A dead shard is skipped (its files
        stay). Closing again does nothing; a dead shard never makes it raise
        (:func:`~.health.close_shards`).
        """
        if not self._actors:
            return
        health = getattr(self, "_health", None)  # (none yet when a start failed)
        actors = list(self._actors)
        self._actors.clear()  # closed even if a warning is raised as an error
        close_shards(actors, None if health is None else health.acknowledgements)

    def __enter__(self) -> "RayReplayBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


if TYPE_CHECKING:  # the buffer surface, checked by mypy
    def _is_a_buffer(buffer: RayReplayBuffer) -> Buffer:
        return buffer

    def _is_a_prioritized_buffer(buffer: RayReplayBuffer) -> PrioritizedBuffer:
        return buffer
