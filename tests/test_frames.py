"""Frame deduplication: one frame per step, stacks rebuilt byte-identical on read."""

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer.collect import StepDriver, Trajectory
from replaybuffer.compat import tf_agents

H = W = 6


def frame(episode, t, row=0):
    return np.full((H, W), (episode * 37 + t * 11 + row * 101) % 251 + 1, np.uint8)


def stacked_episodes(lengths, K, padding, rows=1):
    """Per step: the [K, H, W] stack (axis 0) of each row, as a frame-stack wrapper makes.

    ``padding="stream"`` stacks the last K frames of one endless stream that starts
    with K distinct frames (no padding anywhere), as TF-Agents' hashed-buffer test does.
    """
    if padding == "stream":
        total = sum(lengths)
        return [np.stack([np.stack([frame(0, t + k, r) for k in range(K)]) for r in range(rows)])
                for t in range(total)]
    steps = []
    for e, n in enumerate(lengths):
        for t in range(n):
            stack = []
            for r in range(rows):
                frames = [frame(e, max(t - K + 1 + k, 0), r) if t - K + 1 + k >= 0 or
                          padding == "reset" else np.zeros((H, W), np.uint8)
                          for k in range(K)]
                stack.append(np.stack(frames))
            steps.append(np.stack(stack))
    return steps  # list of [rows, K, H, W]


def spec(K, axis=0):
    shape = (K, H, W) if axis == 0 else (H, W, K)
    return {"obs": rb.ArraySpec(shape, np.uint8), "t": rb.ArraySpec((), np.int64)}


def pair(K, batch_size, max_length, kind="uniform", axis=0, **kw):
    cls = rb.PrioritizedReplayBuffer if kind == "prioritized" else rb.UniformReplayBuffer
    plain = cls(spec(K, axis), batch_size, max_length, seed=3, **kw)
    dedup = cls(spec(K, axis), batch_size, max_length, seed=3, frame_stack="obs",
                stack_axis=axis, **kw)
    return plain, dedup


def feed(buffers, steps, axis=0):
    for i, stacks in enumerate(steps):
        obs = stacks if axis == 0 else np.moveaxis(stacks, 1, -1)
        item = {"obs": obs, "t": np.full(len(stacks), i)}
        for b in buffers:
            b.add_batch(item)


def assert_same(plain, dedup):
    a, b = plain.gather_all(), dedup.gather_all()
    np.testing.assert_array_equal(a["obs"], b["obs"])
    np.testing.assert_array_equal(a["t"], b["t"])


@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("axis", [0, -1])
def test_stacks_come_back_byte_identical_across_episodes_and_the_wrap(padding, axis):
    plain, dedup = pair(4, 2, 9, axis=axis)
    feed([plain, dedup], stacked_episodes([5, 2, 7, 1, 6], 4, padding, rows=2), axis)
    assert_same(plain, dedup)
    x, ix = plain.get_next(64, num_steps=2)
    y, iy = dedup.get_next(64, num_steps=2)  # next observations too
    np.testing.assert_array_equal(x["obs"], y["obs"])
    np.testing.assert_array_equal(ix.ids, iy.ids)
    assert y["obs"].flags.c_contiguous


def test_memory_is_about_one_frame_per_step():
    K, L = 4, 1000
    atari = {"obs": rb.ArraySpec((K, 84, 84), np.uint8), "t": rb.ArraySpec((), np.int64)}
    plain = rb.UniformReplayBuffer(atari, 1, L)
    dedup = rb.UniformReplayBuffer(atari, 1, L, frame_stack="obs")
    frame_bytes = 84 * 84
    other = plain.nbytes - K * frame_bytes * L  # the scalar leaves, stored alike
    per_step = (dedup.nbytes - other) / L
    assert per_step <= 1.05 * frame_bytes  # one frame, K references and a frame id


def test_prioritized_and_save_load(tmp_path):
    plain, dedup = pair(3, 1, 6, kind="prioritized")
    feed([plain, dedup], stacked_episodes([4, 4], 3, "reset"))
    x, ix = plain.get_next(16, num_steps=2)
    y, iy = dedup.get_next(16, num_steps=2)
    np.testing.assert_array_equal(x["obs"], y["obs"])
    dedup.save(tmp_path / "f")
    again = rb.load(tmp_path / "f")
    assert_same(dedup, again)
    feed([dedup, again, plain], stacked_episodes([3], 3, "reset"))
    assert_same(plain, again)


def test_stacks_that_do_not_slide_are_kept_exactly_in_side_frames(tmp_path):
    plain, dedup = pair(3, 1, 5)
    rng = np.random.default_rng(0)
    steps = stacked_episodes([3], 3, "reset") + \
        [rng.integers(1, 255, (1, 3, H, W)).astype(np.uint8) for _ in range(4)]
    feed([plain, dedup], steps)
    assert_same(plain, dedup)
    assert len(dedup._codec.extras) > 0
    dedup.save(tmp_path / "x")
    assert_same(plain, rb.load(tmp_path / "x"))
    feed([plain, dedup], stacked_episodes([6], 3, "reset"))  # overwrites the random ones
    assert_same(plain, dedup)
    assert len(dedup._codec.extras) == 0  # released with the steps that owned them


def test_bad_configuration():
    with pytest.raises(rb.SpecError, match="names no top-level leaf"):
        rb.UniformReplayBuffer(spec(4), frame_stack="pixels")
    with pytest.raises(ValueError, match="storage='numpy'"):
        rb.UniformReplayBuffer(spec(4), frame_stack="obs", storage="torch")
    with pytest.raises(rb.SpecError, match="stack axis"):
        rb.UniformReplayBuffer(spec(4), frame_stack="obs", stack_axis=5)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=8), K=st.integers(2, 4),
       batch_size=st.integers(1, 2), max_length=st.integers(1, 10),
       padding=st.sampled_from(["reset", "zero", "stream"]), extend=st.booleans())
def test_matches_a_plain_buffer(lengths, K, batch_size, max_length, padding, extend):
    plain, dedup = pair(K, batch_size, max_length)
    steps = stacked_episodes(lengths, K, padding, rows=batch_size)
    if extend:
        obs = np.stack(steps, axis=1)  # [B, T, K, H, W]
        item = {"obs": obs, "t": np.broadcast_to(np.arange(len(steps)), (batch_size, len(steps)))}
        plain.extend(item)
        dedup.extend(item)
    else:
        feed([plain, dedup], steps)
    assert_same(plain, dedup)


def test_gymnasium_frame_stack_through_a_driver():
    class Pixels(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (H, W), np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.t, self.e = 0, getattr(self, "e", -1) + 1
            return frame(self.e, 0), {}

        def step(self, action):
            self.t += 1
            return frame(self.e, self.t), 1.0, self.t >= 5, False, {}

    env = gym.wrappers.FrameStackObservation(Pixels(), 4, padding_type="reset")
    policy = lambda obs: np.zeros(len(obs), np.int64)  # noqa: E731
    probe = StepDriver(env, policy)
    plain = rb.UniformReplayBuffer(probe.data_spec, 1, 12, seed=0)
    dedup = rb.UniformReplayBuffer(probe.data_spec, 1, 12, seed=0, frame_stack="observation")
    StepDriver(env, policy, [plain.add_batch, dedup.add_batch], num_steps=30).run()
    np.testing.assert_array_equal(plain.gather_all().observation, dedup.gather_all().observation)


def test_py_hashed_replay_buffer():  # checklist item 32
    obs_spec = tf_agents.ArraySpec((15, 15, 4), np.int32, "obs")
    spec = Trajectory(rb.ArraySpec((), np.int32), obs_spec, rb.ArraySpec((), np.int32), (),
                      rb.ArraySpec((), np.int32), rb.ArraySpec((), np.float32),
                      rb.ArraySpec((), np.float32))
    with pytest.raises(ValueError, match="needs a Trajectory"):
        tf_agents.PyHashedReplayBuffer({"obs": obs_spec}, 32)
    buf = tf_agents.PyHashedReplayBuffer(spec, 32, seed=0)
    frames = [np.full((15, 15), k, np.int32) for k in range(100)]
    for k in range(96):
        stack = np.stack(frames[k:k + 4], -1)[None]
        one = np.ones(1, np.int32)
        buf.add_batch(Trajectory(one, stack, one, (), one, np.ones(1, np.float32),
                                 np.ones(1, np.float32)))
    items, _ = buf.get_next(200)
    obs = items.observation
    assert obs[:, 0, 0, 0].min() >= 64 and buf.size == 32
    for c in range(1, 4):
        np.testing.assert_array_equal(obs[..., c], obs[..., 0] + c)


def test_float_frames_keep_their_bytes():
    spec = {"obs": rb.ArraySpec((2, 3), np.float32), "t": rb.ArraySpec((), np.int64)}
    buf = rb.UniformReplayBuffer(spec, 1, 4, frame_stack="obs")
    negative_zero = np.array([[[0.0, 0.0, 0.0], [-0.0, -0.0, -0.0]]], np.float32)
    buf.add_batch({"obs": negative_zero, "t": np.zeros(1, np.int64)})
    back = buf.gather_all()["obs"][0, 0]
    assert back.tobytes() == negative_zero[0].tobytes()
