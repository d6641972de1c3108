"""A device prioritized sampler's check choices (``draw_checks_on_device``,
``device_updates``) are refused where they are set, and a checkpoint taken after a draw
that found no mass saves the state, leaving that draw's error to the next draw
(``sampling/device_check_choice.py``, ``TorchPrioritizedSampler.state_dict``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybuffer as rb  # noqa: E402
from replaybuffer.errors import EmptyBufferError  # noqa: E402
from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler  # noqa: E402

CHOICES = ("draw_checks_on_device", "device_updates")
BAD = ("yes", 1, 0, np.True_, [True])


def buffer(adds=10, search="prefix"):
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 1, 10, storage="torch",
                                     device="cpu", sample_on_device=True,
                                     device_search=search, seed=3)
    for t in range(adds):
        buf.add_batch(np.array([t]))
    return buf


def default(name, cls=TorchPrioritizedSampler):
    """The class's default: what a new sampler of ``cls`` reads."""
    return getattr(cls(10, device="cpu"), name)


@pytest.fixture
def class_defaults():
    """Puts the class's defaults back after a test that changes them."""
    before = {name: default(name) for name in CHOICES}
    yield
    for name, value in before.items():
        setattr(TorchPrioritizedSampler, name, value)


@pytest.mark.parametrize("name", CHOICES)
@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_bad_value_on_a_sampler_is_refused_at_once_and_leaves_it(name, bad):
    buf = buffer()
    setattr(buf.sampler, name, True)
    with pytest.raises(ValueError, match=rf"^{name} must be True, False or None \(on a "
                                         rf"CUDA device\), got .* it was not changed"):
        setattr(buf.sampler, name, bad)
    assert getattr(buf.sampler, name) is True
    assert default(name) is None  # the class's default untouched


@pytest.mark.parametrize("name", CHOICES)
def test_a_bad_class_default_is_refused_and_a_good_one_is_every_samplers(name,
                                                                        class_defaults):
    with pytest.raises(ValueError, match=f"{name} must be True, False or None"):
        setattr(TorchPrioritizedSampler, name, "yes")
    assert default(name) is None
    setattr(TorchPrioritizedSampler, name, False)
    first, second = buffer(), buffer()
    assert getattr(first.sampler, name) is False
    setattr(second.sampler, name, True)  # one sampler's own choice
    assert (getattr(first.sampler, name), getattr(second.sampler, name)) == (False, True)
    setattr(TorchPrioritizedSampler, name, None)
    assert (getattr(first.sampler, name), getattr(second.sampler, name)) == (None, True)
    # The class assignment kept the check: a bad value on a sampler is still refused.
    with pytest.raises(ValueError, match=name):
        setattr(first.sampler, name, "no")


@pytest.mark.parametrize("name", CHOICES)
def test_a_subclass_choosing_a_bad_default_is_refused_at_its_definition(name):
    with pytest.raises(ValueError, match=f"{name} must be True, False or None .* got 'on'"):
        type("Chooser", (TorchPrioritizedSampler,), {name: "on"})
    chooser = type("Chooser", (TorchPrioritizedSampler,), {name: True})
    sampler = chooser(10, device="cpu")
    assert getattr(sampler, name) is True
    assert default(name) is None
    with pytest.raises(ValueError, match=name):  # its samplers still checked
        setattr(sampler, name, 2)
    with pytest.raises(ValueError, match=name):  # and so is its class
        setattr(chooser, name, 2)
    assert default(name, chooser) is True


def test_a_refused_choice_changes_nothing_the_buffer_does():
    buf, twin = buffer(), buffer()
    buf.sampler.draw_checks_on_device = True
    with pytest.raises(ValueError):
        buf.sampler.draw_checks_on_device = "sometimes"
    twin.sampler.draw_checks_on_device = True
    for b in (buf, twin):
        b.update_priorities(np.arange(10), np.arange(1.0, 11.0))
    np.testing.assert_array_equal(buf.get_next(6)[1].ids, twin.get_next(6)[1].ids)


# ------------------------------------------------ a checkpoint after a no-mass draw
def no_mass_draw_queued(search="prefix"):
    """A buffer whose last draw found no mass, its error queued (deferred checks)."""
    buf = buffer(search=search)
    buf.sampler.draw_checks_on_device = True
    buf.update_priorities(np.arange(10), np.zeros(10))
    _, info = buf.sampler.sample(buf._ring, 4, 1)
    assert torch.isnan(info["probabilities"]).all()  # drawn, not checked yet
    return buf


@pytest.mark.parametrize("search", ["prefix", "tree"])
def test_a_save_after_a_no_mass_draw_saves_and_the_next_draw_raises(tmp_path, search):
    buf = no_mass_draw_queued(search)
    path = buf.save(tmp_path)  # the draw's error says nothing about the state saved
    assert os.listdir(tmp_path) == [path.name]
    with pytest.raises(EmptyBufferError, match="priority 0.*earlier draw on cpu"):
        buf.get_next(4)  # the draw's error, left to the next draw
    restored = rb.load(path)
    np.testing.assert_array_equal(
        restored.sampler.priorities(restored._ring, np.arange(10)), np.zeros(10))
    with pytest.raises(EmptyBufferError, match="priority 0"):
        restored.get_next(4)
        restored.sampler.settle()
    restored.update_priorities(np.arange(10), np.arange(1.0, 11.0))
    assert torch.isfinite(restored.get_next(4)[1].probabilities).all()


def test_a_state_dict_after_a_no_mass_draw_is_the_state_and_keeps_the_error():
    buf = no_mass_draw_queued()
    state = buf.state_dict()
    np.testing.assert_array_equal(state["state"]["sampler"]["priorities"], np.zeros(10))
    with pytest.raises(EmptyBufferError, match="earlier draw"):
        buf.update_priorities(np.arange(10), np.ones(10))  # a later call: raised once
    np.testing.assert_array_equal(buf.sampler.priorities(buf._ring, np.arange(10)),
                                  np.zeros(10))  # that update wrote nothing
    twin = buffer()
    twin.load_state_dict(state)
    np.testing.assert_array_equal(twin.sampler.priorities(twin._ring, np.arange(10)),
                                  np.zeros(10))


def test_a_refused_device_update_still_stops_a_save_once(tmp_path):
    """A pending device update found bad raises at the save (the tree must not be saved
    as if it were applied), nothing is written; the next save writes the state."""
    buf = buffer()
    buf.sampler.device_updates = True
    _, info = buf.get_next(4)
    buf.update_priorities(info.ids, torch.full((4,), float("nan")))
    with pytest.raises(ValueError, match="priorities must be finite and >= 0.*nothing was "
                                         "updated"):
        buf.save(tmp_path)
    assert os.listdir(tmp_path) == []
    path = buf.save(tmp_path)
    restored = rb.load(path)
    np.testing.assert_array_equal(restored.sampler.priorities(restored._ring, np.arange(10)),
                                  buf.sampler.priorities(buf._ring, np.arange(10)))
