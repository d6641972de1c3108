"""Collection with actor processes into a shared buffer, and the demo's --actors run."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("gymnasium")
torch = pytest.importorskip("torch")

from replaybuffer.collect import StepDriver, to_transition  # noqa: E402
from replaybuffer.collect.actors import ActorPool  # noqa: E402
from replaybuffer.distributed import SharedReplayBuffer  # noqa: E402
from replaybuffer_demos.dqn_actors import PolicyWeights, train_actors  # noqa: E402
from replaybuffer_demos.dqn_learner import DQNConfig, make_env  # noqa: E402


def _broken_env():
    raise OSError("no display for this env")


def _random_policy(index: int):
    rng = np.random.default_rng(index)
    return lambda obs: rng.integers(0, 2, len(obs))


def _trajectory_spec():
    env = make_env()
    spec = StepDriver(env, lambda obs: np.zeros(len(obs), np.int64)).data_spec
    env.close()
    return spec


def test_actors_write_whole_episodes_into_their_rows():
    with SharedReplayBuffer(_trajectory_spec(), 2, 400, seed=0) as buffer:
        with ActorPool(buffer, make_env, _random_policy, 2, steps_per_run=16) as pool:
            deadline = time.monotonic() + 60
            while buffer.steps_written().min() < 150 and time.monotonic() < deadline:
                pool.check()
                time.sleep(0.05)
        assert buffer.steps_written().min() >= 150  # both actors wrote their own row
        trajectories, info = buffer.get_next(256, 2)
        current, following, valid = to_transition(trajectories)
        # A valid transition's next observation is the step after it in the same env:
        # CartPole's cart position moves by at most 0.02 * 2.4 per step.
        moved = np.abs(following.observation[:, 0, 0] - current.observation[:, 0, 0])
        assert (moved[valid[:, 0]] < 0.1).all()
        assert valid.any() and not valid.all()  # episodes ended inside the sample


def test_a_failing_actor_is_reported_to_the_learner():
    with SharedReplayBuffer(_trajectory_spec(), 1, 10) as buffer:
        pool = ActorPool(buffer, _broken_env, _random_policy, 1).start()
        try:
            deadline = time.monotonic() + 60
            with pytest.raises(RuntimeError, match="actor 0 failed: OSError: no display"):
                while time.monotonic() < deadline:
                    pool.check()
                    time.sleep(0.05)
        finally:
            pool.stop()
    with pytest.raises(ValueError, match="num_actors"):
        ActorPool(buffer, make_env, _random_policy, 0)


def test_policy_weights_are_read_whole(tmp_path):
    shapes = [(3, 2), (3,)]
    weights = PolicyWeights(tmp_path, shapes, create=True)
    reader = PolicyWeights(tmp_path, shapes, create=False)
    assert reader.read() is not None  # version 0: zeros, whole
    weights.publish([np.ones((3, 2)), np.arange(3.0)])
    got = reader.read()
    np.testing.assert_array_equal(got[1], [0, 1, 2])
    assert reader.read() is None  # nothing newer
    weights._version[0] += 1  # a publish in progress
    weights._vector[:] = 7
    assert reader.read() is None


def test_train_with_actors_paces_learner_and_actors():
    config = DQNConfig(steps=1500, learning_starts=500, eval_every=10_000, eval_episodes=1,
                       final_eval_episodes=1, hidden=(16,), buffer_length=2000)
    result, q_net = train_actors(config, 2, progress=False)
    assert result.steps_trained >= 1500
    assert len(result.evaluations) == 1  # at the end
    assert result.last_network_return > 0 and result.curve == []
    assert q_net(torch.zeros(1, 4)).shape == (1, 2)


def test_train_with_actors_on_prioritized_replay_updates_priorities(monkeypatch):
    import replaybuffer_demos.dqn_actors as dqn_actors

    applied, original = [], SharedReplayBuffer.update_priorities

    def update_priorities(self, ids, priorities):
        applied.append((np.asarray(priorities), original(self, ids, priorities)))
        return applied[-1][1]

    monkeypatch.setattr(dqn_actors.SharedReplayBuffer, "update_priorities", update_priorities)
    config = DQNConfig(steps=1500, learning_starts=500, eval_every=10_000, eval_episodes=1,
                       final_eval_episodes=1, hidden=(16,), buffer_length=2000,
                       prioritized=True)
    result, _ = train_actors(config, 2, progress=False)
    assert result.steps_trained >= 1500 and result.config.prioritized
    assert result.gradient_steps == len(applied)  # one update after every gradient step
    assert applied  # the learner set the priorities of what it drew ...
    priorities, counts = zip(*applied)
    assert sum(counts) > 0 and all(p.shape == (config.sample_batch_size,) for p in priorities)
    assert all((p >= config.priority_epsilon).all() for p in priorities)
    assert np.ptp(np.concatenate(priorities)) > 0  # ... to |TD errors|, not one value
