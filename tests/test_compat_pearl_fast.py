"""compat.pearl's shortcuts against its general path.

The shortcuts: reads (``BaseBuffer._fast``: gathers for random samples, views of the
cache of recent steps for ``last``, ``all`` and ``RolloutBuffer.sample``) and the
direct hand-over of an env's inputs to the core's add (``_direct``, and the core's
``add_single``/``add_usual`` that ``add_trajectory`` calls, ``_add_single`` and
``_add_usual``). Two buffers built alike, one with its shortcuts and one without
(``_fast``, ``_add_single`` and ``_add_usual`` ``None``, ``_direct`` False, and
``add_trajectory`` the class's method instead of the core's one-call adder), are played the same random script of adds (in sequence, after resets, out of
sequence, ending episodes by termination or truncation, inputs of every type the
general path takes) and reads (``sample``, ``last``, ``all`` in both dtypes, with and
without ``flatten_env``, also asking for more than is held); every output must be the
same bytes, every error the same, and so must the cores' whole state at the end.
"""

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.buffers.rollout import RolloutBuffer as RolloutCore
from replaybuffer.compat import pearl
from replaybuffer.compat.pearl import ReplayBuffer, RolloutBuffer
from replaybuffer.errors import EmptyBufferError, SpecError

OBS = spaces.Box(-5, 5, (3,), np.float32)
ACT = spaces.Box(-1, 1, (2,), np.float32)


def pair(cls, num_envs, buffer_size, seed, **spaces_):
    spaces_ = spaces_ or {"observation_space": OBS, "action_space": ACT}
    fast = cls(buffer_size=buffer_size, device="cpu", num_envs=num_envs, seed=seed, **spaces_)
    slow = cls(buffer_size=buffer_size, device="cpu", num_envs=num_envs, seed=seed, **spaces_)
    slow._fast, slow._direct, slow._add_single, slow._add_usual = None, False, None, None
    # Without the core's one-call adder too: add_trajectory is the class's method again.
    slow._step_add = None
    vars(slow).pop("add_trajectory", None)
    # The adapter's direct route is the fast buffer's own (one env or a vector env).
    if fast._direct:
        assert (fast._add_single is None) == (num_envs is not None)
        assert (fast._add_usual is None) == (num_envs is None)
        assert fast._step_add is not None and fast.add_trajectory is fast._step_add
    assert fast._fast is not None
    return fast, slow


def counting(buffer):
    """Count the adds that a shortcut (the core's one-call adder, or the core's
    ``_add_exact`` it falls back to) wrote itself: every add less those that the
    core's general path (``_add_general``) wrote."""
    core = buffer.core
    add, general, counts = buffer.add_trajectory, core._add_general, [0, 0]

    def counted(*args, **kwargs):
        counts[0] += 1
        return add(*args, **kwargs)

    def counted_general(*args):
        counts[1] += 1
        return general(*args)
    buffer.add_trajectory, core._add_general = counted, counted_general

    class Taken:
        def __getitem__(self, i):
            assert i == 0
            return counts[0] - counts[1]
    return Taken()


FIELDS = ("observations", "actions", "rewards", "next_observations", "dones")


def flat(result):
    out = []
    for field in ("observations", "actions", "rewards", "next_observations", "dones"):
        x = getattr(result, field)
        out.append((type(x).__name__, x.numpy() if isinstance(x, torch.Tensor) else x))
    return out


def call(buffer, method, *args, **kwargs):
    try:
        return ("ok", flat(getattr(buffer, method)(*args, **kwargs)))
    except (EmptyBufferError, ValueError, SpecError) as exc:
        return (type(exc).__name__, str(exc))


def assert_same(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] != "ok":
        assert a[1] == b[1]
        return
    for (ta, xa), (tb, xb) in zip(a[1], b[1]):
        assert ta == tb and xa.dtype == xb.dtype and xa.shape == xb.shape
        assert np.ascontiguousarray(xa).tobytes() == np.ascontiguousarray(xb).tobytes()


def assert_same_state(fast, slow):
    a, b = fast.core, slow.core
    assert a._ring.last_id == b._ring.last_id
    for x, y in zip(a._storage.arrays, b._storage.arrays):
        assert np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
    np.testing.assert_array_equal(a._side_ref, b._side_ref)
    for core in (a, b):  # the per-step summary of the references that adds consult
        refs = core._side_ref.reshape(len(core._owns), -1)
        assert bytes(core._owns) == (refs >= 0).any(1).tobytes()
    for x, y in zip(a._head_next, b._head_next):
        assert x.tobytes() == y.tobytes()
    used = a._side_ref[a._side_ref >= 0]
    for x, y in zip(a._side.take(used), b._side.take(b._side_ref[b._side_ref >= 0])):
        assert x.tobytes() == y.tobytes()
    assert fast._rng.bit_generator.state == slow._rng.bit_generator.state
    assert a._sampler._rng.bit_generator.state == b._sampler._rng.bit_generator.state
    if isinstance(a, RolloutCore):
        assert (a._gae_ready, a._version) == (b._gae_ready, b._version)


def as_input(rng, value, kind, vector):
    """``value`` (float32 array, or float / bool per env) in one of the types callers
    pass: the shortcut takes some, the general path the rest."""
    if kind in ("exact", "float64 reward"):
        if vector or isinstance(value, np.ndarray):
            return value
        return bool(value) if isinstance(value, (bool, np.bool_)) else float(value)
    if kind == "numpy scalar" and not vector and not isinstance(value, np.ndarray):
        return np.bool_(value) if isinstance(value, (bool, np.bool_)) else np.float32(value)
    if kind == "float64":
        return np.asarray(value, np.float64) if not isinstance(value, (bool, np.bool_)) \
            and np.asarray(value).dtype != np.bool_ else np.asarray(value)
    if kind == "list":
        return np.asarray(value).tolist()
    if kind == "tensor":
        return torch.as_tensor(np.asarray(value))
    return value


ADD_KINDS = ["exact", "exact", "exact", "numpy scalar", "float64", "float64 reward", "list",
             "tensor"]


def play(fast, slow, data, rng, steps, vector, rollout):
    """Random adds and reads on both buffers; outputs compared as they come."""
    B = fast.num_envs
    shape = (B,) if vector else ()
    obs = rng.standard_normal(shape + (3,), dtype=np.float32)
    for _ in range(steps):
        op = data.draw(st.sampled_from(["add"] * 6 + ["sample", "last", "all", "reset"]))
        if op == "add":
            nxt = rng.standard_normal(shape + (3,), dtype=np.float32)
            action = rng.uniform(-1, 1, shape + (2,)).astype(np.float32)
            reward = rng.standard_normal(shape).astype(np.float32) if vector else \
                float(rng.standard_normal())
            term = rng.random(shape) < 0.15 if vector else bool(rng.random() < 0.15)
            trunc = rng.random(shape) < 0.1 if vector else bool(rng.random() < 0.1)
            kind = data.draw(st.sampled_from(ADD_KINDS))
            args = [as_input(rng, x, kind, vector) for x in (obs, action, reward, nxt, term)]
            if kind == "float64 reward" and vector:  # as gymnasium's vector envs give it
                args[2] = rng.standard_normal(shape)  # float64, mostly not float32-exact
            truncated = data.draw(st.sampled_from(["given", "none"]))
            args.append(None if truncated == "none" else as_input(rng, trunc, kind, vector))
            extra = {}
            if rollout and data.draw(st.booleans()):
                value = rng.standard_normal(shape).astype(np.float32) if vector else \
                    float(rng.standard_normal())
                extra = {"value": value, "log_prob": value}
            results = []
            for buffer in (fast, slow):
                try:
                    buffer.add_trajectory(*args, **extra)
                    results.append("ok")
                except (SpecError, ValueError, TypeError) as exc:
                    results.append(f"{type(exc).__name__}: {exc}")
            assert results[0] == results[1]
            ended = np.asarray(term) | np.asarray(trunc)
            follow = data.draw(st.sampled_from(["next", "next", "next", "reset", "jump"]))
            if follow == "next":
                obs = nxt.copy() if ended.any() and vector else nxt
                if vector and ended.any():  # the envs that ended reset
                    obs[ended] = rng.standard_normal((int(ended.sum()), 3), dtype=np.float32)
                elif ended.any():
                    obs = rng.standard_normal((3,), dtype=np.float32)
            else:  # a reset or an out-of-sequence add: the next observation is another
                obs = rng.standard_normal(shape + (3,), dtype=np.float32)
        elif op == "reset":
            fast.reset()
            slow.reset()
        else:
            dtype = data.draw(st.sampled_from(["numpy", "torch", "NUMPY",
                                               pearl.TrajectoryType.TORCH]))
            flatten = data.draw(st.booleans())
            if op == "all":
                args = ()
            else:
                args = (data.draw(st.integers(1, 3 * fast.buffer_size)),)
            assert_same(call(fast, op, *args, flatten, dtype),
                        call(slow, op, *args, flatten, dtype))


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
@pytest.mark.parametrize("num_envs", [None, 1, 3])
@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), buffer_size=st.integers(1, 9))
def test_fast_paths_give_what_the_general_path_gives(cls, num_envs, data, seed, buffer_size):
    fast, slow = pair(cls, num_envs, buffer_size, seed)
    taken = counting(fast)
    play(fast, slow, data, np.random.default_rng(seed), 60, num_envs is not None,
         cls is RolloutBuffer)
    assert_same_state(fast, slow)
    assert taken[0] >= 0  # (how often depends on the script; see the test below)


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
@pytest.mark.parametrize("num_envs", [None, 1, 3])
@settings(max_examples=10, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), buffer_size=st.integers(1, 6))
def test_runs_from_the_cache_of_recent_steps_over_long_streams(cls, num_envs, data, seed,
                                                               buffer_size):
    """Long scripts: the ring wraps many times and the cache of recent steps moves to
    fresh arrays (every 64 steps or so past its window), is rebuilt after resets and
    after more adds than its window, and catches up lazily; every read must still be
    what the general path reads."""
    fast, slow = pair(cls, num_envs, buffer_size, seed)
    play(fast, slow, data, np.random.default_rng(seed), 300, num_envs is not None,
         cls is RolloutBuffer)
    assert_same_state(fast, slow)


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
@pytest.mark.parametrize("num_envs", [None, 3])
def test_the_cache_of_recent_steps_moves_and_keeps_every_read_exact(cls, num_envs):
    """A read after every add (``last``, ``all``, and the rollout's ``sample``) through
    episode ends, out-of-sequence adds and 30 wraps of the ring: the cache moves to
    fresh arrays several times, and every read equals the general path's."""
    fast, slow = pair(cls, num_envs, 7, 0)
    recent = fast._fast.recent
    allocate, moves = recent._allocate, [0]

    def counted():
        moves[0] += 1
        allocate()
    recent._allocate = counted
    rng = np.random.default_rng(2)
    shape = (num_envs,) if num_envs else ()
    obs = rng.standard_normal(shape + (3,), dtype=np.float32)
    for t in range(210):
        nxt = rng.standard_normal(shape + (3,), dtype=np.float32)
        action = rng.uniform(-1, 1, shape + (2,)).astype(np.float32)
        end = rng.random(shape) < 0.1
        reward = rng.standard_normal(num_envs) if num_envs else float(rng.standard_normal())
        term = end if num_envs else bool(end)
        for buffer in (fast, slow):
            buffer.add_trajectory(obs, action, reward, nxt, term)
        obs = rng.standard_normal(shape + (3,), dtype=np.float32) if t % 13 == 0 else nxt
        op = ("last", "all", "sample")[t % 3]
        args = (1 + t % 7,) if op != "all" else ()
        if op == "sample" and cls is ReplayBuffer:
            op, args = "last", (7,)
        for flatten in (False, True):
            assert_same(call(fast, op, *args, flatten, "numpy"),
                        call(slow, op, *args, flatten, "numpy"))
    assert moves[0] >= 3
    assert_same_state(fast, slow)


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
@pytest.mark.parametrize("num_envs", [None, 3])
def test_an_env_loop_takes_the_fast_add_except_at_episode_ends(cls, num_envs):
    fast, slow = pair(cls, num_envs, 16, 0)
    taken = counting(fast)
    rng = np.random.default_rng(0)
    shape = (num_envs,) if num_envs else ()
    obs = rng.standard_normal(shape + (3,), dtype=np.float32)
    ends = 0
    for t in range(100):
        nxt = rng.standard_normal(shape + (3,), dtype=np.float32)
        action = rng.uniform(-1, 1, shape + (2,)).astype(np.float32)
        end = t % 10 == 9
        if num_envs:
            reward, term, trunc = rng.standard_normal(num_envs), np.full(num_envs, end), \
                np.zeros(num_envs, bool)
        else:
            reward, term, trunc = float(rng.standard_normal()), end, False
        for buffer in (fast, slow):
            buffer.add_trajectory(obs, action, reward, nxt, term, trunc)
        ends += end
        obs = rng.standard_normal(shape + (3,), dtype=np.float32) if end else nxt
    # General adds: the first, each episode's last and the one after each reset, and
    # those overwriting a step that kept a side observation.
    assert 100 - taken[0] <= 1 + 2 * ends + 100 // 16 + 2
    assert taken[0] > 50
    for op, args in (("sample", (5,)), ("last", (7,)), ("all", ())):
        for flatten in (False, True):
            for dtype in ("numpy", "torch"):
                assert_same(call(fast, op, *args, flatten, dtype),
                            call(slow, op, *args, flatten, dtype))
    assert_same_state(fast, slow)


def test_no_shortcuts_where_they_do_not_apply():
    goal = spaces.Dict({"observation": OBS, "achieved_goal": ACT, "desired_goal": ACT})
    her = pearl.HERBuffer(buffer_size=4, observation_space=goal, action_space=ACT,
                          compute_reward=lambda a, d, i: np.zeros(len(a)))
    assert her._fast is None
    nested = ReplayBuffer(buffer_size=4, observation_space=goal, action_space=ACT)
    assert nested._fast is None
    torch_storage = ReplayBuffer(buffer_size=4, observation_space=OBS, action_space=ACT,
                                 storage="torch")
    assert torch_storage._fast is None
    discrete = ReplayBuffer(buffer_size=4, observation_space=OBS,
                            action_space=spaces.Discrete(3))
    assert discrete._fast is not None and not discrete._direct  # Pearl's [1] actions
    assert discrete._add_single is None and discrete._add_usual is None
    assert her._add_single is None and her._add_usual is None


def test_fast_reads_of_a_discrete_action_space():
    kw = {"observation_space": OBS, "action_space": spaces.Discrete(3)}
    fast, slow = pair(ReplayBuffer, None, 5, 3, **kw)
    rng = np.random.default_rng(1)
    obs = rng.standard_normal(3, dtype=np.float32)
    for t in range(12):
        nxt = rng.standard_normal(3, dtype=np.float32)
        for buffer in (fast, slow):
            buffer.add_trajectory(obs, int(t % 3), 1.0, nxt, t % 4 == 3)
        obs = nxt
    with pytest.raises(SpecError):
        fast.add_trajectory(obs, 3, 1.0, obs, False)
    for op, args in (("sample", (6,)), ("last", (4,)), ("all", ())):
        for dtype in ("numpy", "torch"):
            a, b = call(fast, op, *args, False, dtype), call(slow, op, *args, False, dtype)
            assert_same(a, b)
            assert a[1][1][1].shape[-1] == 1  # Pearl's trailing axis of discrete actions


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
def test_samples_are_copies_and_runs_read_only_views_that_never_change(cls):
    """``sample`` gathers copies; ``last``, ``all`` and ``RolloutBuffer.sample`` are views
    of the cache of recent steps: read-only numpy arrays, tensors sharing it, and what
    they hold stays as it was while later adds wrap the ring (Pearl's views changed)."""
    fast, _ = pair(cls, 2, 6, 0)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((2, 3), dtype=np.float32)

    def steps(n, obs):
        for t in range(n):
            nxt = rng.standard_normal((2, 3), dtype=np.float32)
            fast.add_trajectory(obs, np.zeros((2, 2), np.float32), np.ones(2), nxt,
                                np.array([t % 4 == 3, False]))
            obs = nxt
        return obs

    obs = steps(9, obs)
    before = fast.core._storage.arrays[0].copy()
    if cls is ReplayBuffer:
        sampled = fast.sample(4, dtype="numpy")
        for field in FIELDS:
            getattr(sampled, field)[...] = 7
    assert np.ascontiguousarray(fast.core._storage.arrays[0]).tobytes() == \
        np.ascontiguousarray(before).tobytes()
    runs = [fast.last(3, dtype="numpy"), fast.all(dtype="numpy"),
            fast.all(flatten_env=True, dtype="numpy"), fast.last(5, True, "numpy")]
    tensors = [fast.last(3), fast.all(), fast.last(5, flatten_env=True)]
    if cls is RolloutBuffer:
        runs.append(fast.sample(4, dtype="numpy"))
        tensors.append(fast.sample(3, dtype="torch"))
    kept = [[np.array(getattr(r, f)) for f in FIELDS] for r in runs]
    kept_t = [[getattr(r, f).clone() for f in FIELDS] for r in tensors]
    for run in runs:
        for field in FIELDS:
            with pytest.raises(ValueError):
                getattr(run, field)[...] = 7
    steps(14, obs)  # wraps the ring twice, through episode ends
    for run, was in zip(runs, kept):
        for field, x in zip(FIELDS, was):
            np.testing.assert_array_equal(getattr(run, field), x)
    for run, was in zip(tensors, kept_t):
        for field, x in zip(FIELDS, was):
            assert torch.equal(getattr(run, field), x)
    if cls is ReplayBuffer:
        # [num_envs, K] of a vector env: strided, as Pearl's swapaxes made them; over
        # every (step, env) pair: contiguous copies.
        assert not fast.sample(4).observations.is_contiguous()
        for field in FIELDS:
            assert getattr(fast.sample(4, flatten_env=True), field).is_contiguous()


def test_adds_during_a_save_leave_the_snapshot_as_it_was():
    """While a save streams its snapshot, writes must go through the copy-on-write
    storage: the fast add steps aside, so the snapshot still reads what the buffer held
    when it was taken."""
    fast, _ = pair(ReplayBuffer, None, 8, 0)
    taken = counting(fast)
    rng = np.random.default_rng(1)
    obs = rng.standard_normal(3, dtype=np.float32)

    def step(obs):
        nxt = rng.standard_normal(3, dtype=np.float32)
        action = rng.uniform(-1, 1, 2).astype(np.float32)
        fast.add_trajectory(obs, action, 1.0, nxt, False, False)
        return nxt

    for _ in range(12):  # wrapped: later adds overwrite what the snapshot holds
        obs = step(obs)
    core = fast.core
    with core._lock:
        _, streams = core.snapshot()
        reference = {name: [np.array(a) for a in rows._read(np.arange(rows.count))]
                     for name, rows in streams.items()}
    before = taken[0]
    for _ in range(5):
        obs = step(obs)
    assert taken[0] == before  # no shortcut while the snapshot is open
    with core._lock:
        for name, rows in streams.items():
            for got, want in zip(rows.read(0, rows.count), reference[name]):
                np.testing.assert_array_equal(got, want)
        core.release_snapshot()
    obs = step(obs)
    assert taken[0] == before + 1  # and the shortcut again once it is closed
