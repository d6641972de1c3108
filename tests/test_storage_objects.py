"""``storage=`` takes a storage object as well as a name: a user's own storage works end
to end, and one that does not satisfy the protocol, or does not fit the buffer, is
refused at construction with a message that says what is wrong."""

import subprocess
import sys
import typing

import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec
from replaybuffer.storage import STORAGE_KINDS, make_storage, register_storage
from replaybuffer.storage.base import STORAGE_ATTRIBUTES, STORAGE_METHODS, Storage
from replaybuffer.storage.numpy_storage import NumpyStorage
from replaybuffer.storage.registry import storage_class, storage_names

SPEC = {"obs": ArraySpec((3,), np.float32), "reward": ArraySpec((), np.float32)}
LEAF_SPECS = [SPEC["obs"], SPEC["reward"]]  # flatten order: sorted keys


class CountingStorage(NumpyStorage):
    """A user's storage: numpy storage that counts its writes and gathers."""

    kind = "counting"

    def __init__(self, specs, capacity):
        super().__init__(specs, capacity)
        self.writes = self.gathers = 0

    def exact_writer(self, outer_shape):
        return None  # every write through write(), so that it is counted

    def write(self, start, leaves):
        self.writes += 1
        super().write(start, leaves)

    def gather(self, positions, which=None):
        self.gathers += 1
        return super().gather(positions, which)


def item(t, B=2):
    return {"obs": np.full((B, 3), t, np.float32), "reward": np.full(B, t, np.float32)}


def test_a_storage_object_of_the_users_is_used_end_to_end(tmp_path):
    storage = CountingStorage(LEAF_SPECS, 2 * 5)
    buf = rb.UniformReplayBuffer(SPEC, 2, 5, seed=0, storage=storage)
    assert buf.store is storage and buf.storage == "counting"
    for t in range(7):
        buf.add_batch(item(t))
    assert storage.writes == 7
    items, info = buf.get_next(4, 2)
    assert storage.gathers >= 1 and items["obs"].shape == (4, 2, 3)
    np.testing.assert_array_equal(items["obs"][:, 1, 0] - items["obs"][:, 0, 0], 1)
    reference = rb.UniformReplayBuffer(SPEC, 2, 5, seed=0)
    for t in range(7):
        reference.add_batch(item(t))
    expected = reference.get_next(4, 2)
    np.testing.assert_array_equal(items["obs"], expected[0]["obs"])
    np.testing.assert_array_equal(info.ids, expected[1].ids)
    buf.save(tmp_path / "c")  # a checkpoint loads into a backend by name
    again = rb.load(tmp_path / "c", storage="numpy")
    np.testing.assert_array_equal(again.gather_all()["obs"], buf.gather_all()["obs"])


class _Partial:
    """Every member of the protocol but one (``missing``)."""

    def __init__(self, missing):
        base = NumpyStorage(LEAF_SPECS, 10)
        for name in STORAGE_ATTRIBUTES + STORAGE_METHODS:
            if name != missing:
                setattr(self, name, getattr(base, name))


@pytest.mark.parametrize("missing", STORAGE_METHODS)
def test_a_storage_object_without_a_method_is_refused_naming_it(missing):
    with pytest.raises(TypeError, match=rf"storage=_Partial\(\.\.\.\) is not a storage: it "
                                        rf"lacks the method {missing}\(\) of "
                                        r"replaybuffer.storage.Storage"):
        rb.UniformReplayBuffer(SPEC, 2, 5, storage=_Partial(missing))


@pytest.mark.parametrize("missing", STORAGE_ATTRIBUTES)
def test_a_storage_object_without_an_attribute_is_refused_naming_it(missing):
    with pytest.raises(TypeError, match=f"lacks the attribute '{missing}'"):
        rb.UniformReplayBuffer(SPEC, 2, 5, storage=_Partial(missing))


def test_a_storage_class_instead_of_an_object_is_refused():
    with pytest.raises(TypeError, match="storage=NumpyStorage is a class: pass a storage object"):
        rb.UniformReplayBuffer(SPEC, 2, 5, storage=NumpyStorage)


def test_the_checked_members_are_the_protocols():
    members = {name for name in vars(Storage) if not name.startswith("_")} | \
        {name for name in typing.get_type_hints(Storage) if not name.startswith("_")}
    assert members == set(STORAGE_ATTRIBUTES) | set(STORAGE_METHODS)


def test_a_storage_object_that_does_not_fit_the_buffer_is_refused():
    other_specs = [ArraySpec((4,), np.float32), SPEC["reward"]]
    with pytest.raises(SpecError, match=r"storage=NumpyStorage\(\.\.\.\) holds specs .*shape=\(4,\)"
                                        r".*; the buffer stores .*shape=\(3,\)"):
        rb.UniformReplayBuffer(SPEC, 2, 5, storage=NumpyStorage(other_specs, 10))
    with pytest.raises(ValueError, match=r"storage=NumpyStorage\(\.\.\.\) has capacity 12; the "
                                         r"buffer holds 10 \(batch_size \* max_length\)"):
        rb.UniformReplayBuffer(SPEC, 2, 5, storage=NumpyStorage(LEAF_SPECS, 12))
    with pytest.raises(ValueError, match="is a storage object, built already: it takes no "
                                         "device= or path="):
        make_storage(NumpyStorage(LEAF_SPECS, 10), LEAF_SPECS, 10, device="cuda")
    with pytest.raises(ValueError, match="it takes no device= or path="):
        make_storage(NumpyStorage(LEAF_SPECS, 10), LEAF_SPECS, 10, path="somewhere")


def test_names_come_from_the_registry_and_tensorflow_is_listed_by_path():
    assert storage_names()[:4] == STORAGE_KINDS
    assert storage_class("numpy") is NumpyStorage
    with pytest.raises(ValueError, match=r"unknown storage 'disk'; expected one of \('numpy', "
                                         r"'torch', 'tensorflow', 'mmap'\)"):
        make_storage("disk", LEAF_SPECS, 10)
    # Building a numpy buffer imports nothing of replaybuffer.tf (nor TensorFlow).
    code = ("import sys, numpy as np, replaybuffer as rb\n"
            "rb.UniformReplayBuffer({'x': rb.ArraySpec((2,), np.float32)}, 2, 5)\n"
            "assert not [m for m in sys.modules if m.startswith(('replaybuffer.tf', "
            "'tensorflow'))], 'tf imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_registered_name_builds_its_class(monkeypatch):
    from replaybuffer.storage import registry

    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))

    class Plain(NumpyStorage):
        kind = "plain"

        def __init__(self, specs, capacity, device=None):
            super().__init__(specs, capacity, pack=False)

    register_storage("plain", Plain)
    buf = rb.UniformReplayBuffer(SPEC, 2, 5, storage="plain")
    assert type(buf.store) is Plain and buf.store.packed == ()
    buf.add_batch(item(1))
    assert buf.gather_all()["reward"].tolist() == [[1.0], [1.0]]
    with pytest.raises(ValueError, match="a storage backend is a class or a 'module:Class' path"):
        register_storage("bad", "no.colon")
