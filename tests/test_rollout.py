"""RolloutBuffer: GAE against a hand-computed example and a plain reference loop,
minibatch epochs, bad input, a real vector env with time limits."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from conftest import to_np

OBS = rb.ArraySpec((1,), np.float32)
ACT = rb.BoundedArraySpec((), np.int64, 0, 3)


def value_of(obs):
    """The value function of the tests: V(o) = o[0] / 10 (any deterministic one does)."""
    return to_np(obs)[:, 0] / 10.0


def test_gae_by_hand():
    # One env, gamma = lambda = 0.5, values 1..4, rewards 1. Step 1 is truncated with
    # final observation 100 (V = 10), step 2 terminates, step 3 is the rollout's end with
    # last_values 6. Backwards:
    #   t3: delta = 1 + .5 * 6 - 4 = 0                      A3 = 0
    #   t2: delta = 1 + 0 - 3 = -2 (terminated)              A2 = -2
    #   t1: delta = 1 + .5 * 10 - 2 = 4 (truncated: V(final)) A1 = 4 (the trace stops)
    #   t0: delta = 1 + .5 * 2 - 1 = 1                      A0 = 1 + .25 * 4 = 2
    # returns = A + V = [3, 6, 1, 4].
    buffer = rb.RolloutBuffer(OBS, ACT, 8)
    steps = [  # obs, next_obs, terminated, truncated, value
        (0.0, 1.0, False, False, 1.0),
        (1.0, 100.0, False, True, 2.0),
        (20.0, 21.0, True, False, 3.0),
        (30.0, 31.0, False, False, 4.0)]
    for obs, next_obs, term, trunc, value in steps:
        buffer.add(np.array([[obs]], np.float32), np.array([1]), np.array([1.0]),
                   np.array([[next_obs]], np.float32), np.array([term]), np.array([trunc]),
                   value=value, log_prob=-0.5)
    returns, advantages = buffer.compute_returns_and_advantages(
        [6.0], gamma=0.5, gae_lambda=0.5, value_fn=value_of)
    np.testing.assert_allclose(advantages, [2, 4, -2, 0])
    np.testing.assert_allclose(returns, [3, 6, 1, 4])
    everything = buffer.all()
    np.testing.assert_allclose(everything.advantages, [2, 4, -2, 0])
    np.testing.assert_allclose(everything.next_observations[:, 0], [1, 100, 21, 31])
    with pytest.raises(ValueError, match="pass value_fn"):
        buffer.compute_returns_and_advantages([6.0], 0.5, 0.5)


def reference_gae(rows, last_values, gamma, lam):
    """Plain per-env loop over the logged steps: (returns, advantages) lists."""
    out_returns, out_advantages = [], []
    for b, steps in enumerate(rows):
        T = len(steps)
        advantages = [0.0] * T
        gae = 0.0
        for t in reversed(range(T)):
            obs, reward, next_obs, term, trunc, value = steps[t]
            follows = t + 1 < T and np.array_equal(next_obs, steps[t + 1][0])
            if term:
                next_value = 0.0
            elif trunc or (t + 1 < T and not follows):
                next_value = float(next_obs[0]) / 10.0  # V(true next observation)
            elif t + 1 == T:
                next_value = last_values[b]
            else:
                next_value = steps[t + 1][5]
            delta = reward + gamma * next_value - value
            goes_on = follows and not (term or trunc)
            gae = delta + gamma * lam * gae if goes_on else delta
            advantages[t] = gae
        out_advantages.append(advantages)
        out_returns.append([a + s[5] for a, s in zip(advantages, steps)])
    return np.array(out_returns), np.array(out_advantages)


@settings(max_examples=40, deadline=None)
@given(num_envs=st.integers(1, 3), per_row=st.integers(1, 8), steps=st.integers(1, 14),
       gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]), lam=st.sampled_from([0.0, 0.7, 1.0]),
       seed=st.integers(0, 10_000))
def test_gae_matches_a_reference_loop(num_envs, per_row, steps, gamma, lam, seed):
    rng = np.random.default_rng(seed)
    buffer = rb.RolloutBuffer(OBS, ACT, per_row * num_envs, num_envs=num_envs, seed=seed)
    rows = [[] for _ in range(num_envs)]
    obs = rng.normal(size=(num_envs, 1)).astype(np.float32)
    for _ in range(steps):
        reward = rng.normal(size=num_envs).astype(np.float32)
        value = rng.normal(size=num_envs).astype(np.float32)
        next_obs = rng.normal(size=(num_envs, 1)).astype(np.float32)
        end = rng.random(num_envs) < 0.3
        term = end & (rng.random(num_envs) < 0.5)
        trunc = end & ~term
        buffer.add(obs, rng.integers(0, 4, num_envs), reward, next_obs, term, trunc,
                   value=value, log_prob=np.zeros(num_envs))
        for b in range(num_envs):
            rows[b].append((obs[b].copy(), float(reward[b]), next_obs[b].copy(),
                            bool(term[b]), bool(trunc[b]), float(value[b])))
        obs = np.where(end[:, None], rng.normal(size=(num_envs, 1)).astype(np.float32),
                       next_obs)
        if rng.random() < 0.1:  # an out-of-sequence add: bootstraps from its own next obs
            obs = rng.normal(size=(num_envs, 1)).astype(np.float32)
    last_values = rng.normal(size=num_envs).tolist()
    returns, advantages = buffer.compute_returns_and_advantages(last_values, gamma, lam,
                                                                value_fn=value_of)
    held = min(steps, per_row)
    want_r, want_a = reference_gae([r[-held:] for r in rows], last_values, gamma, lam)
    if num_envs == 1:
        want_r, want_a = want_r[0], want_a[0]
    np.testing.assert_allclose(advantages, want_a, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(returns, want_r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("storage", ["numpy", "torch"])
def test_minibatches_cover_every_transition_once_per_epoch(storage):
    num_envs, T = 3, 10
    buffer = rb.RolloutBuffer(OBS, ACT, num_envs * T, num_envs=num_envs, storage=storage,
                              seed=0)
    for t in range(T):
        obs = (np.arange(num_envs) * 100 + t).astype(np.float32)[:, None]
        buffer.add(obs, np.full(num_envs, t % 4), np.ones(num_envs), obs + 1,
                   np.zeros(num_envs, bool), value=obs[:, 0], log_prob=-obs[:, 0])
    with pytest.raises(ValueError, match="compute_returns_and_advantages"):
        buffer.minibatches(8)
    buffer.compute_returns_and_advantages(np.zeros(num_envs), 0.9, 0.95)
    orders = []
    for epoch_batches in _epochs(buffer.minibatches(8, epochs=3, seed=1), 30):
        seen = np.concatenate([to_np(b.observations)[:, 0] for b in epoch_batches])
        assert sorted(seen.tolist()) == sorted(float(100 * e + t) for e in range(num_envs)
                                               for t in range(T))
        assert [len(to_np(b.rewards)) for b in epoch_batches] == [8, 8, 8, 6]
        for b in epoch_batches:  # fields stay aligned
            np.testing.assert_array_equal(to_np(b.values), to_np(b.observations)[:, 0])
            np.testing.assert_array_equal(to_np(b.log_probs), -to_np(b.observations)[:, 0])
            assert to_np(b.advantages).shape == (len(to_np(b.rewards)),)
        orders.append(seen)
    assert not np.array_equal(orders[0], orders[1])  # reshuffled each epoch
    batch = next(iter(buffer.minibatches(8)))
    assert type(batch.returns).__name__ == ("Tensor" if storage == "torch" else "ndarray")
    ordered = list(buffer.minibatches(7, shuffle=False, drop_last=True))
    assert len(ordered) == 4  # 30 // 7
    np.testing.assert_array_equal(to_np(ordered[0].observations)[:3, 0], [0, 100, 200])
    iterator = buffer.minibatches(8)
    next(iterator)
    buffer.reset()  # the buffer changed under the iterator
    with pytest.raises(RuntimeError, match="changed"):
        next(iterator)
    assert len(buffer) == 0


def _epochs(batches, per_epoch):
    """Group minibatches into epochs of ``per_epoch`` transitions."""
    current, count = [], 0
    for b in batches:
        current.append(b)
        count += len(to_np(b.rewards))
        if count == per_epoch:
            yield current
            current, count = [], 0


def test_bad_input_and_empty():
    buffer = rb.RolloutBuffer(OBS, ACT, 8, num_envs=2)
    with pytest.raises(rb.EmptyBufferError, match="is empty"):
        buffer.compute_returns_and_advantages([0, 0])
    with pytest.raises(rb.EmptyBufferError, match="is empty"):
        buffer.sample(1)
    good = dict(observation=np.zeros((2, 1), np.float32), action=np.array([0, 1]),
                reward=np.zeros(2), next_observation=np.ones((2, 1), np.float32),
                terminated=np.zeros(2, bool), truncated=np.zeros(2, bool),
                value=np.zeros((2, 1)), log_prob=np.zeros(2))
    buffer.add(**good)
    cases = [(dict(value=np.zeros(3)), r"\['value'\]: expected 2 numbers"),
             (dict(log_prob=np.zeros((2, 2))), r"\['log_prob'\]: expected 2 numbers"),
             (dict(action=np.array([0, 9])), r"\['action'\] has values outside"),
             (dict(action=np.zeros(3, np.int64)), r"leaf \['action'\]: expected shape \(2,\)"),
             (dict(observation=np.zeros((1, 1), np.float32)), r"\['observation'\]")]
    for change, pattern in cases:
        with pytest.raises(rb.SpecError, match=pattern):
            buffer.add(**{**good, **change})
    assert len(buffer) == 2
    with pytest.raises(ValueError, match="gamma"):
        buffer.compute_returns_and_advantages([0, 0], gamma=1.5)
    with pytest.raises(rb.SpecError, match="expected 2 numbers"):
        buffer.compute_returns_and_advantages([0, 0, 0])
    with pytest.raises(rb.EmptyBufferError, match="more transitions"):
        buffer.last(2)


def test_save_and_load_keep_advantages(tmp_path):
    buffer = rb.RolloutBuffer(OBS, ACT, 6, num_envs=2, seed=3)
    for t in range(4):
        obs = np.full((2, 1), t, np.float32)
        buffer.add(obs, np.array([0, 1]), np.ones(2), obs + 1, np.array([False, t == 2]),
                   value=np.ones(2))
    buffer.compute_returns_and_advantages([0.5, 0.5], 0.9, 0.9)
    buffer.save(tmp_path / "r")
    again = rb.load(tmp_path / "r")
    assert isinstance(again, rb.RolloutBuffer)
    np.testing.assert_array_equal(again.all().advantages, buffer.all().advantages)
    np.testing.assert_array_equal(again.all().actions, buffer.all().actions)


def test_a_vector_env_with_time_limits():
    """gymnasium's SAME_STEP autoreset: final observations come in info; truncated steps
    bootstrap from them."""
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                       wrappers=[lambda e: gym.wrappers.TimeLimit(e.unwrapped, 6)])
    buffer = rb.RolloutBuffer.from_env(env, 2 * 16, seed=0)
    obs, _ = env.reset(seed=0)
    finals = []
    for _ in range(16):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, info = env.step(action)
        true_next = next_obs.copy()
        if "_final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                true_next[i] = info["final_obs"][i]
                finals.append(info["final_obs"][i])
        buffer.add(obs, action, reward, true_next, terminated, truncated,
                   value=np.zeros(2), log_prob=np.zeros(2))
        obs = next_obs
    assert finals
    called = []

    def value_fn(observations):
        called.append(len(observations))
        return np.ones(len(observations))
    buffer.compute_returns_and_advantages(np.zeros(2), 0.99, 0.95, value_fn=value_fn)
    everything = buffer.all()
    ended = everything.truncated | everything.terminated
    assert called == [int(everything.truncated.sum())]  # one call, truncated steps only
    for f in finals:
        assert any(np.array_equal(f, n) for n in everything.next_observations[ended])


@settings(max_examples=40, deadline=None)
@given(num_envs=st.integers(1, 3), per_row=st.integers(1, 6), steps=st.integers(1, 16),
       p_end=st.sampled_from([0.0, 0.3]), p_jump=st.sampled_from([0.0, 0.4]),
       storage=st.sampled_from(["numpy", "torch"]), tensors=st.booleans(),
       seed=st.integers(0, 1000))
def test_add_shortcut_stores_what_the_general_path_stores(num_envs, per_row, steps, p_end,
                                                          p_jump, storage, tensors, seed):
    """Adds of the usual step take a shortcut straight to the fused writer; a twin
    buffer that never takes it must hold, read and compute the same, with episode ends
    and out-of-sequence adds (which leave the shortcut) mixed in."""
    import torch

    rng = np.random.default_rng(seed)
    B = num_envs
    fast = rb.RolloutBuffer(OBS, ACT, per_row * B, num_envs=B, storage=storage, seed=seed)
    slow = rb.RolloutBuffer(OBS, ACT, per_row * B, num_envs=B, storage=storage, seed=seed)
    slow._exact_add = False
    assert fast._exact_add
    taken = []
    shortcut = fast._add_exact
    fast._add_exact = lambda *args: taken.append(shortcut(*args)) or taken[-1]
    obs = rng.normal(size=(B, 1)).astype(np.float32)
    for _ in range(steps):
        nxt = rng.normal(size=(B, 1)).astype(np.float32)
        end = rng.random(B) < p_end
        term, trunc = end & (rng.random(B) < 0.5), end & (rng.random(B) >= 0.5)
        action = rng.integers(0, 4, B)
        reward = rng.normal(size=B).astype(np.float32)
        value = rng.normal(size=(B, 1)).astype(np.float32)
        log_prob = rng.normal(size=B).astype(np.float32)
        if tensors:  # a critic's outputs
            value, log_prob = torch.from_numpy(value), torch.from_numpy(log_prob)
        for buffer in (fast, slow):
            buffer.add(obs, action, reward, nxt, term, trunc, value=value, log_prob=log_prob)
        jump = end | (rng.random(B) < p_jump)
        obs = np.where(jump[:, None], rng.normal(size=(B, 1)).astype(np.float32), nxt)
    if p_end == 0.0 and p_jump == 0.0 and steps > 1:
        assert any(taken)
    a, b = fast.all(), slow.all()
    for field in a._fields:
        x, y = getattr(a, field), getattr(b, field)
        if x is None:
            assert y is None
            continue
        np.testing.assert_array_equal(to_np(x), to_np(y), err_msg=field)
    np.testing.assert_array_equal(fast._side_ref, slow._side_ref)
    last = rng.normal(size=B).astype(np.float32)
    for got, want in zip(fast.compute_returns_and_advantages(last, 0.9, 0.8, value_of),
                         slow.compute_returns_and_advantages(last, 0.9, 0.8, value_of)):
        np.testing.assert_array_equal(to_np(got), to_np(want))
    assert fast._version == slow._version and fast._gae_ready and slow._gae_ready
