"""NumpyStorage's packed records against one-array-per-leaf storage, with plain positions."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import to_np
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.numpy_storage import PACK_MAX_BYTES, NumpyStorage, record_dtype

MIXED = [ArraySpec((3,), np.uint8), ArraySpec((), np.float64), ArraySpec((2, 2), np.int32),
         ArraySpec((), np.bool_), ArraySpec((5,), np.float32), ArraySpec((), np.int16),
         ArraySpec((), np.int64)]


def test_record_fields_are_aligned_and_disjoint():
    dt = record_dtype(MIXED)
    fields = [dt.fields[f"f{k}"] for k in range(len(MIXED))]
    end = 0
    for (field_dtype, offset), spec in zip(fields, MIXED):
        assert offset % spec.dtype.itemsize == 0, (spec, offset)
        assert offset >= end  # no overlap with the previous field
        end = offset + spec.nbytes
    assert dt.itemsize >= end and dt.itemsize % 8 == 0


def test_which_leaves_are_packed():
    big = ArraySpec((PACK_MAX_BYTES + 1,), np.uint8)
    small = ArraySpec((4,), np.float32)
    s = NumpyStorage([big, small, ArraySpec((), np.int64)], 10)
    assert s.packed == (1, 2)
    assert s.arrays[0].flags.c_contiguous and not s.arrays[1].flags.c_contiguous
    assert NumpyStorage([big, small], 10).packed == ()  # one small leaf gains nothing
    assert NumpyStorage([small, small], 10, pack=False).packed == ()
    assert s.nbytes == 10 * (big.nbytes + record_dtype([small, ArraySpec((), np.int64)]).itemsize)


def _random_leaves(specs, n, rng):
    return [rng.integers(0, 100, (n,) + s.shape).astype(s.dtype) for s in specs]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_packed_storage_matches_one_array_per_leaf(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    specs = data.draw(st.lists(st.sampled_from(MIXED + [ArraySpec((600,), np.uint8)]),
                               min_size=1, max_size=6))
    capacity = data.draw(st.integers(1, 30))
    packed, plain = NumpyStorage(specs, capacity), NumpyStorage(specs, capacity, pack=False)
    for _ in range(data.draw(st.integers(1, 6))):  # writes of blocks at random starts
        start = data.draw(st.integers(0, capacity - 1))
        leaves = _random_leaves(specs, data.draw(st.integers(1, capacity - start)), rng)
        packed.write(start, leaves)
        plain.write(start, leaves)
    shape = data.draw(st.sampled_from([(7,), (4, 3), (0,), ()]))
    positions = rng.integers(0, capacity, shape)
    which = data.draw(st.one_of(st.none(), st.lists(st.integers(0, len(specs) - 1),
                                                    max_size=len(specs))))
    got, want = packed.gather(positions, which), plain.gather(positions, which)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    everything = np.arange(capacity)
    for g, w in zip(packed.gather(everything), plain.gather(everything)):
        np.testing.assert_array_equal(g, w)


def test_gathered_fields_convert_to_torch_and_are_copies():
    s = NumpyStorage(MIXED, 8)
    leaves = _random_leaves(MIXED, 8, np.random.default_rng(0))
    s.write(0, leaves)
    got = s.gather(np.array([[5, 6], [7, 0]]))
    for g, spec, src in zip(got, MIXED, leaves):
        assert g.shape == (2, 2) + spec.shape
        t = torch.from_numpy(g)  # refuses strides that are not multiples of the item size
        np.testing.assert_array_equal(t.numpy(), src[[[5, 6], [7, 0]]])
        g[...] = 0  # a gathered leaf is the caller's: the storage is untouched
    np.testing.assert_array_equal(s.gather(np.array([5]))[0], leaves[0][[5]])


def test_load_at_an_offset_and_zero():
    s = NumpyStorage(MIXED, 6)
    leaves = _random_leaves(MIXED, 6, np.random.default_rng(1))
    s.write(0, leaves)
    t = NumpyStorage(MIXED, 6)
    t.load([a[1:4].copy() for a in s.gather(np.arange(6))], start=2)
    for a, b in zip(t.gather(np.arange(6)), leaves):
        np.testing.assert_array_equal(a[2:5], b[1:4])
        assert not a[:2].any() and not a[5:].any()
    s.zero()
    assert all(not a.any() for a in s.gather(np.arange(6)))


@pytest.mark.parametrize("pack", [True, False])
def test_write_of_one_leaf_leaves_the_others_alone(pack):
    s = NumpyStorage(MIXED, 4, pack=pack)
    leaves = _random_leaves(MIXED, 4, np.random.default_rng(2))
    s.write(0, leaves)
    before = s.gather(np.arange(4))
    s.arrays[1][2] = -1.5  # a write through one field's view
    after = s.gather(np.arange(4))
    for k, (a, b) in enumerate(zip(before, after)):
        if k != 1:
            np.testing.assert_array_equal(a, b)
    assert after[1][2] == -1.5


def test_gather_takes_positions_modulo_capacity(storage):
    """A window may run past the last position: every backend wraps it (the buffers
    rely on it and do not take the modulo themselves)."""
    import replaybuffer as rb

    buf = rb.UniformReplayBuffer({"x": rb.ArraySpec((2,), np.float32),
                                  "y": rb.ArraySpec((), np.int64)}, 1, 5, **storage)
    buf.extend({"x": np.arange(10, dtype=np.float32).reshape(1, 5, 2),
                "y": np.arange(5).reshape(1, 5)})
    got = [to_np(a) for a in buf._storage.gather(np.array([[3, 4, 5, 6]]))]
    np.testing.assert_array_equal(got[0], [[[6, 7], [8, 9], [0, 1], [2, 3]]])
    np.testing.assert_array_equal(got[1], [[3, 4, 0, 1]])


@pytest.mark.parametrize("count", [1, 3])
def test_exact_writer_writes_exact_leaves_like_write(count):
    exact = NumpyStorage(MIXED, 8)
    plain = NumpyStorage(MIXED, 8)
    write = exact.exact_writer((count,))
    rng = np.random.default_rng(count)
    for start in (0, 5 - count, 8 - count):
        leaves = [random_leaf(spec, (count,), rng) for spec in MIXED]
        assert write(start, leaves) is True
        plain.write(start, leaves)
        for got, want in zip(exact.gather(np.arange(8)), plain.gather(np.arange(8))):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", ["numpy", "torch", "unpacked"])
@pytest.mark.parametrize("count", [1, 3, 200])
def test_exact_writer_writes_whole_records_bytes_and_padding_included(backend, count):
    """Packed leaves are written as whole records: one position as the leaves' bytes
    joined with zero padding, a few as a block assembled in scratch records, many
    (200 records: more than the block's 8 KiB) field by field (vectors as one void item
    per record where their last axis is contiguous); a large leaf beside them
    keeps its own array. Every stored byte, padding too, must be what field-by-field
    writes leave."""
    from replaybuffer.storage.torch_storage import TorchStorage

    # A flag after the int64 leaves padding at the record's end as well as inside.
    specs = MIXED + [ArraySpec((), np.bool_), ArraySpec((PACK_MAX_BYTES + 1,), np.uint8)]
    capacity = 8 * count
    make = {"numpy": lambda: NumpyStorage(specs, capacity),
            "torch": lambda: TorchStorage(specs, capacity),
            "unpacked": lambda: NumpyStorage(specs, capacity, pack=False)}[backend]
    exact, plain = make(), make()
    write = exact.exact_writer((count,))
    assert ("records" in write.__code__.co_names) == (backend != "unpacked" and count < 200)
    rng = np.random.default_rng(count)
    for start in (0, 3 * count, capacity - count, 2):
        leaves = [random_leaf(spec, (count,), rng) for spec in specs]
        leaves[2] = np.asfortranarray(leaves[2])  # tobytes() is C order whatever the strides
        if start == 2:  # a vector whose last axis is strided: no void view, item by item
            leaves[4] = np.repeat(leaves[4], 2, axis=1)[:, ::2]
        assert write(start, leaves) is True
        plain.write(start, leaves)
        numpy_of = (lambda s: s) if backend != "torch" else (lambda s: s._records)
        ours, theirs = numpy_of(exact), numpy_of(plain)
        if ours._records is not None:
            assert ours._records.tobytes() == theirs._records.tobytes()
        for i in range(len(specs)):
            assert ours.arrays[i].tobytes() == theirs.arrays[i].tobytes()


@pytest.mark.parametrize("backend", ["numpy", "torch", "unpacked"])
@pytest.mark.parametrize("count", [1, 3, 200])
def test_exact_writer_casts_float64_scalars_into_float32_like_write(backend, count):
    """A vector env's rewards come as float64 for a float32 reward leaf: a batched fused
    writer takes them and stores the bytes the validating path's cast stores (one
    record's bytes by astype, a block's field or a plain array by assignment)."""
    from replaybuffer.storage.torch_storage import TorchStorage

    specs = [ArraySpec((4,), np.float32), ArraySpec((), np.float32), ArraySpec((), np.bool_)]
    make = {"numpy": lambda: NumpyStorage(specs, 2 * count),
            "torch": lambda: TorchStorage(specs, 2 * count),
            "unpacked": lambda: NumpyStorage(specs, 2 * count, pack=False)}[backend]
    exact, plain = make(), make()
    write = exact.exact_writer((count,))
    rng = np.random.default_rng(count)
    for start in (0, count):
        leaves = [rng.standard_normal((count, 4), np.float32),
                  rng.standard_normal(count) * 1e3,  # float64, not exact in float32
                  rng.random(count) < 0.5]
        assert write(start, leaves) is True
        plain.write(start, leaves)
        for got, want in zip(exact.gather(np.arange(2 * count)),
                             plain.gather(np.arange(2 * count))):
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    wide = [rng.standard_normal((count, 4)), rng.standard_normal(count),
            rng.random(count) < 0.5]  # a float64 vector leaf is still refused
    assert write(0, wide) is False
    one = exact.exact_writer(())  # and one unbatched step keeps exact dtypes
    assert one(0, [wide[0][0].astype(np.float32), np.float64(1.5), np.True_]) is False
    assert one(0, [wide[0][0].astype(np.float32), np.float32(1.5), np.True_]) is True


def test_no_record_writes_where_other_fields_share_the_record():
    """A structured array with a field that is not among the leaves: its bytes are not
    the writer's, so the leaves are written field by field and the other field stays."""
    from replaybuffer.storage.base import LeafChecker
    from replaybuffer.storage.exact_writer import exact_writer

    specs = [ArraySpec((2,), np.float32), ArraySpec((), np.int16)]
    records = np.zeros(4, record_dtype(specs + [ArraySpec((), np.int64)]))
    records["f2"] = 7
    write = exact_writer([records["f0"], records["f1"]], LeafChecker(specs), (1,))
    assert "records" not in write.__code__.co_names
    assert write(1, [np.ones((1, 2), np.float32), np.full(1, 3, np.int16)])
    assert records["f2"].tolist() == [7] * 4
    assert records["f0"][1].tolist() == [1.0, 1.0] and records["f1"].tolist() == [0, 3, 0, 0]


def random_leaf(spec, outer, rng):
    return rng.integers(0, 100, outer + spec.shape).astype(spec.dtype)


class Sub(np.ndarray):
    pass


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("bad", ["list", "dtype", "byte order", "broadcast", "unbatched",
                                 "subclass", "too few", "too many"])
def test_exact_writer_refuses_anything_but_exact_arrays_and_writes_nothing(count, bad):
    storage = NumpyStorage(MIXED, 8)
    write = storage.exact_writer((count,))
    rng = np.random.default_rng(0)
    leaves = [random_leaf(spec, (count,), rng) for spec in MIXED]
    i = 4  # float32 [5]
    if bad == "list":
        leaves[i] = leaves[i].tolist()
    elif bad == "dtype":
        leaves[i] = leaves[i].astype(np.float64)
    elif bad == "byte order":
        leaves[i] = leaves[i].astype(">f4")
    elif bad == "broadcast":  # numpy would broadcast [count, 1] into [count, 5]
        leaves[i] = leaves[i][:, :1]
    elif bad == "unbatched":  # [5] assigned to one position would fit if unchecked
        leaves[i] = leaves[i][0]
    elif bad == "subclass":
        leaves[i] = leaves[i].view(Sub)
    elif bad == "too few":
        leaves = leaves[:-1]
    else:
        leaves = leaves + [leaves[-1]]
    assert write(2, leaves) is False
    for arr in storage.gather(np.arange(8)):
        assert not arr.any()
