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


def random_stacks(rng, steps, rows, K, shape, values, p_end=0.15, p_jump=0.05):
    """Per step: ``[rows, K, *shape]`` stacks of independent streams that mix every case
    the codec distinguishes: episodes padded by repetition, by zeros or not at all
    (``K`` fresh frames), stacks that jump instead of sliding, frames that repeat or are
    all zero. Frames draw from a few ``values``, so unrelated frames often coincide."""
    def fresh():
        kind = rng.random()
        if kind < 0.1:
            return np.zeros(shape, values.dtype)
        return rng.choice(values, size=shape)

    def start():
        padding = rng.integers(3)
        first = fresh()
        if padding == 0:
            return [first] * K
        if padding == 1:
            return [np.zeros(shape, values.dtype)] * (K - 1) + [first]
        return [fresh() for _ in range(K - 1)] + [first]

    stacks = [start() for _ in range(rows)]
    out = []
    for _ in range(steps):
        out.append(np.stack([np.stack(s) for s in stacks]))
        for r in range(rows):
            u = rng.random()
            if u < p_end:
                stacks[r] = start()
            elif u < p_end + p_jump:
                stacks[r] = [fresh() for _ in range(K)]
            else:  # slide; a frame that repeats the last one is a static screen
                new = stacks[r][-1] if rng.random() < 0.2 else fresh()
                stacks[r] = stacks[r][1:] + [new]
    return out


VALUES = {"uint8": np.array([1, 2, 3], np.uint8),
          # -0.0 and 0.0 differ in bytes, a NaN equals itself in bytes
          "float32": np.array([0.0, -0.0, np.nan, 1.0], np.float32)}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), K=st.integers(1, 4), batch_size=st.integers(1, 3),
       max_length=st.integers(1, 8), steps=st.integers(1, 40), axis=st.sampled_from([0, -1]),
       dtype=st.sampled_from(sorted(VALUES)), kind=st.sampled_from(["uniform", "prioritized"]))
def test_random_streams_and_operations_match_a_plain_buffer(seed, K, batch_size, max_length,
                                                             steps, axis, dtype, kind):
    """Adds one step at a time and in chunks, with clears and save/load round trips in
    between, against a buffer that stores whole stacks: the same bytes come back."""
    import tempfile

    rng = np.random.default_rng(seed)
    shape = (2, 3)
    spec = {"obs": rb.ArraySpec((K,) + shape if axis == 0 else shape + (K,), dtype),
            "t": rb.ArraySpec((), np.int64)}
    cls = rb.PrioritizedReplayBuffer if kind == "prioritized" else rb.UniformReplayBuffer
    plain = cls(spec, batch_size, max_length, seed=seed)
    dedup = cls(spec, batch_size, max_length, seed=seed, frame_stack="obs", stack_axis=axis)
    stacks = random_stacks(rng, steps, batch_size, K, shape, VALUES[dtype])
    stacks = [s if axis == 0 else np.moveaxis(s, 1, -1) for s in stacks]
    i = 0
    while i < len(stacks):
        op = rng.random()
        if op < 0.05:
            plain.clear()
            dedup.clear()
        elif op < 0.1:
            with tempfile.TemporaryDirectory() as tmp:
                dedup.save(f"{tmp}/b")
                dedup = rb.load(f"{tmp}/b")
        elif op < 0.4:
            n = int(rng.integers(1, 6))
            chunk = np.stack(stacks[i:i + n], axis=1)  # [B, T, ...]
            item = {"obs": chunk, "t": np.tile(np.arange(i, i + chunk.shape[1]), (batch_size, 1))}
            plain.extend(item)
            dedup.extend(item)
            i += n
        else:
            feed_one = {"obs": stacks[i], "t": np.full(batch_size, i)}
            plain.add_batch(feed_one)
            dedup.add_batch(feed_one)
            i += 1
    a, b = plain.gather_all(), dedup.gather_all()
    assert a["obs"].tobytes() == b["obs"].tobytes()
    np.testing.assert_array_equal(a["t"], b["t"])
    if plain.num_frames() >= 2 * batch_size:  # every row holds a window of two
        x, _ = plain.get_next(16, num_steps=2)
        y, _ = dedup.get_next(16, num_steps=2)
        assert x["obs"].tobytes() == y["obs"].tobytes()
    live = {n for ns in dedup._codec.extra_owner.values() for n in ns}
    assert live == set(dedup._codec.extras)  # side frames of overwritten steps are gone


def test_a_sliding_stack_costs_one_comparison_after_the_episode_start(monkeypatch):
    """Frame-by-frame matching runs once per episode (its first stack); every other step
    of a sliding episode is matched against the step before it in one comparison."""
    from replaybuffer.storage.frames import FrameStackCodec

    calls = []
    match = FrameStackCodec._match
    monkeypatch.setattr(FrameStackCodec, "_match",
                        lambda self, data, *a, **k: calls.append(1) or match(self, data, *a, **k))
    for padding in ("reset", "zero"):
        calls.clear()
        plain, dedup = pair(4, 2, 7)
        feed([plain, dedup], stacked_episodes([9, 5, 12], 4, padding, rows=2))
        assert_same(plain, dedup)
        assert len(calls) == 3 * 2  # the first step of each episode, in each row
        refs = dedup._storage.gather(np.arange(dedup.capacity))[0]
        assert (refs >= -1).all() and not dedup._codec.extras


@pytest.mark.parametrize("batch_size", [1, 2])
def test_inexact_leaves_between_exact_adds_keep_stacks_exact(batch_size):
    # Exact arrays take the fused encode-and-write path; anything else (another dtype
    # beside exact stacks, stacks of another dtype, non-contiguous stacks) the
    # validating one. Both must leave the codec consistent for the next step's
    # one-comparison match.
    plain, dedup = pair(4, batch_size, 7)
    for i, stacks in enumerate(stacked_episodes([6, 3, 8], 4, "reset", rows=batch_size)):
        t = np.full(batch_size, i)
        obs = stacks
        if i % 4 == 1:
            t = t.astype(np.int32)  # exact stacks, then a leaf the exact writer refuses
        elif i % 4 == 2:
            obs = stacks.astype(np.int64)
        elif i % 4 == 3:
            obs = np.asfortranarray(stacks)  # exact dtype and shape, strided bytes
        for b in (plain, dedup):
            b.add_batch({"obs": obs, "t": t})
    assert_same(plain, dedup)
    x, _ = plain.get_next(32, num_steps=2)
    y, _ = dedup.get_next(32, num_steps=2)
    np.testing.assert_array_equal(x["obs"], y["obs"])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), K=st.integers(1, 4),
       frame_shape=st.sampled_from([(3,), (2, 3), (2, 1, 3)]), lead=st.sampled_from([(5,),
                                                                                   (2, 3)]),
       axis_pick=st.integers(0, 3), sides=st.booleans())
def test_gather_stacks_is_a_gather_then_an_axis_move(seed, K, frame_shape, lead, axis_pick,
                                                     sides):
    """The one decode of frame dedup (local codec and shared ring): for every stack axis,
    interior ones too, and with side frames, the bytes of the plain reference: gather
    ``[..., K, *frame]``, put the side frames in, move the stack axis into place."""
    from replaybuffer.storage.frame_gather import gather_stacks

    rng = np.random.default_rng(seed)
    axis = axis_pick % (len(frame_shape) + 1)
    frames = rng.integers(0, 256, (9,) + frame_shape).astype(np.uint8)
    extras = rng.integers(0, 256, (4,) + frame_shape).astype(np.uint8)
    positions = rng.integers(0, 9, lead + (K,))
    side = rng.random(lead + (K,)) < 0.3 if sides else None
    numbers = rng.integers(0, 4, lead + (K,))
    expected = frames[positions]
    if side is not None:
        expected[side] = extras[numbers[side]]
    expected = np.moveaxis(expected, len(lead), len(lead) + axis)
    got = gather_stacks(frames, positions, axis, side,
                        None if side is None else extras, None if side is None else numbers)
    assert got.shape == expected.shape and got.flags.c_contiguous
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
