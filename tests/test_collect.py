"""Trajectories, drivers and metric observers (checklist items 39-40), on gymnasium envs."""

import gymnasium as gym
import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.collect import (AverageEpisodeLength, AverageReturn, EnvironmentSteps,
                                  EpisodeDriver, PolicyStep, StepDriver, StepType, Trajectory,
                                  boundary, first, last, mid, single_step, to_transition)


class Counter(gym.Env):
    """Observation [episode, t]; reward t + 1; terminates after ``length`` steps (or never)."""

    observation_space = gym.spaces.Box(0, 1e6, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, length=3, terminates=True):
        self.length, self.terminates = length, terminates
        self.episode, self.t = -1, 0
        self.actions = []

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.actions.append(int(action))
        self.t += 1
        return self._obs(), float(self.t), self.terminates and self.t >= self.length, False, {}

    def _obs(self):
        return np.array([self.episode, self.t], np.float32)


def zeros_policy(obs):
    return np.zeros(len(obs), np.int64)


def test_the_collection_names_are_at_the_top_level_too():
    import replaybuffer.collect as collect

    for name in ("StepDriver", "EpisodeDriver", "Trajectory", "StepType"):
        assert getattr(rb, name) is getattr(collect, name) and name in rb.__all__


def test_trajectory_fields_and_predicates():  # item 39
    assert Trajectory._fields == ("step_type", "observation", "action", "policy_info",
                                  "next_step_type", "reward", "discount")
    t = Trajectory(np.array([0, 1, 1, 2]), None, None, (), np.array([1, 1, 2, 0]),
                   np.zeros(4), np.ones(4))
    assert t.is_first().tolist() == [True, False, False, False]
    assert t.is_mid().tolist() == [False, True, False, False]
    assert t.is_last().tolist() == [False, False, True, False]  # looks at next_step_type
    assert t.is_boundary().tolist() == [False, False, False, True]


@pytest.mark.parametrize("make,pair", [(first, (0, 1)), (mid, (1, 1)), (last, (1, 2)),
                                       (single_step, (0, 2)), (boundary, (2, 0))])
def test_constructors_take_the_outer_shape_from_the_discount(make, pair):
    t = make(np.zeros((2, 3, 4)), np.zeros((2, 3)), (), np.ones((2, 3)), np.ones((2, 3)))
    assert t.step_type.shape == (2, 3) and t.step_type.dtype == np.int32
    assert (t.step_type == pair[0]).all() and (t.next_step_type == pair[1]).all()
    assert t.reward.dtype == np.float32


def collect(env, num_steps, **kwargs):
    seen = []
    driver = StepDriver(env, zeros_policy, [seen.append], num_steps=num_steps, **kwargs)
    driver.run()
    return driver, seen


@pytest.mark.parametrize("vector", [False, True])
def test_episode_ends_and_boundaries(vector):
    env = gym.vector.SyncVectorEnv([lambda: Counter(3)]) if vector else Counter(3)
    driver, seen = collect(env, 6)  # two 3-step episodes, plus one uncounted boundary
    steps = [(int(t.step_type[0]), tuple(t.observation[0]), float(t.reward[0]),
              float(t.discount[0]), int(t.next_step_type[0])) for t in seen]
    F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
    assert steps == [
        (F, (0, 0), 1.0, 1.0, M), (M, (0, 1), 2.0, 1.0, M), (M, (0, 2), 3.0, 0.0, L),
        (L, (0, 3), 0.0, 1.0, F),  # boundary: the true final observation, reward 0
        (F, (1, 0), 1.0, 1.0, M), (M, (1, 1), 2.0, 1.0, M), (M, (1, 2), 3.0, 0.0, L)]
    assert all(t.step_type.shape == (1,) and t.observation.shape == (1, 2) for t in seen)
    assert driver.run() == 6  # a second run continues where the first stopped
    assert int(seen[7].step_type[0]) == StepType.LAST


def test_truncation_keeps_the_discount():
    env = gym.wrappers.TimeLimit(Counter(terminates=False), max_episode_steps=2)
    _, seen = collect(env, 2)
    assert [float(t.discount[0]) for t in seen] == [1.0, 1.0]
    assert int(seen[1].next_step_type[0]) == StepType.LAST


def test_boundary_steps_reach_observers_but_do_not_count():  # item 40
    env = gym.vector.SyncVectorEnv([lambda: Counter(2) for _ in range(3)])
    steps = EnvironmentSteps()
    seen = []
    driver = StepDriver(env, zeros_policy, [seen.append, steps], num_steps=10)
    assert driver.run() >= 10
    boundaries = sum(int(t.is_boundary().sum()) for t in seen)
    assert boundaries > 0
    assert steps.result() == sum(int((~t.is_boundary()).sum()) for t in seen)
    assert 10 <= steps.result() <= 10 + 3 - 1  # may overshoot by num_envs - 1, never short


def test_buffer_add_batch_is_an_observer_and_windows_give_true_final_observations():
    env = gym.vector.SyncVectorEnv([lambda: Counter(3) for _ in range(2)])
    probe = StepDriver(env, zeros_policy)
    buffer = rb.UniformReplayBuffer(probe.data_spec, batch_size=2, max_length=100, seed=0)
    StepDriver(env, zeros_policy, [buffer.add_batch], num_steps=40).run()
    items, _ = buffer.get_next(500, num_steps=2)
    current, following, valid = to_transition(items)
    obs, nxt = current.observation[:, 0], following.observation[:, 0]
    ok = valid[:, 0]
    # Within an episode the next observation is one step later, also at the end.
    assert (nxt[ok, 0] == obs[ok, 0]).all() and (nxt[ok, 1] == obs[ok, 1] + 1).all()
    ends = ok & (current.next_step_type[:, 0] == StepType.LAST)
    assert ends.any() and (nxt[ends, 1] == 3).all() and (current.discount[ends, 0] == 0).all()
    assert (~valid).any()  # boundary starts are in the data, masked out


def test_episode_driver_stops_at_the_step_that_ends_the_last_episode():
    env = Counter(3)
    seen = []
    driver = EpisodeDriver(env, zeros_policy, [seen.append], num_episodes=2)
    assert driver.run() == 2
    # first, mid, last; boundary, first, mid, last: the run ends on the episode's end
    assert len(seen) == 7 and bool(seen[-1].is_last()[0])
    assert driver.run() == 2
    assert bool(seen[7].is_boundary()[0])  # the next run starts with the owed boundary
    capped = EpisodeDriver(Counter(terminates=False), zeros_policy, num_episodes=1, max_steps=7)
    assert capped.run() == 0


def test_episode_driver_over_a_vector_env_counts_as_tf_agents_does():
    num_episodes, num_envs = 5, 2
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs)
    seen = []
    driver = EpisodeDriver(env, lambda obs: np.zeros(len(obs), np.int64), [seen.append],
                           num_episodes=num_episodes, seed=0)
    counted = driver.run()
    assert seen[-1].is_last().any()
    ended = sum(int(t.is_last().sum()) for t in seen)
    assert counted == ended and num_episodes <= ended < num_episodes + num_envs


def test_episode_driver_runs_deliver_what_continuous_stepping_would():
    def make(observer):
        env = gym.vector.SyncVectorEnv([lambda: Counter(5), lambda: Counter(2)])
        return EpisodeDriver(env, zeros_policy, [observer], num_episodes=3)

    runs, stepped = [], []
    driver = make(runs.append)
    for _ in range(3):
        driver.run()
    reference = make(stepped.append)
    for _ in range(len(runs)):
        reference.step()
    assert [(t.step_type.tolist(), t.observation.tolist()) for t in runs] == \
        [(t.step_type.tolist(), t.observation.tolist()) for t in stepped]


def test_metrics():
    env = gym.vector.SyncVectorEnv([lambda: Counter(3), lambda: Counter(2)])
    ret, length = AverageReturn(window=100), AverageEpisodeLength(window=100)
    StepDriver(env, zeros_policy, [ret, length], num_steps=30).run()
    assert set(np.round(list(ret.values))) == {6.0, 3.0}  # 1+2+3 and 1+2
    assert set(length.values) == {3.0, 2.0}
    assert ret.episodes == len(ret.values) and not np.isnan(ret.result())
    with pytest.raises(ValueError, match="one metric per driver"):
        ret(Trajectory(np.zeros(3, np.int32), None, None, (), np.ones(3, np.int32),
                       np.zeros(3), np.ones(3)))
    assert np.isnan(AverageReturn().result())


def test_policy_info_reaches_the_buffer():
    env = Counter(3)
    spec = rb.ArraySpec((), np.float32, "logp")
    policy = lambda obs: PolicyStep(np.zeros(len(obs), np.int64), np.full(len(obs), -0.5))  # noqa: E731
    probe = StepDriver(env, policy, policy_info_spec=spec)
    buffer = rb.UniformReplayBuffer(probe.data_spec, 1, 10)
    StepDriver(env, policy, [buffer.add_batch], num_steps=3, policy_info_spec=spec).run()
    assert (buffer.gather_all().policy_info == -0.5).all()


def test_a_buffer_whose_spec_does_not_fit_the_env_is_refused_up_front():
    env = Counter(3)
    probe = StepDriver(env, zeros_policy)
    wrong = probe.data_spec._replace(observation=rb.ArraySpec((3,), np.float32))
    buffer = rb.UniformReplayBuffer(wrong, 1, 10)
    with pytest.raises(rb.SpecError, match=r"leaf \.observation is \(3,\) float32 .* \(2,\)"):
        StepDriver(env, zeros_policy, [buffer.add_batch])
    other = rb.UniformReplayBuffer({"x": rb.ArraySpec((), np.int32)}, 1, 10)
    with pytest.raises(rb.SpecError, match="structure"):
        EpisodeDriver(env, zeros_policy, [other.add_batch])
    assert buffer.num_frames() == 0


@pytest.mark.parametrize("policy,pattern", [
    (lambda obs: np.zeros((len(obs), 2), np.int64), r"expected shape \(1,\).*got \(1, 2\)"),
    (lambda obs: np.zeros(len(obs) + 1, np.int64), r"expected shape \(1,\).*got \(2,\)"),
    (lambda obs: np.full(len(obs), 0.5), r"expected dtype int64.*got float64"),
    (lambda obs: np.full(len(obs), 3), r"outside \[0, 2\]"),
    (lambda obs: (np.zeros(len(obs)),), r"structure"),
])
def test_bad_actions_are_refused_before_anything_is_written(policy, pattern):
    env = Counter(3)
    probe = StepDriver(env, zeros_policy)
    buffer = rb.UniformReplayBuffer(probe.data_spec, 1, 10)
    seen = []
    driver = StepDriver(env, policy, [seen.append, buffer.add_batch], num_steps=1)
    with pytest.raises(rb.SpecError, match=pattern):
        driver.run()
    assert buffer.num_frames() == 0 and seen == [] and env.actions == []


def test_other_autoreset_modes_are_refused():
    env = gym.vector.SyncVectorEnv([lambda: Counter(3)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(ValueError, match="NEXT_STEP"):
        StepDriver(env, zeros_policy)
    with pytest.raises(TypeError, match="gymnasium Env or VectorEnv"):
        StepDriver(object(), zeros_policy)
    with pytest.raises(ValueError, match="num_steps"):
        StepDriver(Counter(), zeros_policy, num_steps=0)


def test_tf_agents_compat_names():
    from replaybuffer.compat import tf_agents

    assert tf_agents.Trajectory is Trajectory and tf_agents.StepType is StepType
    assert tf_agents.trajectory.boundary is boundary
