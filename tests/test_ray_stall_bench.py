"""The Ray bench's rows (issue 25's stalled rows): every collector is a process
started before the row's timed window, and its CPU is counted with the row's.

Started as Ray tasks, collectors beyond the cluster's idle workers waited for a new
worker process each and began writing seconds into a 5 s window, their start-ups'
CPU counted for no collector (their processes were not yet metered)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from ray_cluster import start_local_cluster  # noqa: E402

from replaybuffer_bench import ray_bench  # noqa: E402

COLLECTORS = 4
"""More collectors than the local cluster's 2 CPUs start idle workers for."""


@pytest.fixture(scope="module")
def cluster():
    start_local_cluster()
    yield
    ray.shutdown()


def test_every_collector_is_metered_and_writes_in_the_row(cluster):
    row = ray_bench.run_ray("control", 1, COLLECTORS, 0.5, batches_per_call=2)
    assert row["collectors_metered"] == COLLECTORS
    assert len(set(row["collector_pids"])) == COLLECTORS
    cpu = row["cpu_us_per_batch"]
    assert all(cpu[group] is not None for group in ("learner", "shards", "collectors"))
    assert row["inserts_per_s"] > 0 and row["samples_per_s"] > 0
