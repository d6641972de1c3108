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
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, cast

import numpy as np
import ray
from ray.exceptions import RayError, RayTaskError

from replaybuffer.protocols import BufferInfo
from replaybuffer import nest
from replaybuffer.arguments import positive_or_none
from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.dataset import RandomStream
from replaybuffer.errors import EmptyBufferError, ReplayBufferError, SpecError
from replaybuffer.rate_limiter import RateLimitedError
from replaybuffer.sampling.sampler import make_rng
from replaybuffer.storage.numpy_storage import NumpyStorage

if TYPE_CHECKING:
    from replaybuffer.buffers.prioritized import PrioritizedMixin
    from replaybuffer.buffers.transitions import TransitionReplayBuffer

__all__ = ["RayReplayBuffer", "ShardWriter", "ShardLoss", "ShardsUnavailableError",
           "ShardStartError"]

INCARNATION_SHIFT = 48
GAP_S = 5.0
MASS_REFRESH_S = 1.0
"""Each shard's sampling mass is asked again at least this often (collectors writing
through their own ShardWriters change it without the client seeing their answers)."""
SHARD_WAIT_S = 0.2
"""How long a shard's rate limiter may hold a part of a sample back before the client
draws that part from the other shards (or, all held back, asks again)."""
"""How long a shard holds a writer's early writes for a missing earlier one."""
LOCAL_MASK = (1 << INCARNATION_SHIFT) - 1


class ShardsUnavailableError(ReplayBufferError, RuntimeError):
    """Every shard is down (restarting, or out of restarts)."""


class ShardStartError(ReplayBufferError, RuntimeError):
    """A shard could not start: its factory raised, or its actor died starting."""


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


class _Shard:
    """One shard's actor (wrapped by ``ray.remote`` in :class:`RayReplayBuffer`)."""

    def __init__(self, factory: Callable[[], Any], index: int, root: str | None,
                 checkpoint_every: int | None):
        from replaybuffer.persist import checkpoints, load

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
        b = self.buffer
        return {"index": self.index, "incarnation": self.incarnation, "last_id": b.last_id,
                "size": b.num_frames(), "mass": b.window_mass(num_steps),
                "restored_last_id": self.restored_last_id, "class": type(b).__name__,
                "data_spec": b.data_spec, "beta": getattr(b, "beta", None),
                "saved_last_id": self.saved_last_id}

    def masses(self, keys: list[int | None]) -> dict[int | None, float]:
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
        if method == "get_next":
            items, info = self.buffer.get_next(count, num_steps, timeout=timeout)
        else:  # asked of transition buffers only
            items, info = cast("TransitionReplayBuffer", self.buffer).sample(count,
                                                                             timeout=timeout)
        return (items, np.asarray(info.ids), np.asarray(info.probabilities),
                self.buffer.window_mass(num_steps or 1), self.incarnation)

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray,
                          keys: list[int | None]) -> tuple[int, dict[int | None, float]]:
        prioritized = cast("PrioritizedMixin", self.buffer)  # asked of prioritized ones only
        return prioritized.update_priorities(ids, priorities), self.masses(keys)

    @ray.method(concurrency_group="writes")
    def save(self) -> int:
        if self.root is None:
            return self.saved_last_id
        self.buffer.save(self.root, keep=2)
        self.saved_last_id = self.buffer.last_id
        return self.saved_last_id


class _Outbox:
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
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def flush(self) -> None:
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
        self._outbox = _Outbox(data_spec, max_in_flight, self._written)
        self.dropped = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return ShardWriter, (self._actor, self.shard, self._data_spec, self._max_in_flight)

    def _written(self, shard: int, answer: Any) -> None:
        if answer is None:
            self.dropped += 1

    def add_batch(self, items: Any) -> None:
        self._outbox.check(items, 1, "add_batch")
        self._outbox.send(self.shard, self._actor, "add_batch", (items,), {}, [])

    def extend(self, items: Any) -> None:
        self._outbox.check(items, 2, "extend")
        self._outbox.send(self.shard, self._actor, "extend", (items,), {}, [])

    def add(self, *args: Any, **kwargs: Any) -> None:
        self._outbox.send(self.shard, self._actor, "add", args, kwargs, [])

    def flush(self) -> None:
        self._outbox.flush()


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
            concurrency_groups={"writes": 1})(_Shard).options(**options)
        root = None if checkpoint_dir is None else str(Path(checkpoint_dir).resolve())
        self.num_shards = num_shards
        self._actors = [shard_class.remote(buffer_factory, i, root, checkpoint_every)
                        for i in range(num_shards)]
        self._rng = make_rng(seed)
        self._max_in_flight = max_in_flight
        self._next_shard = 0
        self._up = [True] * num_shards
        self._last_ping = [0.0] * num_shards
        self._pings: dict[int, Any] = {}
        self._probe_lock = threading.Lock()
        self.losses: list[ShardLoss] = []
        described = []
        for i, actor in enumerate(self._actors):
            try:
                described.append(ray.get(actor.describe.remote()))
            except RayError as exc:
                self.close()
                raise ShardStartError(f"shard {i} could not start: {_cause(exc)}") from exc
        specs = [d["data_spec"] for d in described]
        for i, spec in enumerate(specs[1:], 1):
            if nest.flatten(spec)[1] != nest.flatten(specs[0])[1] or \
                    nest.flatten(spec)[0] != nest.flatten(specs[0])[0]:
                self.close()
                raise SpecError(f"shard {i}'s data_spec differs from shard 0's: "
                                f"{spec} vs {specs[0]}")
        self._data_spec = specs[0]
        self._outbox = _Outbox(self._data_spec, max_in_flight, self._written)
        self._incarnation = [d["incarnation"] for d in described]
        self._last_id = [d["last_id"] for d in described]
        self._mass: dict[int | None, np.ndarray] = {}
        self._mass_at: dict[int | None, float] = {}
        self._beta = described[0]["beta"]
        self.buffer_class = described[0]["class"]

    # -------------------------------------------------------------- properties
    @property
    def data_spec(self) -> Any:
        return self._data_spec

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
        return sum(d["size"] for d in self.describe() if d is not None)

    # ----------------------------------------------------------------- writing
    def add_batch(self, items: Any, *, shard: int | None = None) -> None:
        """Append one step to every row of one shard (round-robin, or ``shard``).
        Checked here against the spec; written asynchronously (see :meth:`flush`).

        Round-robin suits items whole on their own (transitions); steps that form
        windows (``get_next(num_steps=T)``) must go to one shard per writer:
        ``shard=`` or a :meth:`writer`."""
        self._outbox.check(items, 1, "add_batch")
        self._write("add_batch", (items,), {}, shard)

    def extend(self, items: Any, *, shard: int | None = None) -> None:
        """``extend`` on one shard (leaves ``[batch_size, T, ...]``), as :meth:`add_batch`."""
        self._outbox.check(items, 2, "extend")
        self._write("extend", (items,), {}, shard)

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
        self._outbox.send(shard, self._actors[shard], method, args, kwargs, list(self._mass))

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
        self._set_masses(shard, masses)

    def flush(self) -> None:
        """Wait for every write in flight; raise the first error one of them met."""
        self._outbox.flush()

    def writer(self, shard: int) -> "ShardWriter":
        """A writer to ``shard`` alone, which pickles: hand it to a collector (a Ray
        actor, a process) so its steps stay one sequence in one shard."""
        if not 0 <= shard < self.num_shards:
            raise ValueError(f"shard must be in [0, {self.num_shards}), got {shard}")
        return ShardWriter(self._actors[shard], shard, self._data_spec, self._max_in_flight)

    # ---------------------------------------------------------------- reading
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, timeout: float | None = None
                 ) -> tuple[Any, BufferInfo]:
        """``get_next`` over all shards (shapes as the shards' buffers give).

        A shard whose rate limiter holds its part back for :data:`SHARD_WAIT_S` has
        that part drawn from the others; when every shard holds back, the draw waits
        (up to ``timeout`` seconds, then :class:`~replaybuffer.RateLimitedError`)."""
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        return self.draw(sample_batch_size, num_steps, time_stacked, timeout=timeout)

    def sample(self, batch_size: int, *, timeout: float | None = None
               ) -> tuple[Any, BufferInfo]:
        """``sample`` over all shards (transition buffers), paced as :meth:`get_next`."""
        return self._draw("sample", int(batch_size), None, self._rng, timeout)

    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo]:
        if within_episodes:
            raise ValueError("within_episodes is not supported across shards")
        if not time_stacked:
            raise ValueError("time_stacked=False is not supported across shards")
        items, info = self._draw("get_next", sample_batch_size or 1, num_steps,
                                 rng or self._rng, timeout)
        if sample_batch_size is None:
            items = _map(lambda a: a[0], items)
            info = BufferInfo(info.ids[0], info.probabilities[0],
                              None if info.weights is None else info.weights[0])
        return items, info

    def _draw(self, method: str, count: int, num_steps: int | None,
              rng: np.random.Generator, timeout: float | None = None
              ) -> tuple[Any, BufferInfo]:
        self._outbox.raise_error()
        self._probe()
        key = num_steps
        if key not in self._mass or \
                time.monotonic() - self._mass_at.get(key, 0.0) > MASS_REFRESH_S:
            self._refresh(key)
        parts: dict[int, tuple[Any, ...]] = {}
        todo = count
        held = np.zeros(self.num_shards, bool)  # shards whose rate limiter held a part back
        deadline = None if timeout is None else time.monotonic() + timeout
        while todo:
            if held.any() and not (self._mass[key] * np.array(self._up) * ~held).sum() > 0:
                # Every shard with mass held its part back: ask all again, with fresh
                # masses (writers elsewhere may have filled the others meanwhile).
                if deadline is not None and time.monotonic() >= deadline:
                    raise RateLimitedError(f"{method}: every shard's rate limiter held the "
                                           f"sample back for {timeout} s")
                self._refresh(key)
                held[:] = False
            mass = self._mass[key] * np.array(self._up) * ~held
            if not mass.sum() > 0:
                if not any(self._up):
                    raise ShardsUnavailableError(f"all {self.num_shards} shards are down")
                self._mass[key] = mass = self._masses(num_steps) * np.array(self._up)
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
                    self._down(i)
                    todo += int(split[i])
                    continue
                self._mass[key][i] = got[3]
                self._incarnation[i] = got[4]
                if i in parts:  # a second round for a shard: append
                    parts[i] = tuple(_concat([a, b]) if k < 3 else b
                                     for k, (a, b) in enumerate(zip(parts[i], got)))
                else:
                    parts[i] = got
        return self._combine(parts, num_steps, rng)

    def _refresh(self, key: int | None) -> None:
        self._mass[key] = self._masses(key)
        self._mass_at[key] = time.monotonic()

    def _masses(self, num_steps: int | None) -> np.ndarray:
        mass = np.zeros(self.num_shards)
        refs = {i: a.describe.remote(num_steps or 1) for i, a in enumerate(self._actors)
                if self._up[i]}
        for i, ref in refs.items():
            try:
                info = ray.get(ref)
            except RayError:
                self._down(i)
                continue
            mass[i] = info["mass"]
            self._incarnation[i] = info["incarnation"]
        return mass

    def _combine(self, parts: dict[int, tuple[Any, ...]], num_steps: int | None,
                 rng: np.random.Generator) -> tuple[Any, BufferInfo]:
        mass = self._mass[num_steps]
        total = float(sum(mass[i] for i in parts))
        shards = sorted(parts)
        items = _concat([parts[i][0] for i in shards])
        ids = np.concatenate([(self._incarnation[i] << INCARNATION_SHIFT)
                              | (parts[i][1] * self.num_shards + i) for i in shards])
        probabilities = np.concatenate([parts[i][2] * (mass[i] / total) for i in shards]
                                       ).astype(np.float32)
        order = rng.permutation(len(probabilities))  # shard parts interleaved
        items = _map(lambda a: a[order], items)
        ids, probabilities = ids[order], probabilities[order]
        weights = None
        if self._beta is not None:  # prioritized: (P_min / P) ** beta over the batch
            p = probabilities.astype(np.float64)
            weights = np.power(p.min() / p, self._beta).astype(np.float32)
        return items, BufferInfo(ids, probabilities, weights)

    def update_priorities(self, ids: Any, priorities: Any) -> int:
        """Route each id's priority to its shard; returns how many were applied (ids of
        a shard's earlier incarnation, and overwritten steps, are ignored)."""
        from replaybuffer.buffers.prioritized import checked_priorities

        self._outbox.raise_error()
        id_array, values, _ = checked_priorities(ids, priorities)
        incarnations = id_array >> INCARNATION_SHIFT
        local = id_array & LOCAL_MASK
        local_ids, shards = np.divmod(local, self.num_shards)
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
                self._set_masses(i, masses)
            except RayTaskError as exc:
                raise exc.as_instanceof_cause() from None
            except RayError:
                self._down(i)
        return applied

    def _set_masses(self, shard: int, masses: dict[int | None, float]) -> None:
        """A shard's sampling masses as it reported them with an answer."""
        for key, value in masses.items():
            cached = self._mass.get(key)
            if cached is not None:
                cached[shard] = value

    # -------------------------------------------------------------- failures
    def _down(self, shard: int) -> None:
        if self._up[shard]:
            self._up[shard] = False
            self._last_ping[shard] = time.monotonic()

    def _probe(self, interval: float = 0.2) -> None:
        """Ping down shards (at most every ``interval`` s, without waiting); one that
        answers is up again, and its loss is recorded."""
        if all(self._up) and not self._pings:
            return
        with self._probe_lock:  # prefetch threads probe too
            self._probe_locked(interval)

    def _probe_locked(self, interval: float) -> None:
        now = time.monotonic()
        for i in range(self.num_shards):
            if self._up[i]:
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
            self._up[i] = True
            self._mass.clear()
            if info["incarnation"] != self._incarnation[i]:
                self.losses.append(ShardLoss(i, max(0, self._last_id[i] -
                                                    info["restored_last_id"]),
                                             info["restored_last_id"],
                                             info["incarnation"], time.time()))
                self._incarnation[i] = info["incarnation"]
                self._last_id[i] = info["last_id"]

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
        return make_rng(np.random.SeedSequence(self._rng.integers(0, 2**63 - 1)))

    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None,
                   prefetch: int | None = None) -> Iterable[tuple[Any, BufferInfo]]:
        """An endless stream of ``get_next`` elements, prefetched from the shards by
        ``num_parallel_calls`` threads (see :class:`~replaybuffer.dataset.RandomStream`)."""
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        return RandomStream(self, sample_batch_size, num_steps, num_parallel_calls, prefetch)

    def close(self) -> None:
        """Kill the shard actors (their checkpoints stay)."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []

    def __enter__(self) -> "RayReplayBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _cause(exc: BaseException) -> str:
    """What went wrong in a shard, in one line: the original exception of a task
    error, or the last line of an actor's death report (its creation's exception)."""
    if isinstance(exc, RayTaskError):
        cause = exc.as_instanceof_cause()
        return f"{type(cause).__name__}: {cause}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _concat(parts: list[Any]) -> Any:
    """Concatenate nests of arrays along their first axis."""
    structure = nest.flatten(parts[0])[1]
    leaves = [nest.flatten(part)[0] for part in parts]
    return structure.unflatten([np.concatenate(group) for group in zip(*leaves)])


def _map(fn: Callable[[np.ndarray], np.ndarray], items: Any) -> Any:
    leaves, structure = nest.flatten(items)
    return structure.unflatten([fn(leaf) for leaf in leaves])
