"""One shard of a :class:`~replaybuffer.distributed.RayReplayBuffer`: the Ray actor
that holds a buffer, applies each writer's chunks of writes in order, samples, and
saves checkpoints (with its rate limiter's counters) it restarts from.

Ids leave a shard as its buffer's local ids; the client tags them with the shard and
the shard's incarnation (a number per start): ``incarnation << INCARNATION_SHIFT |
local_id * num_shards + shard``.

Every answer carries the shard's :meth:`~ShardActor.status` (incarnation, restored
``last_id``, steps lost, ``last_id``), so the client notices a restart at whichever
call it next makes, with no extra round.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np
import ray

from replaybuffer import nest
from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.buffers.queue import FIFOReplayBuffer
from replaybuffer.distributed.ray_shards.draw_answers import DrawReply, draw_packing
from replaybuffer.distributed.ray_shards.ordering import GAP_S, WriteOrder
from replaybuffer.distributed.ray_shards.packing import ChunkPacking
from replaybuffer.distributed.ray_shards.shard_draws import DrawCall, draw_batches
from replaybuffer.distributed.ray_shards.shard_home import ShardHome, writer_key
from replaybuffer.persist import checkpoints, load
from replaybuffer.rate_limiter import RateLimiterStats

if TYPE_CHECKING:
    from replaybuffer.buffers.prioritized import PrioritizedMixin

INCARNATION_SHIFT = 48
"""Ids carry the shard's incarnation from this bit up."""
LOCAL_MASK = (1 << INCARNATION_SHIFT) - 1
"""The bits of an id below its incarnation."""
KEEP = 2
"""Checkpoints (and limiter counters) a shard keeps."""
SWITCH_INTERVAL_S = 0.0005
"""The shard process's GIL switch interval (Python's default is 5 ms). Writes and draws
run in threads of their own; while collectors keep the write thread busy, a draw
thread that wants the GIL may wait out a whole interval, several times a draw, so a
learner's batch could wait milliseconds behind chunks. A tenth of the default bounds
that wait at 0.5 ms for a little more switching."""

TASK_EVENTS = False
"""``enable_task_events`` of the calls a shard answers many times a second (``write``,
``draw``, ``mass_status``, ``update_priorities``): Ray records no task events for them.
Each event (submitted, running, finished) is buffered in the caller and the shard and
sent to Ray's GCS every second, for its dashboard and ``ray list tasks``: at a call per
group of 32 control batches and 4 collectors' chunks, Ray's own processes spent 52-65
us of CPU per batch without them against 61-149 with (a sixth to a half less; measured
on a shared 2-core machine, docs/distributed/ray.md, "Ray's own CPU"); a call's
latency was level (8 actors called in turn, 1.2-1.5 ms either way). Such calls still
fail, retry and raise as before; they are only missing from Ray's task listings."""

Op = tuple[str, tuple[Any, ...], dict[str, Any]]
"""One write: the buffer method's name (or :data:`PACKED_EXTEND`), its arguments and
keywords."""
PACKED_EXTEND = "packed_extend"
"""The op of a writer's chunk: ``extend`` by the steps packed in one byte buffer,
arguments ``(packed, rows, steps)`` (:mod:`.packing`)."""
Lost = list[tuple[int, int]]
"""Chunks of a writer's writes lost with a shard process: ``(seq, steps)`` each."""
Status = tuple[int, int, int, int]
"""``(incarnation, restored_last_id, steps_lost, last_id)`` of a shard."""
PriorityUpdate = tuple[np.ndarray, np.ndarray, int]
"""One priority update: local ids, their priorities, the incarnation they were drawn from."""
WriteCall = tuple[list[Op], list[int | None], str, int, int, Lost | None, bool]
"""The one argument of :meth:`ShardActor.write`: ``(ops, keys, writer, seq, base,
lost, round_robin)``. Ray serialises each argument of a call on its own (a msgpack and
a pickle pass each); one tuple cost the caller and the shard about 100 us less a call
each than seven arguments (measured on a shared 2-core machine)."""
UpdateCall = tuple[np.ndarray, np.ndarray, int, list[int | None], str, int, int]
"""The one argument of :meth:`ShardActor.update_priorities`: ``(ids, priorities,
incarnation, keys, client, seq, base)`` (one argument, as :data:`WriteCall`)."""

def chunk_steps(ops: list[Op]) -> int:
    """The steps a chunk's writes append (``add_batch`` and ``add``: one each)."""
    steps = 0
    for name, args, _ in ops:
        if name == PACKED_EXTEND:
            steps += int(args[2])
        elif name == "extend":
            steps += int(np.shape(nest.flatten(args[0])[0][0])[1])
        else:
            steps += 1
    return steps


__all__ = ["ShardActor", "INCARNATION_SHIFT", "LOCAL_MASK", "GAP_S", "Op", "Status",
           "PriorityUpdate", "PACKED_EXTEND", "WriteCall", "DrawCall", "DrawReply",
           "UpdateCall"]


class ShardActor:
    """One shard's actor (wrapped by ``ray.remote`` in
    :class:`~replaybuffer.distributed.RayReplayBuffer`): a buffer made by ``factory``,
    restored from the shard's last checkpoint under ``root`` when there is one, with
    its rate limiter's counters as they were at that checkpoint.

    Args:
        factory: makes the shard's buffer (a :class:`~replaybuffer.ReplayBuffer`).
        index: the shard's index.
        root: the buffer's checkpoint directory (``None``: no saves).
        checkpoint_every: inserted steps between saves.
        token: names the shard's temporary directory when ``root`` is ``None``.
    """

    def __init__(self, factory: Callable[[], Any], index: int, root: str | None,
                 checkpoint_every: int | None, token: str = "shards"):
        sys.setswitchinterval(SWITCH_INTERVAL_S)  # this process is the shard's alone
        self.index = index
        if root is None:
            home = Path(tempfile.gettempdir()) / f"replaybuffer-ray-{token}" / \
                f"shard-{index:03d}"
            self.files = ShardHome(home, temporary=True)
            self.root = None
        else:
            self.files = ShardHome(Path(root) / f"shard-{index:03d}", temporary=False)
            self.root = self.files.home / "checkpoints"
        self.checkpoint_every = checkpoint_every
        buffer = factory()
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(f"buffer_factory returned {type(buffer).__name__}, not a "
                            "replaybuffer buffer")
        self.incarnation = self.files.next_incarnation()
        self.restored_last_id = -1
        if self.root is not None and self.root.is_dir() and checkpoints(self.root):
            restored = load(self.root)
            limiter = buffer.rate_limiter
            buffer.rate_limiter = None
            restored.rate_limiter = limiter  # limiters are not in checkpoints: the factory's
            buffer = restored
            self.restored_last_id = buffer.last_id
            state = self.files.limiter_state(self.restored_last_id)
            if limiter is not None and state is not None:
                limiter.load_state_dict(state)  # no other thread sees it yet
        # Lost: what the previous process applied past the checkpoint (the mark), the
        # chunks it held (so a writer that never calls again is counted), and what
        # processes before lost that no client was shown. Chunks applied or held are
        # not counted again when a writer reports them (applied_before, held_before).
        # A start killed midway left its count in its record: completed first, so its
        # count is carried, not counted again (ShardHome's docstring).
        held = self.files.held()
        self.held_before = {key: seqs for key, (seqs, _) in held.items()}
        if self.files.start_record is not None:
            self.files.finish_start()
            held = {}
        mark_lost = max(0, self.files.mark - self.restored_last_id)
        self.applied_before = self.files.applied()
        self.steps_lost = self.files.undelivered + mark_lost + sum(
            steps for _, steps in held.values())
        self.shown = 0  # the most steps lost an answer to the client showed
        self.acknowledged = 0  # of which the client acknowledged holding this many
        self.loss_lock = threading.Lock()  # steps_lost and undelivered move together
        self.files.begin_start(self.steps_lost, buffer.last_id)
        self.holding: set[str] = set()  # writers whose held chunks the home records
        self.buffer = buffer
        self.packing = ChunkPacking(buffer.data_spec)
        self.draw_packing = draw_packing(buffer.data_spec)
        self.saved_last_id = buffer.last_id
        self.order: WriteOrder[list[Op]] = WriteOrder()
        self.priority_order: WriteOrder[PriorityUpdate] = WriteOrder()

    def status(self) -> Status:
        """``(incarnation, restored_last_id, steps_lost, last_id)``."""
        return (self.incarnation, self.restored_last_id, self.steps_lost,
                self.buffer.last_id)

    def heard_status(self) -> Status:
        """:meth:`status` for an answer only the client gets (not a write's). The steps
        lost it shows stay carried to the next process until the client acknowledges
        them (:meth:`acknowledge`): the answer may die with the process."""
        status = self.status()
        if status[2] > self.shown:
            with self.loss_lock:  # the draw and priority threads answer too
                self.shown = max(self.shown, status[2])
        return status

    def acknowledge(self, incarnation: int, steps_lost: int) -> None:
        """The client holds ``steps_lost`` steps of ``incarnation``'s loss (in its
        ``losses``; -1: as many as answers to it showed): they are no longer carried
        to the next process. An acknowledgement of another incarnation (one before a
        restart or a clear) changes nothing."""
        with self.loss_lock:
            steps = self.shown if steps_lost < 0 else int(steps_lost)
            if incarnation != self.incarnation or steps <= self.acknowledged:
                return
            self.acknowledged = min(steps, self.steps_lost)
            self.files.undelivered = self.steps_lost - self.acknowledged

    def describe(self, num_steps: int = 1) -> dict[str, Any]:
        """The shard's ``index``, ``incarnation``, ``last_id``, ``size``, ``capacity``,
        ``rows`` (the buffer's ``batch_size``), ``mass`` (for windows of
        ``num_steps``), ``restored_last_id``, ``steps_lost``, ``class``, ``limiter``
        (its class name or ``None``), ``consumes``, ``data_spec``, ``beta``,
        ``saved_last_id``, ``status`` and ``pid`` (the process's id, for tools that
        measure a shard's CPU)."""
        b = self.buffer
        limiter = b.rate_limiter
        return {"index": self.index, "incarnation": self.incarnation, "last_id": b.last_id,
                "size": b.num_frames(), "capacity": b.capacity,
                "rows": getattr(b, "batch_size", None), "mass": b.window_mass(num_steps),
                "restored_last_id": self.restored_last_id, "steps_lost": self.steps_lost,
                "class": type(b).__name__,
                "limiter": None if limiter is None else type(limiter).__name__,
                "consumes": isinstance(b, FIFOReplayBuffer), "data_spec": b.data_spec,
                "beta": getattr(b, "beta", None), "saved_last_id": self.saved_last_id,
                "status": self.heard_status(), "pid": os.getpid()}

    def masses(self, keys: list[int | None]) -> dict[int | None, float]:
        """The sampling mass for windows of each of ``keys`` steps (``None``: 1)."""
        return {k: self.buffer.window_mass(k or 1) for k in keys}

    @ray.method(enable_task_events=TASK_EVENTS)
    def mass_status(self, num_steps: int | None) -> tuple[float, Status]:
        """The mass for windows of ``num_steps`` and :meth:`status` (a cheap refresh)."""
        return self.buffer.window_mass(num_steps or 1), self.heard_status()

    @ray.method(concurrency_group="writes", enable_task_events=TASK_EVENTS)
    def write(self, call: WriteCall) -> tuple[int, dict[int | None, float], int, Status]:
        """``call``: ``(ops, keys, writer, seq, base, lost, round_robin)`` (one argument:
        see :data:`WriteCall`). Apply chunk ``seq`` of ``writer`` (its writes, in order) in the writer's
        order (:class:`~.ordering.WriteOrder`; ``base``: the writer's lowest unsettled
        number). ``lost``: this writer's earlier chunks whose answers a shard process
        died with (counted in :attr:`steps_lost` unless a process applied them).
        ``round_robin``: the chunk is a round-robin write (the writer's next steps go
        to other shards): windows of more than one step are refused from then on.

        Returns:
            ``(last_id, masses for keys, writes of this writer held, status)``.

        Raises:
            The first error a write in the due chunks raised; the others are applied.
        """
        ops, keys, writer, seq, base, lost, round_robin = call
        self.count_lost(writer, lost)
        if round_robin and not self.files.round_robin:
            self.files.round_robin = True
        self.apply(self.order.arrive(writer, seq, base, ops), writer)
        return (self.buffer.last_id, self.masses(keys), self.order.waiting(writer),
                self.status())

    @ray.method(concurrency_group="writes")
    def release(self, writer: str, lost: Lost | None = None) -> Status:
        """Apply every held chunk of ``writer`` (it saw all its chunks settled);
        ``lost`` as for :meth:`write`."""
        self.count_lost(writer, lost)
        self.apply(self.order.release(writer), writer)
        return self.status()

    def count_lost(self, writer: str, lost: Lost | None) -> None:
        """Count in :attr:`steps_lost` the steps of ``writer``'s chunks ``lost`` that
        no process of this shard applied (those it applied after its last checkpoint
        are counted by the mark already)."""
        if lost:
            key = writer_key(writer)
            applied = self.applied_before.get(key, -1)
            counted = self.held_before.get(key, set())
            added = sum(steps for seq, steps in lost if seq > applied and seq not in counted)
            if added:
                with self.loss_lock:  # a client may be shown the count meanwhile
                    self.steps_lost += added
                    self.files.undelivered = self.files.undelivered + added

    def apply(self, chunks: list[list[Op]], writer: str | None = None) -> None:
        """Apply ``chunks`` in order (of ``writer``, whose newest applied chunk is then
        recorded in the shard's home). A write that fails does not stop the ones after
        it (they are other, valid writes); the first error is raised at the end."""
        error: BaseException | None = None
        for ops in chunks:
            for name, args, kwargs in ops:
                try:
                    self.apply_one(name, args, kwargs)
                except Exception as exc:  # noqa: BLE001 - raised below, after the rest
                    error = error or exc
        # The held record before the mark: killed between them, a chunk applied is in
        # neither (never in both), and its writer, answered "held", reports it lost.
        held = None if writer is None else self.order.held.get(writer)
        if held or writer in self.holding:
            assert writer is not None
            self.files.record_held(writer_key(writer),
                                   {seq: chunk_steps(ops) for seq, ops in held.items()}
                                   if held else {})
            if held:
                self.holding.add(writer)
            else:
                self.holding.discard(writer)
        last_id = self.buffer.last_id
        if writer is not None and chunks:  # the mark and the writer's record together
            self.files.record_applied(writer_key(writer), self.order.next_seq[writer] - 1,
                                      last_id)
        else:
            self.files.mark = last_id
        if self.root is not None and self.checkpoint_every and \
                last_id - self.saved_last_id >= self.checkpoint_every:
            # ray.method types save as a remote method; in the actor it is a plain one.
            self.save()  # type: ignore[operator]
        if error is not None:
            raise error

    def apply_one(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """One write. A chunk's ``extend`` into a rate-limited buffer goes in step by
        step, so that a chunk longer than the limiter's window is paced, not refused."""
        if name == PACKED_EXTEND:
            name, args = "extend", (self.packing.unpack(*args),)
        method = getattr(self.buffer, name)
        if name != "extend" or self.buffer.rate_limiter is None:
            method(*args, **kwargs)
            return
        items = args[0]
        leaves, structure = nest.flatten(items)
        for t in range(np.shape(leaves[0])[1]):
            self.buffer.add_batch(structure.unflatten([leaf[:, t] for leaf in leaves]),
                                  **kwargs)

    @ray.method(enable_task_events=TASK_EVENTS)
    def draw(self, call: DrawCall) -> DrawReply | tuple[DrawReply, ...]:
        """``call``: ``(method, batches, num_steps, timeout, within_episodes, runs)``
        (one argument: see :data:`DrawCall`). The batches drawn and packed into one
        answer (:func:`~.shard_draws.draw_batches`): ``(payload, drawn, error, mass,
        status)``, or one such answer per return value when ``runs`` asks for several
        (the caller's ``num_returns``)."""
        replies = draw_batches(self.buffer, self.draw_packing, call, self.files.round_robin)
        mass, status = self.buffer.window_mass(call[2] or 1), self.heard_status()
        answers = [(payload, drawn, error, mass, status)
                   for payload, drawn, error in replies]
        return answers[0] if len(answers) == 1 else tuple(answers)

    @ray.method(concurrency_group="priorities", enable_task_events=TASK_EVENTS)
    def update_priorities(self, call: UpdateCall
                          ) -> tuple[int, dict[int | None, float], Status, int]:
        """``call``: ``(ids, priorities, incarnation, keys, client, seq, base)`` (one
        argument: see :data:`WriteCall`). Set the priorities (float64 ``[S]``) of local ``ids`` (int64 ``[S]``) drawn
        from ``incarnation``: ids of another incarnation (drawn before a restart or a
        clear) are ignored. Call ``seq`` of ``client``, applied in the client's order
        (held until those before it came, as writes are: ``base`` is the client's
        lowest unsettled number; see :mod:`.priority_updates`), in the shard's
        ``priorities`` concurrency group (one thread: the order is kept in one place).

        Returns:
            ``(priorities applied by the calls now due, masses for keys, status, calls
            of this client held)``.

        Raises:
            The first error an update of the due calls raised; the others are applied.
        """
        ids, priorities, incarnation, keys, client, seq, base = call
        due = self.priority_order.arrive(client, seq, base, (ids, priorities, incarnation))
        return (self.apply_priorities(due), self.masses(keys), self.heard_status(),
                self.priority_order.waiting(client))

    @ray.method(concurrency_group="priorities")
    def release_priorities(self, client: str, keys: list[int | None]
                           ) -> tuple[int, dict[int | None, float], Status]:
        """Apply every held call of ``client`` in order (it saw all its calls settled:
        the missing ones will never come). Returns ``(applied, masses, status)``."""
        return (self.apply_priorities(self.priority_order.release(client)),
                self.masses(keys), self.heard_status())

    def apply_priorities(self, updates: list[PriorityUpdate]) -> int:
        """Apply ``updates`` in order; how many priorities were set. An update that
        fails does not stop the ones after it; the first error is raised at the end."""
        applied = 0
        error: BaseException | None = None
        for ids, priorities, incarnation in updates:
            if incarnation != self.incarnation:
                continue  # drawn before a restart or a clear: stale
            prioritized = cast("PrioritizedMixin", self.buffer)  # prioritized ones only
            try:
                applied += prioritized.update_priorities(ids, priorities)
            except Exception as exc:  # noqa: BLE001 - raised below, after the rest
                error = error or exc
        if error is not None:
            raise error
        return applied

    @ray.method(concurrency_group="writes")
    def clear(self) -> dict[str, Any]:
        """Forget every step, as a new incarnation (ids drawn before are stale); with a
        checkpoint directory, save the empty buffer so that a restart does not bring
        the steps back. Returns :meth:`describe`."""
        self.buffer.clear()
        self.incarnation = self.files.next_incarnation()
        self.restored_last_id = -1
        with self.loss_lock:  # the client starts the shard afresh: no loss to carry
            self.steps_lost = self.files.undelivered = 0
            self.shown = self.acknowledged = 0
        self.files.forget_applied()
        self.files.round_robin = False
        self.applied_before = {}
        self.held_before = {}
        self.holding.clear()
        self.files.mark = self.saved_last_id = self.buffer.last_id
        if self.root is not None:
            # Killed between the two, a restart loads the checkpoint before the clear
            # with fresh limiter counters (as a shard that never saved them).
            self.files.forget_limiters()
            self.save()  # type: ignore[operator]
        return self.describe()

    def stats(self) -> RateLimiterStats | None:
        """The shard buffer's rate-limiter counters (``None`` without a limiter)."""
        return self.buffer.stats()

    @ray.method(concurrency_group="writes")
    def save(self) -> int:
        """Save a checkpoint now (keeping :data:`KEEP`), with the rate limiter's
        counters; the ``last_id`` saved."""
        if self.root is None:
            return self.saved_last_id
        limiter = self.buffer.rate_limiter
        if limiter is not None:  # first, so a checkpoint never lacks its counters
            self.files.save_limiter(self.buffer.last_id, limiter.state_dict(), KEEP)
        self.buffer.save(self.root, keep=KEEP)
        self.saved_last_id = self.buffer.last_id
        return self.saved_last_id

    def remove_files(self) -> None:
        """Delete the shard's temporary directory (no checkpoint directory)."""
        self.files.remove()
