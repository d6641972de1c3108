"""A writer's chunk packed into one byte buffer and unpacked by the shard
(``ray_shards.packing``): every leaf comes back equal, aligned, of its dtype and shape,
whatever the spec, rows and steps; a buffer of another size is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer.distributed.ray_shards.packing import ALIGN, ChunkPacking

DTYPES = [np.uint8, np.int32, np.float32, np.float64, np.int64, np.bool_, np.float16]

leaf_specs = st.builds(
    lambda shape, dtype: rb.ArraySpec(tuple(shape), dtype),
    st.lists(st.integers(0, 3), max_size=2), st.sampled_from(DTYPES))


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(leaf_specs, min_size=1, max_size=4), rows=st.integers(1, 3),
       capacity=st.integers(1, 6), data=st.data())
def test_unpack_gives_back_the_first_steps_of_every_leaf(specs, rows, capacity, data):
    steps = data.draw(st.integers(1, capacity))
    spec = {f"leaf{i}": s for i, s in enumerate(specs)}
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    arrays = [rng.integers(0, 100, (rows, capacity) + s.shape).astype(s.dtype)
              for s in spec.values()]  # the chunk's arrays, in the spec's flat order
    packing = ChunkPacking(spec)
    packed = packing.pack(arrays, steps)
    assert packed.dtype == np.uint8 and packed.ndim == 1
    items = packing.unpack(packed, rows, steps)
    assert list(items) == list(spec)
    for (name, s), array in zip(spec.items(), arrays):
        leaf = items[name]
        assert leaf.dtype == s.dtype and leaf.shape == (rows, steps) + s.shape
        assert leaf.flags.c_contiguous
        assert (leaf.ctypes.data - packed.ctypes.data) % ALIGN == 0
        np.testing.assert_array_equal(leaf, array[:, :steps])
    # The chunk's arrays may be reused at once: the packed buffer is a copy.
    for array in arrays:
        array[...] = 0
    for (name, s), leaf in zip(spec.items(), packing.unpack(packed, rows, steps).values()):
        assert leaf.shape == (rows, steps) + s.shape


def test_nested_specs_come_back_in_their_structure():
    spec = {"obs": {"pixels": rb.ArraySpec((2, 2), np.uint8),
                    "state": rb.ArraySpec((3,), np.float32)},
            "step_type": rb.ArraySpec((), np.int32)}
    packing = ChunkPacking(spec)
    arrays = [np.arange(2 * 5 * 4, dtype=np.uint8).reshape(2, 5, 2, 2),
              np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3),
              np.arange(10, dtype=np.int32).reshape(2, 5)]
    items = packing.unpack(packing.pack(arrays, 4), 2, 4)
    np.testing.assert_array_equal(items["obs"]["pixels"], arrays[0][:, :4])
    np.testing.assert_array_equal(items["obs"]["state"], arrays[1][:, :4])
    np.testing.assert_array_equal(items["step_type"], arrays[2][:, :4])


def test_a_buffer_of_another_size_or_dtype_is_refused():
    packing = ChunkPacking({"x": rb.ArraySpec((3,), np.float32)})
    packed = packing.pack([np.zeros((1, 4, 3), np.float32)], 4)
    with pytest.raises(ValueError, match=r"1 x 3 steps must be 36 uint8 bytes, got uint8 \(48,\)"):
        packing.unpack(packed, 1, 3)
    with pytest.raises(ValueError, match="must be 48 uint8 bytes, got float32"):
        packing.unpack(packed.view(np.float32), 1, 4)


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(leaf_specs, min_size=1, max_size=3),
       counts=st.lists(st.integers(0, 3), min_size=1, max_size=3),
       steps=st.integers(1, 3), data=st.data())
def test_parts_packed_row_after_row_come_back_with_their_extra_leaves(specs, counts, steps,
                                                                       data):
    spec = {f"leaf{i}": s for i, s in enumerate(specs)}
    packing = ChunkPacking(spec, [(np.int64, True), (np.float32, False)])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    parts = [[rng.integers(0, 100, (n, steps) + s.shape).astype(s.dtype)
              for s in spec.values()]
             + [rng.integers(0, 2**40, (n, steps)), rng.random(n).astype(np.float32)]
             for n in counts]
    packed = packing.pack_rows(parts, steps)
    rows = sum(counts)
    leaves = packing.unpack_leaves(packed, rows, steps)
    assert len(leaves) == len(spec) + 2
    assert leaves[-2].shape == (rows, steps) and leaves[-1].shape == (rows,)
    for k, leaf in enumerate(leaves):  # every leaf: the parts' rows, in order
        assert (leaf.ctypes.data - packed.ctypes.data) % ALIGN == 0
        np.testing.assert_array_equal(leaf, np.concatenate([part[k] for part in parts]))
    assert list(packing.unflatten(leaves)) == list(spec)
    with pytest.raises(ValueError, match=f"{rows + 1} x {steps} steps must be"):
        packing.unpack_leaves(packed, rows + 1, steps)
