"""Reproducers for the review of the changes merged after 108b677 (up to 6c24279): each
test failed on 6c24279."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.errors import SpecError


class BareVectorEnv(gym.vector.VectorEnv):
    """A vector env of two envs that says what its ``metadata`` says and nothing more
    (a custom or third-party vector env; gymnasium 1.0's had no ``autoreset_mode``)."""

    def __init__(self, metadata: dict):
        self.metadata = metadata
        self.num_envs = 2
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.single_action_space = gym.spaces.Discrete(4)


def test_from_env_on_gymnasium_without_autoreset_modes_refuses_with_a_value_error(
        monkeypatch):
    # gymnasium 1.0 (below pyproject's >= 1.1, installed anyway) has no AutoresetMode:
    # its vector envs all reset with NEXT_STEP. 6c24279 raised AttributeError from inside from_env.
    env = BareVectorEnv({})
    monkeypatch.delattr(gym.vector, "AutoresetMode")
    with pytest.raises(ValueError, match=r"TransitionReplayBuffer\.from_env: gymnasium .*"
                                         r"NEXT_STEP.*gymnasium >= 1\.1.*SAME_STEP"):
        rb.TransitionReplayBuffer.from_env(env, capacity=16)


def test_from_env_refuses_next_step_given_by_its_value_and_takes_same_step_so():
    # gymnasium's constructors take the mode as an enum or its value ("NextStep"); a
    # vector env whose metadata holds the value resets the same way.
    with pytest.raises(ValueError, match="autoreset_mode NEXT_STEP"):
        rb.TransitionReplayBuffer.from_env(
            BareVectorEnv({"autoreset_mode": "NextStep"}), capacity=16)
    buffer = rb.TransitionReplayBuffer.from_env(
        BareVectorEnv({"autoreset_mode": "SameStep"}), capacity=16)
    assert buffer.num_envs == 2
    buffer = rb.TransitionReplayBuffer.from_env(
        BareVectorEnv({"autoreset_mode": gym.vector.AutoresetMode.DISABLED}), capacity=16)
    assert buffer.num_envs == 2


def _two_steps() -> rb.PrioritizedReplayBuffer:
    buffer = rb.PrioritizedReplayBuffer({"x": rb.ArraySpec((), np.float32)}, 1, 8, seed=0)
    for value in (1.0, 2.0):
        buffer.add_batch({"x": np.full(1, value, np.float32)})
    buffer.update_priorities(np.array([0, 1]), np.array([0.5, 3.0]))
    return buffer


@pytest.mark.parametrize("ids", [np.array([True, False]), np.array([0.0, 1.0]),
                                 np.array(["0", "1"])])
def test_priorities_given_bad_ids_names_priorities_and_changes_nothing(ids):
    # 6c24279's message named update_priorities, which the caller never called.
    buffer = _two_steps()
    before = buffer.priorities(np.array([0, 1]))
    with pytest.raises(ValueError, match=r"^priorities: .*got " + re.escape(str(ids.dtype))):
        buffer.priorities(ids)
    np.testing.assert_array_equal(buffer.priorities(np.array([0, 1])), before)
    assert buffer.last_id == 1


def test_update_priorities_still_names_itself():
    buffer = _two_steps()
    with pytest.raises(ValueError, match=r"^update_priorities: ids must be integers"):
        buffer.update_priorities(np.array([True, False]), np.array([1.0, 1.0]))


@pytest.mark.parametrize("shape", [np.int64(3), np.uint8(3)])
def test_array_spec_of_a_numpy_integer_shape_says_how_to_write_one_dimension(shape):
    with pytest.raises(SpecError, match=re.escape("(one dimension is written (3,))")):
        rb.ArraySpec(shape, np.float32)


def test_spec_from_space_given_a_legacy_gym_space_says_it_is_one():
    # 6c24279 said "expected a gymnasium space, got Box": a Box is what it takes.
    legacy_box = type("Box", (), {"__module__": "gym.spaces.box", "shape": (3,),
                                  "dtype": np.dtype(np.float32)})()
    with pytest.raises(SpecError, match=r"got Box of the legacy gym package: make the env "
                                        r"with gymnasium"):
        rb.spec_from_space(legacy_box)
