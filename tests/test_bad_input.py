"""Bad input gets a clear error naming the leaf, and the buffer is unchanged."""

import collections

import numpy as np
import pytest
import torch

import replaybuffer as rb
from conftest import to_np

Step = collections.namedtuple("Step", "obs action")


def make(storage, batch_size=2):
    spec = {"obs": rb.ArraySpec((3,), np.float32), "nested": (rb.ArraySpec((2,), np.int32),)}
    buf = rb.UniformReplayBuffer(spec, batch_size, 4, seed=0, **storage)
    for t in range(5):  # wrapped, so a partial write would be visible
        buf.add_batch({"obs": np.full((batch_size, 3), t, np.float32),
                       "nested": (np.full((batch_size, 2), t, np.int32),)})
    return buf


def snapshot(buf):
    return buf.last_id, to_np(buf.gather_all()), buf._sampler.state_dict()["rng"]["state"]


def good(batch_size=2):
    return {"obs": np.zeros((batch_size, 3), np.float32),
            "nested": (np.zeros((batch_size, 2), np.int32),)}


BAD_ITEMS = {
    "missing key": ({"obs": np.zeros((2, 3), np.float32)}, r"structure.*missing leaves \[\"\['nested'\]\[0\]\"\]"),
    "extra key": (dict(good(), extra=np.zeros(2)), r"unexpected leaves"),
    "tuple for dict": ((np.zeros((2, 3)), (np.zeros((2, 2)),)), r"structure"),
    "list leaf": ({"obs": [[0.0] * 3] * 2, "nested": (np.zeros((2, 2), np.int32),)},
                  r"structure.*missing leaves \[\"\['obs'\]\"\]"),
    "batch size": ({"obs": np.zeros((3, 3), np.float32), "nested": (np.zeros((3, 2), np.int32),)},
                   r"leaf \['nested'\]\[0\]|leaf \['obs'\]: expected shape \(2, 3\).*got \(3, 3\)"),
    "unbatched": ({"obs": np.zeros(3, np.float32), "nested": (np.zeros((2, 2), np.int32),)},
                  r"leaf \['obs'\]: expected shape \(2, 3\) .*batch_size=2.*got \(3,\)"),
    "trailing shape": ({"obs": np.zeros((2, 4), np.float32), "nested": (np.zeros((2, 2), np.int32),)},
                       r"leaf \['obs'\]: expected shape \(2, 3\).*got \(2, 4\)"),
    "float into int": ({"obs": np.zeros((2, 3), np.float32), "nested": (np.zeros((2, 2), np.float64),)},
                       r"leaf \['nested'\]\[0\]: expected dtype int32.*got float64"),
    "strings": ({"obs": np.array([["a"] * 3] * 2), "nested": (np.zeros((2, 2), np.int32),)},
                r"leaf \['obs'\]: expected dtype float32.*got str"),
    "object": ({"obs": object(), "nested": (np.zeros((2, 2), np.int32),)},
               r"leaf \['obs'\]: expected a numeric array"),
}


@pytest.mark.parametrize("case", sorted(BAD_ITEMS))
def test_add_batch_rejects_bad_items_and_changes_nothing(storage, case):
    items, pattern = BAD_ITEMS[case]
    buf = make(storage)
    before = snapshot(buf)
    with pytest.raises(rb.SpecError, match=pattern):
        buf.add_batch(items)
    after = snapshot(buf)
    assert before[0] == after[0] and before[2] == after[2]
    np.testing.assert_array_equal(before[1]["obs"], after[1]["obs"])
    np.testing.assert_array_equal(before[1]["nested"][0], after[1]["nested"][0])


def test_extend_rejects_bad_items_and_changes_nothing(storage):
    buf = make(storage)
    before = snapshot(buf)
    with pytest.raises(rb.SpecError, match=r"leaf \['obs'\]: expected shape \(2, 3, 3\)"):
        buf.extend({"obs": np.zeros((2, 3, 3), np.float32)[:, :2],
                    "nested": (np.zeros((2, 3, 2), np.int32),)})
    with pytest.raises(rb.SpecError, match="num_steps"):
        buf.extend({"obs": np.zeros(2, np.float32), "nested": (np.zeros(2, np.int32),)})
    assert snapshot(buf)[0] == before[0]
    np.testing.assert_array_equal(snapshot(buf)[1]["obs"], before[1]["obs"])


def test_flat_specs_refuse_lists_where_arrays_belong(storage):
    # One-level specs take a shortcut past optree; it must refuse the same things.
    buf = rb.UniformReplayBuffer({"a": rb.ArraySpec((2,), np.float32),
                                  "b": rb.ArraySpec((), np.int32)}, 2, 3, **storage)
    with pytest.raises(rb.SpecError, match=r"leaf \['a'\]: expected an array, got a list"):
        buf.add_batch({"a": [[1.0, 2.0], [3.0, 4.0]], "b": np.zeros(2, np.int32)})
    with pytest.raises(rb.SpecError, match=r"missing leaves \[\"\['b'\]\"\]"):
        buf.add_batch({"a": np.zeros((2, 2)), "c": np.zeros(2, np.int32)})
    assert buf.last_id == -1


def test_safe_casts_are_accepted(storage):
    buf = make(storage)
    buf.add_batch({"obs": np.zeros((2, 3), np.float64), "nested": (np.zeros((2, 2), np.int64),)})
    buf.add_batch({"obs": np.zeros((2, 3), np.int64), "nested": (np.zeros((2, 2), np.uint8),)})
    assert buf.last_id == 6
    assert to_np(buf.gather_all()["obs"]).dtype == np.float32


def test_python_scalars_and_namedtuples(storage):
    spec = Step(rb.ArraySpec((), np.float32), rb.ArraySpec((), np.int64))
    buf = rb.UniformReplayBuffer(spec, 1, 3, **storage)
    buf.add_batch(Step(np.array([0.5]), np.array([2])))
    buf.add_batch(Step(obs=np.float32([1.5]), action=np.array([1])))
    with pytest.raises(rb.SpecError, match=r"structure.*Step"):
        buf.add_batch((np.array([0.5]), np.array([2])))  # a plain tuple is not a Step
    with pytest.raises(rb.SpecError, match=r"leaf \.obs: expected shape \(1,\)"):
        buf.add_batch(Step(0.5, np.array([2])))  # a scalar lacks the batch dimension
    items, _ = buf.get_next(4)
    assert isinstance(items, Step)


def test_torch_storage_checks_tensors_too():
    buf = rb.UniformReplayBuffer(rb.ArraySpec((2,), np.int32), 2, 3, storage="torch")
    buf.add_batch(torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(rb.SpecError, match=r"expected dtype int32.*got float32"):
        buf.add_batch(torch.zeros(2, 2, dtype=torch.float32))
    with pytest.raises(rb.SpecError, match=r"expected shape \(2, 2\).*got \(2, 3\)"):
        buf.add_batch(torch.zeros(2, 3, dtype=torch.int32))
    assert buf.last_id == 0


@pytest.mark.parametrize("kwargs,pattern", [
    ({"sample_batch_size": 0}, "sample_batch_size must be a positive int"),
    ({"sample_batch_size": -3}, "sample_batch_size must be a positive int"),
    ({"sample_batch_size": 2.5}, "sample_batch_size must be a positive int"),
    ({"num_steps": 0}, "num_steps must be a positive int"),
    ({"num_steps": True}, "num_steps must be a positive int"),
])
def test_get_next_rejects_bad_arguments(storage, kwargs, pattern):
    buf = make(storage)
    with pytest.raises(ValueError, match=pattern):
        buf.get_next(**kwargs)


def test_bad_constructor_arguments():
    spec = rb.ArraySpec((), np.float32)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        rb.UniformReplayBuffer(spec, 0, 5)
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        rb.UniformReplayBuffer(spec, 1, 0)
    with pytest.raises(ValueError, match="unknown storage 'disk'"):
        rb.UniformReplayBuffer(spec, 1, 5, storage="disk")
    with pytest.raises(ValueError, match="storage='torch'"):
        rb.UniformReplayBuffer(spec, 1, 5, device="cuda")
    with pytest.raises(rb.SpecError, match=r"leaf \['a'\] is 3 \(int\): expected an ArraySpec"):
        rb.UniformReplayBuffer({"a": 3}, 1, 5)


def test_as_dataset_rejects_bad_arguments(storage):
    buf = make(storage)
    with pytest.raises(ValueError, match="num_parallel_calls"):
        buf.as_dataset(2, num_parallel_calls=0)
    with pytest.raises(ValueError, match="prefetch"):
        buf.as_dataset(2, prefetch=-1)
    with pytest.raises(ValueError, match="window_shift"):
        buf.as_dataset(single_deterministic_pass=True, num_steps=2, window_shift=0)


def test_tensors_that_require_grad_are_stored_detached(storage):
    buf = rb.UniformReplayBuffer(rb.ArraySpec((2,), np.float32), 1, 4, **storage)
    policy = torch.nn.Linear(2, 2)
    for _ in range(3):
        buf.add_batch(policy(torch.ones(1, 2)))
    items, _ = buf.get_next(2)
    if isinstance(items, torch.Tensor):
        assert not items.requires_grad
    assert all(not getattr(a, "requires_grad", False) for a in buf._storage.arrays)
    np.testing.assert_allclose(to_np(items), to_np(policy(torch.ones(1, 2)))[[0, 0]], rtol=1e-6)


def test_big_endian_specs_and_inputs_store_natively(storage, tmp_path):
    spec = rb.ArraySpec((2,), ">f4")
    assert spec.dtype == np.dtype("<f4").newbyteorder("=")
    buf = rb.UniformReplayBuffer(spec, 1, 3, **storage)
    buf.add_batch(np.array([[1.5, -2.0]], dtype=">f4"))
    buf.add_batch(np.array([[3.0, 4.0]], dtype=">f8"))
    np.testing.assert_array_equal(to_np(buf.gather_all()), [[[1.5, -2.0], [3.0, 4.0]]])
    buf.save(tmp_path / "c")
    for backend in ("numpy", "torch"):
        np.testing.assert_array_equal(to_np(rb.load(tmp_path / "c", storage=backend).gather_all()),
                                      [[[1.5, -2.0], [3.0, 4.0]]])


def test_dict_specs_with_mixed_key_types(storage):
    buf = rb.UniformReplayBuffer({1: rb.ArraySpec((), np.int32), "a": rb.ArraySpec((), np.int32)},
                                 1, 3, **storage)
    buf.add_batch({1: np.array([4]), "a": np.array([5])})
    items, _ = buf.get_next()
    assert int(items[1]) == 4 and int(items["a"]) == 5


def test_read_only_inputs_are_fine(storage, recwarn):
    buf = rb.UniformReplayBuffer(rb.ArraySpec((3,), np.float32), 2, 3, **storage)
    data = np.ones((2, 3), np.float32)
    data.flags.writeable = False
    buf.add_batch(data)
    buf.add_batch(np.broadcast_to(np.float32(2), (2, 3)))
    assert not [w for w in recwarn if "writable" in str(w.message)]
    np.testing.assert_array_equal(to_np(buf.gather_all())[:, :, 0], [[1, 2], [1, 2]])


def test_torch_ops_variant_really_uses_torch_ops(storage):
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int32), 1, 3, **storage)
    if storage["storage"] == "torch":
        from replaybuffer.storage.torch_storage import TorchStorage

        # Host views exist only on the CPU, and only where not switched off.
        views = TorchStorage.numpy_views and buf.device.type == "cpu"
        assert (buf._storage._host is None) == (not views)


FLAT_BAD = {
    # numpy assignment would broadcast these into the rows; the shape check must not
    "broadcast trailing": (lambda B: {"a": np.zeros((B, 1), np.float32),
                                      "b": np.zeros(B, np.int32)},
                           r"leaf \['a'\]: expected shape \({B}, 2\).*got \({B}, 1\)"),
    "unbatched": (lambda B: {"a": np.zeros(2, np.float32), "b": np.zeros(B, np.int32)},
                  r"leaf \['a'\]: expected shape \({B}, 2\).*got \(2,\)"),
    "batch size": (lambda B: {"a": np.zeros((B + 1, 2), np.float32),
                              "b": np.zeros(B + 1, np.int32)},
                   r"leaf \['a'\]: expected shape \({B}, 2\).*got \({B1}, 2\)"),
    "float into int": (lambda B: {"a": np.zeros((B, 2), np.float32),
                                  "b": np.zeros(B, np.float64)},
                       r"leaf \['b'\]: expected dtype int32.*got float64"),
}


@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.parametrize("case", sorted(FLAT_BAD))
def test_flat_spec_add_batch_rejects_bad_items_and_changes_nothing(storage, batch_size, case):
    # One-level specs of exact arrays take the fused check-and-write path.
    buf = rb.UniformReplayBuffer({"a": rb.ArraySpec((2,), np.float32),
                                  "b": rb.ArraySpec((), np.int32)}, batch_size, 3, **storage)
    for t in range(4):  # wrapped
        buf.add_batch({"a": np.full((batch_size, 2), t, np.float32),
                       "b": np.full(batch_size, t, np.int32)})
    before = to_np(buf.gather_all())
    make_items, pattern = FLAT_BAD[case]
    with pytest.raises(rb.SpecError,
                       match=pattern.format(B=batch_size, B1=batch_size + 1)):
        buf.add_batch(make_items(batch_size))
    assert buf.last_id == 3
    after = to_np(buf.gather_all())
    for key in ("a", "b"):
        np.testing.assert_array_equal(after[key], before[key])


@pytest.mark.parametrize("batch_size", [1, 2])
def test_flat_spec_add_batch_converts_what_is_not_exact(storage, batch_size):
    buf = rb.UniformReplayBuffer({"a": rb.ArraySpec((2,), np.float32),
                                  "b": rb.ArraySpec((), np.int32)}, batch_size, 3, **storage)
    a = np.arange(2 * batch_size, dtype=np.float64).reshape(batch_size, 2)
    buf.add_batch({"a": a, "b": np.full(batch_size, 7, np.int64)})  # safe casts
    buf.add_batch({"a": np.ma.masked_array(a + 10), "b": np.full(batch_size, 8, np.int32)})
    buf.add_batch({"a": (a + 20).astype(np.float32), "b": np.full(batch_size, 9, np.int32)})
    got = to_np(buf.gather_all())
    np.testing.assert_array_equal(got["a"], np.stack([a, a + 10, a + 20], 1))
    np.testing.assert_array_equal(got["b"], np.repeat([[7, 8, 9]], batch_size, 0))
    assert got["a"].dtype == np.float32


def test_num_steps_longer_than_rows_hold_is_not_told_to_add_items():
    """Rows of 8 steps and num_steps=20 (within max_length): the error says num_steps is
    longer than a row holds, with how many it holds and max_length, and does not advise
    adding items (the buffer holds data); the buffer is unchanged."""
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.float32), 2, 100, seed=0)
    for k in range(8):
        buf.add_batch(np.full(2, k, np.float32))
    for read in (lambda: buf.get_next(1, num_steps=20),
                 lambda: next(iter(buf.as_dataset(1, num_steps=20)))):
        with pytest.raises(rb.EmptyBufferError) as caught:
            read()
        message = str(caught.value)
        assert message == ("num_steps=20 is longer than a row of UniformReplayBuffer "
                           "holds: each row holds 8 steps so far (max_length=100). Ask "
                           "for num_steps <= 8, or read once rows hold 20 steps.")
        assert "add items" not in message
    assert len(buf) == 16 and buf.get_next(1, num_steps=8)[0].shape == (1, 8)
