"""Checkpoint loads that read data files straight into the storage's own arrays
(replaybuffer.persist.in_place), and the CRC-32 they are checked with
(replaybuffer.persist.checksum): byte for byte the general path's result, and every
damaged file refused as before."""

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer import persist
from replaybuffer.persist.checksum import IMPLEMENTATION, crc32
from replaybuffer.persist.in_place import in_place_leaves, load_rest
from replaybuffer.storage.numpy_storage import NumpyStorage

FRAME = (24, 25)  # 600 bytes an item: over PACK_MAX_BYTES, so an array of its own


def spec(small_leaves=2):
    leaves = {"frame": rb.ArraySpec(FRAME, np.uint8)}
    for k in range(small_leaves):
        leaves[f"small{k}"] = rb.ArraySpec((), np.float32 if k else np.int64)
    return leaves


def filled(adds, batch_size=3, max_length=7, small_leaves=2, **kwargs):
    buf = rb.UniformReplayBuffer(spec(small_leaves), batch_size, max_length, seed=5, **kwargs)
    rng = np.random.default_rng(adds)
    for t in range(adds):
        step = {"frame": rng.integers(0, 256, (batch_size,) + FRAME, dtype=np.uint8)}
        for k in range(small_leaves):
            step[f"small{k}"] = (rng.random(batch_size) * 100).astype(np.float32 if k
                                                                      else np.int64)
        buf.add_batch(step)
    return buf


def general_path_copy(buf):
    """The same buffer restored through the in-memory state (storage.load, no files)."""
    again = rb.UniformReplayBuffer(buf.data_spec, buf.batch_size, buf.max_length, seed=0)
    again.load_state_dict(buf.state_dict())
    return again


def test_the_blocks_are_the_numpy_storages_own_arrays():
    buf = filled(3)
    blocks = in_place_leaves(buf.store, 9)
    frame = [i for i, s in enumerate(buf.store.specs) if s.shape == FRAME][0]
    assert blocks[frame] is not None and blocks[frame].shape == (9,) + FRAME
    assert np.shares_memory(blocks[frame], buf.store.arrays[frame])
    # Small leaves packed into records are strided views: no file read fills them.
    assert [b is None for i, b in enumerate(blocks) if i != frame] == [True, True]


def test_a_lone_small_leaf_is_read_in_place_too():
    buf = filled(3, small_leaves=1)  # one small leaf: not packed, an array of its own
    assert all(b is not None for b in in_place_leaves(buf.store, 9))


@pytest.mark.parametrize("storage", [{"storage": "torch"}, {"storage": "mmap"}])
def test_other_backends_keep_their_own_load(storage, tmp_path):
    if storage["storage"] == "mmap":
        storage = {**storage, "path": tmp_path / "files"}
    buf = filled(3, **storage)
    assert in_place_leaves(buf.store, 9) == (None,) * 3


@settings(max_examples=25, deadline=None)
@given(adds=st.integers(0, 20), chunk=st.sampled_from([1, 700, 4000, 1 << 20]),
       small_leaves=st.integers(0, 3))
def test_a_load_matches_the_general_path_byte_for_byte(tmp_path_factory, adds, chunk,
                                                        small_leaves):
    # Chunks of one position, of a part of the frame and of all: every boundary case of
    # the in-place reads (a position split across reads never happens: the step is whole
    # positions, at least one).
    tmp = tmp_path_factory.mktemp("ckpt")
    buf = filled(adds, small_leaves=small_leaves)
    buf.save(tmp)
    old, persist.CHUNK_BYTES = persist.CHUNK_BYTES, chunk
    try:
        again = rb.load(tmp)
    finally:
        persist.CHUNK_BYTES = old
    reference = general_path_copy(buf)
    count = buf.num_frames()
    assert again.last_id == buf.last_id
    for got, want in zip(again.store.arrays, reference.store.arrays):
        assert got.dtype == want.dtype
        assert np.ascontiguousarray(got[:count]).tobytes() == \
            np.ascontiguousarray(want[:count]).tobytes()
        assert not np.any(got[count:])  # nothing written past the saved positions
    if adds:
        a, _ = again.get_next(8)
        b, _ = buf.get_next(8)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def damaged(tmp_path, change):
    buf = filled(12)
    written = buf.save(tmp_path / "ckpt")
    frame_file = [e["file"] for e in persist.read_manifest(written)["leaves"]
                  if e["path"] == "['frame']"][0]
    path = written / frame_file
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(change(data)))
    return tmp_path / "ckpt", frame_file


def flip_middle(data):
    data[len(data) // 2] ^= 0x01
    return data


def test_a_corrupt_block_file_is_refused(tmp_path):
    root, name = damaged(tmp_path, flip_middle)
    with pytest.raises(rb.CheckpointError, match=rf"leaf \['frame'\] \({name}\) is corrupt"):
        rb.load(root)


def test_a_truncated_block_file_is_refused(tmp_path):
    root, name = damaged(tmp_path, lambda data: data[:-600])
    with pytest.raises(rb.CheckpointError, match=rf"leaf \['frame'\] \({name}\) is not a "
                                                 "readable .npy file"):
        rb.load(root)


def test_load_rest_writes_only_the_arrays_given():
    storage = NumpyStorage([rb.ArraySpec(FRAME, np.uint8), rb.ArraySpec((), np.int64)], 6)
    write = load_rest(storage)
    frames = np.full((2,) + FRAME, 7, np.uint8)
    write(3, [None, np.array([11, 12])])  # the frames were read in place: left alone
    assert not storage.arrays[0].any()
    np.testing.assert_array_equal(storage.arrays[1], [0, 0, 0, 11, 12, 0])
    write(1, [frames, np.array([5, 6])])  # all given: the storage's own load
    np.testing.assert_array_equal(storage.arrays[0][1:3], frames)
    np.testing.assert_array_equal(storage.arrays[1], [0, 5, 6, 11, 12, 0])


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=5000), start=st.integers(0, 2**32 - 1))
def test_the_checksum_is_zlibs_crc32(data, start):
    assert crc32(data, start) == zlib.crc32(data, start)
    assert crc32(np.frombuffer(data, np.uint8), start) == zlib.crc32(data, start)


def test_the_checksum_names_its_implementation():
    try:
        import zlib_ng  # noqa: F401
    except ImportError:
        assert IMPLEMENTATION == "zlib" and crc32 is zlib.crc32
    else:
        assert IMPLEMENTATION == "zlib-ng" and crc32 is not zlib.crc32
