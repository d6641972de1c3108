"""``sample_on_device=True`` for transition buffers: draws and reads on the torch
storage's device (``buffers/device_transition_reads.py``). Each sampled transition is pinned byte for
byte against the host path's read of the same step, and the draws' distribution
against uniform (chi-square); on the CPU and, where torch sees one, the CUDA device.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybuffer as rb  # noqa: E402
from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler  # noqa: E402
from replaybuffer.sampling.torch_uniform import TorchUniformSampler  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ENVS = 3


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


def filled(cls, device, adds: int = 40, n_step: int = 1, **kwargs):
    """Observation ``[row * 1000 + t, ...]`` at step ``t`` of env ``row``: a sampled
    transition names its step. Episodes end (terminated, truncated) now and then,
    and one add comes out of sequence (its next observation is not the next step's)."""
    buf = cls(rb.ArraySpec((2,), np.float32), rb.ArraySpec((), np.int64), 36,
              num_envs=ENVS, storage="torch", device=device, sample_on_device=True, seed=7,
              n_step=n_step, **kwargs)
    rows = np.arange(ENVS, dtype=np.float32)[:, None] * 1000
    for t in range(adds):
        obs = np.repeat(rows + t, 2, axis=1)
        following = obs + (50 if t == 11 else 1)  # out of sequence at t = 11
        buf.add(obs, np.full(ENVS, t), np.full(ENVS, t / 10, np.float32), following,
                np.array([t % 7 == 6, False, t % 5 == 4]),
                np.array([False, t % 9 == 8, False]))
    return buf


def assert_matches_host_reads(buf, transitions, info) -> None:
    obs = transitions.observations.cpu().numpy()
    ids = info.ids.cpu().numpy()
    rows = (obs[:, 0] // 1000).astype(np.int64)
    # a prioritized buffer's ids are item ids: step * num_envs + row
    steps = ids // ENVS if isinstance(buf, rb.PrioritizedTransitionReplayBuffer) else ids
    reference = buf.read_steps(np.asarray(steps, np.int64))
    for field in ("observations", "actions", "rewards", "next_observations", "terminated",
                  "truncated", "dones", "discounts"):
        got = getattr(transitions, field)
        assert got.device.type == buf.device.type, field
        expected = getattr(reference, field)[rows, np.arange(len(rows))]
        np.testing.assert_array_equal(got.cpu().numpy(), expected.cpu().numpy(), field)


@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("cls", [rb.TransitionReplayBuffer,
                                 rb.PrioritizedTransitionReplayBuffer])
def test_device_draws_read_what_the_host_path_reads(device, cls, n_step):
    buf = filled(cls, device, n_step=n_step)
    assert isinstance(buf.sampler, (TorchUniformSampler, TorchPrioritizedSampler))
    for _ in range(3):
        transitions, info = buf.sample(64)
        assert info.ids.device.type == device.type
        assert info.probabilities.device.type == device.type
        assert_matches_host_reads(buf, transitions, info)


def test_device_draws_are_uniform_over_held_transitions(device):
    buf = filled(rb.TransitionReplayBuffer, device)
    counts: dict[tuple[int, int], int] = {}
    draws = 0
    for _ in range(60):
        transitions, info = buf.sample(200)
        obs = transitions.observations.cpu().numpy()[:, 0].astype(np.int64)
        for value in obs:
            counts[(value // 1000, value % 1000)] = counts.get((value // 1000, value % 1000),
                                                               0) + 1
        draws += 200
    held = 36  # the capacity: 12 steps of 3 envs, the ring wrapped
    assert len(counts) == held  # every held transition is drawn, none other
    expected = draws / held
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    df = held - 1
    assert chi2 < df * (1 - 2 / (9 * df) + 3.0902 * math.sqrt(2 / (9 * df))) ** 3


def test_device_updates_of_prioritized_transitions_match_the_host_twin(device):
    dev = filled(rb.PrioritizedTransitionReplayBuffer, device, alpha=1.0)
    dev.sampler.device_updates = True  # opt-in (the default checks on the host)
    host = rb.PrioritizedTransitionReplayBuffer(
        rb.ArraySpec((2,), np.float32), rb.ArraySpec((), np.int64), 36, num_envs=ENVS,
        storage="torch", device=device, seed=7, alpha=1.0)
    assert not isinstance(host.sampler, TorchPrioritizedSampler)
    ids = np.arange(40 * ENVS - 36, 40 * ENVS)
    priorities = np.linspace(0.5, 3.0, len(ids))
    assert dev.update_priorities(torch.from_numpy(ids).to(device),
                                 torch.from_numpy(priorities).to(device)) == len(ids)
    np.testing.assert_array_equal(dev.priorities(ids), priorities)
    transitions, info = dev.sample(128)
    drawn = dev.priorities(info.ids.cpu().numpy())
    np.testing.assert_allclose(info.probabilities.cpu().numpy(), drawn / priorities.sum(),
                               rtol=1e-6)
    assert host.max_priority == 1.0 and dev.max_priority == 3.0
    assert_matches_host_reads(dev, transitions, info)


def test_sample_on_device_is_refused_where_it_cannot_apply():
    spec, act = rb.ArraySpec((2,), np.float32), rb.ArraySpec((), np.int64)
    with pytest.raises(ValueError, match="sample_on_device=True needs storage='torch'"):
        rb.TransitionReplayBuffer(spec, act, 8, sample_on_device=True)
    with pytest.raises(ValueError, match="sample_on_device must be True, False or None"):
        rb.TransitionReplayBuffer(spec, act, 8, storage="torch", sample_on_device="yes")

    class OwnReads(rb.TransitionReplayBuffer):
        pass

    with pytest.raises(ValueError, match="OwnReads samples on the host"):
        OwnReads(spec, act, 8, storage="torch", sample_on_device=True)
    with pytest.raises(ValueError, match="applies to sampling on the device only"):
        rb.PrioritizedTransitionReplayBuffer(spec, act, 8, storage="torch",
                                             device_search="tree")
    buf = rb.PrioritizedTransitionReplayBuffer(spec, act, 8, storage="torch",
                                               sample_on_device=True, device_search="tree")
    assert buf.sampler.search == "tree"
    # by default the host samples, also for torch storage
    assert not isinstance(rb.TransitionReplayBuffer(spec, act, 8, storage="torch").sampler,
                          TorchUniformSampler)
