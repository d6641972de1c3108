"""The randomized fault soak (issue 28): for its duration, scenarios chosen at random
(writers and samplers of a shared buffer SIGKILLed, a saver into a checkpoint series
SIGKILLed, an mmap writer SIGKILLed, a Ray shard's process SIGKILLed while collectors
write and a learner samples, a crash point of ``replaybuffer.crash_points`` armed in a
child or in Ray shards' processes), each followed by its invariant checks
(``tests/soak/scenarios.py``, ``tests/soak/ray_workloads.py``; the Ray scenarios share
one local cluster, started at the first of them and shut down at the end).

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
    queue = [("crash_point", name) for name in rng.permutation(sorted(POINTS))]
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


def run_until(queue, deadline, names, rng, tally, tmp_path) -> int:
    """Run the queued crash points, then scenarios at random until ``deadline``; the
    runs made."""
    runs = 0
    while queue or time.monotonic() < deadline:
        if queue:
            _, point = queue.pop()
            pick = lambda r, t, y, p=point: scenarios.crash_workload(p)(  # noqa: E731
                p, int(r.integers(1, 4)), r, t, y)
            tally.scenario = name = f"crash_point({point})"
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
