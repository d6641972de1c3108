"""A prioritized draw on the device whose range has no mass (every priority 0) is
checked without bringing the mass to the host: the check is queued and the
``EmptyBufferError`` raised by a later call (``sampling/torch_prioritized.py``,
``DrawMassChecks``). On the CPU ``draw_checks_on_device=True`` asks for the deferral
(the default defers on CUDA only); host conversions are patched to raise, as a
synchronization on a GPU would be."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybuffer as rb  # noqa: E402
from replaybuffer.errors import EmptyBufferError  # noqa: E402
from replaybuffer.storage.torch_storage import TorchStorage  # noqa: E402

HOST_READS = ("numpy", "item", "tolist", "cpu", "__array__", "__bool__", "__int__",
              "__float__", "__index__")


class HostTouch(Exception):
    pass


def refuse(name, queued):
    """Tensor.``name`` raising, but for the reads of the pinned host memory the device
    copies its checks into without waiting (``queued``: views of it are allowed)."""
    original = getattr(torch.Tensor, name)

    def refused(self, *args, **kwargs):
        if self._base is not None and any(self._base is q for q in queued):
            return original(self, *args, **kwargs)
        raise HostTouch(f"the draw called Tensor.{name}")
    return refused


@pytest.fixture(params=["prefix", "tree"])
def search(request):
    return request.param


def buffer(search, device="cpu", defer=True, adds=10):
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 1, 10, storage="torch",
                                     device=device, sample_on_device=True,
                                     device_search=search, seed=3)
    for t in range(adds):
        buf.add_batch(np.array([t]))
    if defer is not None:
        buf.sampler.draw_checks_on_device = defer
    return buf


def draw_without_host_reads(monkeypatch, buf, count=4):
    """The sampler's draw with every host conversion of a tensor refused."""
    sampler = buf.sampler
    checks = sampler._draw_checks._checks
    queued = [] if checks is None else [checks._host]
    with monkeypatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, refuse(name, queued))
        return sampler.sample(buf._ring, count, 1)


def test_a_draw_with_no_mass_reads_nothing_back_and_the_next_call_raises(monkeypatch,
                                                                        search):
    monkeypatch.setattr(TorchStorage, "numpy_views", False)
    buf = buffer(search)
    buf.update_priorities(np.arange(10), np.zeros(10))
    (ids, positions), info = draw_without_host_reads(monkeypatch, buf)
    assert torch.isnan(info["probabilities"]).all()  # that batch is not valid
    assert int(positions.min()) >= 0 and int(positions.max()) < 10  # in bounds all the same
    with pytest.raises(EmptyBufferError, match=r"every window of num_steps=1 has "
                       r"priority 0.*earlier draw on cpu"):
        buf.get_next(4)
    # Reported once, the buffer unchanged: the next draw is checked as the first was.
    np.testing.assert_array_equal(buf.sampler.priorities(buf._ring, np.arange(10)),
                                  np.zeros(10))
    with pytest.raises(EmptyBufferError, match="priority 0") as raised:
        buf.get_next(4)  # this draw's own check, deferred again
        buf.sampler.settle()
    assert "earlier draw" in str(raised.value)
    buf.update_priorities(np.arange(10), np.arange(1.0, 11.0))
    batch, info = buf.get_next(4)
    assert torch.isfinite(info.probabilities).all()


def test_the_error_comes_at_an_update_too_and_writes_nothing(monkeypatch, search):
    buf = buffer(search)
    buf.update_priorities(np.arange(10), np.zeros(10))
    draw_without_host_reads(monkeypatch, buf)
    with pytest.raises(EmptyBufferError, match="earlier draw"):
        buf.update_priorities(np.arange(10), np.ones(10))
    np.testing.assert_array_equal(buf.sampler.priorities(buf._ring, np.arange(10)),
                                  np.zeros(10))


def test_draws_with_mass_after_zeros_were_stored_never_read_back(monkeypatch, search):
    """A stored 0 makes every later draw check its mass: more draws than the queue has
    slots, none read back, none refused."""
    buf = buffer(search)
    buf.update_priorities(np.array([2, 5]), np.zeros(2))
    assert buf.sampler._empty.possible
    for _ in range(40):
        (_, positions), info = draw_without_host_reads(monkeypatch, buf, 64)
        assert not np.isin(positions.numpy(), [2, 5]).any()
        assert torch.isfinite(info["probabilities"]).all()
    buf.sampler.settle()


def test_a_restore_drops_the_checks_of_draws_from_the_state_it_replaces(search):
    buf = buffer(search)
    state = buf.state_dict()
    buf.update_priorities(np.arange(10), np.zeros(10))
    buf.sampler.sample(buf._ring, 4, 1)
    buf.load_state_dict(state)
    assert buf.get_next(4)[1].probabilities.shape == (4,)


def test_a_clear_drops_the_checks_of_draws_from_the_priorities_it_forgets(search):
    """A no-mass draw's check queued before ``clear()`` is not raised after it (the
    priorities it was about are gone): the refilled buffer's reads, updates and mass
    are its own; a no-mass draw after the clear is checked (and raised) as before."""
    buf = buffer(search)
    buf.update_priorities(np.arange(10), np.zeros(10))
    buf.sampler.sample(buf._ring, 4, 1)  # its check queued, not yet raised
    assert len(buf.sampler._draw_checks._checks) == 1
    buf.clear()
    for t in range(10):
        buf.add_batch(np.array([t]))
    assert buf.get_next(4)[1].probabilities.shape == (4,)
    assert buf.update_priorities(np.arange(10, 20), np.arange(1.0, 11.0)) == 10
    assert buf.sampler.valid_mass(buf._ring, 1) > 0.0
    buf.update_priorities(np.arange(10, 20), np.zeros(10))
    buf.sampler.sample(buf._ring, 4, 1)
    with pytest.raises(EmptyBufferError, match="earlier draw"):
        buf.get_next(4)


def test_the_default_on_the_cpu_raises_at_the_draw(search):
    buf = buffer(search, defer=None)
    buf.update_priorities(np.arange(10), np.zeros(10))
    with pytest.raises(EmptyBufferError, match="priority 0") as raised:
        buf.get_next(4)
    assert "earlier draw" not in str(raised.value)


def test_a_bad_choice_is_refused_by_name(search):
    """Refused where it is set (``device_check_choice``), not at a later draw."""
    buf = buffer(search, defer=True)
    with pytest.raises(ValueError, match="draw_checks_on_device must be True, False or "
                                         "None .* got 'yes'"):
        buf.sampler.draw_checks_on_device = "yes"
    assert buf.sampler.draw_checks_on_device is True  # the choice before stands
    buf.update_priorities(np.arange(10), np.zeros(10))
    buf.sampler.sample(buf._ring, 4, 1)  # deferred, as chosen before
    with pytest.raises(EmptyBufferError, match="earlier draw"):
        buf.get_next(4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_draw_with_no_mass_is_reported_at_a_later_call(search):
    buf = buffer(search, device="cuda", defer=None)
    buf.update_priorities(np.arange(10), np.zeros(10))
    _, info = buf.get_next(4)  # no host wait: nothing raised yet
    assert torch.isnan(info.probabilities).all()
    torch.cuda.synchronize()
    with pytest.raises(EmptyBufferError, match="earlier draw on cuda"):
        buf.get_next(4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_save_after_a_no_mass_draw_saves_and_the_next_draw_raises(search,
                                                                           tmp_path):
    """The CUDA default defers the draw's check; a checkpoint between that draw and the
    next saves the state (``tests/test_device_check_choice.py`` on the CPU)."""
    buf = buffer(search, device="cuda", defer=None)
    buf.update_priorities(np.arange(10), np.zeros(10))
    buf.get_next(4)  # no host wait: nothing raised yet
    torch.cuda.synchronize()
    path = buf.save(tmp_path)
    assert (path / "manifest.json").exists()
    with pytest.raises(EmptyBufferError, match="earlier draw on cuda"):
        buf.get_next(4)
