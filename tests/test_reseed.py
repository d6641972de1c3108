"""``reseed(s)``: a buffer then draws what a fresh buffer built with ``seed=s`` and fed the
same steps draws, for every buffer family; a bad seed is refused and changes nothing.
Also the wording of ``repr``: steps or transitions, as the buffer holds them."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from conftest import to_np

STEP = {"x": rb.ArraySpec((), np.int64)}
OBS = rb.ArraySpec((2,), np.float32)
ACT = rb.BoundedArraySpec((), np.int64, 0, 3)
GOAL = rb.ArraySpec((2,), np.float32)
GOAL_OBS = {"observation": rb.ArraySpec((1,), np.float32), "achieved_goal": GOAL,
            "desired_goal": GOAL}


def distance_reward(achieved_goal, desired_goal, info):
    return -np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)


def fill_steps(buffer, n=40):
    for k in range(n):
        buffer.add_batch({"x": np.arange(buffer.batch_size) * 1000 + k})
    return buffer


def fill_transitions(buffer, n=30, num_envs=1, **extra):
    for k in range(n):
        obs = np.full((num_envs, 2), k, np.float32) + np.arange(num_envs)[:, None] * 100
        ended = np.full(num_envs, k % 7 == 6)
        buffer.add(obs, np.full(num_envs, k % 4), np.full(num_envs, float(k)), obs + 1,
                   ended, **{name: make(num_envs, k) for name, make in extra.items()})
    return buffer


def fill_goals(buffer, n=30):
    for k in range(n):
        goal = np.full((1, 2), k % 5, np.float32)
        obs = {"observation": np.full((1, 1), k, np.float32), "achieved_goal": goal,
               "desired_goal": goal + 1}
        nxt = {**obs, "achieved_goal": goal + 0.5}
        buffer.add(obs, np.array([k % 4]), np.zeros(1), nxt, np.array([k % 6 == 5]))
    return buffer


def draw_steps(buffer):
    items, info = buffer.get_next(16, num_steps=2)
    return [to_np(items["x"]), to_np(info.ids)]


def draw_transitions(buffer):
    batch, info = buffer.sample(16)
    obs = batch.observations  # a dict of goal observations for HER
    leaves = [obs[k] for k in sorted(obs)] if isinstance(obs, dict) else [obs]
    return [to_np(x) for x in leaves] + [to_np(batch.rewards), to_np(info.ids)]


def draw_minibatches(buffer):
    return [to_np(b.observations) for b in buffer.minibatches(8)]


def rollout(seed):
    buffer = rb.RolloutBuffer(OBS, ACT, 30, num_envs=1, seed=seed)
    fill_transitions(buffer, 30, value=lambda n, k: np.full(n, k, np.float32),
                     log_prob=lambda n, k: np.zeros(n, np.float32))
    buffer.compute_returns_and_advantages(np.zeros(1), 0.9, 0.95)
    return buffer


FAMILIES = {
    "uniform": (lambda s: fill_steps(rb.UniformReplayBuffer(STEP, 3, 20, seed=s)), draw_steps),
    "uniform-torch-device": (
        lambda s: fill_steps(rb.UniformReplayBuffer(STEP, 3, 20, seed=s, storage="torch",
                                                    device="cpu", sample_on_device=True)),
        draw_steps),
    "prioritized": (lambda s: fill_steps(rb.PrioritizedReplayBuffer(STEP, 3, 20, seed=s)),
                    draw_steps),
    "prioritized-torch-device": (
        lambda s: fill_steps(rb.PrioritizedReplayBuffer(STEP, 3, 20, seed=s, storage="torch",
                                                        device="cpu", sample_on_device=True)),
        draw_steps),
    "shuffled": (lambda s: fill_steps(rb.ShuffledReplayBuffer(STEP, 3, 20, seed=s)),
                 draw_steps),
    "transitions": (lambda s: fill_transitions(rb.TransitionReplayBuffer(OBS, ACT, 40, seed=s)),
                    draw_transitions),
    "prioritized-transitions": (
        lambda s: fill_transitions(rb.PrioritizedTransitionReplayBuffer(OBS, ACT, 40, seed=s)),
        draw_transitions),
    "her": (lambda s: fill_goals(rb.HERBuffer(GOAL_OBS, ACT, 40, seed=s,
                                              compute_reward=distance_reward)),
            draw_transitions),
    "rollout": (rollout, draw_minibatches),
}


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def differ(a, b):
    return any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"shuffled"}))  # shuffled: below
def test_reseed_draws_what_a_buffer_built_with_that_seed_draws(family):
    make, draw = FAMILIES[family]
    fresh = make(5)
    want = [draw(fresh) for _ in range(3)]
    used = make(1)
    other = [draw(used) for _ in range(3)]  # another seed, and its generator advanced
    assert any(differ(a, b) for a, b in zip(other, want))  # else the test proves nothing
    used.reseed(5)
    for expected in want:
        assert_same(draw(used), expected)
    used.reseed(np.uint32(1))  # numpy ints are taken too
    assert_same(draw(used), draw(make(1)))


def test_fifo_has_nothing_to_reseed_and_keeps_its_order():
    buffer = fill_steps(rb.FIFOReplayBuffer(STEP, 1, 20))
    buffer.reseed(3)
    np.testing.assert_array_equal(to_np(buffer.get_next(4)[0]["x"]), [20, 21, 22, 23])


def test_shuffled_keeps_its_epoch_in_progress_and_draws_the_next_from_the_seed():
    make, draw = FAMILIES["shuffled"]  # 3 rows x 19 windows of 2 steps: 57 an epoch
    first, second = make(1), make(1)
    for _ in range(3):  # 48 of the epoch's 57
        assert_same(draw(second), draw(first))
    second.reseed(9)
    kept, new = draw(first)[1], draw(second)[1]
    np.testing.assert_array_equal(new[:9], kept[:9])  # the epoch in progress, as drawn
    np.testing.assert_array_equal(new[9:], draw(make(9))[1][:7])  # then seed 9's order
    assert not np.array_equal(new[9:], kept[9:])


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (2**64, ValueError),
                                        (1.5, TypeError), (True, TypeError),
                                        ("3", TypeError), (None, TypeError)])
def test_a_bad_seed_is_refused_naming_it_and_the_buffer_is_unchanged(bad, error):
    make, draw = FAMILIES["prioritized-transitions"]
    buffer, twin = make(2), make(2)
    draw(buffer), draw(twin)
    with pytest.raises(error, match=r"seed: expected an int in \[0, 2\*\*64\), got"):
        buffer.reseed(bad)
    assert_same(draw(buffer), draw(twin))
    assert len(buffer) == len(twin)


def test_reseed_keeps_priorities_and_the_beta_schedule():
    buffer = fill_steps(rb.PrioritizedReplayBuffer(STEP, 1, 20, beta=0.4, beta_final=1.0,
                                                   beta_steps=10, seed=0))
    _, info = buffer.get_next(8)
    buffer.update_priorities(info.ids, np.arange(1, 9, dtype=np.float64))
    before = buffer.sampler.state_dict()
    buffer.reseed(4)
    after = buffer.sampler.state_dict()
    assert set(before) == set(after)
    for key in before:
        if key != "rng":
            a, b = before[key], after[key]
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b)
            else:
                assert a == b, key
    assert before["rng"] != after["rng"]


@settings(max_examples=25, deadline=None)
@given(first=st.integers(0, 2**64 - 1), second=st.integers(0, 2**64 - 1),
       reads=st.integers(0, 4))
def test_reseed_matches_a_fresh_buffer_for_any_seed(first, second, reads):
    buffer = fill_steps(rb.UniformReplayBuffer(STEP, 2, 10, seed=first), 15)
    for _ in range(reads):
        draw_steps(buffer)
    buffer.reseed(second)
    fresh = fill_steps(rb.UniformReplayBuffer(STEP, 2, 10, seed=second), 15)
    assert_same(draw_steps(buffer), draw_steps(fresh))


# ------------------------------------------------------------------ repr wording
@pytest.mark.parametrize("family, unit", [
    ("uniform", "steps"), ("prioritized", "steps"), ("shuffled", "steps"),
    ("uniform-torch-device", "steps"), ("transitions", "transitions"),
    ("prioritized-transitions", "transitions"), ("her", "transitions"),
    ("rollout", "transitions")])
def test_repr_says_what_the_buffer_holds(family, unit):
    buffer = FAMILIES[family][0](0)
    text = repr(buffer)
    held = f"{len(buffer)}/{buffer.capacity}"
    assert f"{unit}={held}" in text and "frames=" not in text
    assert text.startswith(type(buffer).__name__ + "(")
    other = {"steps": "transitions", "transitions": "steps"}[unit]
    assert f"{other}=" not in text


def test_repr_of_fifo_and_a_stacked_frame_buffer_says_steps():
    assert "steps=3/10" in repr(fill_steps(rb.FIFOReplayBuffer(STEP, 1, 10), 3))
    frames = rb.UniformReplayBuffer({"obs": rb.ArraySpec((2, 3), np.uint8)}, 1, 10,
                                    frame_stack="obs")
    assert "steps=0/10" in repr(frames)
