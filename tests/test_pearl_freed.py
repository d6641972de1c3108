"""A deleted Pearl adapter, its core, and a transition buffer whose one-call adder
(``TransitionReplayBuffer.step_adder``) was built are freed at once, by reference
counting, not left in reference cycles for the garbage collector (which may run late,
with the buffer's memory held meanwhile). Checked with the collector off."""

from __future__ import annotations

import gc
import weakref

import gymnasium as gym
import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.compat.pearl import HERBuffer, ReplayBuffer, RolloutBuffer

torch = pytest.importorskip("torch")

OBS_SPACE = gym.spaces.Box(-1, 1, (3,), np.float32)
ACT_SPACE = gym.spaces.Box(-1, 1, (2,), np.float32)


@pytest.fixture
def collector_off():
    """Nothing freed but by reference counting while the test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def assert_freed_on_del(owner: dict, *names: str) -> None:
    """Delete ``owner["obj"]`` (the test's only reference) and check that it and the
    objects reached from it by ``names`` (attribute paths) are gone at once."""
    obj = owner["obj"]
    refs = [weakref.ref(obj)]
    for name in names:
        refs.append(weakref.ref(getattr(obj, name)))
    del obj
    owner.clear()
    for name, ref in zip(("the object",) + names, refs):
        assert ref() is None, f"{name} outlived del (a reference cycle)"


def used_adapter(cls, num_envs):
    """An adapter that has taken steps through the one-call adder and its fallback (a
    reset's observation, tensors) and served numpy and torch reads."""
    vector = num_envs is not None
    buffer = cls(observation_space=OBS_SPACE, action_space=ACT_SPACE, buffer_size=16,
                 num_envs=num_envs, device="cpu")
    envs = num_envs or 1
    shape = (envs,) if vector else ()
    obs = np.zeros(shape + (3,), np.float32)
    for t in range(6):
        nxt = obs + 1
        reward = np.ones(envs) if vector else 1.0
        done = np.zeros(envs, bool) if vector else False
        buffer.add_trajectory(obs, np.zeros(shape + (2,), np.float32), reward, nxt, done)
        obs = nxt if t != 3 else nxt + 10  # a reset: the fallback's step
    buffer.add_trajectory(torch.as_tensor(obs), torch.zeros(shape + (2,)), reward,
                          torch.as_tensor(obs + 1), done)  # tensors: the fallback's
    buffer.sample(4, dtype="numpy")
    buffer.sample(4, dtype="torch")
    buffer.last(2, dtype="torch")
    buffer.all(dtype="numpy")
    return buffer


@pytest.mark.parametrize("num_envs", [None, 4])
@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer])
def test_a_deleted_pearl_adapter_and_its_core_are_freed_at_once(collector_off, cls,
                                                                num_envs):
    owner = {"obj": used_adapter(cls, num_envs)}
    assert owner["obj"]._step_add is not None  # the adder is installed
    assert_freed_on_del(owner, "core")


def test_a_deleted_pearl_her_buffer_is_freed_at_once(collector_off):
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    space = gym.spaces.Dict(observation=OBS_SPACE, achieved_goal=box, desired_goal=box)
    buffer = HERBuffer(None, 16, observation_space=space, action_space=ACT_SPACE,
                       compute_reward=lambda a, d, info: -np.abs(a - d).sum(-1),
                       device="cpu")
    obs = {k: np.zeros(s.shape, np.float32) for k, s in space.spaces.items()}
    for t in range(4):
        buffer.add_trajectory(obs, np.zeros(2, np.float32), 0.0, obs, t == 3)
    owner = {"obj": buffer}
    del buffer
    assert_freed_on_del(owner, "core")


@pytest.mark.parametrize("envs", [1, 3])
@pytest.mark.parametrize("cls", [rb.TransitionReplayBuffer, rb.RolloutBuffer])
def test_a_buffer_whose_step_adder_was_built_is_freed_once_the_adder_is(collector_off,
                                                                        cls, envs):
    buf = cls(rb.ArraySpec((3,), np.float32), rb.ArraySpec((2,), np.float32), 12,
              num_envs=envs)
    single = envs == 1
    adder = buf.step_adder(buf.add_single if single else buf.add, env_axis=not single)
    assert adder is not None
    obs = np.zeros(3 if single else (envs, 3), np.float32)
    act = np.zeros(2 if single else (envs, 2), np.float32)
    assert adder(obs, act, 1.0 if single else np.ones(envs, np.float32), obs + 1,
                 False if single else np.zeros(envs, bool)) is None  # the adder's step
    ref = weakref.ref(buf)
    del buf
    assert ref() is not None  # the adder holds its buffer: it may still add
    adder(obs + 1, act, 1.0 if single else np.ones(envs, np.float32), obs + 2,
          False if single else np.zeros(envs, bool))
    assert len(ref()) == 2 * envs
    del adder
    assert ref() is None, "the buffer outlived its adder (a reference cycle)"
    owner = {"obj": cls(rb.ArraySpec((3,), np.float32), rb.ArraySpec((2,), np.float32),
                        12, num_envs=envs)}
    owner["obj"].step_adder(owner["obj"].add, env_axis=True)  # built, then dropped
    assert_freed_on_del(owner)



def used_transition_buffer():
    """A transition buffer that has written steps (through its storage's one-call
    writer) and sampled."""
    buffer = rb.TransitionReplayBuffer(OBS_SPACE, ACT_SPACE, 64)
    obs = np.zeros((1, 3), np.float32)
    for _ in range(5):
        buffer.add(obs, np.zeros((1, 2), np.float32), np.ones(1), obs + 1,
                   np.zeros(1, bool), np.zeros(1, bool))
        obs = obs + 1
    buffer.sample(8)
    return buffer


def test_a_used_transition_buffer_leaves_nothing_for_the_collector(collector_off):
    """Its storage's one-call writer (``storage/exact_writer.py``) sat in its own
    globals: a cycle that held the storage arrays until the collector ran."""
    used_transition_buffer()
    gc.collect()  # what a first use caches module-wide is not the buffer's
    buffer = used_transition_buffer()
    del buffer
    assert gc.collect() == 0


def test_add_trajectory_held_past_its_adapter_refuses_clearly(collector_off):
    """The one-call adder does not hold its adapter (that would be a cycle), so one held
    on its own outlives it: a step it hands to the fallback must say so, not fail on
    ``None`` inside the adapter's method."""
    add = ReplayBuffer(observation_space=OBS_SPACE, action_space=ACT_SPACE,
                       buffer_size=16, device="cpu").add_trajectory
    obs = np.zeros(3, np.float32)
    with pytest.raises(ReferenceError, match="the adapter it belongs to was deleted"):
        add(torch.as_tensor(obs), torch.zeros(2), 1.0, torch.as_tensor(obs + 1), False)
