"""What a shard's frequent calls cost Ray (issue 25: Ray's own CPU per batch): no task
events for the calls a shard answers many times a second, and a group of 32 control
batches answered inside Ray's reply (split into return values), not through its object
store."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray_cluster import start_local_cluster  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.distributed import RayReplayBuffer  # noqa: E402
from replaybuffer.distributed.ray_shards.draw_answers import (  # noqa: E402
    INLINE_BYTES, draw_packing, inline_runs)
from replaybuffer.distributed.ray_shards.shard import ShardActor  # noqa: E402
from replaybuffer_bench.workloads import control_spec  # noqa: E402

HOT = ("write", "draw", "mass_status", "update_priorities")
"""The calls a shard answers many times a second."""
RARE = ("describe", "release", "save", "clear", "acknowledge")


def test_the_frequent_calls_record_no_task_events_and_the_rare_ones_do():
    for name in HOT:
        assert getattr(ShardActor, name).__ray_enable_task_events__ is False, name
    for name in RARE:  # Ray's default (events recorded) for what the dashboard shows
        assert getattr(getattr(ShardActor, name), "__ray_enable_task_events__",
                       True) is True, name


def test_a_group_of_32_control_batches_stays_in_rays_reply():
    packing = draw_packing(control_spec())
    counts = [256] * 32
    assert packing.nbytes(sum(counts), 1) > INLINE_BYTES  # too large for one reply
    runs = inline_runs(packing, counts, None)
    assert runs is not None and sum(runs) == 32 and len(runs) == 11
    starts = np.cumsum([0] + runs)
    assert all(packing.nbytes(sum(counts[a:b]), 1) <= INLINE_BYTES
               for a, b in zip(starts[:-1], starts[1:]))


def uniform():
    return rb.UniformReplayBuffer(control_spec(), 1, 5000, seed=0)


@pytest.fixture(scope="module")
def cluster():
    start_local_cluster()
    yield
    ray.shutdown()


def test_the_shards_handles_send_frequent_calls_without_task_events(cluster):
    with RayReplayBuffer(uniform, 2, seed=0) as buffer:
        for name in HOT:
            assert getattr(buffer.actors[0], name)._enable_task_events is False, name
        assert buffer.actors[0].describe._enable_task_events is True
        items = {k: np.zeros((1, 600) + s.shape, s.dtype)
                 for k, s in control_spec().items()}
        for shard in range(2):
            buffer.extend(items, shard=shard)
        buffer.flush()
        # the calls still answer as before: a group of 32 from one shard, in one call
        stream = iter(buffer.as_dataset(256, prefetch=32, batches_per_call=32,
                                        group_from_one_shard=True))
        batches = [next(stream) for _ in range(40)]
        stream.close()
        assert all(info.ids.shape == (256,) for _, info in batches)
