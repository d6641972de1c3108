"""What the tests on a local Ray cluster share: starting it, killing a shard's process
and waiting for its restart, recording the errors Ray would log as unhandled, the
chi-square check of sampling distributions, and a handle that counts the client's mass
questions."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import ray


def start_local_cluster() -> None:
    """A local cluster of 2 CPUs whose workers import the test modules' buffer
    factories by name (this folder on their path, before the caller's PYTHONPATH)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})


def record_unhandled_errors(monkeypatch) -> list[BaseException]:
    """The errors Ray logs as unhandled from now on (an error nobody read, when its
    object is freed), recorded: Ray's handler patched through ``monkeypatch``."""
    import ray._private.worker as ray_worker

    seen: list[BaseException] = []
    monkeypatch.setattr(ray_worker, "_unhandled_error_handler", seen.append)
    return seen


def free_dropped_refs() -> None:
    """Let Ray free the objects whose references were dropped: it reports an unread
    error (to :func:`record_unhandled_errors`) only then."""
    gc.collect()
    time.sleep(1.0)


def kill_and_wait_restarted(buffer, shard: int) -> None:
    """Kill a shard's process and wait until Ray has restarted it, asking the actor
    directly so that the client does not notice."""
    before = ray.get(buffer.actors[shard].describe.remote())["incarnation"]
    ray.kill(buffer.actors[shard], no_restart=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if ray.get(buffer.actors[shard].describe.remote(), timeout=5)["incarnation"] \
                    != before:
                return
        except (ray.exceptions.RayError, TimeoutError):
            time.sleep(0.1)
    raise AssertionError("the shard did not restart")


def chi_square_passes(counts: np.ndarray, expected: np.ndarray) -> bool:
    """Whether ``counts`` fit ``expected`` at about the 0.1% level (Wilson-Hilferty's
    approximation of the chi-square quantile)."""
    k = len(counts) - 1
    critical = k * (1 - 2 / (9 * k) + 3.09 * np.sqrt(2 / (9 * k))) ** 3
    return float(((counts - expected) ** 2 / expected).sum()) < critical


class CountingMassHandle:
    """A shard's actor handle that counts the client's ``mass_status`` questions."""

    def __init__(self, handle, asked: list[int], shard: int):
        self._handle, self._asked, self._shard = handle, asked, shard

    def __getattr__(self, name):
        if name == "mass_status":
            self._asked[self._shard] += 1
        return getattr(self._handle, name)
