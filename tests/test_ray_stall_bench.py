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


def test_a_row_at_an_insert_rate_is_paced_and_split_per_operation(cluster):
    rate, seconds = 4000.0, 0.5
    row = ray_bench.run_ray("control", 2, 2, seconds, batches_per_call=2,
                            insert_rate=rate)
    assert row["insert_rate"] == rate
    # each collector less than PACE_STEPS and an extend ahead of its share at the end
    ahead = ray_bench.PACE_STEPS + ray_bench.CHUNK
    assert 0 < row["inserts_per_s"] < rate + 2 * ahead / seconds
    op = row["cpu_per_operation"]
    assert set(op) == {"learner_us_per_batch", "shard_draw_us_per_batch",
                       "collector_us_per_step", "shard_write_us_per_step",
                       "shard_main_ms_per_s", "shard_ray_ms_per_s"}
    assert all(value is not None and value > 0 for value in op.values())
    assert op["learner_us_per_batch"] == row["cpu_us_per_batch"]["learner"]
    idle = row["idle_shard_ms_per_s_by_thread"]  # per shard, nothing calling it
    assert set(idle) == {"writes", "calls", "main", "ray"} and idle["main"] > 0
    table = ray_bench.format_per_operation([row])
    assert "| control | 2 | 4,000/s |" in table
