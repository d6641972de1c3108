"""What a transition, rollout or HER buffer's checkpoint keeps of its constructor's
arguments: every argument that changes how the buffer behaves comes back with
``rb.load`` (``sample_on_device``, a prioritized buffer's ``device_search``,
``memory``), and a checkpoint written before an argument was saved loads as it did.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.persist.manifest import manifest_checksum

torch = pytest.importorskip("torch")

from replaybuffer.sampling.prioritized import PrioritizedSampler  # noqa: E402
from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler  # noqa: E402
from replaybuffer.sampling.torch_uniform import TorchUniformSampler  # noqa: E402
from replaybuffer.sampling.uniform import UniformSampler  # noqa: E402

OBS, ACT = rb.ArraySpec((2,), np.float32), rb.ArraySpec((), np.int64)


def filled(buf, adds: int = 12):
    for t in range(adds):
        obs = np.full((buf.num_envs, 2), t, np.float32)
        buf.add(obs, np.zeros(buf.num_envs, np.int64), np.ones(buf.num_envs, np.float32),
                obs + 1, np.zeros(buf.num_envs, bool), np.zeros(buf.num_envs, bool))
    return buf


def only_checkpoint(root: Path) -> Path:
    (directory,) = [p for p in root.iterdir() if p.is_dir()]
    return directory


def rewrite_config(root: Path, drop: tuple[str, ...]) -> None:
    """Make ``root``'s checkpoint look written before ``drop`` were saved."""
    manifest_path = only_checkpoint(root) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for key in drop:
        manifest["config"].pop(key, None)
    manifest.pop("checksum")
    manifest["checksum"] = manifest_checksum(manifest)
    manifest_path.write_text(json.dumps(manifest, indent=1))


@pytest.mark.parametrize("cls", [rb.TransitionReplayBuffer,
                                 rb.PrioritizedTransitionReplayBuffer])
def test_sample_on_device_comes_back_with_load(tmp_path, cls):
    buf = filled(cls(OBS, ACT, 24, num_envs=2, storage="torch", sample_on_device=True,
                     seed=3))
    device_sampler = TorchPrioritizedSampler if cls is not rb.TransitionReplayBuffer \
        else TorchUniformSampler
    assert isinstance(buf.sampler, device_sampler)
    buf.save(tmp_path)
    loaded = rb.load(tmp_path)
    assert isinstance(loaded.sampler, device_sampler)
    ours, info = loaded.sample(16)
    assert isinstance(info.ids, torch.Tensor)
    # The restored device generator draws what the original's would.
    theirs, their_info = buf.sample(16)
    np.testing.assert_array_equal(info.ids.numpy(), their_info.ids.numpy())
    np.testing.assert_array_equal(ours.next_observations.numpy(),
                                  theirs.next_observations.numpy())


def test_a_checkpoint_without_sample_on_device_loads_on_the_host(tmp_path):
    buf = filled(rb.TransitionReplayBuffer(OBS, ACT, 24, num_envs=2, storage="torch",
                                           sample_on_device=True, seed=3))
    buf.save(tmp_path)
    rewrite_config(tmp_path, ("sample_on_device",))
    loaded = rb.load(tmp_path)
    assert type(loaded.sampler) is UniformSampler
    assert isinstance(loaded.sample(4)[1].ids, torch.Tensor)  # torch storage still


def test_host_sampling_saves_no_new_keys(tmp_path):
    """A buffer built without the arguments writes the config it always wrote."""
    filled(rb.TransitionReplayBuffer(OBS, ACT, 24, num_envs=2, seed=3)).save(tmp_path)
    manifest = json.loads((only_checkpoint(tmp_path) / "manifest.json").read_text())
    assert set(manifest["config"]) == {"observation_spec", "action_spec", "capacity",
                                       "num_envs", "n_step", "gamma", "seed"}


def test_a_device_sampled_checkpoint_loads_into_numpy_storage(tmp_path):
    """Sampling on the device needs torch storage: loaded into numpy it samples on the
    host, as a load into other storage asks."""
    buf = filled(rb.PrioritizedTransitionReplayBuffer(
        OBS, ACT, 24, num_envs=2, storage="torch", sample_on_device=True,
        device_search="tree", seed=3))
    buf.save(tmp_path)
    loaded = rb.load(tmp_path, storage="numpy")
    assert type(loaded.sampler) is PrioritizedSampler
    assert isinstance(loaded.sample(4)[1].ids, np.ndarray)


@pytest.mark.parametrize("search", ["tree", "prefix"])
def test_device_search_comes_back_with_load(tmp_path, search):
    buf = filled(rb.PrioritizedTransitionReplayBuffer(
        OBS, ACT, 24, num_envs=2, storage="torch", sample_on_device=True,
        device_search=search, seed=3))
    buf.save(tmp_path)
    loaded = rb.load(tmp_path)
    assert loaded.sampler.search == search


@pytest.mark.parametrize("cls", [rb.TransitionReplayBuffer, rb.RolloutBuffer])
def test_memory_strict_comes_back_with_load(tmp_path, cls):
    buf = filled(cls(OBS, ACT, 24, num_envs=2, seed=3, memory="strict"))
    buf.save(tmp_path)
    manifest = json.loads((only_checkpoint(tmp_path) / "manifest.json").read_text())
    assert manifest["config"]["memory"] == "strict"
    assert rb.load(tmp_path).constructor_config()["memory"] == "strict"


def test_her_memory_strict_comes_back_with_load(tmp_path):
    goal = rb.ArraySpec((2,), np.float32)
    spec = {"observation": OBS, "achieved_goal": goal, "desired_goal": goal}
    buf = rb.HERBuffer(spec, ACT, 24, num_envs=2, seed=3, memory="strict")
    buf.save(tmp_path)
    loaded = rb.load(tmp_path)
    assert loaded.constructor_config()["memory"] == "strict"
