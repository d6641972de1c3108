"""Pearl's buffers (replaybuffer.compat.pearl): checklist items 41-55 of the semantics
reference, adapted to gymnasium, each of Pearl's quirks asserted as fixed."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

import replaybuffer as rb
from replaybuffer.compat import pearl
from replaybuffer.compat.pearl import (BaseBuffer, DictTrajectories, HERBuffer, ReplayBuffer,
                                       RolloutBuffer, Trajectories, TrajectoryType)

BUFFERS = [ReplayBuffer, RolloutBuffer]


def cartpole(num_envs=None):
    if num_envs is None:
        return gym.make("CartPole-v1")
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")


def fill(buffer, env, steps, seed=0, reset_on_end=True):
    """Step ``env`` (a single env) ``steps`` times into ``buffer``; return the log of
    ``(obs, action, reward, next_obs, terminated, truncated)``."""
    log = []
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
        log.append((obs, action, reward, next_obs, terminated, truncated))
        obs = env.reset()[0] if (terminated or truncated) and reset_on_end else next_obs
    return log


class CounterGoalEnv(gym.Env):
    """A goal env whose observations are unique step numbers: sampled transitions can be
    looked up. Episodes last 2 to 4 steps; achieved goals are random."""

    def __init__(self):
        box = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.observation_space = spaces.Dict(
            observation=spaces.Box(0, np.inf, (1,), np.float32), achieved_goal=box,
            desired_goal=box)
        self.action_space = spaces.Discrete(2)
        self.counter = 0

    def _obs(self):
        self.counter += 1
        return {"observation": np.array([self.counter], np.float32),
                "achieved_goal": self.np_random.normal(size=2).astype(np.float32),
                "desired_goal": self.goal.copy()}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.goal = self.np_random.normal(size=2).astype(np.float32)
        self.length, self.t = int(self.np_random.integers(2, 5)), 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], self.goal, {}))
        return obs, reward, False, self.t >= self.length, {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -np.linalg.norm(np.asarray(achieved_goal) - desired_goal, axis=-1)


def run_goal_env(buffer, env, steps, seed=0):
    """Returns {observation id: (episode, index, next achieved goal)} and the episodes'
    lists of next achieved goals."""
    transitions, episodes = {}, [[]]
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        next_obs, reward, terminated, truncated, _ = env.step(0)
        buffer.add_trajectory(obs, 0, reward, next_obs, terminated, truncated)
        transitions[float(obs["observation"][0])] = (len(episodes) - 1, len(episodes[-1]),
                                                     next_obs["achieved_goal"])
        episodes[-1].append(next_obs["achieved_goal"])
        if terminated or truncated:
            episodes.append([])
            obs, _ = env.reset()
        else:
            obs = next_obs
    return transitions, episodes


# ------------------------------------------------------------------ items 41-51


@pytest.mark.parametrize("cls", BUFFERS)
def test_41_arrays_shaped_from_the_env(cls):
    buffer = cls(env=cartpole(), buffer_size=5)
    assert buffer.observations.shape == (5, 4) and buffer.observations.dtype == np.float32
    assert buffer.actions.shape == (5, 1) and buffer.actions.dtype == np.int64
    assert buffer.rewards.shape == (5, 1) and buffer.rewards.dtype == np.float32
    assert buffer.dones.shape == (5, 1) and buffer.dones.dtype == np.float32
    assert buffer.core.capacity == 5 and buffer.obs_shape == (4,)
    spaces_only = cls(None, 5, observation_space=spaces.Box(-1, 1, (3,)),
                      action_space=spaces.Discrete(2))
    assert spaces_only.observations.shape == (5, 3)
    vector = cls(env=cartpole(2), buffer_size=5)  # rows hold every env's transition
    assert vector.observations.shape == (5, 2, 4) and vector.actions.shape == (5, 2, 1)
    assert vector.core.capacity == 10


@pytest.mark.parametrize("cls", BUFFERS)
def test_42_vector_env_last_has_the_env_axis_first(cls):
    env = cartpole(2)
    buffer = cls(env=env, buffer_size=10)
    obs, _ = env.reset(seed=0)
    added = []
    for _ in range(10):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
        added.append(obs)
        obs = next_obs
    last = buffer.last(5, dtype="numpy")
    assert last.observations.shape == (2, 5, 4) and last.actions.shape == (2, 5, 1)
    assert last.rewards.shape == (2, 5, 1) and last.next_observations.shape == (2, 5, 4)
    assert last.dones.shape == (2, 5, 1)
    np.testing.assert_array_equal(last.observations, np.stack(added[5:], 1))


def test_43_flatten_env_keeps_every_transition():
    single = ReplayBuffer(env=cartpole(), buffer_size=4)
    data = np.arange(42).reshape(7, 3, 2)
    assert single._flatten_env_axis(data) is data
    buffer = ReplayBuffer(env=cartpole(3), buffer_size=8, seed=0)
    flat = buffer._flatten_env_axis(data)  # Pearl: (6, 2) from the last 2 rows
    assert flat.shape == (21, 2)
    np.testing.assert_array_equal(flat, data.reshape(21, 2))
    env = cartpole(3)
    obs, _ = env.reset(seed=0)
    for _ in range(6):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
        obs = next_obs
    assert buffer.sample(5, flatten_env=True, dtype="numpy").observations.shape == (5, 4)
    assert buffer.sample(5, dtype="numpy").observations.shape == (3, 5, 4)
    last = buffer.last(5, flatten_env=True, dtype="numpy")  # the 5 newest, time-major
    everything = buffer.all(flatten_env=True, dtype="numpy")
    assert everything.observations.shape == (18, 4)
    np.testing.assert_array_equal(last.observations, everything.observations[-5:])
    rollout = RolloutBuffer(env=cartpole(3), buffer_size=8, seed=0)
    fill_vector(rollout, cartpole(3), 6)
    assert rollout.sample(5, flatten_env=True, dtype="numpy").rewards.shape == (5, 1)


def fill_vector(buffer, env, steps):
    obs, _ = env.reset(seed=0)
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
        obs = next_obs


def test_44_observations_stored_once_without_losing_the_oldest():
    buffer = ReplayBuffer(env=cartpole(), buffer_size=5)
    log = fill(buffer, cartpole(), 5, reset_on_end=False)
    obs0, next_obs = log[0][0], [t[3] for t in log]
    # Pearl: [next_obs[4], next_obs[0..3]] (the newest next_obs overwrote slot 0).
    np.testing.assert_array_equal(buffer.observations, np.stack([obs0] + next_obs[:4]))
    everything = buffer.all(dtype="numpy")
    np.testing.assert_array_equal(everything.next_observations, np.stack(next_obs))
    assert buffer.full and buffer.pos == 0
    # Pearl's test_buffer_add_trajectory_and_sample, at size 2 and one add.
    small = ReplayBuffer(env=cartpole(), buffer_size=2)
    (obs, action, reward, nxt, done, _), = fill(small, cartpole(), 1)
    sample = small.sample(1, dtype="numpy")
    assert all(np.ndim(getattr(sample, f)) == 2 for f in
               ("observations", "actions", "rewards", "next_observations", "dones"))
    np.testing.assert_array_equal(sample.observations[0], obs)
    np.testing.assert_array_equal(sample.next_observations[0], nxt)
    assert sample.actions.item() == action and sample.rewards.item() == reward
    assert sample.dones.item() == done


def test_45_sampling_covers_the_stored_transitions_with_exact_next_observations():
    env = gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=4)
    buffer = ReplayBuffer(env=env, buffer_size=6, seed=0)
    log = fill(buffer, env, 3)
    sample = buffer.sample(200, dtype="numpy")
    stored = np.stack([t[0] for t in log])
    assert all(any(np.array_equal(o, s) for s in stored) for o in sample.observations)
    log += fill_more(buffer, env, log, 20)  # wraps; episodes end by truncation (4 steps)
    retained = log[-6:]
    sample = buffer.sample(400, dtype="numpy")
    seen = set()
    for o, a, r, nxt, d in zip(sample.observations, sample.actions, sample.rewards,
                               sample.next_observations, sample.dones):
        i = next(i for i, t in enumerate(retained) if np.array_equal(t[0], o))
        seen.add(i)
        np.testing.assert_array_equal(nxt, retained[i][3])  # the true final obs too
        assert d[0] == float(retained[i][4])                # truncation: done = 0
    assert seen == set(range(6))  # Pearl never sampled the oldest slot once full
    assert any(t[5] for t in retained)


def fill_more(buffer, env, log, steps):
    """Continue the episode of ``log`` for ``steps`` more steps."""
    more = []
    obs = log[-1][3]
    if log[-1][4] or log[-1][5]:
        obs = env.reset()[0]
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
        more.append((obs, action, reward, next_obs, terminated, truncated))
        obs = env.reset()[0] if terminated or truncated else next_obs
    return more


@pytest.mark.parametrize("cls", BUFFERS + [HERBuffer])
def test_46_sampling_an_empty_buffer_raises(cls):
    env = CounterGoalEnv() if cls is HERBuffer else cartpole()
    with pytest.raises(ValueError, match="is empty"):
        cls(env=env, buffer_size=4).sample(2)
    if cls is not HERBuffer:
        with pytest.raises(ValueError, match="is empty"):
            cls(env=cartpole(2), buffer_size=4).sample(2)


FIELDS = ("observations", "actions", "rewards", "next_observations", "dones")


def assert_no_rows_like(empty, full, rows_axis):
    """``empty`` has the fields of ``full`` with 0 rows on ``rows_axis``, same trailing
    shapes and dtypes (nested dicts for goal envs)."""
    def leaves(t):
        out = []
        for name in FIELDS:
            value = getattr(t, name)
            out += list(value.values()) if isinstance(value, dict) else [value]
        return out

    for e, f in zip(leaves(empty), leaves(full), strict=True):
        assert e.shape[rows_axis] == 0 and f.shape[rows_axis] > 0
        assert tuple(e.shape[:rows_axis]) + tuple(e.shape[rows_axis + 1:]) == \
            tuple(f.shape[:rows_axis]) + tuple(f.shape[rows_axis + 1:])
        assert e.dtype == f.dtype and type(e) is type(f)


@pytest.mark.parametrize("cls, num_envs", [(ReplayBuffer, None), (ReplayBuffer, 2),
                                           (RolloutBuffer, None), (RolloutBuffer, 2),
                                           (HERBuffer, None)])
@pytest.mark.parametrize("flatten_env", [False, True])
@pytest.mark.parametrize("dtype", ["numpy", "torch"])
def test_all_and_last_of_an_empty_buffer_are_empty_not_errors(cls, num_envs, flatten_env,
                                                                dtype):
    """As Pearl's buffers sliced an empty range; on-policy loops call all() after reset()."""
    if cls is HERBuffer:
        env = CounterGoalEnv()
        buffer = cls(env=env, buffer_size=8)
    else:
        env = cartpole(num_envs)
        buffer = cls(env=env, buffer_size=8)
    rows_axis = 1 if num_envs and not flatten_env else 0
    for _ in range(2):  # fresh, then after reset()
        empty_all = buffer.all(flatten_env=flatten_env, dtype=dtype)
        empty_last = buffer.last(3, flatten_env=flatten_env, dtype=dtype)
        with pytest.raises(rb.EmptyBufferError):
            buffer.sample(2)
        if cls is HERBuffer:
            run_goal_env(buffer, env, 6)
        elif num_envs:
            fill_vector(buffer, env, 3)
        else:
            fill(buffer, env, 3)
        full = buffer.all(flatten_env=flatten_env, dtype=dtype)
        assert_no_rows_like(empty_all, full, rows_axis)
        assert_no_rows_like(empty_last, full, rows_axis)
        buffer.reset()


@pytest.mark.parametrize("cls", BUFFERS)
def test_47_last_is_chronological_across_the_wrap(cls):
    buffer = cls(env=cartpole(), buffer_size=2)
    env = cartpole()
    log = []
    for step in range(10):  # Pearl's test_last: after each add, last(1) is that add
        log += fill_more(buffer, env, log, 1) if log else fill(buffer, env, 1)
        last = buffer.last(1, dtype="numpy")
        np.testing.assert_array_equal(last.observations[0], log[-1][0])
        np.testing.assert_array_equal(last.next_observations[0], log[-1][3])
        assert last.actions.dtype == np.int64 and last.actions[0, 0] == log[-1][1]
    buffer = cls(env=cartpole(), buffer_size=5)
    log = fill(buffer, env, 2)
    for _ in range(6):  # groups of 2 steps, across the wrap
        log += fill_more(buffer, env, log, 2)
        last = buffer.last(2, dtype="numpy")
        np.testing.assert_array_equal(last.observations, np.stack([t[0] for t in log[-2:]]))
        np.testing.assert_array_equal(last.next_observations,
                                      np.stack([t[3] for t in log[-2:]]))
    np.testing.assert_array_equal(buffer.last(5, dtype="numpy").observations,
                                  np.stack([t[0] for t in log[-5:]]))  # Pearl: k < N only
    with pytest.raises(rb.EmptyBufferError, match="more transitions"):
        buffer.last(6)
    fresh = cls(env=cartpole(), buffer_size=5)
    fill(fresh, cartpole(), 2)
    with pytest.raises(rb.EmptyBufferError):  # Pearl returned rows of zeros
        fresh.last(3)


@pytest.mark.parametrize("cls", BUFFERS)
def test_48_dtype(cls):
    buffer = cls(env=cartpole(), buffer_size=4)
    fill(buffer, cartpole(), 3)
    assert isinstance(buffer.sample(2, dtype="numpy").observations, np.ndarray)
    assert isinstance(buffer.last(2, dtype=TrajectoryType.NUMPY).rewards, np.ndarray)
    default = buffer.sample(2)  # Pearl's default: torch, on the configured device
    assert isinstance(default.observations, torch.Tensor)
    assert default.observations.device == buffer.device
    assert isinstance(buffer.all(dtype="TORCH").dones, torch.Tensor)
    on_cpu = cls(env=cartpole(), buffer_size=4, device="cpu")
    fill(on_cpu, cartpole(), 1)
    assert on_cpu.last(1).actions.device.type == "cpu"
    with pytest.raises(ValueError):
        buffer.sample(2, dtype="jax")


def test_49_rollout_sample_is_a_contiguous_chronological_block():
    env = gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=3)
    buffer = RolloutBuffer(env=env, buffer_size=6, seed=0)
    log = fill(buffer, env, 4)
    with pytest.raises(ValueError, match="Requesting 5 samples when only 4"):
        buffer.sample(5)
    log += fill_more(buffer, env, log, 5)  # wrapped: storage order is not chronological
    retained = log[-6:]
    for _ in range(20):
        block = buffer.sample(3, dtype="numpy")
        start = next(i for i, t in enumerate(retained)
                     if np.array_equal(t[0], block.observations[0]))
        for j in range(3):
            np.testing.assert_array_equal(block.observations[j], retained[start + j][0])
            np.testing.assert_array_equal(block.next_observations[j], retained[start + j][3])
    everything = buffer.sample(6, dtype="numpy")
    np.testing.assert_array_equal(everything.next_observations,
                                  np.stack([t[3] for t in retained]))


@pytest.mark.parametrize("cls", BUFFERS)
def test_50_reset_empties(cls):
    buffer = cls(env=cartpole(), buffer_size=4)
    fill(buffer, cartpole(), 6)
    assert buffer.full and buffer.observations.any()
    buffer.reset()
    assert buffer.pos == 0 and not buffer.full
    for array in (buffer.observations, buffer.actions, buffer.rewards, buffer.dones):
        assert not array.any()
    with pytest.raises(rb.EmptyBufferError):
        buffer.sample(1)


def test_51_memory_check(monkeypatch):
    from replaybuffer.storage import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 1 << 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ReplayBuffer(env=cartpole(), buffer_size=10_000)
    assert any("of memory is available" in str(w.message) for w in caught)
    with pytest.raises(memory.InsufficientMemoryError):
        ReplayBuffer(env=cartpole(), buffer_size=10_000, memory="strict")


# ------------------------------------------------------------------ HER, items 52-55


def test_52_her_ratio_and_relabelled_rewards():
    assert HERBuffer(CounterGoalEnv(), 10, n_sampled_goal=4).her_ratio == pytest.approx(0.8)
    env = CounterGoalEnv()
    buffer = HERBuffer(env, 60, "future", n_sampled_goal=1, seed=0)
    assert buffer.her_ratio == 0.5
    transitions, _ = run_goal_env(buffer, env, 40)
    batch = buffer.sample(10, dtype="numpy")
    assert isinstance(batch, DictTrajectories) and batch.rewards.shape == (10, 1)
    for i in range(10):
        achieved = transitions[float(batch.observations["observation"][i, 0])][2]
        want = env.compute_reward(achieved, batch.observations["desired_goal"][i], {})
        assert batch.rewards[i, 0] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("strategy", ["final", "future", "episode"])
def test_53_goal_selection_strategies(strategy):
    env = CounterGoalEnv()
    buffer = HERBuffer(env, 200, strategy, n_sampled_goal=4, seed=1)
    assert buffer.goal_selection_strategy == strategy == buffer.goal_section_strategy
    transitions, episodes = run_goal_env(buffer, env, 80)
    batch = buffer.sample(50, dtype="numpy")
    for i in range(40):  # the relabelled ones: int(50 * 0.8)
        episode, index, _ = transitions[float(batch.observations["observation"][i, 0])]
        goal = batch.observations["desired_goal"][i]
        allowed = {"final": episodes[episode][-1:], "future": episodes[episode][index:],
                   "episode": episodes[episode]}[strategy]
        assert any(np.array_equal(goal, g) for g in allowed)
    with pytest.raises(ValueError, match="unknown goal_selection_strategy"):
        HERBuffer(env, 10, "random")


def test_54_only_completed_episodes_also_when_full():
    env = CounterGoalEnv()
    buffer = HERBuffer(env, 12, "future", seed=2)
    with pytest.raises(ValueError, match="is empty"):
        buffer.sample(4)
    obs, _ = env.reset(seed=2)
    next_obs, reward, _, _, _ = env.step(0)
    buffer.add_trajectory(obs, 0, reward, next_obs, False, False)
    with pytest.raises(rb.EmptyBufferError, match="no completed episode"):
        buffer.sample(4)
    transitions, episodes = run_goal_env(buffer, env, 40, seed=3)  # full, wrapped
    assert buffer.full
    in_progress = {o for o, (e, _, _) in transitions.items() if e == len(episodes) - 1}
    assert in_progress  # the last episode is still running
    sampled = buffer.sample(300, dtype="numpy").observations["observation"][:, 0]
    assert not in_progress & set(sampled.tolist())


def test_55_her_outputs_and_last():
    env = CounterGoalEnv()
    buffer = HERBuffer(env, 40, "final", seed=0)
    transitions, episodes = run_goal_env(buffer, env, 15)
    batch = buffer.sample(8)
    assert set(batch.observations) == set(batch.next_observations) == {"observation",
                                                                        "desired_goal"}
    assert isinstance(batch.rewards, torch.Tensor)
    assert torch.equal(batch.next_observations["desired_goal"],
                       batch.observations["desired_goal"])
    last = buffer.last(2, dtype="numpy")
    completed = [o for o, (e, _, _) in sorted(transitions.items())
                 if e < len(episodes) - 1 or not episodes[-1]]
    np.testing.assert_array_equal(last.observations["observation"][:, 0], completed[-2:])
    assert isinstance(buffer.last(2).actions, torch.Tensor)  # Pearl: always numpy
    everything = buffer.all(dtype="numpy")
    assert len(everything.next_observations["observation"]) == len(everything.actions) == 15
    # Pearl's test_her_add_trajectory
    fresh = HERBuffer(env, 10)
    obs, _ = env.reset(seed=5)
    next_obs, reward, _, _, _ = env.step(1)
    fresh.add_trajectory(obs, 1, reward, next_obs, False)
    np.testing.assert_array_equal(fresh.observations[0], obs["observation"])
    np.testing.assert_array_equal(fresh.desired_goals[0], obs["desired_goal"])
    np.testing.assert_array_equal(fresh.next_achieved_goals[0], next_obs["achieved_goal"])
    assert fresh.actions[0, 0] == 1 and fresh.rewards[0, 0] == np.float32(reward)


# ------------------------------------------------------------------ fixed quirks


def test_all_has_one_length_and_survives_the_wrap():
    buffer, env = ReplayBuffer(env=cartpole(), buffer_size=4), cartpole()
    log = fill(buffer, env, 3)
    everything = buffer.all(dtype="numpy")  # Pearl: next_observations was 4 long
    assert {len(getattr(everything, f)) for f in
            ("observations", "actions", "rewards", "next_observations", "dones")} == {3}
    log += fill_more(buffer, env, log, 5)  # pos wraps to 0: Pearl returned nothing
    everything = buffer.all(dtype="numpy")
    np.testing.assert_array_equal(everything.observations, np.stack([t[0] for t in log[-4:]]))
    with pytest.raises(ValueError):  # read-only: later reads return the same rows
        everything.observations[:] = 0
    kept = [np.array(getattr(everything, f)) for f in
            ("observations", "actions", "rewards", "next_observations", "dones")]
    log += fill_more(buffer, env, log, 6)  # the ring wraps again: what was read stays
    for field, before in zip(("observations", "actions", "rewards", "next_observations",
                              "dones"), kept):
        np.testing.assert_array_equal(getattr(everything, field), before)
    np.testing.assert_array_equal(buffer.all(dtype="numpy").observations,
                                  np.stack([t[0] for t in log[-4:]]))


def test_her_reset_keeps_int64_bookkeeping_and_vector_envs_work():
    env = CounterGoalEnv()
    buffer = HERBuffer(env, 600, "episode", seed=0)
    run_goal_env(buffer, env, 50)
    buffer.reset()
    assert not buffer.desired_goals.any() and buffer.pos == 0
    transitions, episodes = run_goal_env(buffer, env, 500)  # > 127 slots and episodes
    assert len(episodes) > 127
    batch = buffer.sample(64, dtype="numpy")
    for i in range(51):
        episode, _, _ = transitions[float(batch.observations["observation"][i, 0])]
        assert any(np.array_equal(batch.observations["desired_goal"][i], g)
                   for g in episodes[episode])
    from gymnasium.vector import AutoresetMode

    vector = gym.vector.SyncVectorEnv([CounterGoalEnv] * 2,
                                      autoreset_mode=AutoresetMode.SAME_STEP)
    her = HERBuffer(vector, 20, "final", seed=0)
    assert her.observations.shape == (20, 2, 1) and her.desired_goals.shape == (20, 2, 2)
    obs, _ = vector.reset(seed=0)
    for _ in range(12):
        next_obs, reward, terminated, truncated, info = vector.step(np.zeros(2, np.int64))
        true_next = {k: v.copy() for k, v in next_obs.items()}
        for i in np.flatnonzero(info.get("_final_obs", [])):
            for key in true_next:
                true_next[key][i] = info["final_obs"][i][key]
        her.add_trajectory(obs, np.zeros(2, np.int64), reward, true_next, terminated,
                           truncated)
        obs = next_obs
    batch = her.sample(16, dtype="numpy")
    assert batch.observations["observation"].shape == (16, 1)
    assert her.last(2, dtype="numpy").actions.shape == (2, 2, 1)


def test_truncation_keeps_done_zero_and_the_true_final_observation():
    env = gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=2)
    buffer = ReplayBuffer(env=env, buffer_size=10)
    log = fill(buffer, env, 6)
    everything = buffer.all(dtype="numpy")
    for t, nxt, done in zip(log, everything.next_observations, everything.dones):
        np.testing.assert_array_equal(nxt, t[3])  # Pearl: the next episode's first obs
        assert done[0] == float(t[4])


def test_bad_input_is_refused_and_changes_nothing():
    buffer = ReplayBuffer(env=cartpole(2), buffer_size=4)
    obs = np.zeros((2, 4), np.float32)
    buffer.add_trajectory(obs, np.array([0, 1]), np.ones(2), obs, np.zeros(2, bool))
    cases = [((obs, np.array([0, 5]), np.ones(2), obs, np.zeros(2, bool)), "outside its space"),
             ((obs[:1], np.array([0, 1]), np.ones(2), obs, np.zeros(2, bool)), "shape"),
             ((obs, np.array([0, 1, 1]), np.ones(2), obs, np.zeros(2, bool)), "shape"),
             ((obs, np.array([0, 1]), np.ones(2), obs[:, :3], np.zeros(2, bool)), "shape")]
    for args, pattern in cases:
        with pytest.raises(rb.SpecError, match=pattern):
            buffer.add_trajectory(*args)
    assert buffer.pos == 1 and len(buffer.core) == 2
    with pytest.raises(ValueError, match="buffer_size"):
        ReplayBuffer(env=cartpole(), buffer_size=0)


def test_base_buffer_is_abstract_and_extendable():
    with pytest.raises(TypeError):
        BaseBuffer(cartpole(), 4)

    class YourBuffer(BaseBuffer):  # the tutorial's buffer, with our helpers
        def reset(self):
            super().reset()

        def add_trajectory(self, observation, action, reward, next_observation, done,
                           truncated=None):
            self._add(observation, action, reward, next_observation, done, truncated)

        def sample(self, batch_size, flatten_env=False, dtype="numpy"):
            return self._last(batch_size, flatten_env, dtype)

        def last(self, batch_size, flatten_env=False, dtype="numpy"):
            return self._last(batch_size, flatten_env, dtype)

        def all(self, flatten_env=False, dtype="numpy"):
            return self._all(flatten_env, dtype)

    buffer = YourBuffer(env=cartpole(), buffer_size=10)
    assert buffer.observations.shape == (10, 4) and buffer.dones.shape == (10, 1)
    log = fill(buffer, cartpole(), 3)
    buffer.add_batch_trajectories(*[[t[i] for t in log] for i in range(5)])
    assert isinstance(buffer.all(), Trajectories) and len(buffer.all().rewards) == 6


def test_rollout_values_reach_the_core_gae():
    buffer = RolloutBuffer(env=cartpole(), buffer_size=8)
    env = cartpole()
    obs, _ = env.reset(seed=0)
    for _ in range(4):
        next_obs, reward, terminated, truncated, _ = env.step(0)
        buffer.add_trajectory(obs, 0, reward, next_obs, terminated, truncated, value=0.5,
                              log_prob=-0.1)
        obs = next_obs
    returns, advantages = buffer.core.compute_returns_and_advantages([0.5], 1.0, 1.0)
    np.testing.assert_allclose(advantages, [4.0, 3.0, 2.0, 1.0])
    assert pearl.TrajectoryType("numpy") is TrajectoryType.NUMPY


TUTORIAL_CELL = '''
from replaybuffer.compat.pearl import BaseBuffer
from replaybuffer.compat.pearl import Observation, Trajectories
from replaybuffer.compat.pearl import TrajectoryType

import gymnasium as gym
from typing import Union
import torch as T
import numpy as np


class YourBuffer(BaseBuffer):
  def __init__(self, env: gym.Env, buffer_size: int,
               device: Union[str, T.device] = "auto") -> None:
    super().__init__(env, buffer_size, device)

  def reset():  # sic: the tutorial's reset takes no self; defining it is what counts
    super().reset()

  def add_trajectory(self, observation: Observation, action: Union[np.ndarray, int],
                     reward: Union[float, np.ndarray], next_observation: Observation,
                     done: Union[bool, np.ndarray]) -> None:
    pass

  def sample(self, batch_size: int, flatten_env: bool = False,
             dtype: Union[str, TrajectoryType] = "numpy") -> Trajectories:
    pass

  def last(self, batch_size: int, flatten_env: bool = False,
           dtype: Union[str, TrajectoryType] = "numpy") -> Trajectories:
    pass

  def all(self, flatten_env: bool = False,
          dtype: Union[str, TrajectoryType] = "numpy") -> Trajectories:
    pass


env = gym.make("CartPole-v1")
buffer = YourBuffer(env=env, buffer_size=10)
shapes = (buffer.observations.shape, buffer.actions.shape, buffer.rewards.shape,
          buffer.dones.shape)
'''


def test_the_tutorials_imports_all_map_to_compat_pearl():
    """Pearl's tutorial imports BaseBuffer/ReplayBuffer/RolloutBuffer/HERBuffer from
    pearll.buffers, Observation and Trajectories from pearll.common.type_aliases and
    TrajectoryType from pearll.common.enumerations: its BaseBuffer cell runs with those
    import lines pointed at replaybuffer.compat.pearl (and gym as gymnasium)."""
    from replaybuffer.compat import pearl

    for name in ("BaseBuffer", "ReplayBuffer", "RolloutBuffer", "HERBuffer", "Observation",
                 "Trajectories", "DictTrajectories", "TrajectoryType", "Tensor",
                 "GoalSelectionStrategy"):
        assert name in pearl.__all__ and hasattr(pearl, name), name
    scope = {}
    exec(compile(TUTORIAL_CELL, "<tutorial cell 2>", "exec"), scope)
    assert scope["shapes"] == ((10, 4), (10, 1), (10, 1), (10, 1))  # the tutorial's output


def test_the_pearl_tutorial_example_runs():
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).parent.parent / "examples" / "pearl_tutorial.py"
    out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Buffer observation array shape = (10, 4)" in out.stdout
    assert "# HER Buffer" in out.stdout


@pytest.mark.parametrize("cls, num_envs", [(ReplayBuffer, None), (ReplayBuffer, 2),
                                           (RolloutBuffer, None), (RolloutBuffer, 2),
                                           (HERBuffer, None)])
def test_sampling_empty_names_the_pearl_class(cls, num_envs):
    """The empty-sample error names the class the user built (not the core buffer under
    it) and says to add transitions first, on every path (single and vector env)."""
    env = CounterGoalEnv() if cls is HERBuffer else cartpole(num_envs)
    buffer = cls(env=env, buffer_size=4)
    for kwargs in ({}, {"flatten_env": True}):
        with pytest.raises(rb.EmptyBufferError) as caught:
            buffer.sample(2, **kwargs)
        message = str(caught.value)
        assert message.startswith(f"{cls.__name__} of replaybuffer.compat.pearl is empty.")
        assert "Add transitions" in message and "before sampling" in message
        assert buffer.core.last_id == -1  # unchanged
