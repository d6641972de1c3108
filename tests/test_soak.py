"""The randomized fault soak (issue 28): for its duration, scenarios chosen at random
(writers and samplers of a shared buffer SIGKILLed, a saver into a checkpoint series
SIGKILLed, an mmap writer SIGKILLed, a Ray shard's process SIGKILLed while collectors
write and a learner samples, a crash point of ``replaybuffer.crash_points`` armed in a
child or in Ray shards' processes), each followed by its invariant checks
(``tests/soak/scenarios.py``, ``tests/soak/ray_workloads.py``; the Ray scenarios share
one local cluster, started at the first of them and shut down at the end, and take
turns on a 2-shard buffer, ``tests/soak/reused_shards.py``).

Bounded to about 20 s by default (in ``make test``); longer with ``pytest --soak
SECONDS`` or ``REPLAYBUFFER_SOAK_SECONDS``. ``REPLAYBUFFER_SOAK_SEED`` repeats a run's
choices (the bounded run's seed is 0, a longer one's is drawn and printed);
``REPLAYBUFFER_SOAK_REPORT=FILE`` writes its figures as JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from replaybuffer.crash_points import POINTS
from soak import ray_workloads, scenarios

BOUNDED_SECONDS = 20.0


def soak_seconds(config: pytest.Config) -> float:
    option = config.getoption("--soak")
    if option is not None:
        return float(option)
    return float(os.environ.get("REPLAYBUFFER_SOAK_SECONDS", BOUNDED_SECONDS))


def test_every_crash_point_has_a_soak_workload():
    """A point whose prefix no workload serves would never be injected: refused here."""
    for name in POINTS:
        assert callable(scenarios.crash_workload(name)), name


def test_an_unknown_prefix_is_refused_by_name():
    with pytest.raises(KeyError, match="crash point 'grpc.shard.write': no soak workload "
                                       "serves the prefix 'grpc'"):
        scenarios.crash_workload("grpc.shard.write")
    tally = scenarios.Tally(scenario="x")
    assert not tally.check(False, "broke") and tally.failures == ["x: broke"]
    assert tally.check(True, "fine") and tally.checks == 2


def test_randomized_soak(request, tmp_path):
    seconds = soak_seconds(request.config)
    # The bounded run (make test) repeats its choices; a longer soak draws new ones.
    fresh = np.random.SeedSequence().entropy % 2**32
    seed = int(os.environ.get("REPLAYBUFFER_SOAK_SEED",
                              0 if seconds <= BOUNDED_SECONDS else fresh))
    rng = np.random.default_rng(seed)
    tally = scenarios.Tally()
    names = sorted(scenarios.SCENARIOS)
    deadline = time.monotonic() + seconds
    # Each crash point once first (in a random order), so that a bounded run injects
    # every point there is; then scenarios at random until the time is up.
    queue = first_queue(rng)
    # The Ray faults come last in that queue: their cluster and first buffer start
    # meanwhile (processes starting: mostly waiting, as the other scenarios do).
    ray_workloads.prepare(int(rng.integers(2**31)), tmp_path / "ray")
    try:
        runs = run_until(queue, deadline, names, rng, tally, tmp_path)
    finally:
        ray_workloads.shutdown()  # the Ray scenarios' one cluster, if one started it
    summary = {"seconds": seconds, "seed": seed, **tally.summary()}
    print("\nsoak:", json.dumps(summary, indent=1))
    if os.environ.get("REPLAYBUFFER_SOAK_REPORT"):
        Path(os.environ["REPLAYBUFFER_SOAK_REPORT"]).write_text(json.dumps(summary, indent=1))
    assert runs >= 1 and tally.checks > 0
    assert not tally.failures, (f"soak seed {seed}: {len(tally.failures)} failures: "
                                f"{tally.failures[:5]}")
    # Every run, the bounded one too, kills a Ray shard and ends one at a crash point.
    assert tally.faults["ray_sigkill"] >= 1 and tally.faults["ray_crash_point"] >= 1, \
        tally.faults


def first_queue(rng: np.random.Generator) -> list[tuple[str, tuple[str, ...]]]:
    """Every crash point once, in a random order (popped from the end), the Ray ones
    after the others (their cluster starts meanwhile): the Ray start points as one
    fault, a shard SIGKILLed and its restarts ended at each in turn (each restart
    costs seconds; a fault of their own each would add a kill and its restart per
    point); the others one fault each."""
    points = [str(name) for name in rng.permutation(sorted(POINTS))]
    starts = tuple(ray_workloads.start_chain([p for p in points if p.startswith("ray.start.")]))
    ray = [("crash_point", (p,)) for p in points if p.startswith("ray.") and p not in starts]
    if starts:
        ray.insert(int(rng.integers(len(ray) + 1)), ("ray_start_chain", starts))
    return ray + [("crash_point", (p,)) for p in points if not p.startswith("ray.")]


def test_the_first_queue_has_every_point_once_and_one_chain_of_starts():
    queue = first_queue(np.random.default_rng(0))
    points = [p for _, names in queue for p in names]
    assert sorted(points) == sorted(POINTS)
    chains = [names for kind, names in queue if kind == "ray_start_chain"]
    assert chains == [tuple(ray_workloads.START_ORDER)]
    assert all(len(names) == 1 for kind, names in queue if kind == "crash_point")
    ray = [names[0].startswith("ray.") for _, names in queue]
    assert ray == sorted(ray, reverse=True)  # popped from the end: the Ray ones last


def test_a_start_point_without_a_place_in_the_order_is_refused_by_name():
    with pytest.raises(KeyError, match=r"\['ray.start.new'\] have no place in START_ORDER"):
        ray_workloads.start_chain(["ray.start.mark", "ray.start.new"])
    assert ray_workloads.start_chain(["ray.start.mark", "ray.start.record"]) == [
        "ray.start.record", "ray.start.mark"]


def run_until(queue, deadline, names, rng, tally, tmp_path) -> int:
    """Run the queued crash points, then scenarios at random until ``deadline``; the
    runs made."""
    runs = 0
    while queue or time.monotonic() < deadline:
        if queue:
            kind, points = queue.pop()
            if kind == "ray_start_chain":
                pick = lambda r, t, y, c=points: ray_workloads.ray_fault(  # noqa: E731
                    r, t, y, chain=c)
            else:
                pick = lambda r, t, y, p=points[0]: scenarios.crash_workload(p)(  # noqa: E731
                    p, int(r.integers(1, 4)), r, t, y)
            tally.scenario = name = f"crash_point({', '.join(points)})"
        else:
            name = str(rng.choice(names))
            pick = scenarios.SCENARIOS[name]
        work = tmp_path / f"run{runs}"
        work.mkdir()
        try:
            pick(rng, work, tally)
        except Exception as exc:  # noqa: BLE001 - an unexpected error is a finding
            tally.check(False, f"{type(exc).__name__}: {exc}")
        tally.scenarios[name if name.startswith("crash_point(") else tally.scenario] += 1
        runs += 1
    return runs
