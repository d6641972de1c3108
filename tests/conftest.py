"""Shared fixtures: every buffer test runs against each storage backend."""

from __future__ import annotations

import numpy as np
import pytest

# "torch-ops" runs the CPU torch storage through torch operations, the code path
# every other device takes, so that it is tested on machines without a GPU.
STORAGES = ["numpy", "torch", "torch-ops"]
try:
    import torch

    if torch.cuda.is_available():
        STORAGES.append("torch-cuda")
except ImportError:  # torch is a test dependency; this only guards odd installs
    torch = None


@pytest.fixture(params=STORAGES)
def storage(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Keyword arguments selecting a storage backend: ``UniformReplayBuffer(..., **storage)``."""
    if request.param == "torch-cuda":
        return {"storage": "torch", "device": "cuda"}
    if request.param == "torch-ops":
        from replaybuffer.storage.torch_storage import TorchStorage

        monkeypatch.setattr(TorchStorage, "numpy_views", False)
        return {"storage": "torch"}
    return {"storage": request.param}


def to_np(x):
    """A numpy copy of an array, tensor, scalar, or a nest of them."""
    from replaybuffer import nest

    def one(leaf):
        if hasattr(leaf, "detach"):
            return leaf.detach().cpu().numpy()
        return np.asarray(leaf)
    return nest.map_structure(one, x)
