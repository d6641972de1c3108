"""The soak's Ray workload: a :class:`~replaybuffer.distributed.RayReplayBuffer` of two
shards on one local cluster (started lazily, once for the whole soak, and shut down at
its end by :func:`shutdown`), collectors writing numbered steps through
``ShardWriter``s while a learner samples, one shard process ended (``SIGKILL`` of its
pid at a random moment, or a ``ray.*`` crash point armed in the shards' processes
through their ``runtime_env``), then the invariants:

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
* the other shard kept its process, lost nothing and was written and sampled meanwhile.

A point is armed in both shards' processes with ``REPLAYBUFFER_CRASH_ONCE`` (see
:mod:`replaybuffer.crash_points`): the first process to reach it ends, no other, and
Ray's restart of it (same environment) runs on. The ``ray.start.*`` points are held
off until the scenario kills a shard, so that a restart reaches them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

PAYLOAD = 16
STEPS = 240
"""Steps each collector writes."""
SHARDS = 2
RAW = 10
"""The writer number (``w``) of the raw writer's steps (shard ``s``: ``RAW + s``)."""
_cluster = {"started": False}


def spec() -> dict[str, Any]:
    from replaybuffer.specs import ArraySpec
    return {"w": ArraySpec((), np.int64), "t": ArraySpec((), np.int64),
            "payload": ArraySpec((PAYLOAD,), np.float32)}


def items(w: int, t: np.ndarray) -> dict[str, np.ndarray]:
    """Steps ``t`` (int64 ``[T]``) of writer ``w`` as one row's ``extend`` items
    (leaves ``[1, T, ...]``)."""
    t = np.asarray(t, np.int64)
    payload = t.astype(np.float32) + np.float32(w / 8)
    return {"w": np.full((1, len(t)), w, np.int64), "t": t[None],
            "payload": np.repeat(payload[None, :, None], PAYLOAD, 2)}


def shard_buffer() -> Any:
    """A shard's buffer: one row, room for every step written (nothing evicted), a
    rate limiter whose counters a restart restores."""
    import replaybuffer as rb
    buffer = rb.UniformReplayBuffer(spec(), 1, 16 * STEPS, seed=0)
    buffer.rate_limiter = rb.MinSize(1)
    return buffer


def worker_path() -> str:
    """The shards' ``PYTHONPATH``: the tests folder (this module's factory) and the
    caller's path, absolute (a worker's directory is not the caller's)."""
    here = Path(__file__).resolve().parent.parent
    parts = [str(here)] + [str(Path(p).resolve()) for p in
                           os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(parts)


def ensure_cluster() -> None:
    """Start the local cluster unless one is up (once per soak)."""
    import ray
    if not ray.is_initialized():
        from ray_cluster import start_local_cluster
        start_local_cluster()
        _cluster["started"] = True


def shutdown() -> None:
    """Shut down the cluster if this module started it."""
    if _cluster["started"]:
        import ray
        ray.shutdown()
        _cluster["started"] = False


class RawWriter:
    """Chunks sent to a shard out of order, as the shard's own calls (a chunk that
    reached a process ahead of the one before it is held there for it): chunk
    ``2k + 1`` then ``2k``, each of ``size`` steps, so that the shard records a held
    chunk at every pair. A call that raised (its process died) is reported lost with
    the next, as a ``ShardWriter`` reports it."""

    def __init__(self, actor: Any, shard: int, size: int):
        self.actor, self.w, self.size = actor, RAW + shard, size
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


def collect(writer: Any, shard: int, rng: np.random.Generator, progress: list[int],
            errors: list[str], pause: Pause) -> None:
    """Write steps ``0..STEPS-1`` of writer ``w = shard`` one at a time, paced, with a
    flush now and then and at the end (which waits out a restart)."""
    try:
        for t in range(STEPS):
            writer.add_batch({k: v[:, 0] for k, v in items(shard, np.array([t])).items()})
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
                  pause: Pause, threads: list[threading.Thread], gate: Path,
                  rng: np.random.Generator) -> bool:
    """``ray.applied.mark`` for a writer that goes silent: with the collectors held,
    the raw writer's in-order chunks until one ends its process (its mark stored, its
    record not); the next process runs (collectors write, the client hears its loss)
    and is SIGKILLed; only then does the writer report the chunk lost, to the third
    process, which must know that a process applied it (the second one settled its
    pending record at its start). Whether the point was reached."""
    pause.hold(threads)
    gate.unlink()
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
              count: int = 1) -> None:
    """The scenario (module docstring): ``point`` ``None``: a shard's process
    SIGKILLed at a random moment; else that crash point armed for its ``count``-th
    pass (a ``ray.applied.*`` point's pass drawn further on, so that checkpoints come
    before it; a ``ray.start.*`` point's first, in the process that follows a
    SIGKILL)."""
    from replaybuffer.distributed import RayReplayBuffer
    ensure_cluster()
    gate = tmp / "crashed"
    start = point is not None and point.startswith("ray.start.")
    held = point is not None and point.startswith("ray.held.")
    if point is not None and point.startswith("ray.applied."):
        count += int(rng.integers(0, 16))
    # ray.applied.mark: half the time a writer that goes silent across two restarts
    # (its report reaches the third process: the second one's settle must be whole).
    silent = point == "ray.applied.mark" and bool(rng.integers(2))
    if start or silent:
        gate.touch()  # held off: the first processes pass it
    if start:
        count = 1  # a start passes it once (a pending record each: one writer's here)
    tally.scenario = (f"ray_fault({point}:{count}{', silent writer' if silent else ''})"
                      if point else "ray_fault(sigkill)")
    options = None
    if point is not None:
        options = {"runtime_env": {"env_vars": {
            "REPLAYBUFFER_CRASH_AT": f"{point}:{count}", "REPLAYBUFFER_CRASH_ONCE": str(gate),
            "PYTHONPATH": worker_path()}}}
    with RayReplayBuffer(shard_buffer, SHARDS, checkpoint_dir=tmp / "shards",
                         checkpoint_every=int(rng.integers(16, 64)), max_restarts=4,
                         seed=int(rng.integers(2**31)), actor_options=options) as buffer:
        before = buffer.describe()
        progress = [0] * SHARDS
        errors: list[str] = []
        writers = [buffer.writer(s, chunk_steps=int(rng.integers(1, 9))) for s in range(SHARDS)]
        pause = Pause()
        threads = [threading.Thread(target=collect, daemon=True,
                                    args=(writers[s], s, np.random.default_rng(rng.integers(2**31)),
                                          progress, errors, pause)) for s in range(SHARDS)]
        for thread in threads:
            thread.start()
        learner = Learner(buffer)
        wait_until(lambda: all(d is not None and d["size"] > 0 for d in buffer.describe()),
                   60)  # (every shard empty at once: the learner's draw is refused)
        learner.start()
        victim = int(rng.integers(SHARDS))
        raw = RawWriter(buffer.actors[victim], victim, int(rng.integers(1, 4)))
        at = int(rng.integers(16, STEPS - 32))
        wait_until(lambda: min(progress) >= at, 60)
        batches_before = learner.batches
        if silent:
            tally.faults["ray_sigkill"] += 1  # the second process
            silent_writer(buffer, raw, victim, before[victim]["incarnation"], pause,
                          threads, gate, rng)
        elif held:
            raw.pairs(count)
        elif point is None or start:
            gate.unlink(missing_ok=True)  # a start point is armed from now on
            os.kill(before[victim]["pid"], signal.SIGKILL)
        tally.faults["ray_sigkill" if point is None or start else "ray_crash_point"] += 1
        crashed = point is None or wait_until(gate.exists, 60)
        tally.check(crashed, f"{point}:{count} was never reached")
        for thread in threads:
            thread.join(120)
        buffer.wait_for_shards(60)
        # The client learns of a restart only from a call: one killed after the last
        # write is not yet known down, and a write racing its restart is (rightly)
        # reported lost. So the step below is written once the new process answered.
        wait_until(lambda: restarted(buffer, before), 60)
        for s, writer in enumerate(writers):  # a step after every fault: it must be held
            writer.add_batch({k: v[:, 0] for k, v in items(s, np.array([STEPS])).items()})
            writer.flush()
        time.sleep(0.2)  # a few more batches with every shard back
        learner.stop.set()
        learner.join(60)
        tally.check(not errors, f"collectors failed: {errors[:2]}")
        tally.check(not learner.errors, f"the learner failed: {learner.errors[:2]}")
        tally.check(learner.torn == 0, f"{learner.torn} items sampled torn")
        tally.check(learner.batches > batches_before,
                    "the learner drew nothing from the fault on")
        check_shards(buffer, before, {victim: raw}, tally)


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


def check_shards(buffer: Any, before: list[Any], raws: dict[int, RawWriter],
                 tally: Any) -> None:
    """The invariants after the fault (module docstring)."""
    import ray
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
        written = {s: STEPS + 1}
        if s in raws:
            written[raws[s].w] = raws[s].written
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
        tally.check(by_writer.get(s, [-1])[-1] == STEPS,
                    f"shard {s}: the step flushed after the faults ({STEPS}) is not held")
        losses = [loss for loss in buffer.losses if loss.shard == s]
        lost = sum(loss.steps_lost for loss in losses)
        expected = sum(written.values()) - sizes[s]
        if s not in died:
            tally.check(lost == 0 and expected == 0,
                        f"shard {s}, which kept its process, lost {lost} (missing "
                        f"{expected})")
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
