"""The one-call adder of the usual step (``TransitionReplayBuffer.step_adder``, built by
``replaybuffer.buffers.step_adder``) against the general path, byte for byte.

Two buffers built alike: one adds through its compiled adder (whose fallback counts,
then adds with the env axis through ``add``), the other through ``add`` with every
shortcut off (``_exact_add = False``). Random scripts of steps that follow on, reset,
jump to the same values in other bytes, end by termination or truncation and wrap the
ring, in every input type callers pass (the adder takes some, its fallback the rest),
bad inputs among them, over each way the adder writes (one env's record joined, several
envs' records in a scratch block, the storage's fused writer for leaves outside the
records, many envs, torch storage); every outcome and every byte of state must match.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from conftest import to_np

FEW = np.array([0.0, -0.0, 1.0, -2.5, 3.25], np.float32)
BOX = rb.ArraySpec((2,), np.float32)
DISCRETE = rb.BoundedArraySpec((), np.int64, 0, 3)  # a discrete action: its range checked
# Layouts: (observation shape, num_envs of the vector case, storage)
LAYOUTS = {
    "records": ((3,), 3, "numpy"),  # every leaf a field of one record
    "own array": ((160,), 3, "numpy"),  # 640 bytes: the observation outside the records
    "many envs": ((100,), 21, "numpy"),  # 21 records over the scratch block's limit
    "torch": ((3,), 3, "torch"),
    "prioritized": ((3,), 3, "numpy"),  # the sampler's on_add sees every add
}


def make(rollout, discrete, layout, env_axis, per_row, seed):
    shape, envs, storage = LAYOUTS[layout]
    obs = rb.ArraySpec(shape, np.float32)
    act = DISCRETE if discrete else BOX
    B = envs if env_axis else 1
    if rollout:
        return rb.RolloutBuffer(obs, act, per_row * B, num_envs=B, storage=storage, seed=seed)
    cls = rb.PrioritizedTransitionReplayBuffer if layout == "prioritized" else \
        rb.TransitionReplayBuffer
    return cls(obs, act, per_row * B, num_envs=B, storage=storage, seed=seed)


def with_axis(args, env_axis):
    """A step's arguments as ``add`` takes them: one env's leaves get the env axis (a
    Python float reward becomes float32 ``[1]``, as ``add_single`` casts it)."""
    if env_axis:
        return list(args)
    out = []
    for i, x in enumerate(args):
        if x is None:
            out.append(None)
        elif i == 2 and type(x) is float:
            out.append(np.array((x,), np.float32))
        else:
            out.append(np.asarray(x)[None])
    return out


def adder_pair(rollout, discrete, layout, env_axis, per_row, seed):
    fast = make(rollout, discrete, layout, env_axis, per_row, seed)
    slow = make(rollout, discrete, layout, env_axis, per_row, seed)
    slow._exact_add = False
    fallbacks = []

    def fallback(*args):
        fallbacks.append(args)
        fast.add(*with_axis(args, env_axis))
    adder = fast.step_adder(fallback, env_axis=env_axis)
    assert adder is not None
    return fast, slow, adder, fallbacks


def assert_same_state(a, b):
    assert a._ring.last_id == b._ring.last_id
    for x, y in zip(a._storage.arrays, b._storage.arrays):
        assert to_np(x).tobytes() == to_np(y).tobytes()
    records = getattr(a._storage, "_records", None)
    if isinstance(records, np.ndarray):  # numpy's: padding included (it stays zero)
        assert records.tobytes() == b._storage._records.tobytes()
    assert a._side_ref.tobytes() == b._side_ref.tobytes()
    assert bytes(a._owns) == bytes(b._owns)
    refs = a._side_ref.reshape(len(a._owns), -1)
    assert bytes(a._owns) == (refs >= 0).any(1).tobytes()
    for x, y in zip(a._head_next, b._head_next):
        assert x.tobytes() == y.tobytes()
    for x, y in zip(a._side.take(a._side_ref[a._side_ref >= 0]),
                    b._side.take(b._side_ref[b._side_ref >= 0])):
        assert x.tobytes() == y.tobytes()
    if isinstance(a, rb.RolloutBuffer):
        assert (a._gae_ready, a._version) == (b._gae_ready, b._version)
    if isinstance(a, rb.PrioritizedTransitionReplayBuffer):
        tree_a, tree_b = a._sampler.state_dict(), b._sampler.state_dict()
        assert repr(tree_a) == repr(tree_b)


SINGLE_KINDS = ["exact"] * 4 + ["numpy scalars", "0-d", "float64 reward", "list action",
                                "float64 action", "wrong shape", "out of range", "huge reward",
                                "nan reward", "int flags"]
VECTOR_KINDS = ["exact"] * 4 + ["float32 reward", "list action", "float64 action",
                                "wrong shape", "out of range", "int flags", "short batch"]


def step_inputs(rng, cur, nxt, kind, env_axis, B, discrete):
    """One step's six arguments in the input type ``kind``."""
    shape = (B,) if env_axis else ()
    if discrete:  # one env's: a 0-d array (taken) or a numpy scalar (the fallback's)
        action = rng.integers(0, 4, shape)
        if not env_axis and rng.random() < 0.7:
            action = np.asarray(action)
    else:
        action = rng.choice(FEW, shape + (2,)).astype(np.float32)
    end = rng.random(shape) < 0.25
    term = end & (rng.random(shape) < 0.5)
    trunc = end & ~term
    if env_axis:
        reward = rng.standard_normal(B)  # float64, as vector envs give it
        flags = term, trunc
    else:
        reward = float(rng.choice(FEW))
        flags = bool(term), bool(trunc)
    truncated = flags[1] if rng.random() < 0.7 else None
    terminated = flags[0]
    if truncated is None and np.any(flags[1]):
        terminated = np.asarray(flags[0]) | flags[1] if env_axis else True
    if kind == "numpy scalars":
        reward, terminated = np.float32(reward), np.bool_(terminated)
        truncated = None if truncated is None else np.bool_(truncated)
    elif kind == "0-d":
        reward, terminated = np.asarray(reward, np.float32), np.asarray(terminated)
    elif kind == "float64 reward":
        reward = np.float64(rng.standard_normal())
    elif kind == "float32 reward":
        reward = reward.astype(np.float32)
    elif kind == "list action":
        action = action.tolist()
    elif kind == "float64 action":
        action = action.astype(np.float64)
    elif kind == "wrong shape":
        action = np.zeros(shape + (3,), np.asarray(action).dtype)
    elif kind == "out of range" and discrete:
        action = np.full(shape, 4, np.int64)
    elif kind == "huge reward":  # overflows float32: the fallback casts it to inf
        reward = 1e300
    elif kind == "nan reward":
        reward = float("nan")
    elif kind == "int flags":
        terminated = np.asarray(terminated).astype(np.int64)
    elif kind == "short batch":
        reward = reward[:1]
    return [cur, action, reward, nxt, terminated, truncated]


def policy_inputs(rng, env_axis, B):
    """A rollout's value and log_prob, in the types callers pass (or left out)."""
    choices = [None, None]
    if env_axis:
        choices += [rng.standard_normal(B).astype(np.float32), rng.standard_normal(B),
                    rng.standard_normal((B, 1)).astype(np.float32)]
    else:
        choices += [float(rng.standard_normal()), np.float32(1.5), np.float64(-0.5)]
    return [choices[rng.integers(len(choices))] for _ in range(2)]


def play(fast, slow, adder, rng, steps, env_axis, rollout, discrete, p_clear=0.03):
    B = fast.num_envs
    shape = (B,) if env_axis else ()
    obs_shape = fast._head_next[0].shape[1:]
    kinds = VECTOR_KINDS if env_axis else SINGLE_KINDS
    cur = rng.choice(FEW, shape + obs_shape).astype(np.float32)
    for _ in range(steps):
        if rng.random() < p_clear:
            fast.clear()
            slow.clear()
        nxt = rng.choice(FEW, shape + obs_shape).astype(np.float32)
        kind = kinds[rng.integers(len(kinds))]
        args = step_inputs(rng, cur, nxt, kind, env_axis, B, discrete)
        if rollout:
            args += policy_inputs(rng, env_axis, B)
        outcomes = []
        for buffer in (fast, slow):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # the overflow's cast
                    if buffer is fast:
                        assert adder(*args) is None
                    else:
                        buffer.add(*with_axis(args, env_axis))
                outcomes.append("ok")
            except (rb.SpecError, ValueError, TypeError) as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")
        assert outcomes[0] == outcomes[1], kind
        assert_same_state(fast, slow)
        ended = np.asarray(args[4]).astype(bool) | (False if args[5] is None
                                                    else np.asarray(args[5]))
        follow = rng.random()
        if follow < 0.7:  # the next step follows on, where the episode went on
            cur = np.where(ended[..., None], rng.choice(FEW, shape + obs_shape), nxt) \
                .astype(np.float32)
        elif follow < 0.8:  # the same values in other bytes (0.0 and -0.0)
            cur = np.where(nxt == 0, -nxt, nxt)
        else:
            cur = rng.choice(FEW, shape + obs_shape).astype(np.float32)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("env_axis", [False, True])
@pytest.mark.parametrize("rollout", [False, True])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), per_row=st.integers(1, 7),
       steps=st.integers(1, 40), discrete=st.booleans())
def test_the_adder_writes_what_the_general_path_writes(layout, env_axis, rollout, seed,
                                                       per_row, steps, discrete):
    fast, slow, adder, _ = adder_pair(rollout, discrete, layout, env_axis, per_row, seed)
    rng = np.random.default_rng(seed)
    play(fast, slow, adder, rng, steps, env_axis, rollout, discrete)
    assert_same_state(fast, slow)
    if fast._ring.last_id >= 0:  # the samplers' generators were left alone alike
        a, _ = fast.sample(5)
        b, _ = slow.sample(5)
        for x, y in zip(a, b):
            if x is not None:
                x, y = (np.asarray(to_np(v)) for v in (x, y)) if not isinstance(x, dict) \
                    else (x, y)
                assert repr(x) == repr(y)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("env_axis", [False, True])
@pytest.mark.parametrize("rollout", [False, True])
def test_an_env_loop_takes_the_adder_except_after_resets(layout, env_axis, rollout):
    """Steps as an env gives them, episodes ending by termination and truncation,
    the ring wrapping many times: the adder writes every step itself except the first
    of each new episode (a reset observation: the fallback keeps the previous next
    observation), and leaves what the general path leaves."""
    fast, slow, adder, fallbacks = adder_pair(rollout, False, layout, env_axis, 5, 0)
    rng = np.random.default_rng(1)
    B = fast.num_envs
    shape = (B,) if env_axis else ()
    obs_shape = fast._head_next[0].shape[1:]
    cur = rng.standard_normal(shape + obs_shape).astype(np.float32)
    resets = 0
    for t in range(60):
        nxt = rng.standard_normal(shape + obs_shape).astype(np.float32)
        action = rng.uniform(-1, 1, shape + (2,)).astype(np.float32)
        term, trunc = t % 9 == 8, t % 13 == 12
        if env_axis:
            args = [cur, action, rng.standard_normal(B), nxt, np.full(B, term),
                    np.full(B, trunc)]
        else:
            args = [cur, action, float(rng.standard_normal()), nxt, term, trunc]
        adder(*args)
        slow.add(*with_axis(args, env_axis))
        if term or trunc:
            cur = rng.standard_normal(shape + obs_shape).astype(np.float32)
            resets += t < 59
        else:
            cur = nxt
    assert len(fallbacks) == resets
    assert_same_state(fast, slow)


def test_bad_input_is_refused_as_add_refuses_it_and_changes_nothing():
    fast, slow, adder, fallbacks = adder_pair(True, True, "records", True, 4, 0)
    obs = np.zeros((3, 3), np.float32)
    step = [obs, np.zeros(3, np.int64), np.zeros(3), obs + 1, np.zeros(3, bool),
            np.zeros(3, bool)]
    adder(*step)
    slow.add(*step)
    before = [to_np(a).copy() for a in fast._storage.arrays], fast._ring.last_id
    for i, bad in ((1, np.full(3, 4)), (1, np.zeros((3, 3), np.int64)),
                   (2, np.zeros(2)), (4, np.zeros(2, bool))):
        args = list(step)
        args[0] = obs + 1
        args[i] = bad
        with pytest.raises(rb.SpecError) as got:
            adder(*args)
        with pytest.raises(rb.SpecError) as expected:
            slow.add(*args)
        assert str(got.value) == str(expected.value)
        assert fast._ring.last_id == before[1]
        for a, b in zip(fast._storage.arrays, before[0]):
            assert to_np(a).tobytes() == b.tobytes()
    assert len(fallbacks) == 4


def test_a_rate_limiter_or_an_open_snapshot_sends_steps_to_the_fallback():
    fast, slow, adder, fallbacks = adder_pair(False, False, "records", False, 4, 0)
    obs = [np.full(3, t, np.float32) for t in range(8)]
    action = np.zeros(2, np.float32)
    adder(obs[0], action, 1.0, obs[1], False)
    assert fallbacks == []
    fast.rate_limiter = rb.MinSize(1)
    adder(obs[1], action, 1.0, obs[2], False)
    assert len(fallbacks) == 1
    fast.rate_limiter = None
    adder(obs[2], action, 1.0, obs[3], False)
    assert len(fallbacks) == 1
    state, streams = fast.snapshot()  # a save in progress: writes go around the writer
    adder(obs[3], action, 1.0, obs[4], False)
    assert len(fallbacks) == 2
    fast.release_snapshot()
    adder(obs[4], action, 1.0, obs[5], True)
    assert len(fallbacks) == 2
    for t in range(5):
        slow.add(obs[t][None], action[None], np.ones(1, np.float32), obs[t + 1][None],
                 np.array([t == 4]), np.zeros(1, bool))
    assert_same_state(fast, slow)


def test_keyword_arguments_and_names():
    fast, slow, adder, fallbacks = adder_pair(True, False, "records", False, 4, 0)
    o = np.zeros(3, np.float32)
    adder(observation=o, action=np.zeros(2, np.float32), reward=0.5, next_observation=o + 1,
          terminated=False, log_prob=-1.0)
    slow.add(o[None], np.zeros((1, 2), np.float32), np.full(1, 0.5, np.float32), o[None] + 1,
             np.zeros(1, bool), log_prob=np.full(1, -1.0, np.float32))
    assert fallbacks == []
    assert_same_state(fast, slow)
    named = fast.step_adder(print, env_axis=False,
                            names=("o", "a", "r", "n", "done", "cut", "v", "lp"))
    named(o + 1, np.zeros(2, np.float32), 1.0, o + 2, done=True, lp=2.0)
    slow.add(o[None] + 1, np.zeros((1, 2), np.float32), np.ones(1, np.float32), o[None] + 2,
             np.ones(1, bool), log_prob=np.full(1, 2.0, np.float32))
    assert_same_state(fast, slow)
    for bad in (("o", "a"), ("o", "a", "r", "n", "done", "cut", "v", "v"),
                ("o", "a", "r", "head", "done", "cut", "v", "lp"),
                ("o", "a", "r", "n", "done", "cut", "v", "q1"),
                ("o", "a", "r", "n", "done", "cut", "v", "for"),
                ("o", "a", "r", "n", "done", "cut", "type", "lp")):
        with pytest.raises(ValueError, match="names: expected 8 distinct argument names"):
            fast.step_adder(print, env_axis=False, names=bad)


def test_no_adder_where_the_shortcut_does_not_apply():
    obs = rb.ArraySpec((3,), np.float32)
    goal = {"observation": obs, "desired_goal": rb.ArraySpec((2,), np.float32)}
    cases = [rb.TransitionReplayBuffer(goal, BOX, 8),  # an observation of several leaves
             rb.TransitionReplayBuffer(rb.ArraySpec((2, 4, 4), np.uint8), BOX, 8,
                                       frame_stack=True)]
    for buffer in cases:
        assert buffer.step_adder(print) is None
    vector = rb.TransitionReplayBuffer(obs, BOX, 8, num_envs=2)
    assert vector.step_adder(print, env_axis=False) is None  # one env's step, two envs
    assert vector.step_adder(print) is not None
