"""TransitionReplayBuffer against a brute-force log of every transition added."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from conftest import to_np
from replaybuffer import nest

OBS = rb.ArraySpec((2,), np.float32)
ACT = rb.BoundedArraySpec((), np.int64, 0, 3)
BOX = rb.ArraySpec((2,), np.float32)  # a continuous action


class Log:
    """Every transition added, per env, in order: the reference model."""

    def __init__(self, num_envs):
        self.rows = [[] for _ in range(num_envs)]

    def add(self, row, obs, action, reward, next_obs, terminated, truncated):
        self.rows[row].append((obs.copy(), action, reward, next_obs.copy(), terminated,
                               truncated))

    def retained(self, row, per_row):
        return self.rows[row][-per_row:]

    def n_step(self, row, index, n, gamma):
        """(return, next_obs, terminated, truncated, discount) of transition ``index``."""
        steps = self.rows[row]
        total, k = 0.0, 0
        while True:
            obs, action, reward, next_obs, term, trunc = steps[index + k]
            total += gamma ** k * reward
            k += 1
            follows = index + k < len(steps) and np.array_equal(steps[index + k][0], next_obs)
            if term or trunc or k == n or not follows:  # not follows: end of log, or a jump
                discount = 0.0 if term else gamma ** k
                return total, next_obs, term, trunc, discount


def run_episodes(buffer, log, steps, rng, p_end=0.2, contiguous=True):
    """Add ``steps`` transitions per env: episodes that end by termination or truncation,
    with fresh (reset) observations after each end; sometimes out of sequence."""
    B = buffer.num_envs
    obs = rng.normal(size=(B, 2)).astype(np.float32)
    for _ in range(steps):
        action = rng.integers(0, 4, B)
        reward = rng.normal(size=B).astype(np.float32)
        next_obs = rng.normal(size=(B, 2)).astype(np.float32)
        end = rng.random(B) < p_end
        terminated = end & (rng.random(B) < 0.5)
        truncated = end & ~terminated
        buffer.add(obs, action, reward, next_obs, terminated, truncated)
        for b in range(B):
            log.add(b, obs[b], action[b], reward[b], next_obs[b], terminated[b], truncated[b])
        obs = np.where(end[:, None], rng.normal(size=(B, 2)).astype(np.float32), next_obs)
        if not contiguous and rng.random() < 0.2:  # an out-of-sequence add
            obs = rng.normal(size=(B, 2)).astype(np.float32)


def check_sample(buffer, log, batch, info, n, gamma):
    per_row = buffer.max_length
    ids = to_np(info.ids)
    obs = to_np(batch.observations)
    for k in range(len(ids)):
        # Find the transition by its observation (unique random floats) in the retained log.
        matches = [(b, i) for b in range(buffer.num_envs)
                   for i, t in enumerate(log.rows[b])
                   if i >= len(log.rows[b]) - per_row and np.array_equal(t[0], obs[k])]
        assert len(matches) == 1, "sampled an observation that is not retained"
        b, i = matches[0]
        ret, next_obs, term, trunc, discount = log.n_step(b, i, n, gamma)
        np.testing.assert_array_equal(to_np(batch.next_observations)[k], next_obs)
        assert to_np(batch.rewards)[k] == pytest.approx(ret, rel=1e-5, abs=1e-5)
        assert bool(to_np(batch.terminated)[k]) == term
        assert bool(to_np(batch.truncated)[k]) == trunc
        assert to_np(batch.discounts)[k] == pytest.approx(discount, rel=1e-6)
        assert to_np(batch.actions)[k] == log.rows[b][i][1]


@settings(max_examples=40, deadline=None)
@given(num_envs=st.integers(1, 3), per_row=st.integers(2, 8), steps=st.integers(1, 25),
       n=st.integers(1, 4), contiguous=st.booleans(), seed=st.integers(0, 1000))
def test_samples_match_the_log(num_envs, per_row, steps, n, contiguous, seed):
    rng = np.random.default_rng(seed)
    buffer = rb.TransitionReplayBuffer(OBS, ACT, per_row * num_envs, num_envs=num_envs,
                                       n_step=n, gamma=0.9, seed=seed)
    log = Log(num_envs)
    run_episodes(buffer, log, steps, rng, contiguous=contiguous)
    batch, info = buffer.sample(32)
    check_sample(buffer, log, batch, info, n, 0.9)
    everything = buffer.all()
    held = min(steps, per_row)
    assert to_np(everything.rewards).shape == ((held,) if num_envs == 1 else (num_envs, held))


def test_true_final_observations_with_torch_storage_and_a_real_env():
    env = gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=8)
    buffer = rb.TransitionReplayBuffer.from_env(env, 40, storage="torch", seed=0)
    log = Log(1)
    obs, _ = env.reset(seed=0)
    for _ in range(60):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add(obs[None], np.array([action]), np.array([reward]), next_obs[None],
                   np.array([terminated]), np.array([truncated]))
        log.add(0, obs, action, reward, next_obs, terminated, truncated)
        obs = env.reset()[0] if terminated or truncated else next_obs
    batch, info = buffer.sample(64)
    assert batch.observations.__class__.__name__ == "Tensor"
    check_sample(buffer, log, batch, info, 1, 0.99)
    assert to_np(batch.truncated).any()  # time limits were sampled, with true final obs


def test_last_and_all_shapes_with_vector_envs():  # Pearl item 42
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    buffer = rb.TransitionReplayBuffer.from_env(env, 20)
    obs, _ = env.reset(seed=0)
    for _ in range(10):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add(obs, action, reward, next_obs, terminated, truncated)
        obs = next_obs
    last = buffer.last(5)
    assert last.observations.shape == (2, 5, 4) and last.actions.shape == (2, 5)
    assert last.next_observations.shape == (2, 5, 4) and last.rewards.shape == (2, 5)
    np.testing.assert_array_equal(last.observations[:, 1:], last.next_observations[:, :-1])


@pytest.mark.parametrize("kind", ["TransitionReplayBuffer", "RolloutBuffer"])
def test_from_env_refuses_a_vector_env_with_next_step_autoreset(kind):
    """gymnasium's default autoreset makes the step after an episode's end a reset with
    no transition, which add (every env at once) cannot leave out: refused by name,
    with the mode that works; that mode is taken."""
    make = getattr(rb, kind).from_env
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(ValueError, match=rf"{kind}.from_env: the vector env resets with "
                                         r"autoreset_mode NEXT_STEP .*AutoresetMode.SAME_STEP"):
        make(env, 20)
    same_step = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                             vector_kwargs={"autoreset_mode":
                                            gym.vector.AutoresetMode.SAME_STEP})
    assert make(same_step, 20).num_envs == 2
    assert rb.TransitionReplayBuffer.from_env(gym.make("CartPole-v1"), 20).num_envs == 1


def test_bad_input_is_refused_and_changes_nothing():
    buffer = rb.TransitionReplayBuffer(OBS, ACT, 10, num_envs=2)
    good = dict(observation=np.zeros((2, 2), np.float32), action=np.zeros(2, np.int64),
                reward=np.zeros(2), next_observation=np.ones((2, 2), np.float32),
                terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    buffer.add(**good)
    cases = [
        (dict(observation=np.zeros((3, 2), np.float32)), r"\['observation'\]: expected shape \(2, 2\)"),
        (dict(action=np.array([0, 7])), r"\['action'\] has values outside its space \[0, 3\]"),
        (dict(action=np.array([0.5, 1.0])), r"\['action'\]: expected dtype int64"),
        (dict(next_observation=np.zeros((2, 3), np.float32)),
         r"\['next_observation'\]: expected shape \(2, 2\)"),
        (dict(reward=np.zeros(1)), r"\['reward'\]: expected shape \(2,\)"),
    ]
    for change, pattern in cases:
        with pytest.raises(rb.SpecError, match=pattern):
            buffer.add(**{**good, **change})
    assert buffer.num_frames() == 2
    with pytest.raises(rb.EmptyBufferError, match="more transitions than each env holds"):
        buffer.last(2)
    with pytest.raises(rb.EmptyBufferError, match="is empty"):
        rb.TransitionReplayBuffer(OBS, ACT, 4).sample(1)
    with pytest.raises(TypeError, match="add\\(observation"):
        buffer.add_batch({})


def test_memory_is_computed_up_front(monkeypatch):
    from replaybuffer.storage import memory

    assert memory.available_memory() > 0  # read from this machine
    monkeypatch.setattr(memory, "available_memory", lambda: 1 << 20)  # pretend 1 MiB is free
    big = rb.ArraySpec((256,), np.float32)  # 1 KiB per observation, 2 MiB for 2048
    with pytest.raises(memory.InsufficientMemoryError, match=r"needs 0.00.* GiB but only"):
        rb.TransitionReplayBuffer(big, ACT, 2048, memory="strict")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rb.TransitionReplayBuffer(big, ACT, 2048)  # allowed (pages are touched lazily)
    assert any("of memory is available" in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.TransitionReplayBuffer(big, ACT, 128)  # fits: no warning


def test_side_store_stays_small_and_save_load(tmp_path):
    rng = np.random.default_rng(1)
    buffer = rb.TransitionReplayBuffer(OBS, ACT, 30, n_step=3, gamma=0.5, seed=4)
    log = Log(1)
    run_episodes(buffer, log, 200, rng, p_end=0.1)
    assert len(buffer._side) <= 30  # only retained episode ends
    buffer.save(tmp_path / "t")
    again = rb.load(tmp_path / "t")
    a, ia = buffer.sample(16)
    b, ib = again.sample(16)
    np.testing.assert_array_equal(ia.ids, ib.ids)
    np.testing.assert_array_equal(a.next_observations, b.next_observations)
    check_sample(again, log, b, ib, 3, 0.5)


def test_prioritized_transitions():
    rng = np.random.default_rng(2)
    buffer = rb.PrioritizedTransitionReplayBuffer(OBS, ACT, 20, num_envs=2, seed=0)
    log = Log(2)
    run_episodes(buffer, log, 10, rng)
    batch, info = buffer.sample(64)
    assert info.weights is not None
    check_sample(buffer, log, batch, info, 1, 0.99)
    assert buffer.update_priorities(info.ids, np.full(64, 2.0)) == 64


def test_n_step_returns_stop_at_out_of_sequence_adds():
    buffer = rb.TransitionReplayBuffer(rb.ArraySpec((), np.float32), ACT, 10, n_step=3, gamma=0.5)

    def add(obs, reward, next_obs):
        buffer.add(np.float32([obs]), np.zeros(1, np.int64), np.float32([reward]),
                   np.float32([next_obs]), np.zeros(1, bool))
    add(0, 1, 1)
    add(1, 1, 2)
    add(10, 100, 11)  # does not follow on from next_obs=2
    add(11, 100, 12)
    last = buffer.last(4)
    np.testing.assert_array_equal(last.next_observations, [2, 2, 12, 12])
    np.testing.assert_allclose(last.rewards, [1.5, 1, 150, 100])
    np.testing.assert_allclose(last.discounts, [0.25, 0.5, 0.25, 0.5])


# ------------------------------------------- one-step transitions: the fast paths pinned
# Few values, so that observations repeat by chance; -0.0 and 0.0 are equal but differ in
# their bytes (a next observation read from the following step must be the very one
# added), and NaN is not equal to itself but has the same bytes.
FEW = np.array([0.0, -0.0, 1.5, np.nan], np.float32)
SPLIT_SPEC = {"a": rb.ArraySpec((2,), np.float32), "b": rb.ArraySpec((), np.float32)}


def as_obs(values, split, dtype):
    """Observations ``[B, 3]`` as given to add: one array, or a dict of two leaves."""
    values = values.astype(dtype)
    return {"a": values[:, :2], "b": values[:, 2]} if split else values


def obs_leaves(obs):
    """The leaves ``[..., 3]`` of an observation nest, as one float32 array."""
    obs = {k: to_np(v) for k, v in obs.items()} if isinstance(obs, dict) else to_np(obs)
    return np.concatenate([obs["a"], obs["b"][..., None]], -1) if isinstance(obs, dict) else obs


def run_few(buffers, log, steps, rng, split, dtype, p_end, p_jump):
    """Add ``steps`` transitions per env made of FEW values: episodes ended by termination
    or truncation, and (with ``p_jump``) observations that do not follow on from the
    last next observation, though by chance they often match it byte for byte."""
    B = buffers[0].num_envs
    cur = rng.choice(FEW, (B, 3))
    for _ in range(steps):
        nxt = rng.choice(FEW, (B, 3))
        action = rng.integers(0, 4, B)
        if buffers[0]._specs[buffers[0]._action_leaves[0]].dtype == np.float32:
            action = rng.normal(size=(B, 2)).astype(np.float32)
        reward = rng.normal(size=B).astype(np.float32)
        end = rng.random(B) < p_end
        terminated = end & (rng.random(B) < 0.5)
        truncated = end & ~terminated
        for buffer in buffers:
            buffer.add(as_obs(cur, split, dtype), action, reward, as_obs(nxt, split, dtype),
                       terminated, truncated)
        for b in range(B):
            log.add(b, cur[b], action[b], reward[b], nxt[b], terminated[b], truncated[b])
        # After a jump: a fresh observation, or the next one with the signs of its zeros
        # flipped (equal values, other bytes).
        jumped = np.where(rng.random((B, 1)) < 0.5, rng.choice(FEW, (B, 3)),
                          np.where(nxt == 0, -nxt, nxt))
        cur = np.where((end | (rng.random(B) < p_jump))[:, None], jumped, nxt)


def assert_bytes_equal(x, y, what):
    x, y = to_np(x), to_np(y)
    assert x.dtype == y.dtype and x.shape == y.shape, what
    assert x.tobytes() == y.tobytes(), what


def assert_nests_equal(a, b):
    (x, xs), (y, ys) = nest.flatten(a), nest.flatten(b)
    assert xs == ys
    for k, (u, v) in enumerate(zip(x, y)):
        assert_bytes_equal(u, v, f"leaf {k}")


@settings(max_examples=60, deadline=None)
@given(num_envs=st.integers(1, 3), per_row=st.integers(1, 6), steps=st.integers(1, 20),
       split=st.booleans(), float64=st.booleans(), p_end=st.sampled_from([0.0, 0.3]),
       p_jump=st.sampled_from([0.0, 0.5]), storage=st.sampled_from(["numpy", "torch"]),
       seed=st.integers(0, 1000), clear_at=st.integers(0, 25), box_action=st.booleans())
def test_one_step_transitions_are_byte_exact(num_envs, per_row, steps, split, float64, p_end,
                                             p_jump, storage, seed, clear_at, box_action):
    """n_step=1 reads (no return windows) and adds whose observation follows on from the
    last next observation (one bytes comparison for all envs) are the fast paths: pin
    them against a log of every transition, against the windowed read, and against
    adds that compare every row."""
    rng = np.random.default_rng(seed)
    B, gamma = num_envs, 0.9
    kw = dict(num_envs=B, gamma=gamma, seed=seed, storage=storage)
    spec = SPLIT_SPEC if split else rb.ArraySpec((3,), np.float32)
    act = BOX if box_action else ACT
    fast = rb.TransitionReplayBuffer(spec, act, per_row * B, **kw)
    rows = rb.TransitionReplayBuffer(spec, act, per_row * B, **kw)
    rows._follows_on = lambda host: False  # decide row by row, as for out-of-sequence adds
    rows._exact_add = False  # and never take add's shortcut (fast takes it where it can)
    assert fast._exact_add  # numpy, or torch on the CPU; one leaf or a one-level dict
    taken = []
    shortcut = fast._add_exact
    fast._add_exact = lambda *args: taken.append(shortcut(*args)) or taken[-1]
    dtype = np.float64 if float64 else np.float32  # float64 is cast: rows decide
    log = Log(B)
    if clear_at < steps:  # what went before a clear must not leak into what follows
        run_few([fast, rows], log, clear_at, rng, split, dtype, p_end, p_jump)
        fast.clear()
        rows.clear()
        log, steps = Log(B), steps - clear_at
    run_few([fast, rows], log, steps, rng, split, dtype, p_end, p_jump)

    if fast._exact_add and not float64 and p_end == 0.0 and p_jump == 0.0 and steps > 1:
        assert any(taken)  # the usual step took the shortcut
    assert_same_core_state(fast, rows)
    # Every retained transition, oldest first, read with and without the newest step
    # (whose next observation the buffer keeps aside).
    held = min(steps, per_row)
    ring = fast._ring
    ids = np.arange(ring.oldest_id, ring.last_id + 1)
    positions = ring.positions(ids[None, :], np.arange(B)[:, None])
    ids = np.broadcast_to(ids, positions.shape)
    for count in (held, held - 1):
        got = fast._read(ids[:, :count], positions[:, :count])
        fields = {name: to_np(getattr(got, name)).reshape((B, count))
                  for name in ("rewards", "terminated", "truncated", "dones", "discounts")}
        obs = obs_leaves(got.observations).reshape(B, count, 3)
        nxt = obs_leaves(got.next_observations).reshape(B, count, 3)
        for b in range(B):
            for k, (o, _, reward, next_obs, term, trunc) in enumerate(
                    log.retained(b, held)[:count]):
                assert obs[b, k].tobytes() == o.tobytes()
                assert nxt[b, k].tobytes() == next_obs.tobytes(), (b, k)
                assert fields["rewards"][b, k] == reward
                assert fields["terminated"][b, k] == term
                assert fields["truncated"][b, k] == trunc
                assert fields["dones"][b, k] == (term or trunc)
                assert fields["discounts"][b, k] == (0.0 if term else np.float32(gamma))

    # The windowed read, one step long, gives the same transitions.
    returns, term, trunc, discounts, next_leaves = fast._n_step_returns(ids, positions)
    one = fast._read(ids, positions)
    assert_bytes_equal(one.rewards, returns, "rewards")
    assert_bytes_equal(one.terminated, term, "terminated")
    assert_bytes_equal(one.truncated, trunc, "truncated")
    assert_bytes_equal(one.discounts, discounts, "discounts")
    for leaf, want in zip(nest.flatten(one.next_observations)[0], next_leaves):
        assert_bytes_equal(leaf, want, "next_observations")

    # Adds that decide row by row keep the same side observations and read the same.
    assert_nests_equal(fast.all(), rows.all())
    np.testing.assert_array_equal(fast._side_ref, rows._side_ref)
    assert len(fast._side) == len(rows._side)
    for _ in range(2):
        (x, ix), (y, iy) = fast.sample(16), rows.sample(16)
        assert_nests_equal(x, y)
        np.testing.assert_array_equal(to_np(ix.ids), to_np(iy.ids))


@pytest.mark.parametrize("copy_compare_max", [1 << 16, 0])  # 0: compared in place
def test_next_observations_are_the_ones_added_byte_for_byte(monkeypatch, copy_compare_max):
    """An observation equal in value to the last next observation but not in its bytes
    (-0.0 for 0.0) does not follow on from it; NaN does (the same bytes)."""
    from replaybuffer.buffers import side_observations, transition_add

    monkeypatch.setattr(side_observations, "COPY_COMPARE_MAX", copy_compare_max)
    monkeypatch.setattr(transition_add, "COPY_COMPARE_MAX", copy_compare_max)
    buffer = rb.TransitionReplayBuffer(rb.ArraySpec((2,), np.float32), ACT, 10, num_envs=2)
    zero = np.zeros(2, np.int64)
    added = [(np.float32([[1, 1], [1, 1]]), np.float32([[0.0, np.nan], [0.0, 2]])),
             (np.float32([[-0.0, np.nan], [0.0, 2]]), np.float32([[3, 3], [3, 3]])),
             (np.float32([[3, 3], [-0.0, 3]]), np.float32([[np.nan, 0.0], [4, 4]])),
             (np.float64([[np.nan, 0.0], [4, 4]]), np.float64([[5, 5], [-0.0, 5]]))]
    for obs, next_obs in added:  # the last add in float64: cast, then compared by rows
        buffer.add(obs, zero, np.zeros(2), next_obs, np.zeros(2, bool))
    got = buffer.all().next_observations  # [env, step, 2]
    want = np.stack([n.astype(np.float32) for _, n in added], 1)
    assert got.tobytes() == want.tobytes()
    assert len(buffer._side) == 2  # steps 0 (env 0) and 1 (env 1) do not continue


# ------------------------------------------------------- frame_stack=True (deduplicated)
STACK_VALUES = np.array([1, 2, 3], np.uint8)  # few values: unrelated frames often coincide


def stacked_spec(K, axis=0, shape=(2, 3)):
    return rb.ArraySpec((K,) + shape if axis == 0 else shape + (K,), np.uint8)


def run_stacked(buffers, log, steps, rng, K, axis=0, shape=(2, 3), p_end=0.2, p_jump=0.1):
    """Add ``steps`` transitions per env whose observations are frame stacks: episodes
    padded by repetition, by zeros or not at all, ended by termination or truncation
    (the final observation slid on by one frame), and sometimes an out-of-sequence
    stack that does not slide from the last next observation."""
    B = buffers[0].num_envs

    def fresh():
        return np.zeros(shape, np.uint8) if rng.random() < 0.1 else rng.choice(STACK_VALUES, shape)

    def start():
        padding, first = rng.integers(3), fresh()
        if padding == 0:
            return [first] * K
        if padding == 1:
            return [np.zeros(shape, np.uint8)] * (K - 1) + [first]
        return [fresh() for _ in range(K - 1)] + [first]

    def as_obs(stacks):
        obs = np.stack([np.stack(s) for s in stacks])
        return obs if axis == 0 else np.moveaxis(obs, 1, -1)

    stacks = [start() for _ in range(B)]
    for _ in range(steps):
        follow = [s[1:] + [s[-1] if rng.random() < 0.2 else fresh()] for s in stacks]
        obs, next_obs = as_obs(stacks), as_obs(follow)
        action = rng.integers(0, 4, B)
        reward = rng.normal(size=B).astype(np.float32)
        end = rng.random(B) < p_end
        terminated = end & (rng.random(B) < 0.5)
        truncated = end & ~terminated
        for buffer in buffers:
            buffer.add(obs, action, reward, next_obs, terminated, truncated)
        for b in range(B):
            log.add(b, obs[b], action[b], reward[b], next_obs[b], terminated[b], truncated[b])
        for b in range(B):
            if end[b]:
                stacks[b] = start()
            elif rng.random() < p_jump:
                stacks[b] = [fresh() for _ in range(K)]
            else:
                stacks[b] = follow[b]


def assert_transitions_equal(a, b):
    for field in a._fields:
        x, y = to_np(getattr(a, field)), to_np(getattr(b, field))
        assert x.dtype == y.dtype and x.shape == y.shape, field
        assert x.tobytes() == y.tobytes(), field


def assert_side_frames_owned(buffer):
    codec = buffer._codec
    assert {n for ns in codec.extra_owner.values() for n in ns} == set(codec.extras)


@settings(max_examples=40, deadline=None)
@given(num_envs=st.integers(1, 3), per_row=st.integers(1, 8), steps=st.integers(1, 30),
       K=st.integers(1, 4), n=st.integers(1, 3), axis=st.sampled_from([0, -1]),
       prioritized=st.booleans(), seed=st.integers(0, 1000), clear_at=st.integers(0, 40))
def test_deduplicated_stacks_match_the_log(num_envs, per_row, steps, K, n, axis, prioritized,
                                           seed, clear_at):
    rng = np.random.default_rng(seed)
    cls = rb.PrioritizedTransitionReplayBuffer if prioritized else rb.TransitionReplayBuffer
    kw = dict(num_envs=num_envs, n_step=n, gamma=0.9, seed=seed)
    spec = stacked_spec(K, axis)
    plain = cls(spec, ACT, per_row * num_envs, **kw)
    dedup = cls(spec, ACT, per_row * num_envs, frame_stack=True, stack_axis=axis, **kw)
    log = Log(num_envs)
    if clear_at < steps:  # what went before a clear must not leak into what follows
        run_stacked([plain, dedup], log, clear_at, rng, K, axis)
        plain.clear()
        dedup.clear()
        log, steps = Log(num_envs), steps - clear_at
    run_stacked([plain, dedup], log, steps, rng, K, axis)
    everything = dedup.all()
    assert_transitions_equal(plain.all(), everything)
    if n == 1:  # every retained transition is the one added, final observations included
        for b in range(num_envs):
            kept = log.retained(b, per_row)
            obs = to_np(everything.observations).reshape((num_envs, -1) + spec.shape)[b]
            nxt = to_np(everything.next_observations).reshape((num_envs, -1) + spec.shape)[b]
            for k, (o, _, _, next_obs, _, _) in enumerate(kept):
                assert obs[k].tobytes() == o.tobytes()
                assert nxt[k].tobytes() == next_obs.tobytes()
    x, ix = plain.sample(32)
    y, iy = dedup.sample(32)
    assert_transitions_equal(x, y)
    np.testing.assert_array_equal(ix.ids, iy.ids)
    assert_side_frames_owned(dedup)


def test_deduplicated_memory_is_about_one_frame_per_transition():
    K, capacity, episode = 4, 2000, 250
    spec = rb.ArraySpec((K, 84, 84), np.uint8)
    frame_bytes = 84 * 84
    dedup = rb.TransitionReplayBuffer(spec, ACT, capacity, frame_stack=True)
    plain = rb.TransitionReplayBuffer(spec, ACT, capacity)
    rng = np.random.default_rng(0)
    for e in range(capacity // episode + 1):  # a little past the wrap
        frames = rng.integers(0, 256, (episode + 1, 84, 84), dtype=np.uint8)
        stack = np.stack([frames[0]] * K)  # padding by repetition at the start
        for t in range(episode):
            next_stack = np.concatenate([stack[1:], frames[t + 1][None]])
            dedup.add(stack[None], np.zeros(1, np.int64), np.ones(1, np.float32),
                      next_stack[None], np.array([t == episode - 1]))
            stack = next_stack
    per_transition = dedup.nbytes / capacity
    assert per_transition <= 1.05 * frame_bytes  # one frame, K references, side frames
    assert plain.nbytes / capacity > K * frame_bytes
    assert len(dedup._codec.extras) == capacity // episode  # one final frame per episode
    batch = dedup.last(capacity)
    ends = np.flatnonzero(to_np(batch.terminated))
    assert len(ends) == capacity // episode
    final = to_np(batch.next_observations)[ends[-1]]
    np.testing.assert_array_equal(final[:-1], to_np(batch.observations)[ends[-1]][1:])


def test_deduplicated_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(5)
    spec = stacked_spec(3)
    kw = dict(num_envs=2, n_step=2, gamma=0.5, seed=1, frame_stack=True)
    buffer = rb.PrioritizedTransitionReplayBuffer(spec, ACT, 16, **kw)
    plain = rb.PrioritizedTransitionReplayBuffer(spec, ACT, 16, num_envs=2, n_step=2,
                                                 gamma=0.5, seed=1)
    log = Log(2)
    run_stacked([buffer, plain], log, 30, rng, 3)
    assert buffer._codec.extras  # some final observations hold side frames
    buffer.save(tmp_path / "t")
    again = rb.load(tmp_path / "t")
    assert type(again) is rb.PrioritizedTransitionReplayBuffer and again._codec is not None
    assert again.nbytes == buffer.nbytes
    assert_transitions_equal(buffer.all(), again.all())
    assert_transitions_equal(buffer.sample(16)[0], again.sample(16)[0])
    plain.sample(16)  # keeps the plain buffer's generator in step
    run_stacked([again, plain], log, 20, rng, 3)  # and it carries on as the plain one
    assert_transitions_equal(plain.all(), again.all())
    assert_transitions_equal(plain.sample(64)[0], again.sample(64)[0])
    assert_side_frames_owned(again)


def test_deduplicated_bad_input_is_refused_and_changes_nothing():
    K, shape = 3, (2, 3)
    buffer = rb.TransitionReplayBuffer(stacked_spec(K), ACT, 8, num_envs=2, frame_stack=True)
    rng = np.random.default_rng(3)
    run_stacked([buffer], Log(2), 12, rng, K, p_end=0.3)
    good = dict(observation=np.ones((2, K) + shape, np.uint8), action=np.zeros(2, np.int64),
                reward=np.zeros(2, np.float32),
                next_observation=np.full((2, K) + shape, 2, np.uint8),
                terminated=np.ones(2, bool), truncated=np.zeros(2, bool))
    before = buffer.all()
    codec = buffer._codec
    ring, ids, extras = codec.frames.copy(), codec.frame_ids.copy(), dict(codec.extras)
    cases = [
        (dict(observation=np.ones((2, K + 1) + shape, np.uint8)),
         r"\['observation'\]: expected shape \(2, 3, 2, 3\)"),
        (dict(observation=np.ones((2,) + shape + (K,), np.uint8)),  # the other stack axis
         r"\['observation'\]: expected shape"),
        (dict(observation=np.ones((2, K) + shape, np.float32)),
         r"\['observation'\]: expected dtype uint8"),
        (dict(next_observation=np.ones((2, K, 3, 2), np.uint8)),
         r"\['next_observation'\]: expected shape \(2, 3, 2, 3\)"),
        (dict(next_observation=np.ones((2, K) + shape, np.float64)),
         r"\['next_observation'\]: expected dtype uint8"),
        (dict(action=np.array([0, 9])), r"\['action'\] has values outside its space"),
    ]
    for change, pattern in cases:
        with pytest.raises(rb.SpecError, match=pattern):
            buffer.add(**{**good, **change})
    assert buffer.num_frames() == 8
    assert_transitions_equal(before, buffer.all())
    np.testing.assert_array_equal(codec.frames, ring)
    np.testing.assert_array_equal(codec.frame_ids, ids)
    assert codec.extras.keys() == extras.keys()
    buffer.add(**good)  # and a good add still goes in, final observation included
    last = buffer.last(1)
    np.testing.assert_array_equal(to_np(last.next_observations), good["next_observation"][:, None])


def test_deduplicated_configuration_errors():
    with pytest.raises(rb.SpecError, match="one array of stacked frames"):
        rb.TransitionReplayBuffer({"pixels": stacked_spec(3), "x": OBS}, ACT, 8, frame_stack=True)
    with pytest.raises(rb.SpecError, match="stack axis"):
        rb.TransitionReplayBuffer(stacked_spec(3), ACT, 8, frame_stack=True, stack_axis=3)
    with pytest.raises(ValueError, match="storage='numpy'"):
        rb.TransitionReplayBuffer(stacked_spec(3), ACT, 8, frame_stack=True, storage="torch")
    with pytest.raises(ValueError, match="frame_stack must be True or False"):
        rb.TransitionReplayBuffer(stacked_spec(3), ACT, 8, frame_stack="observation")


@pytest.mark.parametrize("storage", ["numpy", "torch"])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("num_envs", [1, 2])
def test_episode_ends_take_the_shortcut_and_keep_their_next_observations(storage, split,
                                                                       num_envs):
    """A step that ends episodes but follows on takes add's shortcut, which keeps the
    true next observations aside (and releases those of the steps it overwrites) as
    the general path does: a twin that never takes it holds and reads the same."""
    B, rng = num_envs, np.random.default_rng(num_envs)
    spec = SPLIT_SPEC if split else rb.ArraySpec((3,), np.float32)
    fast, slow = (rb.TransitionReplayBuffer(spec, ACT, 4 * B, num_envs=B, storage=storage)
                  for _ in range(2))
    slow._exact_add = False
    taken = []
    shortcut = fast._add_exact
    fast._add_exact = lambda *args: taken.append(shortcut(*args)) or taken[-1]
    cur = rng.normal(size=(B, 3)).astype(np.float32)
    for t in range(15):  # wraps the 4 steps per env three times
        nxt = rng.normal(size=(B, 3)).astype(np.float32)
        end = np.full(B, t % 3 == 2)
        end[0] = t % 3 == 1  # env 0 ends on other steps than the rest
        terminated = end & (t % 2 == 0)
        action = rng.integers(0, 4, B)
        for buffer in (fast, slow):
            buffer.add(as_obs(cur, split, np.float32), action,
                       np.full(B, t, np.float32), as_obs(nxt, split, np.float32),
                       terminated, end & ~terminated)
        # Where an episode ended the next one starts elsewhere (that add leaves the
        # shortcut), except in env 0, whose next episode starts where the last one
        # ended (only the side store tells its steps apart); every other add follows
        # on and takes the shortcut, ending or not.
        jump = end & (np.arange(B) > 0)
        cur = np.where(jump[:, None], rng.normal(size=(B, 3)).astype(np.float32), nxt)
    assert taken == [not (B > 1 and t % 3 == 0 and t > 0) for t in range(15)]
    assert_same_core_state(fast, slow)
    a, b = fast.all(), slow.all()
    assert_nests_equal(a, b)
    np.testing.assert_array_equal(fast._side_ref, slow._side_ref)
    assert len(fast._side) == len(slow._side) == int((fast._side_ref >= 0).sum())


SINGLE_KINDS = ["exact", "exact", "exact", "0-d", "float64", "wrong shape", "discrete out of range"]


def single_inputs(rng, cur, nxt, kind, box_action):
    """One env's step as ``add_single`` takes it (no env axis): numpy scalars for the
    reward and flags, or 0-d arrays, or something the shortcut refuses (then the
    general path converts or raises)."""
    action = rng.uniform(-1, 1, 2).astype(np.float32) if box_action else \
        np.int64(rng.integers(0, 4))
    # A Python float (also one that overflows float32: the shortcut refuses it and the
    # general path casts it to inf), or a float32 scalar.
    rewards = [float(rng.choice(FEW)), 1e300, -3.3e38, np.float32(rng.choice(FEW))]
    reward = rewards[rng.integers(len(rewards))]
    end = rng.random() < 0.3
    flags = rb.buffers.transitions.SINGLE_FLAGS if rng.random() < 0.7 else \
        (np.False_, np.True_)
    terminated = flags[int(end and rng.random() < 0.5)]
    truncated = flags[int(end and not terminated)] if rng.random() < 0.8 else None
    if kind == "0-d":
        reward, terminated = np.asarray(reward), np.asarray(terminated)
        if not box_action:
            action = np.asarray(action)
    elif kind == "float64":
        cur = cur.astype(np.float64)
    elif kind == "wrong shape":
        nxt = nxt[:1]
    elif kind == "discrete out of range" and not box_action:
        action = np.int64(4)
    return cur, action, reward, nxt, terminated, truncated


def assert_owns_match_side_refs(buffer):
    """The per-step summary the adds consult (``_owns``) says exactly which step slots
    hold side references."""
    refs = buffer._side_ref.reshape(len(buffer._owns), -1)
    assert bytes(buffer._owns) == (refs >= 0).any(1).tobytes()


def assert_same_core_state(a, b):
    assert a._ring.last_id == b._ring.last_id
    assert_owns_match_side_refs(a)
    assert_owns_match_side_refs(b)
    for x, y in zip(a._storage.arrays, b._storage.arrays):
        assert to_np(x).tobytes() == to_np(y).tobytes()
    assert a._side_ref.tobytes() == b._side_ref.tobytes()
    for x, y in zip(a._head_next, b._head_next):
        assert x.tobytes() == y.tobytes()
    for x, y in zip(a._side.take(a._side_ref[a._side_ref >= 0]),
                    b._side.take(b._side_ref[b._side_ref >= 0])):
        assert x.tobytes() == y.tobytes()


@settings(max_examples=60, deadline=None)
@given(per_row=st.integers(1, 6), steps=st.integers(1, 25), seed=st.integers(0, 1000),
       storage=st.sampled_from(["numpy", "torch"]), box_action=st.booleans(),
       rollout=st.booleans())
def test_single_env_adds_without_the_env_axis_are_adds_with_it(per_row, steps, seed,
                                                                storage, box_action,
                                                                rollout):
    """``add_single`` (one env's leaves without the env axis, as compat adapters get
    them) against ``add`` of the same leaves with the axis added, on a twin that never
    takes the shortcut: the same errors, the same stored bytes, side store and heads,
    for steps that follow on, jump (also to the same values with other bytes), end,
    and come in types the shortcut refuses."""
    rng = np.random.default_rng(seed)
    act = BOX if box_action else ACT
    if rollout:
        make = lambda: rb.RolloutBuffer(OBS, act, per_row, storage=storage, seed=seed)  # noqa: E731
    else:
        make = lambda: rb.TransitionReplayBuffer(OBS, act, per_row, storage=storage,  # noqa: E731
                                                 seed=seed)
    fast, slow = make(), make()
    slow._exact_add = False
    assert fast._write_single is not None
    taken = []
    shortcut = fast._add_exact
    fast._add_exact = lambda *args: taken.append(shortcut(*args)) or taken[-1]
    cur = rng.choice(FEW, 2).astype(np.float32)
    for _ in range(steps):
        nxt = rng.choice(FEW, 2).astype(np.float32)
        kind = SINGLE_KINDS[rng.integers(len(SINGLE_KINDS))]
        leaves = single_inputs(rng, cur, nxt, kind, box_action)
        extra = {}
        if rollout and rng.random() < 0.5:
            extra = {"value": np.float32(rng.normal()),
                     "log_prob": rng.choice([np.float32(-1.5), np.asarray(0.5, np.float32),
                                             np.float64(2.0), None])}
        outcomes = []
        for buffer, single in ((fast, True), (slow, False)):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # the overflow's cast
                    if single:
                        buffer.add_single(*leaves, **extra)
                    else:
                        *first, truncated = (x if x is None else np.asarray(x)[None]
                                             for x in leaves)
                        first[2] = first[2].astype(np.float32)  # a float reward's cast
                        buffer.add(*first, truncated, **extra)
                outcomes.append("ok")
            except rb.SpecError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
        assert_same_core_state(fast, slow)
        ended = bool(leaves[4]) or bool(leaves[5])
        cur = rng.choice(FEW, 2).astype(np.float32) if ended or rng.random() < 0.2 else \
            np.where(nxt == 0, -nxt, nxt) if rng.random() < 0.1 else nxt
    if fast._ring.last_id >= 0:
        assert_nests_equal(fast.all(), slow.all())
    if steps > 5:
        assert taken  # (whether any wrote depends on the script; the pins above hold)


@pytest.mark.parametrize("storage", ["numpy", "torch"])
@pytest.mark.parametrize("rollout", [False, True])
def test_an_env_loop_of_single_adds_takes_the_shortcut_every_step(storage, rollout):
    """Steps as one env gives them (numpy scalar reward and flags, episodes ending by
    termination and truncation) take the shortcut, wrapping the ring, except the first
    of each new episode (a reset elsewhere: the general path keeps the previous next
    observation), and leave what ``add`` with the env axis leaves."""
    rng = np.random.default_rng(3)
    cls = rb.RolloutBuffer if rollout else rb.TransitionReplayBuffer
    fast, slow = (cls(OBS, BOX, 4, storage=storage) for _ in range(2))
    slow._exact_add = False
    taken = []
    shortcut = fast._add_exact
    fast._add_exact = lambda *args: taken.append(shortcut(*args)) or taken[-1]
    cur = rng.normal(size=2).astype(np.float32)
    resets = []
    for t in range(15):
        nxt = rng.normal(size=2).astype(np.float32)
        action = rng.uniform(-1, 1, 2).astype(np.float32)
        terminated, truncated = np.bool_(t % 5 == 4), np.bool_(t % 7 == 6)
        resets.append(t > 0 and ((t - 1) % 5 == 4 or (t - 1) % 7 == 6))
        fast.add_single(cur, action, np.float32(t), nxt, terminated, truncated)
        slow.add(cur[None], action[None], np.float32(t)[None], nxt[None], terminated[None],
                 truncated[None])
        cur = rng.normal(size=2).astype(np.float32) if terminated or truncated else nxt
    # A refused step is offered to the shortcut again by add, with the axis added.
    assert taken == [k for reset in resets for k in ([False, False] if reset else [True])]
    assert_same_core_state(fast, slow)
    assert_nests_equal(fast.all(), slow.all())


@pytest.mark.parametrize("rollout", [False, True])
def test_the_shortcut_alone_takes_the_usual_step_or_writes_nothing(rollout):
    """``add_usual`` (what compat.pearl calls first for a vector env's step): True
    having written the step as ``add`` would (float64 rewards cast to the float32 leaf),
    or False having written nothing (a reset observation: not the previous next one)."""
    rng = np.random.default_rng(5)
    cls = rb.RolloutBuffer if rollout else rb.TransitionReplayBuffer
    fast, slow = (cls(OBS, BOX, 6, num_envs=2) for _ in range(2))
    cur = rng.normal(size=(2, 2)).astype(np.float32)
    for t in range(9):
        nxt = rng.normal(size=(2, 2)).astype(np.float32)
        action = rng.uniform(-1, 1, (2, 2)).astype(np.float32)
        reward = rng.standard_normal(2)  # float64, as a vector env gives it
        flags = np.array([t % 4 == 3, False]), np.zeros(2, bool)
        if t % 4 == 0 and t:  # a reset: the step must go to the general path
            before = fast._ring.last_id, [a.copy() for a in fast._storage.arrays]
            assert fast.add_usual(cur, action, reward, nxt, *flags) is False
            assert fast._ring.last_id == before[0]
            for a, b in zip(fast._storage.arrays, before[1]):
                assert a.tobytes() == b.tobytes()
            fast.add(cur, action, reward, nxt, *flags)
        else:
            assert fast.add_usual(cur, action, reward, nxt, *flags) is True
        slow.add(cur, action, reward.astype(np.float32), nxt, *flags)
        cur = rng.normal(size=(2, 2)).astype(np.float32) if t % 4 == 3 else nxt
    assert_same_core_state(fast, slow)
