"""The one local Ray cluster of a soak and the 2-shard buffer its Ray faults share, with
what each shard was written and lost so far (:class:`ReusedShards`).

Starting shard processes is most of what a Ray fault costs (seconds each on a shared
machine), so the faults of a soak take turns on one buffer instead of building one each:
a fault's collectors and raw writer get writer numbers of their own
(:meth:`ReusedShards.next_fault`), nothing is cleared (a shard's ``clear`` keeps its
limiter's counters), and the invariants are counted from the ledger (every writer's
steps on each shard since the buffer was built, the losses the client heard), so that
each one is what it would be on a fresh buffer:
steps held once each in order, the losses of a shard exactly what was written to it and
is not held, its limiter counting every step it holds. A buffer serves at most
:data:`FAULTS_PER_BUFFER` faults and never one that could fill a shard (nothing may be
evicted); after a fault whose checks failed, the next fault gets a new buffer (a broken
ledger must not fail the faults after it). The cluster and the first buffer start in a
thread while the soak runs its other scenarios (:meth:`Soak.prepare`).

Crash points are armed while the shards run, in order, through the file of
``REPLAYBUFFER_CRASH_ARMING`` (:func:`replaybuffer.crash_points.arm`: a sequence ends
one process each, a shard's then its restarts'): the variable is in the cluster's
environment when the soak starts it, or in the shards' own ``runtime_env`` when a
cluster was up already.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np

from soak.ray_items import SHARDS, STEPS, shard_buffer, worker_path

FAULTS_PER_BUFFER = 8
"""Faults one buffer serves before the next is built, so that a long soak draws other
``checkpoint_every`` and seeds."""
MAX_RESTARTS = 64
"""Restarts Ray gives a shard of one buffer: a fault restarts its victim once per point
of its sequence, at most 6 times (a SIGKILL and the 4 start points, or a silent
writer's two), 48 in :data:`FAULTS_PER_BUFFER` faults."""
RAW_MOST = 200 * 3
"""The most steps a fault's raw writer writes (200 chunks of at most 3)."""
WRITER_BLOCK = 16
"""Writer numbers a fault takes: ``16 k + s`` (collectors), ``16 k + RAW + s`` (raw)."""


class SoakCluster:
    """The local cluster (started at the first Ray fault, once a soak) and the arming
    file its shard processes read."""

    def __init__(self) -> None:
        self.started = False
        self.folder: Path | None = None
        self.actor_env: dict[str, str] | None = None

    @property
    def arming(self) -> Path:
        assert self.folder is not None
        return self.folder / "armed"

    def ensure(self) -> None:
        """Start the cluster unless one is up; the arming variables go in its
        environment (the shards need no ``runtime_env`` of their own) or, when it was
        up already, in :attr:`actor_env`."""
        import ray
        if self.folder is not None:
            return
        self.folder = Path(tempfile.mkdtemp(prefix="replaybuffer-soak-ray-"))
        self.arm()  # nothing armed until a fault arms a point
        env = {"REPLAYBUFFER_CRASH_ARMING": str(self.arming), "PYTHONPATH": worker_path()}
        if ray.is_initialized():
            self.actor_env = env
            return
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": env})
        self.started = True

    def arm(self, *points: str) -> None:
        """Arm ``points`` (each ``NAME:N``, in order; none: nothing) in the shard
        processes."""
        from replaybuffer.crash_points import arm
        arm(self.arming, *points)

    def still_armed(self) -> list[str]:
        """The armed points no process has ended at yet."""
        from replaybuffer.crash_points import still_armed
        return still_armed(self.arming)

    def shutdown(self) -> None:
        """Shut the cluster down if this soak started it; remove the arming files."""
        if self.started:
            import ray
            ray.shutdown()
            self.started = False
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
            self.actor_env = None


class ReusedShards:
    """A 2-shard :class:`~replaybuffer.distributed.RayReplayBuffer` that several faults
    take turns on, and its ledger (module docstring)."""

    def __init__(self, cluster: SoakCluster, rng: np.random.Generator, home: Path):
        from replaybuffer.distributed import RayReplayBuffer
        options = None
        if cluster.actor_env is not None:
            options = {"runtime_env": {"env_vars": cluster.actor_env}}
        self.checkpoint_every = int(rng.integers(16, 64))
        self.buffer = RayReplayBuffer(
            shard_buffer, SHARDS, checkpoint_dir=home / "shards",
            checkpoint_every=self.checkpoint_every, max_restarts=MAX_RESTARTS,
            seed=int(rng.integers(2**31)), actor_options=options)
        self.capacity = self.buffer.capacity // SHARDS
        self.faults = 0
        self.failed = False
        self.written: list[dict[int, int]] = [{} for _ in range(SHARDS)]
        """Per shard, each writer number's steps written to it (held or lost)."""

    def serves_another(self) -> bool:
        """Whether a next fault may use this buffer (none failed, under
        :data:`FAULTS_PER_BUFFER`, room on every shard for a fault's writes)."""
        if self.failed or self.faults >= FAULTS_PER_BUFFER:
            return False
        described = self.buffer.describe()
        return all(d is not None and int(d["size"]) + STEPS + 1 + RAW_MOST <= self.capacity
                   for d in described)

    def next_fault(self) -> int:
        """Count a fault in; the writer numbers' base it takes (:data:`WRITER_BLOCK`)."""
        base = WRITER_BLOCK * self.faults
        self.faults += 1
        return base

    def record(self, shard: int, w: int, steps: int) -> None:
        """``steps`` more steps of writer ``w`` written to ``shard``."""
        self.written[shard][w] = self.written[shard].get(w, 0) + steps

    def lost(self, shard: int) -> int:
        """The steps the client heard ``shard`` lost since the buffer was built."""
        return sum(loss.steps_lost for loss in self.buffer.losses if loss.shard == shard)

    def missing(self, shard: int, size: int) -> int:
        """Steps written to ``shard`` that it does not hold, holding ``size``."""
        return sum(self.written[shard].values()) - size

    def close(self) -> None:
        self.buffer.close()


class Soak:
    """The soak's cluster and its current :class:`ReusedShards` (module-level: the
    soak's scenarios are plain functions)."""

    def __init__(self) -> None:
        self.cluster = SoakCluster()
        self.shards: ReusedShards | None = None
        self.starting: threading.Thread | None = None
        self.start_done = threading.Event()
        self.soak_over = threading.Event()
        self.start_error: BaseException | None = None

    def prepare(self, seed: int, home: Path) -> None:
        """Start the cluster and build the first buffer (seeded by ``seed``, in
        ``home``) in a thread of its own, while the soak runs its other scenarios: both
        mostly wait for processes to start. The first Ray fault waits for it. The
        thread lives until :meth:`shutdown`: the processes ``ray.init`` starts end with
        the thread that started them (Linux's parent-death signal is a thread's)."""
        def start() -> None:
            try:
                self.cluster.ensure()
                self.shards = ReusedShards(self.cluster, np.random.default_rng(seed), home)
            except BaseException as exc:  # noqa: BLE001 - raised to the first Ray fault
                self.start_error = exc
            self.start_done.set()
            self.soak_over.wait()
        self.starting = threading.Thread(target=start, name="soak-ray-start", daemon=True)
        self.starting.start()

    def started(self) -> None:
        """Wait for :meth:`prepare`'s start, if one is under way; raise its error."""
        if self.starting is not None:
            self.start_done.wait()
        error, self.start_error = self.start_error, None
        if error is not None:
            raise error

    def shards_for_a_fault(self, rng: np.random.Generator, home: Path) -> ReusedShards:
        """The buffer the next fault uses: the current one if it serves another, else
        a new one (in ``home``)."""
        self.started()
        self.cluster.ensure()
        if self.shards is not None and not self.shards.serves_another():
            self.shards.close()
            self.shards = None
        if self.shards is None:
            self.shards = ReusedShards(self.cluster, rng, home)
        return self.shards

    def shutdown(self) -> None:
        if self.starting is not None:
            self.start_done.wait()
        if self.shards is not None:
            self.shards.close()
            self.shards = None
        self.cluster.shutdown()
        if self.starting is not None:
            self.soak_over.set()
            self.starting.join()
            self.starting = None
            self.start_done.clear()
            self.soak_over.clear()


SOAK = Soak()
"""The running soak's Ray side."""

__all__ = ["SOAK", "Soak", "ReusedShards", "SoakCluster"]
