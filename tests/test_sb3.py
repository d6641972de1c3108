"""replaybuffer.integrations.sb3 inside Stable-Baselines3's algorithms, checked against
SB3's own buffers fed the same add calls and against a plain list of transitions."""

from __future__ import annotations

import copy
import json
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.buffers import DictReplayBuffer, NStepReplayBuffer
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import BitFlippingEnv
from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

import replaybuffer as rb
from replaybuffer.integrations.sb3 import (HerReplayBuffer, PrioritizedDQN,
                                           PrioritizedReplayBuffer,
                                           PrioritizedReplayBufferSamples, ReplayBuffer)

FIELDS = ("observations", "actions", "next_observations", "dones", "rewards", "discounts")


@pytest.fixture(autouse=True)
def one_torch_thread():
    # Small networks on a shared machine: extra threads only contend.
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


def tee(ours, theirs):
    """Make every add to ``ours`` (as SB3's algorithm calls it) go to ``theirs`` too."""
    add = ours.add

    def both(*args):
        theirs.add(*copy.deepcopy(args))
        add(*args)
    ours.add = both


def assert_same_samples(got, want):
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape,
                                                           b.shape)
        assert th.equal(a, b), name


def chronological(array, buffer):
    """SB3's ``[buffer_size, n_envs, ...]`` array as ``[n_envs, steps, ...]``, oldest first."""
    held = array if buffer.full else array[:buffer.pos]
    if buffer.full:
        held = np.roll(held, -buffer.pos, axis=0)
    return np.swapaxes(held, 0, 1)


def masked_dones(buffer):
    return buffer.dones * (1 - buffer.timeouts)


# ------------------------------------------------------------------ DQN on CartPole
def test_dqn_on_cartpole_trains_on_exactly_what_sb3s_buffer_holds():
    """Every batch train() draws equals SB3's ReplayBuffer._get_samples at the same slots,
    SB3's buffer having received the same add calls; the ring wraps on the way."""
    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer, buffer_size=1000,
                learning_starts=200, train_freq=4, batch_size=32, target_update_interval=250,
                seed=0)
    ours = model.replay_buffer
    theirs = SB3ReplayBuffer(1000, model.observation_space, model.action_space, model.device)
    tee(ours, theirs)
    drawn, compared, dones_seen = [], [0], [0.0]
    core_sample, sample = ours.core.sample, ours.sample

    def recording_core_sample(batch_size):
        batch, info = core_sample(batch_size)
        drawn.append(info.ids)  # one env: ids are the add ids
        return batch, info

    def checked_sample(batch_size, env=None):
        got = sample(batch_size, env)
        want = theirs._get_samples(drawn[-1] % theirs.buffer_size, env)
        assert_same_samples(got, want)
        compared[0] += 1
        dones_seen[0] += float(got.dones.sum())
        return got

    ours.core.sample, ours.sample = recording_core_sample, checked_sample
    before = [p.detach().clone() for p in model.q_net.parameters()]
    model.learn(3500)
    assert compared[0] == model._n_updates >= 800
    assert dones_seen[0] > 0  # episode ends were among the compared transitions
    assert (ours.size(), ours.pos, ours.full) == (theirs.size(), theirs.pos, theirs.full) \
        == (1000, 500, True)
    assert len(ours.core) == 1000
    assert any(not th.equal(a, b) for a, b in zip(before, model.q_net.parameters()))


# ------------------------------------------------------------------ episode ends, frames
class FlashEnv(gym.Env):
    """Random uint8 frames ``[12, 12, 1]``; terminates with probability 0.15 a step."""

    observation_space = spaces.Box(0, 255, (12, 12, 1), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action):
        return self._frame(), 1.0, bool(self.np_random.random() < 0.15), False, {}

    def _frame(self):
        return self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)


def test_frame_stack_keeps_next_observations_exact_where_sb3s_optimized_buffer_fails():
    """Stacked frames from VecFrameStack, two envs, terminations and time-limit
    truncations, the ring wrapped: with frame_stack=True every transition equals SB3's
    plain buffer's (exact, since SB3 patches in terminal_observation), while SB3's
    optimize_memory_usage buffer returns the next episode's first stack at every episode
    end and a done of 1 at every truncation."""
    venv = VecFrameStack(make_vec_env(lambda: TimeLimit(FlashEnv(), 8), n_envs=2, seed=0), 4)
    model = DQN("MlpPolicy", venv, replay_buffer_class=ReplayBuffer, buffer_size=400,
                replay_buffer_kwargs={"frame_stack": True}, learning_starts=10**6, seed=0)
    ours = model.replay_buffer
    space = model.observation_space  # [4, 12, 12] after SB3's channel-first transpose
    assert space.shape == (4, 12, 12)
    exact = SB3ReplayBuffer(400, space, model.action_space, "cpu", n_envs=2)
    optimized = SB3ReplayBuffer(400, space, model.action_space, "cpu", n_envs=2,
                                optimize_memory_usage=True, handle_timeout_termination=False)
    tee(ours, exact)
    tee(ours, optimized)
    model.learn(600)  # collection only: 300 steps per env into 200 slots per env
    assert (ours.size(), ours.pos, ours.full) == (200, 100, True)
    got = ours.core.all()  # [n_envs, 200, ...], oldest first
    np.testing.assert_array_equal(got.observations, chronological(exact.observations, exact))
    np.testing.assert_array_equal(got.next_observations,
                                  chronological(exact.next_observations, exact))
    np.testing.assert_array_equal(got.actions, chronological(exact.actions, exact))
    np.testing.assert_array_equal(got.rewards, chronological(exact.rewards, exact))
    np.testing.assert_array_equal(got.terminated, chronological(masked_dones(exact), exact))
    np.testing.assert_array_equal(got.truncated, chronological(exact.timeouts, exact))
    ends = chronological(exact.dones, exact)[:, :-1] == 1  # the newest has no successor
    truncations = chronological(exact.timeouts, exact) == 1
    assert ends.sum() > 20 and truncations.sum() > 5 and (ends & ~truncations[:, :-1]).any()
    their_next = np.swapaxes(np.roll(optimized.observations, -optimized.pos - 1, 0), 0, 1)
    wrong = (their_next[:, :-1] != got.next_observations[:, :-1]).any(axis=(2, 3, 4))
    np.testing.assert_array_equal(wrong, ends)  # wrong at every episode end, only there
    their_dones = chronological(optimized.dones, optimized)
    assert (their_dones[truncations] == 1).all() and not got.terminated[truncations].any()


def test_frame_stack_memory_against_sb3s_buffers():
    space, actions = spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(4)

    def sb3_nbytes(buffer):
        arrays = [buffer.observations, buffer.actions, buffer.rewards, buffer.dones,
                  buffer.timeouts]
        if not buffer.optimize_memory_usage:
            arrays.append(buffer.next_observations)
        return sum(a.nbytes for a in arrays)

    theirs = sb3_nbytes(SB3ReplayBuffer(2000, space, actions, "cpu"))
    optimized = sb3_nbytes(SB3ReplayBuffer(2000, space, actions, "cpu",
                                           optimize_memory_usage=True,
                                           handle_timeout_termination=False))
    plain = ReplayBuffer(2000, space, actions, "cpu").core.nbytes
    stacked = ReplayBuffer(2000, space, actions, "cpu", frame_stack=True).core.nbytes
    assert 0.45 < plain / theirs < 0.55  # each observation once: half of SB3's default
    assert stacked / theirs < 0.15 and stacked / optimized < 0.3  # one frame a transition


# ------------------------------------------------------------------ SAC, TD3: Box actions
def test_sac_with_vec_normalize_and_two_envs_stores_what_sb3s_buffer_stores():
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = SAC("MlpPolicy", venv, replay_buffer_class=ReplayBuffer, buffer_size=10_000,
                learning_starts=100, batch_size=64, seed=0)
    ours = model.replay_buffer
    theirs = SB3ReplayBuffer(10_000, model.observation_space, model.action_space, "cpu",
                             n_envs=2)
    tee(ours, theirs)
    model.learn(500)  # 250 steps per env: each env truncates at step 200
    assert model._n_updates > 100
    assert ours.size() == theirs.size() == 250
    got = ours.core.all()
    for name in ("observations", "next_observations", "actions", "rewards"):
        np.testing.assert_array_equal(getattr(got, name),
                                      chronological(getattr(theirs, name), theirs))
    assert got.truncated[:, 199].all() and got.truncated.sum() == 2
    assert not got.terminated.any()
    # Samples are normalized as SB3's are: the same draw from a twin, unnormalized.
    del ours.add  # the tee is a local function: back to the class's add
    twin = pickle.loads(pickle.dumps(ours))
    normalized, raw = ours.sample(64, env=venv), twin.sample(64)
    np.testing.assert_array_equal(normalized.observations.numpy(),
                                  venv.normalize_obs(raw.observations.numpy()))
    np.testing.assert_array_equal(normalized.next_observations.numpy(),
                                  venv.normalize_obs(raw.next_observations.numpy()))
    np.testing.assert_array_equal(normalized.rewards.numpy(),
                                  venv.normalize_reward(raw.rewards.numpy()))
    assert not np.array_equal(normalized.observations.numpy(), raw.observations.numpy())
    th.testing.assert_close(normalized.actions, raw.actions, rtol=0, atol=0)


def test_td3_with_n_step_returns_matches_sb3s_n_step_buffer():
    """n_steps=3 through replay_buffer_kwargs: every batch TD3 draws equals SB3's
    NStepReplayBuffer at the same slots (returns across a truncation included)."""
    model = TD3("MlpPolicy", "Pendulum-v1", replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs={"n_steps": 3, "gamma": 0.9}, gamma=0.9,
                buffer_size=1000, learning_starts=100, batch_size=64, seed=0)
    ours = model.replay_buffer
    theirs = NStepReplayBuffer(1000, model.observation_space, model.action_space, "cpu",
                               n_steps=3, gamma=0.9)
    tee(ours, theirs)
    drawn, compared = [], [0]
    core_sample, sample = ours.core.sample, ours.sample

    def recording_core_sample(batch_size):
        batch, info = core_sample(batch_size)
        drawn.append(info.ids)
        return batch, info

    def checked_sample(batch_size, env=None):
        got = sample(batch_size, env)
        want = theirs._get_samples(drawn[-1] % theirs.buffer_size, env)
        for name in FIELDS:  # sums in another order: equal to float32 rounding
            th.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-6,
                                    atol=1e-6)
        compared[0] += 1
        return got

    ours.core.sample, ours.sample = recording_core_sample, checked_sample
    model.learn(300)
    assert compared[0] == model._n_updates >= 150
    assert ours.core.all().truncated[199]  # one env: [steps]; windows from 197 stop at 199
    assert ours.sample(8).discounts.shape == (8, 1)


# ------------------------------------------------------------------ bad input
def test_bad_input_names_the_field_and_changes_nothing():
    env = gym.make("CartPole-v1")
    buffer = ReplayBuffer(20, env.observation_space, env.action_space, "cpu", n_envs=2)
    obs = np.zeros((2, 4), np.float32)
    infos = [{}, {}]
    for t in range(3):
        buffer.add(obs + t, obs + t + 1, np.array([0, 1]), np.ones(2), np.zeros(2, bool), infos)
    before = buffer.core.all()
    good = dict(obs=obs + 3, next_obs=obs + 4, action=np.array([1, 0]), reward=np.ones(2),
                done=np.zeros(2, bool), infos=infos)
    bad = [
        (dict(obs=np.zeros((2, 5), np.float32)),
         r"\['observation'\]: expected shape \(2, 4\).*got \(2, 5\)"),
        (dict(obs=np.zeros((3, 4), np.float32)),
         r"\['observation'\]: expected shape \(2, 4\).*got \(3, 4\)"),
        (dict(next_obs=np.zeros((2, 3), np.float32)),
         r"\['next_observation'\]: expected shape \(2, 4\).*got \(2, 3\)"),
        (dict(obs=np.zeros((2, 4), np.complex64)),
         r"\['observation'\]: expected dtype float32.*got complex64"),
        (dict(action=np.array([0.5, 1.0])),
         r"\['action'\]: expected dtype int64.*got float64"),
        (dict(action=np.array([0, 2])), r"\['action'\] has values outside its space \[0, 1\]"),
        (dict(done=np.zeros(3, bool)), r"done: expected shape \(2,\).*got \(3,\)"),
        (dict(infos=[{}]), r"infos: expected 2 dicts.*got 1"),
    ]
    for change, message in bad:
        with pytest.raises(rb.SpecError, match=message):
            buffer.add(**{**good, **change})
        assert buffer.core.last_id == 2 and buffer.pos == 3
        after = buffer.core.all()
        for a, b in zip(after, before):
            np.testing.assert_array_equal(a, b)
    image = ReplayBuffer(8, spaces.Box(0, 255, (4, 6, 6), np.uint8), spaces.Discrete(2), "cpu")
    with pytest.raises(rb.SpecError, match=r"\['observation'\]: expected dtype uint8.*"
                                           r"got float32"):
        image.add(np.zeros((1, 4, 6, 6), np.float32), np.zeros((1, 4, 6, 6), np.uint8),
                  np.array([0]), np.zeros(1), np.zeros(1, bool), [{}])
    assert image.size() == 0


def test_construction_errors():
    env = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match="optimize_memory_usage: expected False, got True"):
        DQN("MlpPolicy", env, replay_buffer_class=ReplayBuffer, optimize_memory_usage=True)
    tuple_space = spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3)))
    with pytest.raises(rb.SpecError, match=r"observation_space: expected Box.*got Tuple"):
        ReplayBuffer(10, tuple_space, env.action_space)
    nested = spaces.Dict(a=spaces.Dict(b=spaces.Discrete(2)))
    with pytest.raises(rb.SpecError, match=r"observation_space\['a'\]: expected Box.*got Dict"):
        ReplayBuffer(10, nested, env.action_space)
    with pytest.raises(rb.SpecError, match="frame_stack needs an observation"):
        ReplayBuffer(10, spaces.Dict(a=spaces.Box(0, 1, (2,))), env.action_space,
                     frame_stack=True)
    with pytest.raises(ValueError, match="copy_info_dict: expected False"):
        HerReplayBuffer(10, BitFlippingEnv(4).observation_space, env.action_space, None,
                        copy_info_dict=True)
    with pytest.raises(rb.EmptyBufferError):
        ReplayBuffer(10, env.observation_space, env.action_space).sample(2)


def test_discrete_and_dict_observations_take_sb3s_shapes():
    space = spaces.Dict(pos=spaces.Discrete(5, start=1), vec=spaces.Box(-1, 1, (2,)),
                        bits=spaces.MultiBinary(3))
    action_space = spaces.MultiDiscrete([2, 3])
    buffer = ReplayBuffer(30, space, action_space, "cpu", n_envs=3)
    theirs = DictReplayBuffer(30, space, action_space, "cpu", n_envs=3)
    tee(buffer, theirs)
    rng = np.random.default_rng(0)
    for _ in range(12):
        obs = {"pos": rng.integers(1, 6, 3), "vec": rng.random((3, 2), np.float32),
               "bits": rng.integers(0, 2, (3, 3)).astype(np.int8)}
        nxt = {"pos": rng.integers(1, 6, 3), "vec": rng.random((3, 2), np.float32),
               "bits": rng.integers(0, 2, (3, 3)).astype(np.int8)}
        buffer.add(obs, nxt, rng.integers(0, 2, (3, 2)), rng.random(3), rng.random(3) < 0.2,
                   [{}] * 3)
    got = buffer.core.all()
    for key in space.spaces:
        np.testing.assert_array_equal(got.observations[key],
                                      chronological(theirs.observations[key], theirs))
        np.testing.assert_array_equal(got.next_observations[key],
                                      chronological(theirs.next_observations[key], theirs))
    np.testing.assert_array_equal(got.actions, chronological(theirs.actions, theirs))
    sample = buffer.sample(5)
    assert type(sample).__name__ == "DictReplayBufferSamples"
    assert sample.observations["pos"].shape == (5, 1) and sample.actions.shape == (5, 2)
    with pytest.raises(rb.SpecError, match=r"\['observation'\]\['pos'\] has values outside"):
        buffer.add({**obs, "pos": np.array([0, 1, 2])}, nxt, np.zeros((3, 2), np.int64),
                   np.zeros(3), np.zeros(3, bool), [{}] * 3)


@pytest.mark.parametrize("device", ["cpu", "meta"] + (["cuda"] if th.cuda.is_available()
                                                      else []))
def test_samples_are_placed_on_the_device(device):
    env = gym.make("Pendulum-v1")
    for cls in (ReplayBuffer, PrioritizedReplayBuffer):
        buffer = cls(10, env.observation_space, env.action_space, device, n_steps=2)
        for t in range(4):
            buffer.add(np.full((1, 3), t, np.float32), np.full((1, 3), t + 1, np.float32),
                       np.zeros((1, 1), np.float32), np.ones(1), np.zeros(1, bool), [{}])
        sample = buffer.sample(3)
        tensors = [getattr(sample, name) for name in FIELDS]
        if cls is PrioritizedReplayBuffer:
            tensors.append(sample.weights)
        assert all(t.device.type == device for t in tensors)


# ------------------------------------------------------------------ prioritized replay
def filled_prioritized_dqn(steps=400, **kwargs):
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", learning_starts=10**6, buffer_size=1000,
                           seed=0, **kwargs)
    model.learn(steps)  # collection only
    return model


def huber(x):
    return th.where(x.abs() < 1, 0.5 * x**2, x.abs() - 0.5)


def test_prioritized_dqn_loss_is_the_importance_weighted_mean():
    model = filled_prioritized_dqn()
    buffer = model.replay_buffer
    assert isinstance(buffer, PrioritizedReplayBuffer)
    spread = buffer.sample(512)
    buffer.update_priorities(spread.indices, np.random.default_rng(0).random(512) * 10 + 0.01)
    samples = buffer.sample(64)
    assert isinstance(samples, PrioritizedReplayBufferSamples)
    assert samples.weights.shape == (64, 1) and float(samples.weights.max()) == 1.0
    assert float(samples.weights.min()) < 0.9  # the weights differ: weighting shows
    loss, td = model.td_loss(samples)
    with th.no_grad():
        q = model.q_net(samples.observations).gather(1, samples.actions.long())
        next_q = model.q_net_target(samples.next_observations).max(1).values.reshape(-1, 1)
        target = samples.rewards + (1 - samples.dones) * model.gamma * next_q
    want = (samples.weights * huber(q - target)).mean()
    th.testing.assert_close(loss.detach(), want)
    assert not th.isclose(loss.detach(), huber(q - target).mean())
    th.testing.assert_close(td, (target - q).reshape(-1))


def test_prioritized_dqn_train_sets_priorities_to_abs_td_error_plus_eps():
    model = filled_prioritized_dqn(priority_eps=0.01)
    buffer = model.replay_buffer
    seen = []
    td_loss = model.td_loss

    def recording(samples):
        loss, td = td_loss(samples)
        seen.append((samples.indices, td))
        return loss, td
    model.td_loss = recording
    model.train(gradient_steps=3, batch_size=32)
    assert len(seen) == 3 and model._n_updates == 3
    indices, td = seen[-1]  # earlier steps' items may be drawn again: check the last
    want = (td.abs().numpy().astype(np.float64) + 0.01) ** buffer.core.alpha
    np.testing.assert_allclose(buffer.core.priorities(indices), want, rtol=1e-6)
    assert buffer.core.max_priority != 1.0  # new items entered at 1, now changed


def test_prioritized_dqn_learns_on_cartpole():
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", learning_starts=200, train_freq=4,
                           buffer_size=2000, batch_size=32, seed=0,
                           replay_buffer_kwargs={"beta_final": 1.0, "beta_steps": 300})
    model.learn(1500)
    assert model._n_updates >= 300
    assert model.replay_buffer.core.beta == 1.0
    with pytest.raises(TypeError, match="replay_buffer: expected a .*PrioritizedReplayBuffer"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer).train(1, 4)


# ------------------------------------------------------------------ saving, loading
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_save_and_load_replay_buffer_round_trip(tmp_path, cls):
    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=cls, buffer_size=300,
                learning_starts=10**6, seed=0)
    model.learn(500)  # wrapped once
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    other = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=cls, buffer_size=300, seed=1)
    other.load_replay_buffer(tmp_path / "buffer.pkl")
    loaded = other.replay_buffer
    assert type(loaded) is cls and loaded.device == other.device
    assert (loaded.size(), loaded.pos, loaded.full) == (300, 200, True)
    for a, b in zip(loaded.core.all(), model.replay_buffer.core.all()):
        np.testing.assert_array_equal(a, b)
    # The sampler's state travels too: both draw the same next batches.
    for _ in range(3):
        want, got = model.replay_buffer.sample(16), loaded.sample(16)
        assert_same_samples(got, want)
    loaded.reset()
    assert loaded.size() == 0 and loaded.pos == 0 and not loaded.full


# ------------------------------------------------------------------ hindsight replay
def test_her_with_dqn_on_bit_flipping_relabels_and_round_trips(tmp_path):
    venv = make_vec_env(lambda: BitFlippingEnv(n_bits=4, max_steps=4), n_envs=2, seed=0)
    model = DQN("MultiInputPolicy", venv, replay_buffer_class=HerReplayBuffer,
                replay_buffer_kwargs={"goal_selection_strategy": "final", "n_sampled_goal": 3},
                buffer_size=1000, learning_starts=50, seed=0)
    model.learn(400)
    buffer = model.replay_buffer
    assert isinstance(buffer, HerReplayBuffer) and buffer.size() == 200
    assert buffer.her_ratio == 0.75 and buffer.goal_selection_strategy.name == "FINAL"
    batch = buffer.sample(200)
    achieved = batch.next_observations["achieved_goal"].numpy()
    goals = batch.observations["desired_goal"].numpy()
    np.testing.assert_array_equal(batch.next_observations["desired_goal"].numpy(), goals)
    want = BitFlippingEnv(4).compute_reward(achieved, goals, None)
    np.testing.assert_array_equal(batch.rewards.numpy().reshape(-1), want)
    # "final": a relabelled goal is what some episode achieved last.
    finals = _all_final_goals(buffer)
    assert all(tuple(g) in finals for g in goals[:150])
    # One more step in both envs, so that both have an episode in progress.
    obs = {k: v[:, 0] for k, v in buffer.core.last(1).next_observations.items()}
    buffer.add(obs, obs, np.zeros(2, np.int64), np.zeros(2, np.float32), np.zeros(2, bool),
               [{}, {}])
    model.save_replay_buffer(tmp_path / "her.pkl")
    model.load_replay_buffer(tmp_path / "her.pkl", truncate_last_traj=False)
    again = model.replay_buffer
    assert again is not buffer and again.env is model.env
    assert again.core.completed() == buffer.core.completed()
    with pytest.warns(UserWarning, match=r"episodes in progress in 2 env\(s\) were ended"):
        model.load_replay_buffer(tmp_path / "her.pkl")  # truncate_last_traj=True
    assert model.replay_buffer.core.completed() >= buffer.core.completed() + 2
    model.learn(100, reset_num_timesteps=False)
    assert model.replay_buffer.sample(8).rewards.shape == (8, 1)


def _all_final_goals(buffer):
    """The next achieved goals of every stored step that ended its episode."""
    steps = buffer.core.all()
    ended = steps.terminated | steps.truncated
    return {tuple(g) for g in steps.next_observations["achieved_goal"][ended]}


# ------------------------------------------------------------------ random streams
def reference_transitions(history, n_steps, gamma, timeouts):
    """The transitions a buffer must return, worked out from the add history of one env:
    ``n_steps`` returns stop after an end and where the next add did not follow on."""
    out = []
    for j, step in enumerate(history):
        ret, last = 0.0, j
        for k in range(n_steps):
            i = j + k
            if i >= len(history):
                break
            s = history[i]
            ret += gamma**k * float(s["reward"])
            last = i
            follows = i + 1 < len(history) and np.array_equal(history[i + 1]["obs"],
                                                              s["next_obs"])
            if s["done"] or (i + 1 < len(history) and not follows):
                break
        end = history[last]
        done = end["terminated"] if timeouts else end["done"]
        out.append(dict(obs=step["obs"], action=step["action"], next_obs=end["next_obs"],
                        reward=np.float32(ret), done=float(done),
                        discount=0.0 if done else gamma ** (last - j + 1)))
    return out


@settings(max_examples=40, deadline=None)
@given(n_envs=st.integers(1, 3), per_env=st.integers(2, 8), steps=st.integers(1, 25),
       n_steps=st.integers(1, 3), timeouts=st.booleans(),
       p_end=st.sampled_from([0.0, 0.2, 0.5]), p_jump=st.sampled_from([0.0, 0.2]),
       seed=st.integers(0, 10_000))
def test_random_streams_match_a_list_of_transitions(n_envs, per_env, steps, n_steps, timeouts,
                                                    p_end, p_jump, seed):
    """Random terminations, truncations and unannounced resets over ``n_envs`` envs: every
    sample equals the transition the reference list holds for it (uniform samples found
    by their unique observation, prioritized ones by their index)."""
    rng = np.random.default_rng(seed)
    obs_space, act_space = spaces.Box(-np.inf, np.inf, (2,), np.float32), spaces.Discrete(3)
    kwargs = dict(n_steps=n_steps, gamma=0.9, handle_timeout_termination=timeouts, seed=seed)
    uniform = ReplayBuffer(per_env * n_envs, obs_space, act_space, "cpu", n_envs, **kwargs)
    prioritized = PrioritizedReplayBuffer(per_env * n_envs, obs_space, act_space, "cpu",
                                          n_envs, alpha=0.0, **kwargs)
    counter = iter(range(1, 10**9))

    def fresh():
        return np.array([[next(counter), rng.random()] for _ in range(n_envs)], np.float32)
    history = [[] for _ in range(n_envs)]
    obs = fresh()
    for _ in range(steps):
        next_obs = fresh()
        ended = rng.random(n_envs) < p_end
        terminated = ended & (rng.random(n_envs) < 0.5)
        truncated = ended & ~terminated
        action, reward = rng.integers(0, 3, n_envs), rng.normal(size=n_envs).astype(np.float32)
        infos = [{"TimeLimit.truncated": bool(t)} for t in truncated]
        for buffer in (uniform, prioritized):
            buffer.add(obs.copy(), next_obs.copy(), action, reward, ended, infos)
        for e in range(n_envs):
            history[e].append(dict(obs=obs[e], next_obs=next_obs[e], action=action[e],
                                   reward=reward[e], done=bool(ended[e]),
                                   terminated=bool(terminated[e])))
        jump = rng.random(n_envs) < p_jump
        obs = np.where((ended | jump)[:, None], fresh(), next_obs)
    held = min(steps, per_env)
    for buffer in (uniform, prioritized):
        assert (buffer.size(), buffer.pos, buffer.full) == (held, steps % per_env,
                                                             steps >= per_env)
    reference = [reference_transitions(h, n_steps, 0.9, timeouts)[-held:] for h in history]
    by_obs = {float(t["obs"][0]): t for row in reference for t in row}

    def check(sample, i, want):
        np.testing.assert_array_equal(sample.observations[i].numpy(), want["obs"])
        np.testing.assert_array_equal(sample.next_observations[i].numpy(), want["next_obs"])
        assert int(sample.actions[i, 0]) == want["action"]
        assert float(sample.rewards[i, 0]) == pytest.approx(float(want["reward"]), rel=1e-6,
                                                           abs=1e-6)
        assert float(sample.dones[i, 0]) == want["done"]
        if n_steps > 1:
            assert float(sample.discounts[i, 0]) == pytest.approx(want["discount"], rel=1e-6)
        else:
            assert sample.discounts is None

    sample = uniform.sample(64)
    for i in range(64):
        check(sample, i, by_obs[float(sample.observations[i, 0])])
    sample = prioritized.sample(64)
    np.testing.assert_array_equal(sample.weights.numpy(), 1.0)
    first = (steps - held) * n_envs  # item ids: step * n_envs + env
    for i, item in enumerate(sample.indices):
        step, env = divmod(int(item), n_envs)
        check(sample, i, reference[env][step - (first // n_envs)])


# ------------------------------------------------------------------ reproducibility
def dqn_parameters(seed, replay_buffer_class=ReplayBuffer):
    """DQN on CartPole-v1 for 2k steps (500 of them before learning, a gradient step every
    4) on the CPU: its Q-network's parameters, flat."""
    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=replay_buffer_class,
                buffer_size=10_000, learning_starts=500, train_freq=4, batch_size=32,
                policy_kwargs={"net_arch": [32]}, device="cpu", seed=seed)
    model.learn(2000)
    return th.cat([p.detach().flatten() for p in model.policy.parameters()]).numpy()


def test_the_same_seed_reproduces_a_dqn_run_bit_for_bit():
    """The buffer takes its sampling seed from numpy's global generator when the algorithm
    builds it, after SB3's set_random_seed(seed) has seeded that generator: the same
    seed= gives the same draws and so equal parameters; another seed differs."""
    first = dqn_parameters(0)
    np.testing.assert_array_equal(dqn_parameters(0), first)
    assert not np.array_equal(dqn_parameters(1), first)


def test_an_explicit_seed_is_taken_as_given_and_none_follows_the_global_generator():
    box = spaces.Box(-1, 1, (2,), np.float32)

    def draws(seed, global_seed):
        np.random.seed(global_seed)
        buffer = ReplayBuffer(100, box, spaces.Discrete(2), device="cpu", seed=seed)
        for k in range(20):
            obs = np.full((1, 2), k / 20, np.float32)
            buffer.add(obs, obs + 0.01, np.array([k % 2]), np.array([1.0]), np.array([False]),
                       [{}])
        return buffer.sample(16).observations.numpy()

    np.testing.assert_array_equal(draws(5, 0), draws(5, 1))  # seed= as given
    np.testing.assert_array_equal(draws(None, 3), draws(None, 3))  # from np.random
    assert not np.array_equal(draws(None, 3), draws(None, 4))


def filled_model(seed, cls=ReplayBuffer, **kwargs):
    """A DQN (not trained) whose buffer holds the same 50 transitions whatever ``seed``."""
    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=cls, buffer_size=300,
                learning_starts=10**6, device="cpu", seed=seed, **kwargs)
    for k in range(50):
        obs = np.full((1, 4), k, np.float32)
        model.replay_buffer.add(obs, obs + 1, np.array([k % 2]), np.array([1.0]),
                                np.array([k % 9 == 8]), [{}])
    return model


def sampled(model):
    return model.replay_buffer.sample(32).observations.numpy()


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_set_random_seed_on_an_existing_model_reseeds_the_buffer(cls):
    """After model.set_random_seed(s) the buffer's draws depend on s alone, not on the
    seed the model was built with, as SB3's own buffer's (numpy's global generator) do;
    the same s twice on one model repeats the draws; another s differs."""
    built_0, built_1 = filled_model(0, cls), filled_model(1, cls)
    assert not np.array_equal(sampled(built_0), sampled(built_1))  # built apart: differ
    built_0.set_random_seed(7)  # one model at a time: both draw from numpy's generator
    first = sampled(built_0)
    built_1.set_random_seed(7)
    np.testing.assert_array_equal(sampled(built_1), first)
    built_0.set_random_seed(7)  # the same seed again: torch's initial seed is unchanged
    np.testing.assert_array_equal(sampled(built_0), first)
    built_0.set_random_seed(8)
    assert not np.array_equal(sampled(built_0), first)


def test_an_explicit_seed_is_not_reseeded_by_the_algorithm_and_reseed_sets_it():
    fixed_a = filled_model(0, replay_buffer_kwargs={"seed": 3})
    fixed_b = filled_model(1, replay_buffer_kwargs={"seed": 3})
    fixed_b.set_random_seed(9)
    np.testing.assert_array_equal(sampled(fixed_a), sampled(fixed_b))
    follows = filled_model(0)
    follows.replay_buffer.reseed(3)  # now fixed: the algorithm's seeding leaves it
    follows.set_random_seed(11)
    np.testing.assert_array_equal(sampled(follows), sampled(filled_model(2, replay_buffer_kwargs={"seed": 3})))
    with pytest.raises(ValueError, match=r"seed: expected an int in \[0, 2\*\*64\), got -1"):
        follows.replay_buffer.reseed(-1)


def test_a_run_continued_after_set_random_seed_is_reproduced():
    def run():
        model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer,
                    buffer_size=10_000, learning_starts=300, train_freq=4, batch_size=32,
                    policy_kwargs={"net_arch": [32]}, device="cpu", seed=0)
        model.learn(1000)
        model.set_random_seed(5)
        model.learn(1000, reset_num_timesteps=False)
        return th.cat([p.detach().flatten() for p in model.policy.parameters()]).numpy()

    np.testing.assert_array_equal(run(), run())


def test_bench_sb3_returns_quick_writes_the_table_and_json(tmp_path, capsys):
    from replaybuffer.cli import main
    from replaybuffer_bench import sb3_returns

    out = tmp_path / "returns.json"
    assert main(["bench", "--sb3-returns", "--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["steps"] == 1500 and report["hyperparameters"] == sb3_returns.ZOO
    assert sorted(r["buffer"] for r in report["runs"]) == ["ours", "sb3"]
    assert all(0 < r["mean_return"] <= 500 for r in report["runs"])
    summary = report["summary"]
    low, high = summary["difference"]["ci95"]
    assert low <= summary["difference"]["ours_minus_sb3"] <= high
    assert "| seed | SB3's buffer | ours |" in capsys.readouterr().out


def test_bootstrap_interval_of_the_difference_of_means():
    from replaybuffer_bench.sb3_returns import bootstrap_difference

    same = np.array([100.0, 200.0, 300.0, 400.0])
    diff, low, high = bootstrap_difference(same, same, 2000)
    assert diff == 0 and low < 0 < high
    diff, low, high = bootstrap_difference(same + 1000, same, 2000)
    assert diff == 1000 and 0 < low <= 1000 <= high
    assert bootstrap_difference(same, same[::-1], 500, seed=3) == \
        bootstrap_difference(same, same[::-1], 500, seed=3)  # seeded


# ------------------------------------------------- returns: only the index stream differs
def cartpole_dqn(replay_buffer_class, **kwargs):
    """A short DQN on CartPole cut at 25 steps (so both terminations and truncations are
    stored and sampled), RL-Zoo's learning settings scaled down; one env, no wrap."""
    env = make_vec_env("CartPole-v1", n_envs=1, env_kwargs={"max_episode_steps": 25})
    return DQN("MlpPolicy", env, replay_buffer_class=replay_buffer_class, buffer_size=10_000,
               learning_starts=300, train_freq=64, gradient_steps=32, batch_size=64,
               target_update_interval=10, policy_kwargs={"net_arch": [32]}, device="cpu",
               seed=3, **kwargs)


def parameters_after(model, steps=1500):
    before = th.cat([p.detach().flatten() for p in model.q_net.parameters()]).clone()
    model.learn(steps)
    after = th.cat([p.detach().flatten() for p in model.q_net.parameters()])
    assert not th.equal(before, after)  # it trained
    return after.numpy()


def test_dqn_with_ours_drawing_sb3s_indices_reproduces_sb3s_run_bit_for_bit():
    """Ours made to draw SB3's indices (numpy's global generator, as SB3's sample and
    _get_samples draw) trains DQN to exactly the parameters SB3's own buffer gives: the
    stored data, dtypes, shapes, dones at terminations and truncations, next
    observations at episode ends and everything else train() sees are the same, so the
    two buffers' returns can differ only by which indices are drawn."""
    want = parameters_after(cartpole_dqn(SB3ReplayBuffer))
    model = cartpole_dqn(ReplayBuffer, replay_buffer_kwargs={"seed": 0})  # no global draw
    core = model.replay_buffer.core

    def sb3s_draws(batch_size):
        ids = np.random.randint(0, core.last_id + 1, size=batch_size)  # SB3's sample()
        np.random.randint(0, high=1, size=(batch_size,))  # SB3's _get_samples' env index
        batch = core.read_steps(ids.astype(np.int64))
        return type(batch)(*(None if f is None else f[0] for f in batch)), None

    core.sample = sb3s_draws
    got = parameters_after(model)
    np.testing.assert_array_equal(got, want)
    stored = core.all()
    assert stored.terminated.any() and stored.truncated.any()  # 138 and 5 with seed=3


def test_sb3s_buffer_drawing_ours_indices_reproduces_our_run_bit_for_bit():
    """The bench's control arm sb3-own-stream (SB3's buffer drawing its indices as ours
    does) trains exactly as ours, so its returns are ours'."""
    from replaybuffer_bench.sb3_returns import own_stream_sb3_buffer

    ours = parameters_after(cartpole_dqn(ReplayBuffer))
    np.testing.assert_array_equal(parameters_after(cartpole_dqn(own_stream_sb3_buffer())),
                                  ours)
    assert not np.array_equal(parameters_after(cartpole_dqn(SB3ReplayBuffer)), ours)


def test_summary_and_table_carry_each_control_arm():
    from replaybuffer_bench.sb3_returns import OWN_STREAM, Run, main, summary, table

    runs = [Run(arm, seed, value, 0.0, 1.0) for seed in (0, 1) for arm, value in
            (("sb3", 200.0 + seed), ("ours", 100.0 + seed), (OWN_STREAM, 100.0 + seed))]
    stats = summary(runs, 200)
    assert stats[OWN_STREAM] == {"mean": 100.5, "std": pytest.approx(0.7071, abs=1e-4)}
    assert stats["own_stream_difference"]["own_stream_minus_sb3"] == -100.0
    assert "sb3-shifted" not in stats and "control_difference" not in stats
    text = table(runs, stats)
    assert "| seed | SB3's buffer | ours | SB3's, ours' index stream |" in text
    assert "| 1 | 201.0 | 101.0 | 101.0 |" in text
    assert "SB3's, ours' index stream - SB3: -100.0" in text
    with pytest.raises(SystemExit):
        main(["--arms", "ours,sb3-own"])
