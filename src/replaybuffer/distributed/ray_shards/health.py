"""Shards that die and come back: which are up, probing the down ones, and the loss
accounting (:class:`ShardLoss`) when a restarted shard answers again.

A shard actor that dies (``ray.kill``, a crash) is restarted by Ray from its last
checkpoint; meanwhile the client samples from the others. Every answer of a shard
carries its status (incarnation, restored ``last_id``, steps lost, ``last_id``), so the
client sees a restart at its next call to that shard, even one that happened between
two calls, and records a :class:`ShardLoss`: the steps the shard had applied that its
checkpoint lacks (the shard keeps a mark of its ``last_id`` that outlives its process,
so steps from every writer count), plus the steps of writes lost on their way to it
(each writer reports its own to the shard; the loss grows as reports come).

Once a loss is in :attr:`ShardHealth.losses` (or, for the incarnations the client
first described, once it was shown), the client acknowledges it to the shard
(``acknowledge``, an answer not waited for): only then does the shard stop carrying it
to its next process, so a process killed before its answer left leaves its loss to the
next one rather than unreported. The acknowledgements' outcomes are read without
waiting (:class:`Acknowledgements`), at the client's later answers: one that reached a
shard that died or is restarting is dropped (its next process carries the loss, counted
twice, never missed); one that failed in the shard is a ``RuntimeWarning``. Those still
in flight when the buffer closes are read then, within a bound (:meth:`Acknowledgements.
settle`), before the shards are killed.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError, RayTaskError


@dataclass
class ShardLoss:
    """Steps a shard lost when it died: those written after its last checkpoint.

    Attributes:
        shard: its index.
        steps_lost: the ``last_id`` the shard had applied before the failure minus
            the restored one (every step when there was no checkpoint), plus steps of
            writes lost on the way (grows as writers report them).
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
        self._latest: dict[int, ShardLoss] = {}
        self._seen: dict[int, set[int]] = {}  # incarnations each shard has had
        self._acked: dict[int, tuple[int, int]] = {}  # per shard (incarnation, steps)
        self.acknowledgements = Acknowledgements()
        for shard, (actor, incarnation) in enumerate(zip(actors, incarnations)):  # described
            self.acknowledgements.sent(actor.acknowledge.remote(incarnation, -1), shard)

    def observe(self, shard: int, status: Sequence[int]) -> None:
        """A shard's status from one of its answers: ``(incarnation,
        restored_last_id, steps_lost, last_id)``. A new incarnation is a restart the
        client had not seen (a :class:`ShardLoss` is recorded); more steps lost in the
        same one are writers' reports (the loss grows)."""
        if self.acknowledgements.in_flight:  # earlier ones' outcomes, not waited for
            self.acknowledgements.collect()
        incarnation, restored, steps_lost, last_id = (int(v) for v in status)
        loss = self._latest.get(shard)
        seen = self._seen.setdefault(shard, {self.incarnation[shard]})
        if incarnation != self.incarnation[shard] and incarnation in seen:
            return  # an answer of an earlier incarnation, read late
        if incarnation != self.incarnation[shard]:
            seen.add(incarnation)
            loss = ShardLoss(shard, steps_lost, restored, incarnation, time.time())
            self.losses.append(loss)
            self._latest[shard] = loss
            self.incarnation[shard] = incarnation
            self.last_id[shard] = last_id
        elif loss is not None and loss.incarnation == incarnation and \
                steps_lost > loss.steps_lost:
            loss.steps_lost = steps_lost
        self.last_id[shard] = max(self.last_id[shard], last_id)
        acked = self._acked.get(shard, (incarnation, 0))
        if incarnation == self.incarnation[shard] and shard < len(self._actors) and \
                (acked[0] != incarnation or acked[1] < steps_lost):
            self._acked[shard] = (incarnation, steps_lost)  # the loss is held above
            self.acknowledgements.sent(
                self._actors[shard].acknowledge.remote(incarnation, steps_lost), shard)

    def renamed(self, shard: int, incarnation: int, last_id: int) -> None:
        """The shard became a new incarnation on purpose (``clear``): no loss."""
        self.incarnation[shard] = incarnation
        self.last_id[shard] = last_id
        self._latest.pop(shard, None)
        self._acked.pop(shard, None)
        self._seen.setdefault(shard, set()).add(incarnation)

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
            self.observe(i, info["status"])


class Acknowledgements:
    """The ``acknowledge`` calls sent to shards and not yet read back.

    The client does not wait for an acknowledgement (a round trip per loss on the
    learner's path), but its outcome must be read: an error nobody reads is logged by
    Ray as unhandled when its reference goes. :meth:`collect` reads those that have
    arrived without waiting (``ray.wait(timeout=0)``); the health calls it at its next
    answers while any is in flight. At the buffer's close, :meth:`settle` reads those
    still in flight within a short bound.
    """

    def __init__(self) -> None:
        # Each ref sent and not yet read, with its shard (for the warning), in order.
        self._shards: dict[Any, int] = {}
        self._lock = threading.Lock()  # answers are observed from prefetch threads too

    @property
    def in_flight(self) -> int:
        """How many were sent and not yet read back."""
        return len(self._shards)

    def sent(self, ref: Any, shard: int) -> None:
        """Keep ``ref`` (an ``acknowledge`` call's ``ObjectRef`` to ``shard``) until it
        is read."""
        with self._lock:
            self._shards[ref] = shard

    def collect(self) -> None:
        """Read the outcomes that have arrived, without waiting. One that reached a
        shard that died or is restarting is dropped: its next process carries the loss
        (counted twice, never missed). Those that failed in their shard are one
        ``RuntimeWarning`` naming each shard and cause (the same double count follows),
        given once every ready outcome is read: a warning raised as an error (``-W
        error``) leaves none of them unread."""
        message = self.read(0.0)
        if message:
            warnings.warn(message, RuntimeWarning, stacklevel=2)

    def read(self, timeout: float) -> str:
        """Read the outcomes that arrive within ``timeout`` s (:meth:`collect`'s
        handling); returns the warning their failures make ("" if none)."""
        with self._lock:
            if not self._shards:
                return ""
            ready, _ = ray.wait(list(self._shards), num_returns=len(self._shards),
                                timeout=timeout, fetch_local=False)
            shards = [self._shards.pop(ref) for ref in ready]
        failures: list[tuple[int, str]] = []
        for shard, ref in zip(shards, ready):
            try:
                ray.get(ref)
            except (RayActorError, ActorUnavailableError):
                pass  # the shard died or restarts: its next start settles the loss
            except RayError as exc:
                failures.append((shard, failure_cause(exc)))
        if len(failures) == 1:
            return (f"shard {failures[0][0]} could not take the client's acknowledgement "
                    f"of its loss ({failures[0][1]}); its next process will count that "
                    f"loss again")
        if failures:
            return (f"shards {sorted({shard for shard, _ in failures})} could not take "
                    f"the client's acknowledgements of their losses ("
                    + "; ".join(f"shard {shard}: {cause}" for shard, cause in failures)
                    + "); their next processes will count those losses again")
        return ""

    def settle(self, timeout: float) -> str:
        """Read every acknowledgement still in flight, waiting at most ``timeout`` s for
        them (the buffer's close, before its shards go); returns :meth:`read`'s warning.
        One not back by then is dropped unread: its shard did not answer in time, and a
        shard that never took it carries the loss to its next process."""
        try:
            return self.read(timeout)
        finally:
            with self._lock:
                self._shards.clear()


def close_shards(actors: Sequence[Any], acknowledgements: Acknowledgements | None,
                 timeout: float = 5.0) -> None:
    """Close a buffer's shards (``actors``, in shard order): each removes its temporary
    files, the acknowledgements still in flight are read (both within ``timeout`` s
    together), then every shard is killed (its checkpoints stay).

    What the shards answered is read, never dropped: a removal that failed in a shard
    and a shard that did not answer within ``timeout`` (its files may stay) are one
    ``RuntimeWarning`` naming each shard and cause, with the acknowledgements' failures
    (:meth:`Acknowledgements.read`), given after every shard is killed, so that a
    warning raised as an error leaves no shard running. A shard that is dead (or
    restarting) is skipped silently: its files stay where it left them (a temporary
    directory under the system's), and killing it again is harmless."""
    refs = [actor.remove_files.remote() for actor in actors]
    deadline = time.monotonic() + timeout
    try:
        ready = ray.wait(refs, num_returns=len(refs), timeout=timeout)[0] if refs else []
    except RayError:
        ready = []
    problems = []
    if acknowledgements is not None:
        problems.append(acknowledgements.settle(max(0.0, deadline - time.monotonic())))
    answered = set(ready)
    for shard, ref in enumerate(refs):
        if ref not in answered:
            problems.append(f"shard {shard} did not answer within {timeout:g} s: its "
                            f"temporary files may stay")
            continue
        try:
            ray.get(ref)
        except (RayActorError, ActorUnavailableError):
            pass  # dead or restarting: skipped (its files stay where it left them)
        except RayError as exc:
            problems.append(f"shard {shard} could not remove its temporary files "
                            f"({failure_cause(exc)})")
    for actor in actors:
        ray.kill(actor, no_restart=True)
    late = [ref for ref in refs if ref not in answered]
    if late:  # their shards are gone now: read the errors, so Ray logs none unhandled
        try:
            gone, _ = ray.wait(late, num_returns=len(late), timeout=2.0)
        except RayError:
            gone = []
        for ref in gone:
            try:
                ray.get(ref)
            except RayError:
                pass
    message = "; ".join(problem for problem in problems if problem)
    if message:
        warnings.warn(f"closing the Ray buffer: {message}", RuntimeWarning, stacklevel=3)


def failure_cause(exc: BaseException) -> str:
    """What went wrong in a shard, in one line: the original exception of a task
    error, or the last line of an actor's death report (its creation's exception)."""
    if isinstance(exc, RayTaskError):
        # The shard's own exception where Ray kept it: the text of the error as an
        # instance of its cause is the whole remote traceback.
        cause = exc.cause if exc.cause is not None else exc.as_instanceof_cause()
        return f"{type(cause).__name__}: {cause}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
