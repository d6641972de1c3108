"""``replaybuffer bench --ray``: a :class:`~replaybuffer.distributed.RayReplayBuffer`
with 1, 2, 4 and 8 shards fed by 4 collectors (Ray actors), sampled by the learner
(this process).

Per workload (control, frames), batch mode (``--shards-per-batch``: ``1``, Ape-X's one
shard per batch, or ``all``) and shard count: a local Ray cluster (``num_cpus=2``),
uniform shards holding 100k control (20k frames) items between them, prefilled with
1000 items each; 4 collectors (:class:`Collector` actors, their processes started
before the timed window; collector ``k`` writes to shard ``k % shards``
through a :class:`~replaybuffer.distributed.ShardWriter` sending chunks of
``--chunk-steps``, ``extend`` of 32 steps at a time) run for ``--seconds`` while the
learner iterates ``as_dataset(256, prefetch=--prefetch, batches_per_call=
--batches-per-call, group_from_one_shard=...)`` (defaults: :data:`BATCHES_PER_CALL`,
and as many in flight, at least 4; each group from one shard chosen by mass per
:data:`GROUP_FROM_ONE_SHARD`, or as ``--[no-]group-from-one-shard`` says, shown as ``1
per group of G`` in the table's shard choice). Inserts/s sum the
collectors' steps; samples/s count sampled items. The idle latency of one
``get_next(256)`` (median of 50) is taken first, on the prefilled shards, before the
collectors start.

Collectors write episodes of :data:`EPISODE_STEPS` steps (``step_type`` FIRST, then
MID, LAST at the end: :func:`episode`), as an environment with a fixed horizon would,
so a writer's chunks are sent when they hold ``--chunk-steps`` steps and at each
episode's end (the shared workloads' random step types, 0-99, would end an episode
about every 100 steps and send a chunk each time).

CPU per sampled batch (Linux, :mod:`.process_cpu`): the learner, the shards together,
the collectors' processes and Ray's own (GCS, raylet, idle workers), measured over the
sampling run (the window whose batches it is divided by); and the CPU each shard
spends while nothing calls it (1 s before the
run: Ray's worker wakes every 10 ms to check for signals, whatever the actor). On a
machine with fewer cores than processes, samples/s follow these sums.

CPU per operation (a second table, JSON ``cpu_per_operation``: :func:`per_operation`):
each part divided by its own operations, since inserts/s and samples/s move together
on a machine whose cores every process shares (an unpaced collector takes more CPU
where more shard processes take its writes): the learner's and the shards' draw
threads' per batch sampled, the collectors' and the shards' writes thread's per step
inserted, and per shard and second its main thread and Ray's threads in it
(:mod:`.shard_threads`). ``--insert-rate R``: the collectors write at most ``R`` steps
a second together (:data:`PACE_STEPS`), so that samples/s compare across shard counts
at equal inserts/s.

Bytes per sampled batch: a shard gathers its part (one copy) and Ray writes it into
its object store (one copy); ``ray.get`` maps arrays that are contiguous in the store
without a copy (they come back read-only: the row reports the share of the batch's
bytes that did; the small packed leaves are strided views, which Ray copies in band);
the client concatenates the shards' parts (one copy).
"""

from __future__ import annotations

import argparse
import math
import functools
import json
import os
import time
from typing import Any

import numpy as np

from replaybuffer_bench.process_cpu import CpuMeter, descendants
from replaybuffer_bench.processes import WORKLOADS, run_single
from replaybuffer_bench.shard_threads import ShardThreadMeter, shard_threads
from replaybuffer_bench.workloads import random_items

SAMPLE = 256
CHUNK = 32
EPISODE_STEPS = 1000
"""Steps of a collector's episode (FIRST, MID..., LAST)."""
FIRST, MID, LAST = 0, 1, 2
PACE_STEPS = 256
"""A collector held to an insert rate sleeps once it is this many steps ahead, until it
is on time: about 100 wake-ups a second at 25k steps/s. Sleeping whenever it was ahead
(after every 32-step ``extend``) doubled its CPU per step (6.9 us against 3.5: a
process woken from sleep runs on cold caches)."""
BATCHES_PER_CALL = {"control": 32, "frames": 2}
"""Per workload, the batches the learner's dataset starts together unless
``--batches-per-call`` says (and keeps as many in flight, at least 4, unless
``--prefetch`` says: the next group starts when the batches requested ahead would fall
below that, so a whole group is in flight while the learner takes the current one).
Frame batches (7.2 MB) stay in groups of 2: calls carrying 32 of them cost the shards
and Ray's object store more than the calls saved (a sixth of the samples/s from 1
shard, 0.6x from 8; docs/distributed/ray.md, "Larger groups")."""
GROUP_FROM_ONE_SHARD = {"control": True, "frames": False}
"""Per workload, whether each group of batches comes whole from one shard chosen by
mass (``as_dataset(..., group_from_one_shard=True)``: one call per group at any shard
count, each item's marginal exact, ``g`` consecutive batches from one shard) unless
``--group-from-one-shard`` / ``--no-group-from-one-shard`` says. Control: a group of
32 split over 8 shards by each batch's own choice takes about 7.8 calls (0.25 a
batch against 1/32 with one shard); from one shard, the learner's CPU per batch is the
same at any shard count (docs/distributed/ray.md, "The sliding look-ahead"). Frames: a
group is 2 batches, which one shard per batch already serves in 1-2 calls."""


def shard_buffer(spec: Any, max_length: int) -> Any:
    import replaybuffer as rb

    return rb.UniformReplayBuffer(spec, 1, max_length, seed=0)


def episode(spec: Any, rng: np.random.Generator) -> Any:
    """One row of :data:`EPISODE_STEPS` random steps (leaves ``[1, EPISODE_STEPS,
    ...]``) whose ``step_type`` (int32, where the spec has one) is FIRST at the first
    step, LAST at the last and MID between."""
    items = random_items(spec, (1, EPISODE_STEPS), rng)
    if isinstance(items, dict) and "step_type" in items:
        step_type = np.full((1, EPISODE_STEPS), MID, items["step_type"].dtype)
        step_type[:, 0], step_type[:, -1] = FIRST, LAST
        items["step_type"] = step_type
    return items


class Collector:
    """One collector (a Ray actor in :func:`run_ray`): its episode's pieces made, and
    its process started, before the row's timed window, so that the window measures
    writing alone. Started as tasks, 2 of the 4 collectors began 2-5 s into a 5 s
    window (Ray started a worker process for each, importing Ray, numpy and this
    harness, a CPU-second or more each on the shared 2-core machine), so rows mixed
    2 and 4 writers with process start-ups, and those start-ups' CPU was counted for
    no collector.

    Args:
        spec: the workload's data spec.
        seed: the seed of the collector's random episode.
    """

    def __init__(self, spec: Any, seed: int):
        from replaybuffer import nest

        steps_of = episode(spec, np.random.default_rng(seed))
        self.pieces = [nest.map_structure(lambda a, t=t: a[:, t:t + CHUNK], steps_of)
                       for t in range(0, EPISODE_STEPS, CHUNK)]
        self.sizes = [min(CHUNK, EPISODE_STEPS - t) for t in range(0, EPISODE_STEPS, CHUNK)]

    def pid(self) -> int:
        """The collector's process id (its CPU is metered from before the window)."""
        return os.getpid()

    def collect(self, writer: Any, seconds: float, rate: float | None = None) -> int:
        """Write the episode, ``extend`` calls of up to :data:`CHUNK` steps (the last
        of an episode shorter), through ``writer`` for ``seconds``; the steps sent.
        ``rate``: at most this many steps a second (the collector sleeps when
        :data:`PACE_STEPS` ahead; ``None``: as fast as it can)."""
        start = time.perf_counter()
        deadline = start + seconds
        steps = k = 0
        while (now := time.perf_counter()) < deadline:
            if rate is not None and steps >= rate * (now - start) + PACE_STEPS:
                time.sleep(min(steps / rate - (now - start), deadline - now))
                continue
            writer.extend(self.pieces[k])
            steps += self.sizes[k]
            k = (k + 1) % len(self.pieces)
        writer.flush()
        return steps


def idle_shard_cpu(pids: list[int], seconds: float = 1.0,
                   threads: ShardThreadMeter | None = None) -> float | None:
    """The CPU milliseconds per second each of the shard processes ``pids`` spends
    while nothing calls it (their mean; ``None`` without ``/proc``); ``threads``, if
    given, metered over the same time (its ``spent`` then per role)."""
    meter = CpuMeter(pids)
    meter.start()
    if threads is not None:
        threads.start()
    time.sleep(seconds)
    meter.stop()
    if threads is not None:
        threads.stop()
    spent = meter.spent(pids)
    return None if spent is None else spent / len(pids) / seconds * 1e3


def cpu_per_batch(meter: CpuMeter, learner: int, shards: list[int],
                  collectors: set[int], batches: int) -> dict[str, float | None]:
    """Microseconds of CPU per sampled batch of the learner, the shards together, the
    collectors' processes and Ray's own (GCS, raylet, idle workers), as ``meter``
    measured them."""
    others = set(meter.pids) - {learner, *shards} - collectors
    groups = {"learner": [learner], "shards": shards, "collectors": sorted(collectors),
              "ray": sorted(others)}
    out: dict[str, float | None] = {}
    for name, pids in groups.items():
        spent = meter.spent(pids)
        out[name] = None if spent is None or not batches else spent / batches * 1e6
    return out


def per_operation(learner_us: float | None, collectors_s: float | None,
                  shards_s: dict[str, float] | None, shards: int, batches: int,
                  steps: int, seconds: float) -> dict[str, float | None]:
    """The row's CPU per operation: per batch sampled, the learner's
    (``learner_us_per_batch``) and the shards' threads that draw
    (``shard_draw_us_per_batch``); per step inserted, the collectors'
    (``collector_us_per_step``) and the shards' writes thread
    (``shard_write_us_per_step``); per shard and second, its main thread
    (``shard_main_ms_per_s``) and Ray's threads in it (``shard_ray_ms_per_s``: the
    calls' bytes sent and received, and timers). ``collectors_s`` and ``shards_s``
    (per role of :data:`~.shard_threads.ROLES`) span ``seconds``, until the
    collectors flushed their ``steps``; ``None`` where not read."""
    def per(value: float | None, count: float, scale: float) -> float | None:
        return None if value is None or not count else value / count * scale

    roles = shards_s or {}
    return {"learner_us_per_batch": learner_us,
            "shard_draw_us_per_batch": per(roles.get("calls"), batches, 1e6),
            "collector_us_per_step": per(collectors_s, steps, 1e6),
            "shard_write_us_per_step": per(roles.get("writes"), steps, 1e6),
            "shard_main_ms_per_s": per(roles.get("main"), shards * seconds, 1e3),
            "shard_ray_ms_per_s": per(roles.get("ray"), shards * seconds, 1e3)}


def run_ray(workload: str, shards: int, collectors: int, seconds: float,
            shards_per_batch: int | None = 1, prefetch: int = 4,
            chunk_steps: int = 256, batches_per_call: int = 2,
            group_from_one_shard: bool = False,
            insert_rate: float | None = None) -> dict[str, Any]:
    """One row: ``shards`` shards, ``collectors`` writers, the learner through a
    dataset with ``prefetch`` batches in flight, started ``batches_per_call`` at a
    time (each group from one shard with ``group_from_one_shard``). ``insert_rate``:
    the collectors together write at most this many steps a second (each an equal
    share; ``None``: as fast as they can)."""
    import ray

    from replaybuffer.distributed import RayReplayBuffer

    make_spec, capacity = WORKLOADS[workload]
    spec = make_spec()
    factory = functools.partial(shard_buffer, spec, capacity // shards)
    with RayReplayBuffer(factory, shards, seed=0, max_in_flight=16,
                         shards_per_batch=shards_per_batch) as buffer:
        prefill = random_items(spec, (1, 1000), np.random.default_rng(0))
        for shard in range(shards):
            buffer.extend(prefill, shard=shard)
        buffer.flush()
        items, _ = buffer.get_next(SAMPLE)  # warm up; and the copies, checked below
        payload = ray.get(buffer.actors[0].draw.remote(("get_next", [(SAMPLE, None)],
                                                             None, 0.0, False)))[0]
        # one buffer (items, ids, probabilities), or large: the items' leaves
        part = {"packed": payload} if isinstance(payload, np.ndarray) else payload[0][0]
        idle = []
        for _ in range(50):
            t0 = time.perf_counter()
            buffer.get_next(SAMPLE)
            idle.append(time.perf_counter() - t0)
        # Arrays ray.get maps from the store are read-only; those it copied are not.
        mapped = sum(leaf.nbytes for leaf in part.values() if not leaf.flags.writeable)
        zero_copy_share = mapped / sum(leaf.nbytes for leaf in part.values())
        batch_bytes = sum(leaf.nbytes for leaf in items.values())
        shard_pids = [int(d["pid"]) for d in buffer.describe() if d is not None]
        threads = ShardThreadMeter(shard_threads(buffer.actors, shard_pids))
        idle_s = 1.0
        idle_ms = idle_shard_cpu(shard_pids, idle_s, threads)
        idle_roles = None if threads.spent is None else \
            {role: value / shards / idle_s * 1e3 for role, value in threads.spent.items()}
        learner = os.getpid()
        remote_collector: Any = ray.remote(num_cpus=0)(Collector)
        actors: list[Any] = [remote_collector.remote(spec, k) for k in range(collectors)]
        collector_pids = ray.get([actor.pid.remote() for actor in actors])
        meter = CpuMeter([learner, *set(descendants(learner)) | set(shard_pids)
                          | set(collector_pids)])
        # Until every collector has flushed: per step inserted, every step's CPU.
        writes_meter = CpuMeter(collector_pids)
        share = None if insert_rate is None else insert_rate / collectors
        meter.start()
        writes_meter.start()
        threads.start()
        start = time.perf_counter()
        runs = [actor.collect.remote(buffer.writer(k % shards, chunk_steps=chunk_steps),
                                     seconds, share)
                for k, actor in enumerate(actors)]
        sampled = 0
        stream = iter(buffer.as_dataset(SAMPLE, prefetch=prefetch,
                                        batches_per_call=batches_per_call,
                                        group_from_one_shard=group_from_one_shard))
        while time.perf_counter() - start < seconds:
            next(stream)
            sampled += SAMPLE
        sample_seconds = time.perf_counter() - start
        # The CPU over the batches' window: metered until the collectors had flushed,
        # a row whose collectors ended late divided their CPU by too few batches.
        meter.stop()
        stream.close()
        inserted = sum(ray.get(runs))
        insert_seconds = time.perf_counter() - start
        writes_meter.stop()
        threads.stop()
        for actor in actors:
            ray.kill(actor)
        cpu = cpu_per_batch(meter, learner, shard_pids, set(collector_pids),
                            sampled // SAMPLE)
        per_op = per_operation(cpu["learner"], writes_meter.spent(collector_pids),
                               threads.spent, shards, sampled // SAMPLE, inserted,
                               insert_seconds)
    return {"peer": "replaybuffer[ray]", "workload": workload, "shards": shards,
            "shards_per_batch": shards_per_batch or "all", "prefetch": prefetch,
            "chunk_steps": chunk_steps, "batches_per_call": batches_per_call,
            "group_from_one_shard": group_from_one_shard,
            "episode_steps": EPISODE_STEPS, "idle_get_next_ms": float(np.median(idle)) * 1e3,
            "collectors": collectors, "inserts_per_s": inserted / insert_seconds,
            "samples_per_s": sampled / sample_seconds, "batch_bytes": batch_bytes,
            "zero_copy_share": zero_copy_share, "seconds": seconds,
            "cpu_us_per_batch": cpu, "idle_shard_cpu_ms_per_s": idle_ms,
            "idle_shard_ms_per_s_by_thread": idle_roles,
            "collector_pids": collector_pids, "insert_rate": insert_rate,
            "cpu_per_operation": per_op,
            "collectors_metered": sum(meter.spent([pid]) is not None
                                      for pid in collector_pids)}


def run_idle(shards: int, shards_per_batch: int | None, prefetch: int = 4,
             seconds: float = 2.0, batches_per_call: int = 1,
             group_from_one_shard: bool = False) -> dict[str, Any]:
    """The learner alone (no collectors): the median of 100 ``get_next(256)`` over
    ``shards`` control shards of 1000 items, the shards' CPU while nothing calls them
    (1 s), then items/s and CPU per batch from a dataset with ``prefetch`` batches in
    flight, started ``batches_per_call`` at a time, for ``seconds``."""
    from replaybuffer.distributed import RayReplayBuffer

    make_spec, capacity = WORKLOADS["control"]
    spec = make_spec()
    factory = functools.partial(shard_buffer, spec, capacity // shards)
    with RayReplayBuffer(factory, shards, seed=0, shards_per_batch=shards_per_batch) as b:
        prefill = random_items(spec, (1, 1000), np.random.default_rng(0))
        for shard in range(shards):
            b.extend(prefill, shard=shard)
        b.flush()
        for _ in range(20):
            b.get_next(SAMPLE)
        latencies = []
        for _ in range(100):
            t0 = time.perf_counter()
            b.get_next(SAMPLE)
            latencies.append(time.perf_counter() - t0)
        shard_pids = [int(d["pid"]) for d in b.describe() if d is not None]
        idle_ms = idle_shard_cpu(shard_pids)
        learner = os.getpid()
        meter = CpuMeter([learner, *set(descendants(learner)) | set(shard_pids)])
        stream = iter(b.as_dataset(SAMPLE, prefetch=prefetch,
                                   batches_per_call=batches_per_call,
                                   group_from_one_shard=group_from_one_shard))
        meter.start()
        sampled, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            next(stream)
            sampled += SAMPLE
        rate = sampled / (time.perf_counter() - start)
        meter.stop()
        stream.close()
        cpu = cpu_per_batch(meter, learner, shard_pids, set(), sampled // SAMPLE)
    return {"peer": "replaybuffer[ray] idle", "shards": shards,
            "shards_per_batch": shards_per_batch or "all", "prefetch": prefetch,
            "batches_per_call": batches_per_call,
            "group_from_one_shard": group_from_one_shard,
            "get_next_ms": float(np.median(latencies)) * 1e3, "dataset_items_per_s": rate,
            "cpu_us_per_batch": cpu, "idle_shard_cpu_ms_per_s": idle_ms}


def format_cpu(row: dict[str, Any]) -> str:
    """A row's CPU per sampled batch (learner / shards / collectors / Ray's own, us)
    and an idle shard's CPU (ms/s); blank without ``/proc``."""
    cpu = row.get("cpu_us_per_batch") or {}
    parts = [cpu.get(name) for name in ("learner", "shards", "collectors", "ray")]
    text = " / ".join("-" if v is None else f"{v:,.0f}" for v in parts)
    idle = row.get("idle_shard_cpu_ms_per_s")
    return text + ("" if idle is None else f" (idle shard {idle:.1f} ms/s)")


def shard_choice(row: dict[str, Any]) -> str:
    """Where a row's dataset batches came from: ``1 per group of G`` (a group of G
    batches from one shard, ``group_from_one_shard``) or the shards per batch."""
    if row.get("group_from_one_shard"):
        return f"1 per group of {row['batches_per_call']}"
    return f"{row['shards_per_batch']} per batch"


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | buffer | shards | shard choice | inserts/s | samples/s | "
             "idle get_next(256) | batch bytes (mapped by ray.get) | CPU us per batch: "
             "learner / shards / collectors / Ray's |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["peer"] == "replaybuffer[ray] idle":
            lines.append(f"| idle | {r['peer']} | {r['shards']} | {shard_choice(r)} "
                         f"| | {r['dataset_items_per_s']:,.0f} | {r['get_next_ms']:.2f} ms "
                         f"| | {format_cpu(r)} |")
        elif r["peer"] == "replaybuffer[ray]":
            lines.append(f"| {r['workload']} | {r['peer']} | {r['shards']} | "
                         f"{shard_choice(r)} | {r['inserts_per_s']:,.0f} | "
                         f"{r['samples_per_s']:,.0f} | {r['idle_get_next_ms']:.2f} ms | "
                         f"{r['batch_bytes']:,} ({r['zero_copy_share']:.1%}) | "
                         f"{format_cpu(r)} |")
        else:
            lines.append(f"| {r['workload']} | {r['peer']} | | | {r['inserts_per_s']:,.0f} "
                         f"| {r['samples_per_s']:,.0f} | | | |")
    return "\n".join(lines)


def format_per_operation(rows: list[dict[str, Any]]) -> str:
    """The collectors' rows' CPU per operation (:func:`per_operation`), a table."""
    names = ("learner_us_per_batch", "shard_draw_us_per_batch", "collector_us_per_step",
             "shard_write_us_per_step", "shard_main_ms_per_s", "shard_ray_ms_per_s")
    lines = ["| workload | shards | insert rate | inserts/s | samples/s | CPU us per batch: "
             "learner / shards' draws | CPU us per step: collectors / shards' writes | "
             "per shard, ms/s: main thread / Ray's threads (idle: the same) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        op = r.get("cpu_per_operation")
        if op is None:
            continue
        v = ["-" if op.get(n) is None else
             f"{op[n]:,.{1 if n.endswith(('step', '_s')) else 0}f}" for n in names]
        idle = r.get("idle_shard_ms_per_s_by_thread")
        idle_text = "" if idle is None else f" ({idle['main']:.1f} / {idle['ray']:.1f})"
        rate = "as fast as they can" if r.get("insert_rate") is None \
            else f"{r['insert_rate']:,.0f}/s"
        lines.append(f"| {r['workload']} | {r['shards']} | {rate} | "
                     f"{r['inserts_per_s']:,.0f} | {r['samples_per_s']:,.0f} | "
                     f"{v[0]} / {v[1]} | {v[2]} / {v[3]} | {v[4]} / {v[5]}{idle_text} |")
    return "\n".join(lines)



def _positive_rate(text: str) -> float:
    """``--insert-rate``'s value: a finite number of steps a second above 0."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not (0 < rate < math.inf):
        raise argparse.ArgumentTypeError(f"expected steps a second above 0, got {text!r}")
    return rate

def main(argv: list[str] | None = None) -> int:
    import ray

    parser = argparse.ArgumentParser(prog="replaybuffer bench --ray")
    parser.add_argument("--workloads", default="control,frames")
    parser.add_argument("--shards", default="1,2,4,8")
    parser.add_argument("--shards-per-batch", default="1",
                        help="comma-separated: a number of shards, or 'all'")
    parser.add_argument("--prefetch", type=int, default=None,
                        help="batches in flight (default: the batches per call, at "
                             "least 4)")
    parser.add_argument("--chunk-steps", type=int, default=256)
    parser.add_argument("--batches-per-call", type=int, default=None,
                        help="batches the learner's dataset starts together (default: "
                             "32 for control, 2 for frames)")
    parser.add_argument("--group-from-one-shard", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="each group of --batches-per-call batches from one shard "
                             "chosen by mass (as_dataset's group_from_one_shard; "
                             "default: control yes, frames no)")
    parser.add_argument("--idle", action="store_true",
                        help="only the learner alone: get_next latency and dataset items/s")
    parser.add_argument("--no-single", action="store_true",
                        help="skip the one-process row of each workload")
    parser.add_argument("--collectors", type=int, default=4)
    parser.add_argument("--insert-rate", type=_positive_rate, default=None,
                        help="steps a second the collectors write together, at most "
                             "(default: as fast as they can); samples/s at an equal "
                             "insert rate compare across shard counts")
    parser.add_argument("--seconds", type=float, default=None,
                        help="seconds per row (default 5; 2 for --idle's dataset)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    def group(workload: str) -> tuple[int, int]:
        """The batches per call and the prefetch of ``workload``'s rows."""
        per_call = (BATCHES_PER_CALL[workload] if args.batches_per_call is None
                    else args.batches_per_call)
        return per_call, max(4, per_call) if args.prefetch is None else args.prefetch

    def one_shard(workload: str) -> bool:
        """Whether ``workload``'s groups come from one shard each."""
        return (GROUP_FROM_ONE_SHARD[workload] if args.group_from_one_shard is None
                else args.group_from_one_shard)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"# collectors write episodes of {EPISODE_STEPS} steps (FIRST, MID..., LAST) "
          f"in extends of {CHUNK}; chunks of {args.chunk_steps} steps; learner: "
          f"as_dataset({SAMPLE}, prefetch=P, batches_per_call=G, "
          f"group_from_one_shard=O), (G, P, O) per workload: "
          f"{ {w: (*group(w), one_shard(w)) for w in BATCHES_PER_CALL} }", flush=True)
    rows = []
    try:
        for mode in [m for m in args.shards_per_batch.split(",") if m] if args.idle else []:
            for shards in [int(s) for s in args.shards.split(",") if s]:
                per_call, prefetch = group("control")
                rows.append(run_idle(shards, None if mode == "all" else int(mode),
                                     prefetch, args.seconds or 2.0, per_call,
                                     one_shard("control")))
                print(json.dumps(rows[-1]), flush=True)
        for workload in [w for w in args.workloads.split(",") if w and not args.idle]:
            if not args.no_single:
                rows.append(run_single(workload, args.seconds or 5.0))
                print(json.dumps(rows[-1]), flush=True)
            for mode in [m for m in args.shards_per_batch.split(",") if m]:
                for shards in [int(s) for s in args.shards.split(",") if s]:
                    per_call, prefetch = group(workload)
                    rows.append(run_ray(workload, shards, args.collectors,
                                        args.seconds or 5.0,
                                        None if mode == "all" else int(mode),
                                        prefetch, args.chunk_steps, per_call,
                                        one_shard(workload), args.insert_rate))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
    print()
    print(format_rows(rows))
    if any("cpu_per_operation" in r for r in rows):
        print()
        print(format_per_operation(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
