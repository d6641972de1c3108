"""The device layout of the torch storage (storage/torch_packing.py): leaves of one
dtype packed in one tensor, one gather per dtype. Pinned byte for byte against
per-leaf gathers and against the CPU storage's records, on the CPU (the CPU twin:
``numpy_views = False``) and, where torch sees one, on the CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.storage.numpy_storage import NumpyStorage  # noqa: E402
from replaybuffer.storage.torch_packing import PackedLeaves  # noqa: E402
from replaybuffer.storage.torch_storage import TorchStorage  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.int32, torch.uint8, torch.bool, torch.float64, torch.int64]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


def control_spec() -> dict:
    return {"observation": rb.ArraySpec((17,), np.float32),
            "action": rb.ArraySpec((6,), np.float32),
            "reward": rb.ArraySpec((), np.float32),
            "discount": rb.ArraySpec((), np.float32),
            "step_type": rb.ArraySpec((), np.int32),
            "frame": rb.ArraySpec((2, 3), np.uint8)}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), max_size=3),
                          st.sampled_from(range(len(DTYPES)))), min_size=1, max_size=6),
       st.integers(1, 9), st.lists(st.integers(0, 8), min_size=1, max_size=12),
       st.data())
def test_packed_gathers_are_per_leaf_gathers(leaves, capacity, positions, data):
    shapes = [tuple(s) for s, _ in leaves]
    dtypes = [DTYPES[d] for _, d in leaves]
    packed = PackedLeaves(shapes, dtypes, capacity, torch.device("cpu"))
    reference = []
    gen = torch.Generator().manual_seed(0)
    for view, shape, dtype in zip(packed.views, shapes, dtypes):
        assert view.shape == (capacity,) + shape and view.dtype == dtype
        values = (torch.randint(0, 200, (capacity,) + shape, generator=gen)).to(dtype)
        view.copy_(values)  # written through the view, as the storage writes
        reference.append(values)
    flat = torch.tensor([p % capacity for p in positions], dtype=torch.int64)
    outer = data.draw(st.sampled_from([(len(positions),)] + (
        [(len(positions) // 2, 2)] if len(positions) % 2 == 0 else [])))
    which = data.draw(st.lists(st.sampled_from(range(len(leaves))), min_size=1,
                               unique=True))
    for i, got in zip(which, packed.gather(flat, outer, which)):
        expected = reference[i][flat].reshape(outer + shapes[i])
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got, expected)
    packed.zero()
    assert all(not v.any() for v in packed.views)


def test_one_gather_per_dtype(monkeypatch):
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setattr(TorchStorage, "numpy_views", False)
    buf = rb.UniformReplayBuffer(control_spec(), 2, 16, storage="torch", seed=0,
                                 sample_on_device=True)
    for t in range(20):
        buf.add_batch({k: np.full((2,) + s.shape, t, s.dtype)
                       for k, s in control_spec().items()})
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        buf.get_next(32, 2)
    selects = [e.count for e in prof.key_averages() if e.key == "aten::index_select"]
    assert selects == [3]  # float32, int32 and uint8: three blocks for six leaves


def fill(buf, batch_size: int, adds: int) -> None:
    rng = np.random.default_rng(1)
    for _ in range(adds):
        buf.add_batch({k: (rng.random((batch_size,) + s.shape) * 100).astype(s.dtype)
                       for k, s in control_spec().items()})


@pytest.mark.parametrize("batch_size, adds", [(1, 10), (1, 37), (3, 50)])
def test_device_layout_samples_what_the_records_hold(monkeypatch, batch_size, adds):
    """The same seed draws the same windows from both layouts (records, and the
    packed blocks of a device on its CPU twin), wrap-around included: byte for byte."""
    def filled() -> rb.UniformReplayBuffer:
        buf = rb.UniformReplayBuffer(control_spec(), batch_size, 16, storage="torch",
                                     seed=4, sample_on_device=True)
        fill(buf, batch_size, adds)
        return buf

    records = filled()
    monkeypatch.setattr(TorchStorage, "numpy_views", False)
    packed = filled()
    for num_steps in (None, 2, 5):
        items, info = packed.get_next(64, num_steps)
        ref_items, ref_info = records.get_next(64, num_steps)
        assert torch.equal(info.ids, ref_info.ids)
        assert torch.equal(info.probabilities, ref_info.probabilities)
        for key in control_spec():
            assert items[key].dtype == ref_items[key].dtype
            assert torch.equal(items[key], ref_items[key])


def test_device_gathers_are_the_numpy_storages(device, monkeypatch):
    """Windows of positions past the end (taken modulo the capacity), on the device."""
    monkeypatch.setattr(TorchStorage, "numpy_views", False)
    specs = list(control_spec().values())
    ours = TorchStorage(specs, 12, device)
    reference = NumpyStorage(specs, 12)
    rng = np.random.default_rng(2)
    for start in (0, 4, 8):
        leaves = [(rng.random((4,) + s.shape) * 100).astype(s.dtype) for s in specs]
        ours.write(start, ours.convert(leaves, [str(i) for i in range(len(specs))], (4,),
                                       "[4]"))
        reference.write(start, leaves)
    positions = rng.integers(0, 20, (16, 3))
    got = ours.gather(torch.from_numpy(positions).to(device))
    expected = reference.gather(positions % 12)
    for g, e in zip(got, expected):
        assert g.device.type == device.type
        np.testing.assert_array_equal(g.cpu().numpy(), e)
    sub = ours.gather(torch.from_numpy(positions[:, 0]).to(device), [2, 4])
    for g, e in zip(sub, [expected[2][:, 0], expected[4][:, 0]]):
        np.testing.assert_array_equal(g.cpu().numpy(), e)
