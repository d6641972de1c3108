"""RayReplayBuffer's priority updates without waiting (``update_priorities(...,
block=False)``, Ape-X's learner) on a local Ray cluster (num_cpus=2): applied by
``flush()``, applied in the order sent, a shard's errors raised later and never lost,
bad input refused in the caller with nothing sent, ids from before a restart ignored
(issue 25)."""

from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray_cluster import start_local_cluster, kill_and_wait_restarted, chi_square_passes  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.distributed import RayReplayBuffer  # noqa: E402

SPEC = {"x": rb.ArraySpec((), np.int64)}
LOCAL_MASK = (1 << 48) - 1
REFUSED = 13.0
"""A priority :class:`PickyBuffer` refuses (an error raised in the shard)."""


def prioritized():
    return rb.PrioritizedReplayBuffer(SPEC, 1, 100, alpha=1.0, seed=0)


class PickyBuffer(rb.PrioritizedReplayBuffer):
    """A prioritized buffer whose update raises on the priority :data:`REFUSED`."""

    def update_priorities(self, ids, priorities):
        if np.any(np.asarray(priorities) == REFUSED):
            raise RuntimeError(f"this shard refuses priority {REFUSED}")
        return super().update_priorities(ids, priorities)


def picky():
    return PickyBuffer(SPEC, 1, 100, alpha=1.0, seed=0)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    start_local_cluster()
    yield
    ray.shutdown()


def filled(buffer: RayReplayBuffer, count: int = 8) -> np.ndarray:
    """Write x = 0 .. count-1 round-robin; the ids of x = 0 .. count-1, in order."""
    for v in range(count):
        buffer.add_batch({"x": np.array([v])})
    buffer.flush()
    items, info = buffer.get_next(count * 64)
    by_x = {int(x): int(i) for x, i in zip(items["x"], info.ids)}
    assert sorted(by_x) == list(range(count))
    return np.array([by_x[x] for x in range(count)])


def probabilities_by_x(buffer: RayReplayBuffer, count: int = 8, draws: int = 4000
                       ) -> np.ndarray:
    """Each x's probability as the shards report it for a draw of ``draws``."""
    items, info = buffer.get_next(draws)
    out = np.full(count, np.nan)
    out[items["x"]] = info.probabilities
    return out


def test_updates_sent_without_waiting_are_applied_by_flush():
    with RayReplayBuffer(prioritized, 2, seed=1) as buffer:
        ids = filled(buffer)  # x even on shard 0, odd on shard 1
        assert buffer.update_priorities(ids, np.arange(1.0, 9.0), block=False) is None
        buffer.flush()
        assert buffer.priorities_applied == 8
        items, info = buffer.get_next(36_000)
        counts = np.bincount(items["x"], minlength=8)
        assert chi_square_passes(counts, np.arange(1.0, 9.0) * 1000)
        np.testing.assert_allclose(info.probabilities, (items["x"] + 1) / 36, rtol=1e-5)
        # A blocking call after them counts its own priorities only.
        assert buffer.update_priorities(ids[:3], np.full(3, 2.0)) == 3
        assert buffer.priorities_applied == 11


def test_the_later_of_two_updates_of_an_id_wins():
    with RayReplayBuffer(prioritized, 2, seed=2, max_in_flight=2) as buffer:
        ids = filled(buffer)
        # 30 updates of every id, at most 2 in flight: the oldest settled as they go.
        for k in range(30):
            buffer.update_priorities(ids, np.full(8, 1.0 + k) + (k == 29) * np.arange(8.0),
                                     block=False)
        buffer.flush()
        assert buffer.priorities_applied == 30 * 8
        expected = (30.0 + np.arange(8.0)) / (30 * 8 + 28)  # the last call's: 30 .. 37
        np.testing.assert_allclose(probabilities_by_x(buffer), expected, rtol=1e-5)
        # One id updated twice in one flight, with other ids between.
        buffer.update_priorities(ids[:1], [100.0], block=False)
        buffer.update_priorities(ids[1:], np.full(7, 5.0), block=False)
        buffer.update_priorities(ids[:1], [1.0], block=False)
        buffer.flush()
        np.testing.assert_allclose(probabilities_by_x(buffer),
                                   np.r_[1.0, np.full(7, 5.0)] / 36, rtol=1e-5)


def test_a_shard_applies_a_clients_calls_in_their_order_whatever_order_they_arrive():
    with RayReplayBuffer(prioritized, 1, seed=3) as buffer:
        ids = filled(buffer, 4)
        actor = buffer.actors[0]
        incarnation = buffer.describe()[0]["incarnation"]
        local = ids & LOCAL_MASK  # one shard: the local ids
        # Call 1 arrives before call 0: held, then applied after it.
        applied, _, _, held = ray.get(actor.update_priorities.remote((
            local, np.array([1.0, 2.0, 3.0, 4.0]), incarnation, [], "client", 1, 0)))
        assert (applied, held) == (0, 1)
        np.testing.assert_allclose(probabilities_by_x(buffer, 4), 0.25, rtol=1e-5)
        applied, _, _, held = ray.get(actor.update_priorities.remote((
            local, np.full(4, 7.0), incarnation, [], "client", 0, 0)))
        assert (applied, held) == (8, 0)
        np.testing.assert_allclose(probabilities_by_x(buffer, 4),
                                   np.arange(1.0, 5.0) / 10, rtol=1e-5)
        # Call 3 whose call 2 never comes: held until the client releases it.
        applied, _, _, held = ray.get(actor.update_priorities.remote((
            local, np.full(4, 1.0), incarnation, [], "client", 3, 2)))
        assert (applied, held) == (0, 1)
        assert ray.get(actor.release_priorities.remote("client", []))[0] == 4
        np.testing.assert_allclose(probabilities_by_x(buffer, 4), 0.25, rtol=1e-5)
        # Another client's numbers are its own.
        assert ray.get(actor.update_priorities.remote((
            local[:1], [2.0], incarnation, [], "other", 0, 0)))[0] == 1


def test_a_shards_error_is_raised_by_a_later_call_or_flush_and_the_rest_applied():
    with RayReplayBuffer(picky, 2, seed=4, max_in_flight=2) as buffer:
        ids = filled(buffer)
        good = np.full(8, 2.0)
        buffer.update_priorities(ids, np.r_[REFUSED, np.ones(7)], block=False)
        buffer.update_priorities(ids, good, block=False)
        with pytest.raises(RuntimeError, match="refuses priority 13"):
            buffer.update_priorities(ids, good, block=False)  # settles the first
        buffer.flush()  # raised once: nothing left
        # The refused call's other shard applied its part; the next call was applied.
        assert buffer.priorities_applied == 4 + 8
        np.testing.assert_allclose(probabilities_by_x(buffer), 1 / 8, rtol=1e-5)
        buffer.update_priorities(ids[1:2], [REFUSED], block=False)
        with pytest.raises(RuntimeError, match="refuses priority 13"):
            buffer.flush()
        buffer.update_priorities(ids[1:2], [REFUSED], block=False)
        deadline = time.monotonic() + 30
        with pytest.raises(RuntimeError, match="refuses priority 13"):
            while time.monotonic() < deadline:  # get_next raises it once it has come
                buffer.get_next(4)
                time.sleep(0.01)
        buffer.flush()
        # Blocking calls raise their own error at once.
        with pytest.raises(RuntimeError, match="refuses priority 13"):
            buffer.update_priorities(ids[:1], [REFUSED])


def test_clear_with_an_update_error_pending_clears_then_raises_it():
    with RayReplayBuffer(picky, 2, seed=6, max_in_flight=2) as buffer:
        ids = filled(buffer)
        buffer.update_priorities(ids[:1], [REFUSED], block=False)
        with pytest.raises(RuntimeError, match="refuses priority 13"):
            buffer.clear()
        assert len(buffer) == 0  # cleared all the same
        buffer.flush()  # raised once


def answered(buffer: RayReplayBuffer) -> None:
    """Wait until the shards have answered every update in flight (the client has not
    taken the answers in yet)."""
    refs = [ref for calls in buffer._updates._pending for _, _, ref in calls]
    assert refs
    ray.wait(refs, num_returns=len(refs), timeout=30)


def test_a_write_raises_an_update_error_pending_once_after_sending_itself():
    with RayReplayBuffer(picky, 2, seed=8, max_in_flight=2) as buffer:
        ids = filled(buffer)
        writes = [(lambda: buffer.add_batch({"x": np.array([100])}), 1),  # round-robin
                  (lambda: buffer.extend({"x": np.array([[101, 102]])}, shard=1), 2),
                  (lambda: buffer.add_batch({"x": np.array([103])}, shard=0), 1)]
        size = 8
        for write, steps in writes:
            buffer.update_priorities(ids[:1], [REFUSED], block=False)
            answered(buffer)
            with pytest.raises(RuntimeError, match="refuses priority 13"):
                write()
            buffer.add_batch({"x": np.array([7])})  # raised once: nothing left
            buffer.flush()
            size += steps + 1
            assert len(buffer) == size  # the write that raised was sent all the same


def test_bad_input_is_refused_in_the_caller_with_nothing_sent():
    with RayReplayBuffer(prioritized, 2, seed=5) as buffer:
        ids = filled(buffer)
        buffer.update_priorities(ids, np.arange(1.0, 9.0))
        before = probabilities_by_x(buffer)
        np.testing.assert_allclose(before, np.arange(1.0, 9.0) / 36, rtol=1e-5)
        for bad, match in [(np.ones(7), "same S"),
                           (np.r_[np.ones(7), np.nan], r"priorities\[7\] is nan"),
                           (np.r_[-1.0, np.ones(7)], r"priorities\[0\] is -1.0"),
                           (np.r_[np.ones(7), np.inf], r"priorities\[7\] is inf")]:
            with pytest.raises(ValueError, match=match):
                buffer.update_priorities(ids, bad, block=False)
        with pytest.raises(ValueError, match="same S"):
            buffer.update_priorities(ids[:, None].repeat(2, 1)[None], np.ones(8),
                                     block=False)
        buffer.flush()
        assert buffer.priorities_applied == 8
        np.testing.assert_allclose(probabilities_by_x(buffer), before, rtol=1e-6)


def test_ids_from_before_a_restart_are_ignored(tmp_path):
    with RayReplayBuffer(prioritized, 2, checkpoint_dir=tmp_path, checkpoint_every=4,
                         seed=6) as buffer:
        ids = filled(buffer)  # 4 steps a shard: each saved at last_id 3
        from_shard_1 = ids[(ids & LOCAL_MASK) % 2 == 1]
        buffer.update_priorities(ids, np.ones(8), block=False)  # numbered 0 in each shard
        buffer.flush()
        kill_and_wait_restarted(buffer, 0)  # the client has not noticed: sent, ignored there
        buffer.update_priorities(ids, np.full(8, 3.0), block=False)
        buffer.flush()
        assert buffer.priorities_applied == 8 + 4
        assert [loss.shard for loss in buffer.losses] == [0]
        # Now the client knows: the stale ids are not even sent; fresh ids of the new
        # incarnation are applied (its process starts numbering at the client's base).
        buffer.wait_for_shards()
        buffer.update_priorities(ids, np.full(8, 5.0), block=False)
        buffer.flush()
        assert buffer.priorities_applied == 8 + 4 + 4
        items, info = buffer.get_next(400)
        fresh = info.ids[(info.ids & LOCAL_MASK) % 2 == 0][:1]
        buffer.update_priorities(fresh, [2.0], block=False)
        buffer.flush()
        assert buffer.priorities_applied == 8 + 4 + 4 + 1
        assert set(from_shard_1.tolist()) <= set(info.ids.tolist())


def test_updates_in_flight_to_a_shard_that_dies_are_dropped_and_later_ones_applied(tmp_path):
    with RayReplayBuffer(prioritized, 2, checkpoint_dir=tmp_path, checkpoint_every=4,
                         seed=7) as buffer:
        ids = filled(buffer)
        for k in range(5):
            buffer.update_priorities(ids, np.full(8, 1.0 + k), block=False)
        ray.kill(buffer.actors[0], no_restart=False)  # with some of them in flight
        buffer.flush()  # a lost update is no error: its ids are stale now anyway
        buffer.wait_for_shards()
        applied = buffer.priorities_applied
        deadline = time.monotonic() + 30
        while True:  # the client learns the restarted shard's mass from a later answer
            items, info = buffer.get_next(400)
            by_x = {int(x): int(i) for x, i in zip(items["x"], info.ids)}
            if len(by_x) == 8 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sorted(by_x) == list(range(8))
        fresh = np.array([by_x[x] for x in range(8)])  # shard 0's of its new incarnation
        buffer.update_priorities(fresh, np.arange(1.0, 9.0), block=False)
        buffer.flush()
        assert buffer.priorities_applied == applied + 8
        np.testing.assert_allclose(probabilities_by_x(buffer), np.arange(1.0, 9.0) / 36,
                                   rtol=1e-5)
