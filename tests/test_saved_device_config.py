"""A uniform or prioritized buffer's checkpoint keeps the device choices it was built
with (``sample_on_device``, ``capture_samples``, a prioritized buffer's
``device_search``): ``rb.load`` gives a buffer that samples where the saved one did.
A buffer built without them saves the config it always saved, and a load into numpy
storage drops them (it samples on the host)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import replaybuffer as rb

torch = pytest.importorskip("torch")

from replaybuffer.sampling.prioritized import PrioritizedSampler  # noqa: E402
from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler  # noqa: E402
from replaybuffer.sampling.torch_uniform import TorchUniformSampler  # noqa: E402
from replaybuffer.sampling.uniform import UniformSampler  # noqa: E402
from replaybuffer.storage.torch_storage import TorchStorage  # noqa: E402

SPEC = rb.ArraySpec((3,), np.float32)


@pytest.fixture
def packed_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch storage on the CPU with the device layout (packed blocks), which is what
    a recording gathers from (as in tests/test_captured_draws.py)."""
    monkeypatch.setattr(TorchStorage, "numpy_views", False)


def filled(buf):
    for t in range(10):
        buf.add_batch(np.full((2, 3), t, np.float32))
    return buf


def saved_config(root: Path) -> dict:
    (directory,) = [p for p in root.iterdir() if p.is_dir()]
    return json.loads((directory / "manifest.json").read_text())["config"]


@pytest.mark.parametrize("cls, device_sampler", [
    (rb.UniformReplayBuffer, TorchUniformSampler),
    (rb.PrioritizedReplayBuffer, TorchPrioritizedSampler)])
def test_sample_on_device_comes_back_with_load(tmp_path, cls, device_sampler):
    buf = filled(cls(SPEC, 2, 16, storage="torch", sample_on_device=True, seed=1))
    buf.save(tmp_path)
    assert saved_config(tmp_path)["sample_on_device"] is True
    loaded = rb.load(tmp_path)
    assert isinstance(loaded.sampler, device_sampler)
    _, info = loaded.get_next(8)
    _, theirs = buf.get_next(8)
    assert isinstance(info.ids, torch.Tensor)
    np.testing.assert_array_equal(info.ids.numpy(), theirs.ids.numpy())


def test_device_search_comes_back_with_load(tmp_path):
    buf = filled(rb.PrioritizedReplayBuffer(SPEC, 2, 16, storage="torch",
                                            sample_on_device=True, device_search="tree"))
    buf.save(tmp_path)
    assert rb.load(tmp_path).sampler.search == "tree"


@pytest.mark.parametrize("cls", [rb.UniformReplayBuffer, rb.PrioritizedReplayBuffer])
def test_capture_samples_comes_back_with_load(tmp_path, cls, packed_on_cpu):
    buf = filled(cls(SPEC, 2, 16, storage="torch", sample_on_device=True,
                     capture_samples=True, seed=1))
    buf.save(tmp_path)
    assert saved_config(tmp_path)["capture_samples"] is True
    assert rb.load(tmp_path).constructor_config()["capture_samples"] is True


@pytest.mark.parametrize("cls", [rb.UniformReplayBuffer, rb.PrioritizedReplayBuffer])
def test_defaults_save_no_device_keys(tmp_path, cls):
    filled(cls(SPEC, 2, 16, seed=1)).save(tmp_path)
    assert not {"sample_on_device", "capture_samples", "device_search"} \
        & set(saved_config(tmp_path))


@pytest.mark.parametrize("cls, host_sampler", [
    (rb.UniformReplayBuffer, UniformSampler),
    (rb.PrioritizedReplayBuffer, PrioritizedSampler)])
def test_a_device_sampled_checkpoint_loads_into_numpy_storage(tmp_path, cls, host_sampler,
                                                              packed_on_cpu):
    buf = filled(cls(SPEC, 2, 16, storage="torch", sample_on_device=True,
                     capture_samples=True, seed=1))
    buf.save(tmp_path)
    loaded = rb.load(tmp_path, storage="numpy")
    assert type(loaded.sampler) is host_sampler
    assert isinstance(loaded.get_next(4)[1].ids, np.ndarray)


@pytest.mark.parametrize("cls, keywords", [
    (rb.UniformReplayBuffer, {"capture_samples": True}),
    (rb.PrioritizedReplayBuffer, {"capture_samples": True}),
    (rb.PrioritizedReplayBuffer, {"device_search": "tree"})])
def test_a_gpu_default_checkpoint_loads_onto_the_cpu(tmp_path, monkeypatch, cls, keywords,
                                                     packed_on_cpu):
    """On a GPU, ``sample_on_device`` left to ``None`` samples on the device, and the
    device keywords given with it are saved; a load onto the CPU
    (``device="cpu"``) must not resolve the default there (off) and refuse them."""
    module = __import__(cls.__module__, fromlist=["samples_on_device"])
    real = module.samples_on_device

    def as_on_a_gpu(storage, device, sample_on_device, track_episodes):
        # What torch storage on "cuda" decides for sample_on_device=None.
        if sample_on_device is None and storage == "torch" and not track_episodes:
            return True
        return real(storage, device, sample_on_device, track_episodes)

    monkeypatch.setattr(module, "samples_on_device", as_on_a_gpu)
    buf = filled(cls(SPEC, 2, 16, storage="torch", seed=1, **keywords))
    monkeypatch.setattr(module, "samples_on_device", real)
    buf.save(tmp_path)
    assert saved_config(tmp_path)["sample_on_device"] is True
    loaded = rb.load(tmp_path, storage="torch", device="cpu")
    assert loaded.constructor_config() == buf.constructor_config()
    assert isinstance(loaded.get_next(4)[1].ids, torch.Tensor)


@pytest.mark.parametrize("cls", [rb.UniformReplayBuffer, rb.PrioritizedReplayBuffer])
def test_a_gpu_recording_checkpoint_loads_onto_the_cpu_layout_eagerly(tmp_path,
                                                                      monkeypatch, cls):
    """A CUDA buffer with ``capture_samples=True`` (its config as saved there: the
    device's default sampling on it) loaded with ``device="cpu"`` into torch storage's
    CPU layout, which cannot serve recordings: it loads, samples on the device eagerly,
    and does not claim recordings."""
    with monkeypatch.context() as m:
        m.setattr(TorchStorage, "numpy_views", False)  # the layout CUDA storage has
        buf = filled(cls(SPEC, 2, 16, storage="torch", sample_on_device=True,
                         capture_samples=True, seed=1))
    buf.save(tmp_path)
    assert TorchStorage.numpy_views  # the load gets the CPU layout
    loaded = rb.load(tmp_path, storage="torch", device="cpu")
    assert "capture_samples" not in loaded.constructor_config()
    assert loaded.constructor_config()["sample_on_device"] is True
    _, info = loaded.get_next(4)
    assert isinstance(info.ids, torch.Tensor)
