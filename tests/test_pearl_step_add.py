"""compat.pearl's ``add_trajectory`` as the core's one-call adder
(``TransitionReplayBuffer.step_adder``): Pearl's argument names, a subclass's own
``add_trajectory`` left alone, the buffer's life (reset, save and load) and threads.
The byte-for-byte comparison with the general path over random scripts is in
tests/test_compat_pearl_fast.py (the slow twin drops the adder) and, for the core,
tests/test_transition_step_add.py."""

import inspect
import sys
import threading

import numpy as np
import pytest
from gymnasium import spaces

from replaybuffer.compat.pearl import HERBuffer, ReplayBuffer, RolloutBuffer
from replaybuffer.errors import SpecError

FIELDS = ("observations", "actions", "rewards", "next_observations", "dones")
OBS = spaces.Box(-5, 5, (3,), np.float32)
ACT = spaces.Box(-1, 1, (2,), np.float32)


def build(cls, num_envs, buffer_size=8, **kwargs):
    return cls(buffer_size=buffer_size, device="cpu", num_envs=num_envs, seed=0,
               observation_space=OBS, action_space=ACT, **kwargs)


def general(buffer):
    """``buffer`` without the adder (``add_trajectory`` the class's method again)."""
    vars(buffer).pop("add_trajectory")
    buffer._step_add = None
    buffer._add_single = buffer._add_usual = None
    buffer._direct = False
    return buffer


def steps(num_envs, count, seed=0):
    rng = np.random.default_rng(seed)
    shape = (num_envs,) if num_envs else ()
    obs = rng.standard_normal(shape + (3,), dtype=np.float32)
    for t in range(count):
        nxt = rng.standard_normal(shape + (3,), dtype=np.float32)
        action = rng.uniform(-1, 1, shape + (2,)).astype(np.float32)
        end = t % 5 == 4
        if num_envs:
            yield obs, action, rng.standard_normal(num_envs), nxt, np.full(num_envs, end)
        else:
            yield obs, action, float(rng.standard_normal()), nxt, end
        obs = rng.standard_normal(shape + (3,), dtype=np.float32) if end else nxt


def assert_same_data(a, b):
    assert a.core.last_id == b.core.last_id
    for x, y in zip(a.core.store.arrays, b.core.store.arrays):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    if a.core.last_id >= 0:
        x, y = a.all(dtype="numpy"), b.all(dtype="numpy")
        for field in FIELDS:
            assert getattr(x, field).tobytes() == getattr(y, field).tobytes()


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
@pytest.mark.parametrize("num_envs", [None, 2])
def test_add_trajectory_is_the_compiled_adder_with_pearls_names(cls, num_envs):
    fast, slow = build(cls, num_envs), general(build(cls, num_envs))
    assert fast.add_trajectory is fast._step_add
    method = vars(cls)["add_trajectory"]
    assert inspect.signature(fast.add_trajectory) == \
        inspect.signature(method.__get__(fast, cls))
    assert fast.add_trajectory.__doc__ == method.__doc__
    assert fast.add_trajectory.__name__ == "add_trajectory"
    for obs, action, reward, nxt, done in steps(num_envs, 30):
        kwargs = dict(observation=obs, action=action, reward=reward, next_observation=nxt,
                      done=done, truncated=None)
        if cls is RolloutBuffer:
            kwargs["value"] = np.float32(0.5) if num_envs is None else \
                np.full(num_envs, 0.5, np.float32)
        fast.add_trajectory(**kwargs)
        slow.add_trajectory(**kwargs)
    assert_same_data(fast, slow)


class OwnAdd(ReplayBuffer):
    """A user's subclass with its own add_trajectory: that one must run."""

    def add_trajectory(self, *args, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        super().add_trajectory(*args, **kwargs)


class Inherits(ReplayBuffer):
    pass


def test_a_subclass_keeps_its_own_add_trajectory():
    own, inherits = build(OwnAdd, None), build(Inherits, None)
    assert own._step_add is None and "add_trajectory" not in vars(own)
    assert inherits._step_add is not None
    obs = np.zeros(3, np.float32)
    own.add_trajectory(obs, np.zeros(2, np.float32), 1.0, obs + 1, False)
    assert own.calls == 1 and own.core.last_id == 0
    # ReplayBuffer's own add_trajectory (the fallback) still takes the core's shortcut.
    own.add_trajectory(obs + 1, np.zeros(2, np.float32), 1.0, obs + 2, False)
    assert own.calls == 2 and own.core.last_id == 1


def test_no_adder_where_the_adapter_converts():
    discrete = ReplayBuffer(buffer_size=4, observation_space=OBS,
                            action_space=spaces.Discrete(3))
    goal = spaces.Dict({"observation": OBS, "achieved_goal": ACT, "desired_goal": ACT})
    her = HERBuffer(buffer_size=4, observation_space=goal, action_space=ACT,
                    compute_reward=lambda a, d, i: np.zeros(len(a)))
    nested = ReplayBuffer(buffer_size=4, observation_space=goal, action_space=ACT)
    for buffer in (discrete, her, nested):
        assert buffer._step_add is None and "add_trajectory" not in vars(buffer)


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
@pytest.mark.parametrize("num_envs", [None, 3])
def test_reset_save_and_load_keep_adding_exactly(cls, num_envs, tmp_path):
    """The adder binds the core's arrays once: after reset() and in a loaded buffer
    (which builds its own), adds still write what the general path writes."""
    fast, slow = build(cls, num_envs), general(build(cls, num_envs))
    script = list(steps(num_envs, 40, seed=3))
    for i, step in enumerate(script[:20]):
        fast.add_trajectory(*step)
        slow.add_trajectory(*step)
        if i == 11:
            fast.reset()
            slow.reset()
    fast.save(tmp_path / "fast")
    loaded = cls.load(tmp_path / "fast", device="cpu", observation_space=OBS,
                      action_space=ACT)
    assert loaded.add_trajectory is loaded._step_add is not None
    for step in script[20:]:
        loaded.add_trajectory(*step)
        slow.add_trajectory(*step)
    assert_same_data(loaded, slow)


def test_bad_input_raises_the_general_paths_error_and_changes_nothing():
    fast, slow = build(ReplayBuffer, 2), general(build(ReplayBuffer, 2))
    obs = np.zeros((2, 3), np.float32)
    for buffer in (fast, slow):
        buffer.add_trajectory(obs, np.zeros((2, 2), np.float32), np.zeros(2), obs + 1,
                              np.zeros(2, bool))
    before = [np.array(a) for a in fast.core.store.arrays]
    for bad in ({"action": np.zeros((2, 5), np.float32)}, {"reward": np.zeros(3)},
                {"observation": np.zeros((3, 3), np.float32)}):
        args = dict(observation=obs + 1, action=np.zeros((2, 2), np.float32),
                    reward=np.zeros(2), next_observation=obs + 2, done=np.zeros(2, bool))
        args.update(bad)
        errors = []
        for buffer in (fast, slow):
            with pytest.raises(SpecError) as got:
                buffer.add_trajectory(**args)
            errors.append(str(got.value))
        assert errors[0] == errors[1]
        assert fast.core.last_id == 0
        for a, b in zip(fast.core.store.arrays, before):
            assert np.asarray(a).tobytes() == b.tobytes()


def test_reads_from_another_thread_see_whole_adds():
    """A reader thread beside an env loop of adds (taken by the adder), thread switches
    forced often: every transition read is one that was added whole (observation,
    action, reward and next observation together): the adder holds the core's lock
    around its write and bookkeeping, as the core's other writes do."""
    buffer = build(ReplayBuffer, None, buffer_size=16)
    added, errors, done = {}, [], threading.Event()
    rng = np.random.default_rng(0)
    obs = rng.standard_normal(3, dtype=np.float32)

    def reader():
        try:
            while not done.is_set():
                if buffer.core.last_id < 3:
                    continue
                batch = buffer.last(4, dtype="numpy")
                for o, a, r, n in zip(batch.observations, batch.actions, batch.rewards,
                                      batch.next_observations):
                    assert added[o.tobytes()] == (a.tobytes(), float(r[0]), n.tobytes())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for t in range(3000):
            nxt = rng.standard_normal(3, dtype=np.float32)
            action = rng.standard_normal(2, dtype=np.float32)
            added[obs.tobytes()] = (action.tobytes(), float(t), nxt.tobytes())
            buffer.add_trajectory(obs, action, float(t), nxt, t % 50 == 49)
            obs = rng.standard_normal(3, dtype=np.float32) if t % 50 == 49 else nxt
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
