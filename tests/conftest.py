"""Shared fixtures: every buffer test runs against each storage backend."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter

# "torch-ops" runs the CPU torch storage through torch operations, the code path
# every other device takes, so that it is tested on machines without a GPU.
STORAGES = ["numpy", "torch", "torch-ops"]
try:
    import torch

    if torch.cuda.is_available():
        STORAGES.append("torch-cuda")
except ImportError:  # torch is a test dependency; this only guards odd installs
    torch = None
# "tensorflow" is tensorflow storage (the Python ring over TF variables) under every
# buffer class; the TF-graph buffer, replaybuffer.tf.TFUniformReplayBuffer, is named by
# the tests that test it. An optional extra.
HAVE_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
STORAGES.append("tensorflow")

# Tests outside the TF backend's own files that reach into what the TensorFlow backend
# does not have; each is skipped for it with the reason given.
TENSORFLOW_SKIPS: dict[str, str] = {}


@pytest.fixture(params=STORAGES)
def storage(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Keyword arguments selecting a storage backend: ``UniformReplayBuffer(..., **storage)``."""
    if request.param == "tensorflow":
        if not HAVE_TENSORFLOW:
            pytest.skip("tensorflow is not installed (pip install 'replaybuffer[tensorflow]')")
        reason = TENSORFLOW_SKIPS.get(f"{request.node.path.name}::{request.node.originalname}")
        if reason:
            pytest.skip(reason)
        return {"storage": "tensorflow"}
    if request.param == "torch-cuda":
        return {"storage": "torch", "device": "cuda"}
    if request.param == "torch-ops":
        from replaybuffer.storage.torch_storage import TorchStorage

        monkeypatch.setattr(TorchStorage, "numpy_views", False)
        return {"storage": "torch"}
    return {"storage": request.param}


def to_np(x):
    """A numpy copy of an array, tensor (torch or TensorFlow), scalar, or a nest of them."""
    from replaybuffer import nest

    def one(leaf):
        if hasattr(leaf, "detach"):
            return leaf.detach().cpu().numpy()
        if hasattr(leaf, "numpy") and not isinstance(leaf, np.ndarray):  # tf.Tensor, Variable
            return np.asarray(leaf.numpy())
        return np.asarray(leaf)
    return nest.map_structure(one, x)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", type=float, default=None, metavar="SECONDS",
                     help="run tests/test_soak.py's randomized fault soak for SECONDS "
                          "(default: REPLAYBUFFER_SOAK_SECONDS, else a 20 s bounded run)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soak runs for as long as it is asked to: its timeout is that plus 5 minutes."""
    option = config.getoption("--soak")
    seconds = option if option is not None else float(
        os.environ.get("REPLAYBUFFER_SOAK_SECONDS", 20))
    for item in items:
        if item.name == "test_randomized_soak":
            item.add_marker(pytest.mark.timeout(seconds + 300))
