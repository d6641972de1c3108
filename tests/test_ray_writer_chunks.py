"""``ShardWriter``'s default chunk (``distributed/ray_shards/writer.py``,
``CHUNK_STEPS``): 256 steps a remote call, a quarter of the calls of 64, while a step
still waits at most ``chunk_seconds`` (to the next write) before it is sent."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray_cluster import start_local_cluster  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.distributed import RayReplayBuffer, ShardWriter  # noqa: E402
from replaybuffer.distributed.ray_shards.writer import CHUNK_STEPS  # noqa: E402

SPEC = {"x": rb.ArraySpec((), np.int64), "step_type": rb.ArraySpec((), np.int32)}


def uniform():
    return rb.UniformReplayBuffer(SPEC, 1, 1000, seed=0)


@pytest.fixture(scope="module")
def buffer():
    start_local_cluster()
    made = RayReplayBuffer(uniform, 1, seed=0)
    yield made
    made.close()
    ray.shutdown()


def step(x: int) -> dict:
    return {"x": np.array([x], np.int64), "step_type": np.array([1], np.int32)}  # MID


def test_a_writer_sends_256_steps_a_call_by_default(buffer):
    """300 steps (no episode end, an hour's ``chunk_seconds``): one chunk of 256 goes
    on its own, the rest at ``flush``; a pickled copy keeps the default."""
    buffer.clear()
    writer = ShardWriter(buffer.actors[0], 0, SPEC, rows=1, chunk_seconds=3600)
    assert writer.chunk_steps == CHUNK_STEPS == 256
    assert pickle.loads(pickle.dumps(writer)).chunk_steps == 256
    for x in range(300):
        writer.add_batch(step(x))
    assert writer._outbox._seq == {0: 1}  # one call so far (64 a chunk made four)
    writer.flush()
    assert writer._outbox._seq == {0: 2}
    window, _ = buffer.get_next(1, 300)
    np.testing.assert_array_equal(window["x"][0], np.arange(300))


def test_the_buffers_writers_default_to_the_same_chunk_size(buffer):
    """``RayReplayBuffer.writer(i)`` gives a writer of the default chunk size, as one
    made directly (it gave 64)."""
    assert buffer.writer(0).chunk_steps == CHUNK_STEPS
    assert buffer.writer(0, chunk_steps=8).chunk_steps == 8


def test_a_step_waits_at_most_chunk_seconds_at_the_default_size(buffer):
    """With the defaults (256 steps, 0.05 s), a write made once ``chunk_seconds`` have
    passed since the oldest unsent step sends the chunk, however few it holds."""
    buffer.clear()
    writer = ShardWriter(buffer.actors[0], 0, SPEC, rows=1)
    writer.add_batch(step(0))
    assert writer._outbox._seq == {}  # gathered, not sent
    time.sleep(writer.chunk_seconds + 0.02)
    writer.add_batch(step(1))
    assert writer._outbox._seq == {0: 1}  # sent by time, 2 steps of 256
    writer._outbox.flush()  # wait for it to land (sends nothing more)
    assert buffer.describe()[0]["size"] == 2
