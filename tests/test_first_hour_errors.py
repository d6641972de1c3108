"""The mistakes a new user makes in the first hour, and what the errors tell them.

Each error must name what was wrong, what was expected and what to do, and leave
nothing changed behind it.
"""

import re

import gymnasium as gym
import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.cli import main


def test_spec_from_space_given_an_env_says_which_spaces_to_pass():
    env = gym.make("CartPole-v1")
    with pytest.raises(rb.SpecError, match=r"got an environment \(TimeLimit\), not a space: "
                                           r"pass env\.observation_space or env\.action_space"):
        rb.spec_from_space(env)
    vector = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(rb.SpecError, match=r"pass env\.single_observation_space or "
                                           r"env\.single_action_space"):
        rb.spec_from_space(vector)


def test_spec_from_space_given_an_array_names_the_functions_that_take_one():
    with pytest.raises(rb.SpecError, match=r"expected a gymnasium space, got ndarray "
                                           r"\(rb\.spec_from_example"):
        rb.spec_from_space(np.zeros(3, np.float32))
    with pytest.raises(rb.SpecError, match="Sequence: it has no fixed shape"):
        rb.spec_from_space(gym.spaces.Sequence(gym.spaces.Discrete(2)))


@pytest.mark.parametrize("data_spec,pattern", [
    ({"obs": (4,)}, r"leaf \['obs'\]\[0\] is 4 \(int\): expected an ArraySpec.*"
                    r"a shape alone is not a spec: write rb\.ArraySpec\(shape, dtype\)"),
    ({"obs": rb.ArraySpec((4,), np.float32), "act": "int64"},
     r"leaf \['act'\] is 'int64' \(str\): expected an ArraySpec"),
    (7, r"leaf <root> is 7 \(int\)"),
])
def test_a_data_spec_leaf_that_is_not_a_spec_is_named_by_its_path(data_spec, pattern):
    with pytest.raises(rb.SpecError, match=pattern):
        rb.UniformReplayBuffer(data_spec, batch_size=2, max_length=4)


def test_a_data_spec_of_spaces_and_specs_still_converts_in_place():
    spec = rb.as_data_spec({"o": gym.spaces.Dict({"a": gym.spaces.Discrete(3)}),
                            "b": (rb.ArraySpec((), np.float32),)})
    assert spec == {"o": {"a": rb.BoundedArraySpec((), np.int64, 0, 2)},
                    "b": (rb.ArraySpec((), np.float32),)}


def test_loading_a_path_that_is_not_there_or_a_file_says_which(tmp_path):
    with pytest.raises(rb.CheckpointError, match=r"no checkpoint at .*nowhere: the path does "
                                                 r"not exist"):
        rb.load(tmp_path / "nowhere")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(rb.CheckpointError, match=r"afile is a file, not a checkpoint: pass "
                                                 r"the directory given to buffer\.save"):
        rb.load(tmp_path / "afile")


def test_inspect_of_a_missing_path_does_not_call_it_corrupt(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "typo")]) == 1
    err = capsys.readouterr().err
    assert "the path does not exist" in err and "corrupt" not in err
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(tmp_path / "empty")]) == 1
    assert "corrupt or incomplete" in capsys.readouterr().err  # there, but no save in it


def test_a_single_env_policy_returning_a_bare_action_is_told_about_the_batch_of_one():
    env = gym.make("CartPole-v1")
    buffer = rb.UniformReplayBuffer(rb.StepDriver(env, lambda o: o).data_spec, 1, 10)
    driver = rb.StepDriver(env, lambda obs: 1, [buffer.add_batch], num_steps=3, seed=0)
    with pytest.raises(rb.SpecError, match=r"leaf action: expected shape \(1,\).*got \(\); a "
                                           r"single env is driven as a batch of one"):
        driver.run()
    assert buffer.num_frames() == 0


def test_a_vector_env_policy_with_too_few_actions_gets_no_single_env_hint():
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    driver = rb.StepDriver(env, lambda obs: np.zeros(1, np.int64), num_steps=2, seed=0)
    with pytest.raises(rb.SpecError) as info:
        driver.run()
    assert "got (1,)" in str(info.value) and "batch of one" not in str(info.value)


def test_an_action_out_of_bounds_names_the_bounds_and_the_actions():
    env = gym.make("CartPole-v1")
    driver = rb.StepDriver(env, lambda obs: np.array([5]), num_steps=1, seed=0)
    with pytest.raises(rb.SpecError, match=r"outside \[0, 1\] \(the action space's bounds\) "
                                           r"in action: \[5\]"):
        driver.run()


def test_a_buffer_of_another_structure_is_told_to_use_the_driver_spec():
    env = gym.make("CartPole-v1")
    buffer = rb.UniformReplayBuffer({"obs": rb.ArraySpec((4,), np.float32)}, 1, 10)
    with pytest.raises(rb.SpecError, match=r"build the buffer from the driver's spec, "
                                           r"StepDriver\(env, policy\)\.data_spec"):
        rb.StepDriver(env, lambda obs: np.zeros(1, np.int64), [buffer.add_batch])
    assert len(buffer) == 0


def test_no_window_within_episodes_says_the_episodes_are_too_short():
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    rng = np.random.default_rng(0)
    policy = lambda obs: rng.integers(0, 2, len(obs))  # noqa: E731
    probe = rb.StepDriver(env, policy)
    buffer = rb.UniformReplayBuffer(probe.data_spec, 2, 1000, track_episodes=True, seed=0)
    rb.StepDriver(env, policy, [buffer.add_batch], num_steps=300, seed=0).run()
    held = len(buffer)
    with pytest.raises(rb.EmptyBufferError, match=r"no window of num_steps=100 lies within "
                                                  r"one episode: every episode .* is shorter "
                                                  r"than 100 steps.*Ask for fewer num_steps"):
        buffer.get_next(2, num_steps=100, within_episodes=True)
    assert len(buffer) == held
    items, _ = buffer.get_next(2, num_steps=4, within_episodes=True)  # short ones still fit
    assert items.observation.shape == (2, 4, 4)


def test_extend_given_one_step_without_its_time_axis_points_to_add_batch():
    buffer = rb.UniformReplayBuffer({"obs": rb.ArraySpec((4,), np.float32)}, 2, 10, seed=0)
    with pytest.raises(rb.SpecError, match=r"extend takes leaves \[batch_size, num_steps, "
                                           r"\*spec\.shape\].*one step is add_batch"):
        buffer.extend({"obs": np.zeros((2, 4), np.float32)})
    assert len(buffer) == 0
    with pytest.raises(rb.SpecError) as info:  # a wrong spec shape gets no such hint
        buffer.extend({"obs": np.zeros((2, 3, 5), np.float32)})
    assert "add_batch" not in str(info.value) and len(buffer) == 0
    buffer.extend({"obs": np.zeros((2, 3, 4), np.float32)})
    assert len(buffer) == 6


def test_reopen_of_a_missing_path_or_of_a_checkpoint_says_which(tmp_path):
    with pytest.raises(rb.CheckpointError, match=r"no buffer at .*gone: the path does not "
                                                 r"exist"):
        rb.reopen(tmp_path / "gone")
    buffer = rb.UniformReplayBuffer({"x": rb.ArraySpec((), np.float32)}, 1, 4)
    buffer.add_batch({"x": np.zeros(1, np.float32)})
    buffer.save(tmp_path / "ckpt")
    with pytest.raises(rb.CheckpointError, match=r"holds no buffer on mmap storage .*it holds "
                                                 r"a checkpoint: load it with "
                                                 r"replaybuffer\.load\("):
        rb.reopen(tmp_path / "ckpt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(rb.CheckpointError) as info:
        rb.reopen(tmp_path / "empty")
    assert "holds no buffer on mmap storage" in str(info.value) and "load" not in str(info.value)
    assert len(rb.load(tmp_path / "ckpt")) == 1  # the checkpoint is untouched


def test_array_spec_mistakes_say_how_to_write_it():
    with pytest.raises(rb.SpecError, match=r"shape must be a tuple of ints, got 4 \(one "
                                           r"dimension is written \(4,\)\)"):
        rb.ArraySpec(4, np.float32)
    with pytest.raises(rb.SpecError) as info:
        rb.ArraySpec((None,), np.float32)
    assert "one dimension" not in str(info.value)
    torch = pytest.importorskip("torch")
    with pytest.raises(rb.SpecError, match=r"dtype torch\.float32 is not a numpy dtype: pass "
                                           r"one such as np\.float32 \(rb\.spec_from_tensor"):
        rb.ArraySpec((4,), torch.float32)
    assert rb.spec_from_tensor_spec(torch.zeros(4)) == rb.ArraySpec((4,), np.float32)


@pytest.mark.parametrize("make", [
    lambda seed: rb.UniformReplayBuffer({"x": rb.ArraySpec((), np.float32)}, 1, 4, seed=seed),
    lambda seed: rb.PrioritizedReplayBuffer({"x": rb.ArraySpec((), np.float32)}, 1, 4,
                                            seed=seed),
    lambda seed: rb.TransitionReplayBuffer(rb.ArraySpec((2,), np.float32),
                                           rb.ArraySpec((), np.int64), 8, seed=seed),
])
def test_a_bad_seed_is_named_at_construction(make):
    with pytest.raises(TypeError, match=r"seed: expected an int in \[0, 2\*\*64\), got str 'a'"):
        make("a")
    with pytest.raises(ValueError, match=r"seed: expected an int in \[0, 2\*\*64\), got -1"):
        make(-1)
    assert make(np.int64(3)) is not None and make(None) is not None


@pytest.mark.parametrize("device", ["gpu", "cuda:x", 3.5])
def test_a_device_torch_cannot_name_is_refused_naming_device(device):
    """torch's own error names no argument (``Expected one of cpu, cuda, ...``)."""
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"device must be a torch device or its name .* "
                                         rf"got {re.escape(repr(device))}"):
        rb.UniformReplayBuffer({"x": rb.ArraySpec((), np.float32)}, 2, 4, storage="torch",
                               device=device)
