"""HERBuffer against a brute-force log of every episode; a bit-flipping goal env, single
and vectorised."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from conftest import to_np

GOAL = rb.ArraySpec((2,), np.float32)
OBS = {"observation": rb.ArraySpec((1,), np.float32), "achieved_goal": GOAL,
       "desired_goal": GOAL}
ACT = rb.BoundedArraySpec((), np.int64, 0, 3)


def distance_reward(achieved_goal, desired_goal, info):
    """A vectorised compute_reward: minus the distance to the goal."""
    return -np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)


class BitFlippingEnv(gym.Env):
    """Flip one of ``n_bits`` bits per step until the state equals the goal."""

    def __init__(self, n_bits=5, max_steps=None):
        self.n_bits, self.max_steps = n_bits, max_steps or n_bits
        bits = spaces.MultiBinary(n_bits)
        self.observation_space = spaces.Dict(observation=bits, achieved_goal=bits,
                                             desired_goal=bits)
        self.action_space = spaces.Discrete(n_bits)
        self.calls = 0

    def _obs(self):
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(),
                "desired_goal": self.goal.copy()}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        self.state[action] ^= 1
        self.steps += 1
        reward = float(self.compute_reward(self.state, self.goal, {}))
        terminated = reward == 0.0
        truncated = self.steps >= self.max_steps and not terminated
        return self._obs(), reward, terminated, truncated, {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        self.calls += 1
        return -(np.asarray(achieved_goal) != np.asarray(desired_goal)).any(-1).astype(
            np.float32)


class EpisodeLog:
    """Every transition added, per env, with its episode number: the reference model."""

    def __init__(self, num_envs):
        self.rows = [[] for _ in range(num_envs)]
        self.episode = [0] * num_envs

    def add(self, row, obs, next_obs, reward, ended):
        self.rows[row].append(dict(obs=obs, next_obs=next_obs, reward=reward,
                                   episode=self.episode[row], ended=ended))
        self.episode[row] += bool(ended)

    def find(self, row_steps, observation):
        return [i for i, s in enumerate(row_steps)
                if np.array_equal(s["obs"]["observation"], observation)]


def run_goal_episodes(buffer, log, steps, rng, p_end):
    """Add ``steps`` transitions per env with unique observations and random goals."""
    B = buffer.num_envs
    counter = iter(range(1, 10**9))

    def fresh(goals):
        return {"observation": np.array([[next(counter)] for _ in range(B)], np.float32),
                "achieved_goal": rng.normal(size=(B, 2)).astype(np.float32),
                "desired_goal": goals.copy()}
    goals = rng.normal(size=(B, 2)).astype(np.float32)
    obs = fresh(goals)
    for _ in range(steps):
        next_obs = fresh(goals)
        reward = distance_reward(next_obs["achieved_goal"], goals, {}).astype(np.float32)
        end = rng.random(B) < p_end
        terminated = end & (rng.random(B) < 0.5)
        buffer.add(obs, rng.integers(0, 4, B), reward, next_obs, terminated, end & ~terminated)
        for b in range(B):
            log.add(b, {k: v[b] for k, v in obs.items()}, {k: v[b] for k, v in next_obs.items()},
                    reward[b], end[b])
        goals = np.where(end[:, None], rng.normal(size=(B, 2)).astype(np.float32), goals)
        after = fresh(goals)  # reset observations where an episode ended
        obs = {k: np.where(end.reshape((B,) + (1,) * (v.ndim - 1)), after[k], v)
               for k, v in next_obs.items()}


@settings(max_examples=40, deadline=None)
@given(num_envs=st.integers(1, 3), per_row=st.integers(2, 10), steps=st.integers(1, 30),
       strategy=st.sampled_from(["final", "future", "episode"]),
       n_sampled_goal=st.integers(0, 4), p_end=st.sampled_from([0.1, 0.3, 0.7]),
       seed=st.integers(0, 10_000))
def test_relabelled_goals_come_from_the_episode_and_respect_the_strategy(
        num_envs, per_row, steps, strategy, n_sampled_goal, p_end, seed):
    rng = np.random.default_rng(seed)
    buffer = rb.HERBuffer(OBS, ACT, per_row * num_envs, num_envs=num_envs,
                          compute_reward=distance_reward, goal_selection_strategy=strategy,
                          n_sampled_goal=n_sampled_goal, seed=seed)
    log = EpisodeLog(num_envs)
    run_goal_episodes(buffer, log, steps, rng, p_end)
    retained = [r[-per_row:] for r in log.rows]
    complete = sum(1 for r in retained for s in r
                   if any(t["ended"] for t in r if t["episode"] == s["episode"]))
    assert buffer.completed() == complete
    if complete == 0:
        with pytest.raises(rb.EmptyBufferError, match="no completed episode"):
            buffer.sample(4)
        return
    size = 32
    batch, info = buffer.sample(size)
    k = int(size * (1 - 1 / (n_sampled_goal + 1)))
    np.testing.assert_array_equal(batch.relabelled, np.arange(size) < k)
    assert np.allclose(info.probabilities, 1 / complete)
    for s in range(size):
        observation = batch.observations["observation"][s]
        where = [(b, i) for b in range(num_envs) for i in log.find(retained[b], observation)]
        assert len(where) == 1, "sampled a transition that is not retained"
        b, i = where[0]
        step = retained[b][i]
        episode = [j for j, t in enumerate(retained[b]) if t["episode"] == step["episode"]]
        assert retained[b][episode[-1]]["ended"], "sampled an episode in progress"
        for key in ("observation", "achieved_goal"):
            np.testing.assert_array_equal(batch.next_observations[key][s],
                                          step["next_obs"][key])
        goal = batch.observations["desired_goal"][s]
        np.testing.assert_array_equal(batch.next_observations["desired_goal"][s], goal)
        if s >= k:  # plain replay
            np.testing.assert_array_equal(goal, step["obs"]["desired_goal"])
            assert batch.rewards[s] == step["reward"]
            continue
        allowed = {"final": [episode[-1]], "future": [j for j in episode if j >= i],
                   "episode": episode}[strategy]
        assert any(np.array_equal(goal, retained[b][j]["next_obs"]["achieved_goal"])
                   for j in allowed), f"{strategy} goal not from the allowed steps"
        want = distance_reward(step["next_obs"]["achieved_goal"][None], goal[None], {})[0]
        assert batch.rewards[s] == pytest.approx(want, rel=1e-5, abs=1e-6)


def collect(env, buffer, steps, seed, vector=False):
    """Drive ``env`` (single, or vector with SAME_STEP autoreset) into ``buffer``; return
    the completed episodes' final achieved goals."""
    finals = []
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, info = env.step(action)
        if not vector:
            ended = terminated or truncated
            batch = lambda x: {k: v[None] for k, v in x.items()}  # noqa: E731
            buffer.add(batch(obs), np.array([action]), np.array([reward]), batch(next_obs),
                       np.array([terminated]), np.array([truncated]))
            if ended:
                finals.append(next_obs["achieved_goal"])
            obs = env.reset()[0] if ended else next_obs
            continue
        true_next = {k: v.copy() for k, v in next_obs.items()}
        for i in np.flatnonzero(info.get("_final_obs", [])):
            for key in true_next:
                true_next[key][i] = info["final_obs"][i][key]
            finals.append(info["final_obs"][i]["achieved_goal"])
        buffer.add(obs, action, reward, true_next, terminated, truncated)
        obs = next_obs
    return finals


@pytest.mark.parametrize("vector", [False, True])
def test_bit_flipping_env_single_and_vector(vector):
    if vector:
        env = gym.vector.SyncVectorEnv([lambda: BitFlippingEnv(6)] * 3,
                                       autoreset_mode=AutoresetMode.SAME_STEP)
        reward_env = env.envs[0]
    else:
        env = reward_env = BitFlippingEnv(6)
    env.action_space.seed(0)
    buffer = rb.HERBuffer.from_env(env, 120, goal_selection_strategy="final",
                                   n_sampled_goal=4, seed=0)
    assert buffer.num_envs == (3 if vector else 1)
    finals = collect(env, buffer, 40, seed=0, vector=vector)
    calls = reward_env.calls
    batch, _ = buffer.sample(50)
    assert reward_env.calls == calls + 1  # one vectorised call per sample
    k = 40  # int(50 * 0.8)
    goals = batch.observations["desired_goal"]
    for goal in goals[:k]:
        assert any(np.array_equal(goal, f) for f in finals)
    want = reward_env.compute_reward(batch.next_observations["achieved_goal"][:k],
                                     goals[:k], {})
    np.testing.assert_array_equal(batch.rewards[:k], want)
    np.testing.assert_array_equal(batch.next_observations["desired_goal"], goals)


def test_construction_errors_and_sampling_before_an_episode_ends():
    with pytest.raises(ValueError, match="unknown goal_selection_strategy"):
        rb.HERBuffer(OBS, ACT, 10, compute_reward=distance_reward,
                     goal_selection_strategy="random")
    with pytest.raises(ValueError, match="n_sampled_goal"):
        rb.HERBuffer(OBS, ACT, 10, n_sampled_goal=-1)
    with pytest.raises(rb.SpecError, match="dict observation with keys"):
        rb.HERBuffer(rb.ArraySpec((3,), np.float32), ACT, 10)
    with pytest.raises(rb.SpecError, match="one shape and dtype"):
        rb.HERBuffer({**OBS, "desired_goal": rb.ArraySpec((3,), np.float32)}, ACT, 10)
    with pytest.raises(ValueError, match="compute_reward"):
        rb.HERBuffer.from_env(gym.make("CartPole-v1"), 10)
    buffer = rb.HERBuffer(OBS, ACT, 10, compute_reward=distance_reward,
                          goal_selection_strategy="EPISODE")
    assert buffer.goal_selection_strategy == "episode"
    with pytest.raises(rb.EmptyBufferError, match="is empty"):
        buffer.sample(2)
    log = EpisodeLog(1)
    run_goal_episodes(buffer, log, 3, np.random.default_rng(0), p_end=0.0)
    with pytest.raises(rb.EmptyBufferError, match="no completed episode"):
        buffer.sample(2)
    with pytest.raises(rb.EmptyBufferError, match="completed episodes"):
        buffer.last_completed(1)
    obs = {k: v[None] for k, v in log.rows[0][0]["obs"].items()}
    with pytest.raises(rb.SpecError, match="desired_goal"):  # bad input changes nothing
        buffer.add({**obs, "desired_goal": np.zeros((1, 3), np.float32)}, np.array([0]),
                   np.zeros(1), obs, np.zeros(1, bool))
    with pytest.raises(rb.SpecError, match="structure"):
        buffer.add(obs["observation"], np.array([0]), np.zeros(1), obs, np.zeros(1, bool))
    assert len(buffer) == 3


def test_many_episodes_after_clear_and_save_load(tmp_path):
    """Pearl's reset made its bookkeeping int8; ours stays int64 past 127 episodes."""
    buffer = rb.HERBuffer(OBS, ACT, 400, compute_reward=distance_reward,
                          goal_selection_strategy="final", seed=1)
    rng = np.random.default_rng(1)
    run_goal_episodes(buffer, EpisodeLog(1), 50, rng, p_end=0.5)
    buffer.clear()
    log = EpisodeLog(1)
    run_goal_episodes(buffer, log, 300, rng, p_end=1.0)  # 300 one-step episodes
    batch, _ = buffer.sample(64)
    # A one-step episode's final goal is the transition's own next achieved goal.
    np.testing.assert_array_equal(batch.observations["desired_goal"][:51],
                                  batch.next_observations["achieved_goal"][:51])
    buffer.save(tmp_path / "h")
    again = rb.load(tmp_path / "h")
    again.compute_reward = distance_reward  # functions are not saved
    a, ia = buffer.sample(16)
    b, ib = again.sample(16)
    np.testing.assert_array_equal(ia.ids, ib.ids)
    np.testing.assert_array_equal(a.observations["desired_goal"],
                                  b.observations["desired_goal"])
    assert again.goal_selection_strategy == "final"


def test_torch_storage():
    buffer = rb.HERBuffer(OBS, ACT, 40, num_envs=2, compute_reward=distance_reward,
                          storage="torch", seed=0)
    run_goal_episodes(buffer, EpisodeLog(2), 20, np.random.default_rng(0), p_end=0.3)
    batch, info = buffer.sample(10)
    assert type(batch.rewards).__name__ == "Tensor"
    assert type(batch.observations["desired_goal"]).__name__ == "Tensor"
    want = distance_reward(to_np(batch.next_observations["achieved_goal"])[:8],
                           to_np(batch.observations["desired_goal"])[:8], {})
    np.testing.assert_allclose(to_np(batch.rewards)[:8], want, rtol=1e-6)


def test_an_unreported_reset_ends_the_episode_and_end_episodes_ends_the_rest():
    """Row 0 jumps from observation 3 to 10 with no end reported (an SB3 learn() call
    resets its env): steps 0-1 form a completed episode whose goals stay inside it."""
    def obs(values):
        v = np.asarray(values, np.float32)[:, None]
        return {"observation": v, "achieved_goal": np.repeat(v, 2, 1),
                "desired_goal": np.zeros((2, 2), np.float32)}

    buffer = rb.HERBuffer(OBS, ACT, 40, num_envs=2, compute_reward=distance_reward,
                          goal_selection_strategy="future", n_sampled_goal=4, seed=0)
    stream = [((1, 101), (2, 102)), ((2, 102), (3, 103)), ((10, 103), (11, 104)),
              ((11, 104), (12, 105))]
    no = np.zeros(2, bool)
    for o, n in stream:
        buffer.add(obs(o), np.zeros(2, np.int64), np.zeros(2), obs(n), no, no)
    assert buffer.completed() == 2
    batch, _ = buffer.sample(200)
    assert set(batch.observations["observation"][:, 0].tolist()) == {1.0, 2.0}
    k = int(200 * 0.8)
    goals = set(batch.observations["desired_goal"][:k, 0].tolist())
    assert goals <= {2.0, 3.0} and len(goals) == 2  # never 11 or 12: those are later
    following = batch.next_observations["observation"][:, 0] - batch.observations[
        "observation"][:, 0]
    np.testing.assert_array_equal(following, 1.0)  # step 1's next observation is exact
    assert not batch.terminated.any() and not batch.truncated.any()
    assert buffer.end_episodes() == 2
    assert buffer.completed() == 8 and buffer.end_episodes() == 0
    batch, _ = buffer.sample(400)
    seen = batch.observations["observation"][:, 0]
    assert set(seen.tolist()) == {1.0, 2.0, 10.0, 11.0, 101.0, 102.0, 103.0, 104.0}
    goals = batch.observations["desired_goal"][:int(400 * 0.8), 0]
    later = {1.0: {2, 3}, 2.0: {3}, 10.0: {11, 12}, 11.0: {12}, 101.0: {102, 103, 104, 105},
             102.0: {103, 104, 105}, 103.0: {104, 105}, 104.0: {105}}
    for o, g in zip(seen[:len(goals)], goals):
        assert g in later[o], (o, g)


@settings(max_examples=40, deadline=None)
@given(num_envs=st.integers(1, 3), per_row=st.integers(2, 8), steps=st.integers(1, 40),
       p_end=st.sampled_from([0.0, 0.1, 0.4]), p_jump=st.sampled_from([0.0, 0.2]),
       p_cast=st.sampled_from([0.0, 0.2]), storage=st.sampled_from(["numpy", "torch"]),
       strategy=st.sampled_from(["final", "future", "episode"]), seed=st.integers(0, 10_000))
def test_add_shortcut_stores_and_samples_what_the_general_path_does(
        num_envs, per_row, steps, p_end, p_jump, p_cast, storage, strategy, seed):
    """HER's adds of the usual step (dict observation following on, episode ends
    included) take the shortcut; a twin that never takes it must hold the same bytes,
    side observations and episode bookkeeping, and draw the same samples, through
    wrap-around, unreported resets and inputs the shortcut leaves to the general path."""
    rng = np.random.default_rng(seed)
    B = num_envs
    kw = dict(num_envs=B, compute_reward=distance_reward, goal_selection_strategy=strategy,
              n_sampled_goal=2, seed=seed, storage=storage)
    fast, slow = rb.HERBuffer(OBS, ACT, per_row * B, **kw), rb.HERBuffer(OBS, ACT, per_row * B, **kw)
    slow._exact_add = False
    assert fast._exact_add
    taken = []
    shortcut = fast._add_exact

    def spy(*args):
        taken.append((shortcut(*args), bool(np.any(args[3]) or np.any(args[4]))))
        return taken[-1][0]
    fast._add_exact = spy

    def fresh():
        return {"observation": rng.normal(size=(B, 1)).astype(np.float32),
                "achieved_goal": rng.normal(size=(B, 2)).astype(np.float32),
                "desired_goal": rng.normal(size=(B, 2)).astype(np.float32)}
    obs = fresh()
    for _ in range(steps):
        nxt = fresh()
        end = rng.random(B) < p_end
        terminated = end & (rng.random(B) < 0.5)
        action = rng.integers(0, 4, B)
        reward = rng.normal(size=B).astype(np.float32)
        given = obs
        if rng.random() < p_cast:  # float64: the general path casts it
            given = {k: v.astype(np.float64) for k, v in obs.items()}
        for buffer in (fast, slow):
            buffer.add(given, action, reward, nxt, terminated, end & ~terminated)
        jump = end | (rng.random(B) < p_jump)
        after = fresh()
        obs = {k: np.where(jump[:, None], after[k], v) for k, v in nxt.items()}

    if p_cast == 0.0 and p_jump == 0.0:
        # Every add takes the shortcut, episode ends included, but the one after an
        # end (where a row starts anew: it does not follow on).
        ended_before = [False] + [e for _, e in taken[:-1]]
        assert [t for t, _ in taken] == [not e for e in ended_before]
    positions = np.arange(fast._ring.capacity)
    for got, want in zip(fast._storage.gather(positions), slow._storage.gather(positions)):
        assert to_np(got).tobytes() == to_np(want).tobytes()
    for name in ("_side_ref", "_episode_start", "_episode_end", "_current_start"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)
    for got, want in zip(fast._head_next, slow._head_next):
        assert got.tobytes() == want.tobytes()
    owned = fast._side_ref[fast._side_ref >= 0]
    assert len(fast._side) == len(slow._side) == len(owned)
    for got, want in zip(fast._side.take(owned), slow._side.take(owned)):
        assert got.tobytes() == want.tobytes()
    assert fast._ring.last_id == slow._ring.last_id
    assert fast.completed() == slow.completed()
    if fast.completed():
        (a, a_info), (b, b_info) = fast.sample(32), slow.sample(32)
        assert_same = lambda x, y: to_np(x).tobytes() == to_np(y).tobytes()  # noqa: E731
        for field in a._fields:
            x, y = getattr(a, field), getattr(b, field)
            if isinstance(x, dict):
                assert all(assert_same(x[k], y[k]) for k in x), field
            else:
                assert assert_same(x, y), field
        assert assert_same(a_info.ids, b_info.ids)
