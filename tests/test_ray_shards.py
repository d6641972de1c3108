"""RayReplayBuffer on a local Ray cluster (num_cpus=2): routing, distribution, stale
ids, shard restart from checkpoints, bad input."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray_cluster import (  # noqa: E402
    CountingMassHandle, chi_square_passes, start_local_cluster)

import replaybuffer as rb  # noqa: E402
from replaybuffer.distributed import (RayReplayBuffer, ShardsUnavailableError,  # noqa: E402
                                      ShardStartError)
from replaybuffer.errors import SpecError  # noqa: E402

SPEC = {"x": rb.ArraySpec((), np.int64)}


def make_buffer(kind: str = "uniform", max_length: int = 100, batch_size: int = 1):
    if kind == "prioritized":
        return rb.PrioritizedReplayBuffer(SPEC, batch_size, max_length, alpha=1.0, seed=0)
    if kind == "transitions":
        return rb.TransitionReplayBuffer(rb.ArraySpec((2,), np.float32),
                                         rb.ArraySpec((), np.int64), capacity=max_length,
                                         seed=0)
    return rb.UniformReplayBuffer(SPEC, batch_size, max_length, seed=0)


def failing_factory():
    raise MemoryError("no room for this shard")


def alternating_factory(counter: str):
    """Shard 0 gets int64 items, later shards float32: mismatched specs."""
    path = Path(counter)
    n = int(path.read_text()) if path.exists() else 0
    path.write_text(str(n + 1))
    return rb.UniformReplayBuffer({"x": rb.ArraySpec((), np.int64 if n == 0 else np.float32)},
                                  1, 10)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    start_local_cluster()
    yield
    ray.shutdown()


def fill(buffer: RayReplayBuffer, values, shard=None) -> None:
    for v in values:
        buffer.add_batch({"x": np.array([v])}, shard=shard)
    buffer.flush()


def test_round_robin_writes_and_uniform_draws_over_all_shards():
    with RayReplayBuffer(make_buffer, 3, seed=0) as buffer:
        fill(buffer, range(30))  # 10 per shard, round-robin
        assert [d["size"] for d in buffer.describe()] == [10, 10, 10]
        fill(buffer, range(30, 50), shard=2)  # shard 2 now holds 30 of 50 items
        items, info = buffer.get_next(25_000)
        counts = np.bincount(items["x"], minlength=50)
        assert chi_square_passes(counts, np.full(50, 500.0))
        np.testing.assert_allclose(info.probabilities, 1 / 50, rtol=1e-6)
        single, single_info = buffer.get_next()
        assert single["x"].shape == () and np.ndim(single_info.ids) == 0


def test_prioritized_draws_follow_priorities_across_shards_and_route_updates():
    with RayReplayBuffer(functools.partial(make_buffer, "prioritized"), 2, seed=1) as buffer:
        fill(buffer, range(8))  # x even on shard 0, odd on shard 1
        items, info = buffer.get_next(8 * 64)
        by_x = {int(x): int(i) for x, i in zip(items["x"], info.ids)}
        assert sorted(by_x) == list(range(8))
        ids = np.array([by_x[x] for x in range(8)])
        assert buffer.update_priorities(ids, np.arange(1.0, 9.0)) == 8
        items, info = buffer.get_next(36_000)
        counts = np.bincount(items["x"], minlength=8)
        assert chi_square_passes(counts, np.arange(1.0, 9.0) * 1000)
        np.testing.assert_allclose(info.probabilities, (items["x"] + 1) / 36, rtol=1e-5)
        assert info.weights.max() == 1.0
        with pytest.raises(ValueError, match="priorities"):
            buffer.update_priorities(ids[:2], np.array([1.0, np.nan]))


def test_transition_buffers_shard_too():
    with RayReplayBuffer(functools.partial(make_buffer, "transitions"), 2, seed=2) as buffer:
        for t in range(10):
            buffer.add(np.full((1, 2), t, np.float32), np.array([t]), np.array([1.0]),
                       np.full((1, 2), t + 1, np.float32), np.array([False]))
        buffer.flush()
        batch, info = buffer.sample(64)
        np.testing.assert_array_equal(batch.next_observations[:, 0], batch.observations[:, 0] + 1)
        assert set(batch.actions.tolist()) <= set(range(10))


def test_a_killed_shard_restarts_from_its_checkpoint_and_reports_the_loss(tmp_path):
    with RayReplayBuffer(make_buffer, 2, checkpoint_dir=tmp_path, checkpoint_every=10,
                         seed=3) as buffer:
        fill(buffer, range(50))  # 25 steps each; shard 0 saved at last_id 9 and 19
        ray.kill(buffer.actors[0], no_restart=False)
        time.sleep(0.2)
        # Meanwhile the client samples from shard 1 alone (odd x), then shard 0 is back.
        seen_alone = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not buffer.losses:
            items, _ = buffer.get_next(32)
            if not buffer.shards_up()[0]:
                assert (items["x"] % 2 == 1).all()
                seen_alone = True
            time.sleep(0.05)
        assert seen_alone and buffer.losses
        loss = buffer.losses[0]
        assert (loss.shard, loss.steps_lost, loss.restored_last_id) == (0, 5, 19)
        buffer.wait_for_shards()
        items, _ = buffer.get_next(4000)
        assert set(items["x"].tolist()) == set(range(0, 40, 2)) | set(range(1, 50, 2))


def test_stale_ids_from_an_earlier_incarnation_are_ignored(tmp_path):
    factory = functools.partial(make_buffer, "prioritized")
    with RayReplayBuffer(factory, 2, checkpoint_dir=tmp_path, checkpoint_every=5,
                         seed=4) as buffer:
        fill(buffer, range(20))
        _, info = buffer.get_next(64)
        shard0 = (info.ids & ((1 << 48) - 1)) % 2 == 0
        ray.kill(buffer.actors[0], no_restart=False)
        time.sleep(0.5)
        buffer.wait_for_shards()
        applied = buffer.update_priorities(info.ids, np.full(64, 5.0))
        assert applied == int((~shard0).sum())  # shard 0's are from its old incarnation


def test_clear_empties_every_shard_as_a_new_incarnation(tmp_path):
    factory = functools.partial(make_buffer, "prioritized")
    with RayReplayBuffer(factory, 2, checkpoint_dir=tmp_path, checkpoint_every=5,
                         seed=7) as buffer:
        fill(buffer, range(20))
        _, info = buffer.get_next(16)
        buffer.clear()
        assert len(buffer) == 0 and [d["size"] for d in buffer.describe()] == [0, 0]
        with pytest.raises(rb.EmptyBufferError):
            buffer.get_next(2)
        assert buffer.update_priorities(info.ids, np.full(16, 2.0)) == 0  # stale ids
        fill(buffer, range(100, 104))
        # The empty buffer was saved at the clear: a restart does not bring 0..19 back.
        ray.kill(buffer.actors[0], no_restart=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not buffer.losses:
            buffer.get_next(8)
            time.sleep(0.05)
        buffer.wait_for_shards()
        items, _ = buffer.get_next(400)
        assert set(items["x"].tolist()) == {101, 103}  # shard 0's two steps were lost


def test_bad_input_and_failures_give_clear_errors(tmp_path):
    with pytest.raises(ShardStartError, match="shard 0 could not start: MemoryError: no room"):
        RayReplayBuffer(failing_factory, 2)
    with pytest.raises(SpecError, match="shard 1's data_spec differs"):
        RayReplayBuffer(functools.partial(alternating_factory, str(tmp_path / "n")), 2)
    with RayReplayBuffer(make_buffer, 2) as buffer:
        fill(buffer, range(4))
        with pytest.raises(SpecError, match="structure"):
            buffer.add_batch({"y": np.array([1])})
        with pytest.raises(SpecError, match="x"):
            buffer.add_batch({"x": np.array([[1, 2]])})
        assert [d["size"] for d in buffer.describe()] == [2, 2]  # nothing reached a shard
        for actor in buffer.actors:
            ray.kill(actor, no_restart=True)
        with pytest.raises(ShardsUnavailableError, match="all 2 shards are down"):
            for _ in range(3):
                buffer.get_next(4)
    with pytest.raises(ValueError, match="num_shards"):
        RayReplayBuffer(make_buffer, 0)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        RayReplayBuffer(make_buffer, 1, checkpoint_every=5)


def test_as_dataset_prefetches_from_shards():
    with RayReplayBuffer(functools.partial(make_buffer, batch_size=2), 2, seed=5) as buffer:
        for t in range(10):  # each shard its own sequence: windows stay in one
            buffer.add_batch({"x": np.array([t, 100 + t])}, shard=0)
            buffer.add_batch({"x": np.array([1000 + t, 1100 + t])}, shard=1)
        buffer.flush()
        stream = iter(buffer.as_dataset(16, 2, num_parallel_calls=2))
        for _ in range(4):
            items, info = next(stream)
            assert items["x"].shape == (16, 2)
            np.testing.assert_array_equal(np.diff(items["x"], axis=1), 1)
        stream.close()


def limited_buffer():
    buffer = rb.UniformReplayBuffer(SPEC, 1, 1000, seed=0)
    buffer.rate_limiter = rb.SampleToInsertRatio(samples_per_insert=1.0,
                                                 min_size_to_sample=10, error_buffer=20)
    return buffer


def collect(writer, start: int, count: int) -> int:
    for t in range(count):
        writer.add_batch({"x": np.array([start + t])})
    writer.flush()
    return count


def test_collector_actors_write_sequences_paced_by_shard_limiters():
    """Each collector task holds a ShardWriter (pickled); a shard's rate limiter holds
    its writes back until the learner samples, in the shard's own threads."""
    with RayReplayBuffer(limited_buffer, 2, seed=6) as buffer:
        remote = ray.remote(num_cpus=0)(collect)
        done = [remote.remote(buffer.writer(i), 1000 * i, 200) for i in range(2)]
        deadline = time.monotonic() + 60
        while min(d["last_id"] for d in buffer.describe()) < 9:  # both past min_size
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)
        held = [d["last_id"] for d in buffer.describe()]
        assert max(held) < 60  # 10 to fill, then at most about error_buffer ahead
        while ray.wait(done, num_returns=2, timeout=0)[1] and time.monotonic() < deadline:
            try:  # once the collectors are done, the limiters hold samples back
                items, _ = buffer.get_next(8, 2, timeout=1.0)
            except rb.RateLimitedError:
                continue
            np.testing.assert_array_equal(np.diff(items["x"], axis=1), 1)  # one sequence
        assert ray.get(done, timeout=5) == [200, 200]


def test_dqn_demo_on_ray_collectors_runs_end_to_end():
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    from replaybuffer_demos.dqn_learner import DQNConfig
    from replaybuffer_demos.dqn_ray import train_ray

    config = DQNConfig(steps=1500, learning_starts=400, eval_every=10_000, eval_episodes=1,
                       final_eval_episodes=1, hidden=(16,), buffer_length=2000)
    result, q_net = train_ray(config, 2, progress=False)
    assert result.steps_trained > config.learning_starts
    assert result.evaluations[-1][0] == result.steps_trained  # evaluated at the end
    assert result.last_network_return > 0
    assert ray.is_initialized()  # the test's cluster is left running


@ray.remote(num_cpus=0)
class Silent:
    """Answers nothing: a question to it is never ready."""

    def __init__(self):
        import threading
        self.never = threading.Event()

    def mass_status(self, key):
        self.never.wait()


class SilentMassHandle:
    """A shard's actor handle whose ``mass_status`` questions go to a silent actor."""

    def __init__(self, handle, silent):
        self._handle, self._silent = handle, silent

    def __getattr__(self, name):
        return getattr(self._silent if name == "mass_status" else self._handle, name)


def test_a_shard_that_never_answers_its_mass_question_does_not_stop_the_others(
        monkeypatch):
    """Shard 2 never answers a mass question; shard 1 (empty: no draw reaches it, so
    only questions bring its mass) is still asked each refresh period, and items a
    writer puts in it are drawn (before the fix one unanswered question stopped new
    questions to every shard: shard 1 was asked once and its items never drawn)."""
    from replaybuffer.distributed.ray_shards import sampling

    monkeypatch.setattr(sampling, "MASS_REFRESH_S", 0.2)
    silent = Silent.remote()
    with RayReplayBuffer(make_buffer, 3, seed=11) as buffer:
        fill(buffer, range(10), shard=0)
        buffer.get_next(8)  # the first draw asks every shard and waits
        handles = list(buffer._actors)
        asked = [0, 0, 0]
        buffer._actors[:] = [CountingMassHandle(handles[0], asked, 0),
                             CountingMassHandle(handles[1], asked, 1),
                             CountingMassHandle(SilentMassHandle(handles[2], silent),
                                                asked, 2)]
        try:
            time.sleep(0.3)
            buffer.get_next(8)  # stale: shards 1 and 2 asked (2 never answers)
            asked[:] = [0, 0, 0]
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:  # several refresh periods
                batch, _ = buffer.get_next(8)
                assert (batch["x"] < 10).all()
                time.sleep(0.02)
            assert asked[1] >= 2 and asked[2] == 0  # 2 is not asked again meanwhile
            writer = buffer.writer(1, chunk_steps=4)
            writer.extend({"x": 100 + np.arange(4)[None]})
            writer.flush()
            deadline = time.monotonic() + 30.0
            while not (buffer.get_next(8)[0]["x"] >= 100).any():
                assert time.monotonic() < deadline, "shard 1's new items never drawn"
        finally:
            buffer._actors[:] = handles
    ray.kill(silent)
