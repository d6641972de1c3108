"""Save and restore (item 24), and refusing anything that is not a complete, matching save."""

import collections
import json

import numpy as np
import pytest

import replaybuffer as rb
from conftest import to_np
from replaybuffer.persist import decode_spec, encode_spec, manifest_checksum, verify

Obs = collections.namedtuple("Obs", "pixels speed")


def spec():
    return {"obs": Obs(rb.ArraySpec((2, 2), np.uint8, "pixels"),
                       rb.BoundedArraySpec((), np.float32, -1, 1)),
            "ids": (rb.ArraySpec((), np.int64),), "none": None}


def filled(storage, adds=7, batch_size=3, max_length=5):
    buf = rb.UniformReplayBuffer(spec(), batch_size, max_length, seed=3, **storage)
    for t in range(adds):
        buf.add_batch({"obs": Obs(np.full((batch_size, 2, 2), t, np.uint8),
                                  np.full(batch_size, t / 10, np.float32)),
                       "ids": (np.arange(batch_size) * 100 + t,), "none": None})
    buf.get_next(4)  # advance the sampler so its state is not the seed's
    return buf


def assert_same_contents(a, b):
    ga, gb = to_np(a.gather_all()), to_np(b.gather_all())
    np.testing.assert_array_equal(ga["obs"].pixels, gb["obs"].pixels)
    np.testing.assert_array_equal(ga["obs"].speed, gb["obs"].speed)
    np.testing.assert_array_equal(ga["ids"][0], gb["ids"][0])


@pytest.mark.parametrize("adds", [0, 3, 12])
def test_round_trip_restores_data_ids_head_and_sampler(storage, tmp_path, adds):  # item 24
    buf = filled(storage, adds) if adds else rb.UniformReplayBuffer(spec(), 3, 5, **storage)
    buf.save(tmp_path / "ckpt")
    again = rb.load(tmp_path / "ckpt")
    assert type(again) is type(buf) and again.storage == buf.storage
    assert again.last_id == buf.last_id and again.num_frames() == buf.num_frames()
    assert again.data_spec == buf.data_spec and isinstance(again.data_spec["obs"], Obs)
    assert_same_contents(buf, again)
    if adds:
        a, ia = buf.get_next(16, num_steps=2)  # the same draws: the generator state came back
        b, ib = again.get_next(16, num_steps=2)
        np.testing.assert_array_equal(to_np(ia.ids), to_np(ib.ids))
        np.testing.assert_array_equal(to_np(a["ids"][0]), to_np(b["ids"][0]))
    again.add_batch({"obs": Obs(np.zeros((3, 2, 2), np.uint8), np.zeros(3, np.float32)),
                     "ids": (np.zeros(3, np.int64),), "none": None})
    assert again.last_id == buf.last_id + 1


def test_restore_into_another_backend(storage, tmp_path):
    buf = filled(storage)
    buf.save(tmp_path / "ckpt")
    other = "torch" if storage["storage"] == "numpy" else "numpy"
    again = rb.load(tmp_path / "ckpt", storage=other)
    assert again.storage == other
    assert_same_contents(buf, again)


def test_saving_over_a_save_replaces_it(tmp_path):
    first = filled({"storage": "numpy"}, 2)
    first.save(tmp_path / "ckpt")
    second = filled({"storage": "numpy"}, 9)
    second.save(tmp_path / "ckpt")
    assert rb.load(tmp_path / "ckpt").last_id == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    # keep=1: only the newest checkpoint, and no temporaries left
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt-000002"]


def test_save_refuses_to_clobber_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(rb.CheckpointError, match="non-empty directory"):
        filled({"storage": "numpy"}).save(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_load_with_the_users_own_spec_classes(tmp_path):
    filled({"storage": "numpy"}).save(tmp_path / "c")
    again = rb.load(tmp_path / "c", data_spec=spec())
    assert type(again.data_spec["obs"]) is Obs
    wrong = spec()
    wrong["ids"] = (rb.ArraySpec((), np.int32),)
    with pytest.raises(rb.CheckpointError, match="data_spec does not match"):
        rb.load(tmp_path / "c", data_spec=wrong)


def test_unknown_namedtuples_come_back_as_equivalent_ones():
    encoded = encode_spec(Obs(rb.ArraySpec((), np.int8), rb.ArraySpec((), np.int8)))
    encoded["module"] = "not.imported.anywhere"
    decoded = decode_spec(json.loads(json.dumps(encoded)))
    assert type(decoded).__name__ == "Obs" and decoded._fields == ("pixels", "speed")


def rewrite(d, change, fix_checksum=True):
    """Edit the manifest as a person would; with a valid checksum unless told otherwise."""
    m = json.loads((d / "manifest.json").read_text())
    change(m)
    if fix_checksum:
        m["checksum"] = manifest_checksum(m)
    (d / "manifest.json").write_text(json.dumps(m))


def test_torch_storage_comes_back_on_its_device(storage, tmp_path):
    buf = filled(storage, 4)
    buf.save(tmp_path / "ckpt")
    manifest = json.loads((rb.checkpoints(tmp_path / "ckpt")[-1] / "manifest.json").read_text())
    if buf.storage != "torch":
        assert manifest["device"] is None
        return
    assert manifest["device"] == str(buf.device)
    again = rb.load(tmp_path / "ckpt")
    assert again.device == buf.device
    cpu = rb.load(tmp_path / "ckpt", device="cpu")  # an explicit device wins
    assert str(cpu.device) == "cpu"
    np.testing.assert_array_equal(to_np(cpu.gather_all())["ids"][0],
                                  to_np(buf.gather_all())["ids"][0])


def test_a_device_this_process_lacks_is_named(tmp_path):
    buf = filled({"storage": "torch"}, 4)
    buf.save(tmp_path / "ckpt")
    checkpoint = rb.checkpoints(tmp_path / "ckpt")[-1]
    rewrite(checkpoint, lambda m: m.update(device="cuda:7"))  # no eighth GPU here
    with pytest.raises(rb.CheckpointError, match=r"cuda:7.*saved on cuda:7; pass device="):
        rb.load(tmp_path / "ckpt")
    again = rb.load(tmp_path / "ckpt", device="cpu")
    np.testing.assert_array_equal(to_np(again.gather_all())["ids"][0],
                                  to_np(buf.gather_all())["ids"][0])


def corrupt_cases():
    def drop_manifest(d):
        (d / "manifest.json").unlink()

    def bad_json(d):
        (d / "manifest.json").write_text("{not json")

    def missing_leaf(d):
        (d / "leaf_000.npy").unlink()

    def truncated_leaf(d):
        data = (d / "leaf_001.npy").read_bytes()
        (d / "leaf_001.npy").write_bytes(data[:len(data) - 7])

    def flipped_byte(d):
        data = bytearray((d / "leaf_002.npy").read_bytes())
        data[-1] ^= 0xFF
        (d / "leaf_002.npy").write_bytes(bytes(data))

    def wrong_shape(d):
        np.save(d / "leaf_000.npy", np.zeros((2, 3), np.int64))

    def pickled(d):
        np.save(d / "leaf_000.npy", np.array([object()] * 15, dtype=object), allow_pickle=True)

    def edit(change, fix_checksum=True):
        return lambda d: rewrite(d, change, fix_checksum)

    def set_key(key, value):
        return lambda m: m.__setitem__(key, value)

    def set_spec_dtype(m):
        entries = dict((k, v) for k, v in m["data_spec"]["dict"])
        entries["ids"]["tuple"][0]["spec"]["dtype"] = "zz"

    return {
        "no manifest": (drop_manifest, "holds no manifest.json"),
        "bad json": (bad_json, "not valid JSON"),
        "edited without checksum": (edit(lambda m: m["state"].__setitem__("last_id", 100), False),
                                    "checksum does not match"),
        "version": (edit(set_key("version", 99)), "format version 99"),
        "missing field": (edit(lambda m: m.pop("state")), "lacks the field 'state'"),
        "no last_id": (edit(lambda m: m["state"].pop("last_id")), "malformed state"),
        "last_id text": (edit(lambda m: m["state"].__setitem__("last_id", "x")), "malformed state"),
        "last_id before the data": (edit(lambda m: m["state"].__setitem__("last_id", 1)),
                                    r"expected shape \(6,\) dtype int64, found shape \(15,\)"),
        "leaves not a list": (edit(set_key("leaves", 5)), "leaves must be a list"),
        "leaves of strings": (edit(set_key("leaves", ["x"])), "leaves must be a list"),
        "spec dtype": (edit(set_spec_dtype), "malformed data_spec"),
        "unknown config": (edit(set_key("config", {"foo": 1})), "cannot rebuild the buffer"),
        "unknown storage": (edit(set_key("storage", "tf")), "cannot rebuild the buffer"),
        "batch_size": (edit(set_key("batch_size", 0)), "batch_size must be a positive int"),
        "unknown class": (edit(set_key("buffer", "NoSuchBuffer")),
                          "unknown buffer class 'NoSuchBuffer'"),
        "missing leaf": (missing_leaf, r"leaf \['ids'\]\[0\] \(leaf_000.npy\) is missing"),
        "truncated": (truncated_leaf, r"leaf \['obs'\]\.pixels \(leaf_001.npy\) is not a readable"),
        "flipped byte": (flipped_byte, r"leaf \['obs'\]\.speed \(leaf_002.npy\) is corrupt"),
        "wrong shape": (wrong_shape, r"expected shape \(15,\) dtype int64, found shape \(2, 3\)"),
        "pickled": (pickled, "not a readable .npy"),
    }


@pytest.mark.parametrize("case", sorted(corrupt_cases()))
def test_load_refuses_incomplete_or_corrupt_saves(tmp_path, case):
    damage, pattern = corrupt_cases()[case]
    written = filled({"storage": "numpy"}).save(tmp_path / "ckpt")
    assert rb.checkpoints(tmp_path / "ckpt") == [written]
    damage(written)
    with pytest.raises(rb.CheckpointError, match=pattern):
        rb.load(tmp_path / "ckpt")
    if case not in BUILT_ONLY:
        with pytest.raises(rb.CheckpointError, match=pattern):  # inspect's check says the same
            verify(tmp_path / "ckpt")


BUILT_ONLY = {"unknown config", "unknown storage"}
"""Damage found only when the buffer is built, which verify (inspect) does not do."""


def test_load_of_a_missing_directory(tmp_path):
    with pytest.raises(rb.CheckpointError, match="nowhere: the path does not exist"):
        rb.load(tmp_path / "nowhere")
