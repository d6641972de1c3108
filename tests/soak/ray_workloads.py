"""The soak's Ray workload: on the 2-shard
:class:`~replaybuffer.distributed.RayReplayBuffer` that the soak's Ray faults share
(:mod:`soak.reused_shards`: one local cluster, started lazily and shut down at the
soak's end by :func:`shutdown`; a buffer serves several faults), collectors writing
numbered steps through ``ShardWriter``s while a learner samples, one shard process
ended (``SIGKILL`` of its pid at a random moment, or a ``ray.*`` crash point armed in
the shards' processes), then the invariants, per fault (counted from the buffer's
ledger: every writer's steps on each shard, the losses heard before the fault):

* every sampled item is one whole write (``payload`` is ``t + w / 8`` throughout, for
  the writer ``w`` and step ``t`` it names), during the fault and after;
* a shard holds each writer's steps once each, in the order written, and nothing no
  writer wrote; every step it holds can be drawn; a step written and flushed after the
  faults is held;
* the steps the buffer reports lost (``losses``) for the shard that died are exactly
  the steps written to it that it does not hold, also for a kill during a restart
  (the ``ray.start.*`` points: the next start completes the killed one's record, so
  nothing is counted twice);
* ``stats()`` is the sum of the shards' counters, and each shard's limiter counts as
  many inserts as it holds steps (a restarted shard's counters were restored with its
  checkpoint, then counted on);
* the other shard kept its process, lost nothing more and holds every step written to
  it meanwhile, and was written and sampled meanwhile.

A point is armed in both shards' processes while they run (the file of
``REPLAYBUFFER_CRASH_ARMING``, see :mod:`replaybuffer.crash_points`): the first
process to reach it ends, no other, and Ray's restart of it runs on. The ``ray.start.*``
points are armed when the scenario kills a shard, so that a restart reaches them; a
sequence of them (:data:`START_ORDER`) ends the restarts that follow one another, one
point each (the bounded soak's chained fault: a SIGKILL and every start point).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from soak.ray_items import RAW, SHARDS, STEPS, items
from soak.reused_shards import SOAK, ReusedShards


START_ORDER = ("ray.start.record", "ray.start.forget_held", "ray.start.settle",
               "ray.start.mark")
"""The start points in the order that a chain of restarts reaches them, one each: a
start killed at ``record`` left no valid record, so the next one stores it and reaches
``forget_held``; the one after completes that record, past ``forget_held``, to
``settle`` (the pending records are still there); the next completes it to ``mark``."""


def start_chain(points: list[str]) -> list[str]:
    """``points`` (start points) in :data:`START_ORDER`.

    Raises:
        KeyError: a start point that has no place in :data:`START_ORDER` yet.
    """
    unknown = sorted(set(points) - set(START_ORDER))
    if unknown:
        raise KeyError(f"start points {unknown} have no place in START_ORDER "
                       "(tests/soak/ray_workloads.py): which restart reaches them?")
    return [p for p in START_ORDER if p in points]


def prepare(seed: int, home: Path) -> None:
    """Start the cluster and the first shared buffer while the soak goes on
    (:meth:`~soak.reused_shards.Soak.prepare`)."""
    SOAK.prepare(seed, home)


def shutdown() -> None:
    """Close the soak's shared buffer; shut the cluster down if the soak started it."""
    SOAK.shutdown()


class RawWriter:
    """Chunks sent to a shard out of order, as the shard's own calls (a chunk that
    reached a process ahead of the one before it is held there for it): chunk
    ``2k + 1`` then ``2k``, each of ``size`` steps, so that the shard records a held
    chunk at every pair. A call that raised (its process died) is reported lost with
    the next, as a ``ShardWriter`` reports it."""

    def __init__(self, actor: Any, w: int, size: int):
        self.actor, self.w, self.size = actor, w, size
        self.name = os.urandom(8).hex()
        self.written = 0

    def call(self, seq: int, base: int, lost: list[tuple[int, int]] | None) -> bool:
        import ray
        t = np.arange(seq * self.size, (seq + 1) * self.size)
        ops = [("extend", (items(self.w, t),), {})]
        self.written += self.size
        try:
            ray.get(self.actor.write.remote((ops, [], self.name, seq, base, lost, False)),
                    timeout=60)
        except ray.exceptions.RayError:
            return False
        return True

    def pairs(self, count: int) -> None:
        """``count`` pairs; after a lost call, one more chunk carries its report to
        the next process, and the writer stops."""
        import ray
        for k in range(count):
            if not self.call(2 * k + 1, 2 * k, None):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # the shard's next process, without
                    try:                            # asking for its status
                        ray.get(self.actor.stats.remote(), timeout=5)
                        break
                    except (ray.exceptions.RayError, TimeoutError):
                        time.sleep(0.1)
                self.call(2 * k, 2 * k, [(2 * k + 1, self.size)])
                return
            self.call(2 * k, 2 * k, None)


class Learner(threading.Thread):
    """Samples until stopped, counting batches, torn items and errors."""

    def __init__(self, buffer: Any):
        super().__init__(daemon=True)
        self.buffer = buffer
        self.stop = threading.Event()
        self.batches = self.torn = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                batch, _ = self.buffer.get_next(64, timeout=10)
            except Exception as exc:  # noqa: BLE001 - a finding, reported by the checks
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)
                continue
            self.torn += torn(batch)
            self.batches += 1


def torn(batch: dict[str, np.ndarray]) -> int:
    """Items of ``batch`` that are not the one write they name."""
    want = batch["t"].astype(np.float32) + batch["w"].astype(np.float32) / 8
    return int((batch["payload"] != want[:, None]).any(1).sum())


class Pause:
    """Collectors held at a step boundary with their writes flushed (so that no chunk
    of theirs is in flight or passes a crash point meanwhile)."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self.parked = [threading.Event() for _ in range(SHARDS)]

    def hold(self, threads: list[threading.Thread]) -> None:
        self.on.set()
        wait_until(lambda: all(p.is_set() or not t.is_alive()
                               for p, t in zip(self.parked, threads)), 120)

    def release(self) -> None:
        for parked in self.parked:
            parked.clear()
        self.on.clear()

    def park(self, writer: Any, shard: int) -> None:
        if self.on.is_set():
            writer.flush()
            self.parked[shard].set()
            while self.on.is_set():
                time.sleep(0.005)


def collect(writer: Any, shard: int, w: int, rng: np.random.Generator, progress: list[int],
            errors: list[str], pause: Pause) -> None:
    """Write steps ``0..STEPS-1`` of writer ``w`` to ``shard`` one at a time, paced,
    with a flush now and then and at the end (which waits out a restart)."""
    try:
        for t in range(STEPS):
            writer.add_batch({k: v[:, 0] for k, v in items(w, np.array([t])).items()})
            progress[shard] = t + 1
            if t % 16 == 15:
                time.sleep(float(rng.uniform(0, 0.03)))
            if rng.random() < 0.02:
                writer.flush()
            pause.park(writer, shard)
        writer.flush()
    except Exception as exc:  # noqa: BLE001 - a finding, reported by the checks
        errors.append(f"collector {shard}: {type(exc).__name__}: {exc}")


def back(buffer: Any, shard: int, incarnation: int) -> dict[str, Any]:
    """The shard's description once a process after ``incarnation`` answers (the
    client hears its loss)."""
    info: dict[str, Any] = {}

    def answered() -> bool:
        described = buffer.describe()[shard]
        if described is not None:
            info.update(described)
        return described is not None and described["incarnation"] != incarnation
    wait_until(answered, 60)
    return info


def silent_writer(buffer: Any, raw: RawWriter, victim: int, incarnation: int,
                  pause: Pause, threads: list[threading.Thread], point: str,
                  rng: np.random.Generator) -> bool:
    """``ray.applied.mark`` for a writer that goes silent: with the collectors held,
    the raw writer's in-order chunks until one ends its process (its mark stored, its
    record not); the next process runs (collectors write, the client hears its loss)
    and is SIGKILLed; only then does the writer report the chunk lost, to the third
    process, which must know that a process applied it (the second one settled its
    pending record at its start). Whether the point was reached."""
    pause.hold(threads)
    SOAK.cluster.arm(point)
    seq = 0
    while seq < 200 and raw.call(seq, seq, None):
        seq += 1
    if seq == 200:
        pause.release()
        return False
    second = back(buffer, victim, incarnation)
    pause.release()
    time.sleep(float(rng.uniform(0, 0.3)))
    pause.hold(threads)  # the collectors' reports delivered, and heard by the client
    second = back(buffer, victim, incarnation)
    buffer.describe()  # after the client's acknowledgement of what it heard (one order)
    os.kill(second["pid"], signal.SIGKILL)
    back(buffer, victim, second["incarnation"])
    pause.release()
    raw.call(seq + 1, seq + 1, [(seq, raw.size)])
    return True


def ray_fault(rng: np.random.Generator, tmp: Path, tally: Any, point: str | None = None,
              count: int = 1, chain: tuple[str, ...] = ()) -> None:
    """The scenario (module docstring): ``point`` ``None``: a shard's process
    SIGKILLed at a random moment; else that crash point armed for its ``count``-th
    pass (a ``ray.applied.*`` point's pass drawn further on, so that checkpoints come
    before it; a ``ray.start.*`` point's first, in the process that follows a
    SIGKILL); ``chain``: start points (:data:`START_ORDER`) armed after it, for the
    restarts that follow, one each. On the soak's shared buffer (a new one, in
    ``tmp``, when it serves no more); nothing is left armed once the fault is over."""
    shards = SOAK.shards_for_a_fault(rng, tmp)
    failures = len(tally.failures)
    try:
        fault(shards, rng, tally, point, count, chain)
    except BaseException:
        shards.failed = True
        raise
    finally:
        SOAK.cluster.arm()  # a point never reached must not end a later fault's process
    if len(tally.failures) > failures:
        shards.failed = True  # its ledger may be off: the next fault gets a new buffer


def fault(shards: ReusedShards, rng: np.random.Generator, tally: Any, point: str | None,
          count: int, chain: tuple[str, ...]) -> None:
    """:func:`ray_fault` on ``shards``."""
    cluster = SOAK.cluster
    start = point is not None and point.startswith("ray.start.")
    held = point is not None and point.startswith("ray.held.")
    if point is not None and point.startswith("ray.applied."):
        count += int(rng.integers(0, 16))
    # ray.applied.mark: half the time a writer that goes silent across two restarts
    # (its report reaches the third process: the second one's settle must be whole).
    silent = point == "ray.applied.mark" and not chain and bool(rng.integers(2))
    if start:
        count = 1  # a start passes it once (a pending record each: one writer's here)
    sequence = ([] if point is None else [f"{point}:{count}"]) + [f"{p}:1" for p in chain]
    tally.scenario = (f"ray_fault({', then '.join(sequence)}"
                      f"{', silent writer' if silent else ''})" if point else
                      f"ray_fault(sigkill{''.join(', then ' + p for p in sequence)})")
    buffer = shards.buffer
    base = shards.next_fault()
    before = buffer.describe()
    lost_before = [shards.lost(s) for s in range(SHARDS)]
    missing_before = [shards.missing(s, int(d["size"])) for s, d in enumerate(before)]
    if point is not None and not (start or silent):
        cluster.arm(*sequence)  # from the collectors' first chunk on
    progress = [0] * SHARDS
    errors: list[str] = []
    writers = [buffer.writer(s, chunk_steps=int(rng.integers(1, 9))) for s in range(SHARDS)]
    pause = Pause()
    threads = [threading.Thread(target=collect, daemon=True,
                                args=(writers[s], s, base + s,
                                      np.random.default_rng(rng.integers(2**31)),
                                      progress, errors, pause)) for s in range(SHARDS)]
    for thread in threads:
        thread.start()
    learner = Learner(buffer)
    wait_until(lambda: all(d is not None and d["size"] > 0 for d in buffer.describe()),
               60)  # (every shard empty at once: the learner's draw is refused)
    learner.start()
    victim = int(rng.integers(SHARDS))
    raw = RawWriter(buffer.actors[victim], base + RAW + victim, int(rng.integers(1, 4)))
    at = int(rng.integers(16, STEPS - 32))
    wait_until(lambda: min(progress) >= at, 60)
    batches_before = learner.batches
    if silent:
        tally.faults["ray_sigkill"] += 1  # the second process
        silent_writer(buffer, raw, victim, before[victim]["incarnation"], pause,
                      threads, sequence[0], rng)
    elif held:
        raw.pairs(count)
    elif point is None or start:
        cluster.arm(*sequence)  # start points: armed for the restarts from now on
        os.kill(before[victim]["pid"], signal.SIGKILL)
    tally.faults["ray_sigkill" if point is None or start else "ray_crash_point"] += 1
    tally.faults["ray_crash_point"] += len(chain)
    crashed = wait_until(lambda: not cluster.still_armed(), 60 * max(1, len(sequence)))
    tally.check(crashed, f"{cluster.still_armed()} of {sequence} never reached")
    for thread in threads:
        thread.join(120)
    buffer.wait_for_shards(60)
    # The client learns of a restart only from a call: one killed after the last
    # write is not yet known down, and a write racing its restart is (rightly)
    # reported lost. So the step below is written once the new process answered.
    wait_until(lambda: restarted(buffer, before), 60)
    for s, writer in enumerate(writers):  # a step after every fault: it must be held
        writer.add_batch({k: v[:, 0] for k, v in items(base + s, np.array([STEPS])).items()})
        writer.flush()
    time.sleep(0.2)  # a few more batches with every shard back
    learner.stop.set()
    learner.join(60)
    for s in range(SHARDS):
        shards.record(s, base + s, STEPS + 1)
    shards.record(victim, raw.w, raw.written)
    tally.check(not errors, f"collectors failed: {errors[:2]}")
    tally.check(not learner.errors, f"the learner failed: {learner.errors[:2]}")
    tally.check(learner.torn == 0, f"{learner.torn} items sampled torn")
    tally.check(learner.batches > batches_before,
                "the learner drew nothing from the fault on")
    check_shards(shards, before, lost_before, missing_before, base, tally)


def restarted(buffer: Any, before: list[Any]) -> bool:
    """Whether every shard answers, one from a process other than ``before``'s (the
    fault's: a crash point armed in every shard ends the first to reach it)."""
    now = buffer.describe()
    return all(n is not None for n in now) and any(
        n["incarnation"] != b["incarnation"] for n, b in zip(now, before))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def drawn_items(buffer: Any, total: int) -> dict[int, dict[int, tuple[int, int]]]:
    """Per shard, its items by local id (``(w, t)``), drawn until every one of the
    ``total`` held was seen (or 15 s); torn items are left out and counted by
    the caller's size checks."""
    from replaybuffer.distributed.ray_shards.shard import LOCAL_MASK
    seen: dict[int, dict[int, tuple[int, int]]] = {s: {} for s in range(SHARDS)}
    # By time, not by count: a restarted shard's mass reaches the client within
    # MASS_REFRESH_S (its last mass, from its restart, may be that of an empty shard).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        batch, info = buffer.get_next(1024, timeout=30)
        ids = np.asarray(info.ids) & LOCAL_MASK
        whole = (batch["payload"] == (batch["t"].astype(np.float32)
                                      + batch["w"].astype(np.float32) / 8)[:, None]).all(1)
        for i, w, t, ok in zip(ids.tolist(), batch["w"].tolist(), batch["t"].tolist(),
                               whole.tolist()):
            if ok:
                seen[i % SHARDS][i // SHARDS] = (w, t)
        if sum(len(v) for v in seen.values()) >= total:
            break
    return seen


def check_shards(shards: ReusedShards, before: list[Any], lost_before: list[int],
                 missing_before: list[int], base: int, tally: Any) -> None:
    """The invariants after the fault (module docstring); ``before``: the shards as
    the fault began, ``lost_before``/``missing_before``: per shard, the steps the
    client had heard lost and the steps written and not held then; ``base``: the
    fault's writer numbers."""
    import ray
    buffer = shards.buffer
    after = buffer.describe()
    deadline = time.monotonic() + 60
    while not all(after) and time.monotonic() < deadline:  # killed after its last write:
        time.sleep(0.1)                                     # no call saw it restart
        after = buffer.describe()
    tally.check(all(a is not None for a in after), "a shard is down at the end")
    if not all(a is not None for a in after):
        return
    died = [s for s in range(SHARDS) if after[s]["incarnation"] != before[s]["incarnation"]]
    tally.check(len(died) == 1, f"shards {died} restarted, one was to")
    sizes = [int(a["size"]) for a in after]
    tally.check(all(int(a["last_id"]) + 1 == n for a, n in zip(after, sizes)),
                f"sizes {sizes} are not last_id + 1: {[a['last_id'] for a in after]}")
    seen = drawn_items(buffer, sum(sizes))
    for s in range(SHARDS):
        held = seen[s]
        tally.check(len(held) == sizes[s], f"shard {s} holds {sizes[s]} steps, "
                                           f"{len(held)} whole ones can be drawn")
        written = shards.written[s]
        by_writer: dict[int, list[int]] = {}
        for local in sorted(held):
            w, t = held[local]
            by_writer.setdefault(w, []).append(t)
        for w, ts in by_writer.items():
            tally.check(w in written and all(0 <= t < written[w] for t in ts),
                        f"shard {s} holds steps no writer wrote: writer {w}, "
                        f"{[t for t in ts if not 0 <= t < written.get(w, 0)][:4]}")
            tally.check(all(a < b for a, b in zip(ts, ts[1:])),
                        f"shard {s}: writer {w}'s steps not once each in order")
        tally.check(by_writer.get(base + s, [-1])[-1] == STEPS,
                    f"shard {s}: the step flushed after the faults ({STEPS}) is not held")
        lost = shards.lost(s)
        expected = shards.missing(s, sizes[s])
        if s not in died:
            tally.check(lost == lost_before[s] and expected == missing_before[s],
                        f"shard {s}, which kept its process, lost "
                        f"{lost - lost_before[s]} (missing "
                        f"{expected - missing_before[s]})")
            continue
        tally.check(lost == expected,
                    f"shard {s} reports {lost} steps lost; {expected} written are not "
                    f"held")
    stats = [ray.get(actor.stats.remote(), timeout=30) for actor in buffer.actors]
    total = buffer.stats()
    tally.check(total is not None and tuple(total[:3]) == tuple(
        sum(st[k] for st in stats) for k in range(3)),
        f"stats() {total} is not the sum of the shards' {stats}")
    tally.check([st.inserts for st in stats] == sizes,
                f"the shards' limiters count {[st.inserts for st in stats]} inserts, "
                f"they hold {sizes}")
