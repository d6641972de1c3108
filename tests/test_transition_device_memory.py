"""The device copy of a transition buffer's next-observation bookkeeping
(``sample_on_device=True``: ``buffers/device_side_mirror.py``) is counted: in the
buffer's ``nbytes``, as the tensors it holds, and checked against the memory of the
device it sits on before it is made."""

from __future__ import annotations

import numpy as np
import pytest

import replaybuffer as rb

torch = pytest.importorskip("torch")

from replaybuffer.buffers import device_side_mirror  # noqa: E402
from replaybuffer.storage.memory import InsufficientMemoryError  # noqa: E402

OBS, ACT = rb.ArraySpec((3,), np.float32), rb.ArraySpec((), np.int64)
ENVS, CAPACITY = 2, 40


def build(on_device: bool, capacity: int = CAPACITY, **kwargs):
    return rb.TransitionReplayBuffer(OBS, ACT, capacity, num_envs=ENVS, storage="torch",
                                     sample_on_device=on_device, seed=1, **kwargs)


def add(buf, t: int, end: bool = False) -> None:
    obs = np.full((ENVS, 3), t, np.float32)
    buf.add(obs, np.zeros(ENVS, np.int64), np.ones(ENVS, np.float32), obs + 1,
            np.full(ENVS, end), np.zeros(ENVS, bool))


def tensor_bytes(mirror) -> int:
    return sum(t.numel() * t.element_size() for t in [mirror.refs, *mirror.rows])


def test_nbytes_counts_the_device_mirror():
    host, device = build(False), build(True)
    side_slots = 64  # the side store's first size
    mirror = 8 * CAPACITY + (side_slots + ENVS) * OBS.nbytes
    assert device.nbytes == host.nbytes + mirror
    for t in range(5):
        add(device, t)
    device.sample(4)  # the first sync makes the rows: what nbytes counted
    reads = device._device_reads
    assert tensor_bytes(reads.mirror) == mirror
    assert device.nbytes == host.nbytes + mirror


def test_nbytes_follows_the_side_store_as_it_grows():
    buf = build(True, capacity=200)
    for t in range(100):  # every step ends an episode: one side slot per env each
        add(buf, t, end=True)
    buf.sample(4)
    mirror = buf._device_reads.mirror
    assert mirror.side_slots > 64  # grown
    host = build(False, capacity=200)
    for t in range(100):
        add(host, t, end=True)
    assert buf.nbytes - host.nbytes == tensor_bytes(mirror)
    assert mirror.nbytes == tensor_bytes(mirror)


def test_the_mirror_is_checked_against_host_memory_on_the_cpu(monkeypatch):
    asked = []
    monkeypatch.setattr(device_side_mirror, "check_memory",
                        lambda nbytes, what, strict: asked.append((nbytes, what, strict)))
    build(True, memory="strict")
    assert asked == [(8 * CAPACITY + (64 + ENVS) * OBS.nbytes,
                      "TransitionReplayBuffer(sample_on_device=True)", True)]
    asked.clear()
    build(False)
    assert asked == []


def test_a_mirror_that_does_not_fit_on_cuda_is_refused_or_warned(monkeypatch):
    """The CUDA branch, with the device's free memory faked (no device touched)."""
    free = 1000
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 10 * free))
    cuda = torch.device("cuda", 0)
    device_side_mirror.check_device_memory(free, "x", cuda, True)  # fits exactly
    with pytest.raises(InsufficientMemoryError, match=r"x needs .* on cuda:0 .* free"):
        device_side_mirror.check_device_memory(free + 1, "x", cuda, True)
    with pytest.warns(ResourceWarning, match="on cuda:0"):
        device_side_mirror.check_device_memory(free + 1, "x", cuda, False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nbytes_counts_the_mirror_on_cuda():
    host = rb.TransitionReplayBuffer(OBS, ACT, CAPACITY, num_envs=ENVS, storage="torch",
                                     device="cuda", sample_on_device=False, seed=1)
    buf = rb.TransitionReplayBuffer(OBS, ACT, CAPACITY, num_envs=ENVS, storage="torch",
                                    device="cuda", sample_on_device=True, seed=1)
    for t in range(5):
        add(buf, t)
    buf.sample(4)
    mirror = buf._device_reads.mirror
    assert mirror.refs.device.type == "cuda"
    assert buf.nbytes == host.nbytes + tensor_bytes(mirror)
