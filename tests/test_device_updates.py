"""Priority updates with device tensors (sampling/torch_priority_updates.py): made and
checked on the device, a bad batch writing nothing and raising at the next call.

Pinned against the host path (the same updates given as numpy arrays to a twin
buffer): the priorities stored, the largest priority and the draws that follow, on
the CPU and, where torch sees one, on the CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.buffers.device_sampling import AUTO_TREE_FROM, device_search_for  # noqa: E402
from replaybuffer.sampling.torch_deferred_checks import SLOTS, DeviceChecks  # noqa: E402
from replaybuffer.sampling.torch_priority_updates import checked_on_device  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


def twins(device: torch.device, batch_size: int = 2, max_length: int = 12, adds: int = 20,
          alpha: float = 0.6, normalize: str = "batch") -> tuple[rb.PrioritizedReplayBuffer,
                                                                 rb.PrioritizedReplayBuffer]:
    """Two device-sampling buffers built and filled alike (the ring wrapped when
    ``adds > max_length``): one is updated through the host path, one on the device (``device_updates``
    switched on for it: on the CPU the default checks on the host)."""
    bufs = []
    for _ in range(2):
        buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), batch_size, max_length,
                                         storage="torch", device=device, seed=5,
                                         sample_on_device=True, alpha=alpha,
                                         normalize=normalize)
        for t in range(adds):
            buf.add_batch(np.arange(batch_size, dtype=np.int64) * 1000 + t)
        bufs.append(buf)
    # On the CPU the default checks on the host (CUDA's default is the device): True
    # takes the path a CUDA device takes by default.
    bufs[1].sampler.device_updates = True
    return bufs[0], bufs[1]


def device_done(device: torch.device) -> None:
    """Let the device finish its queue: a deferred check is reported by the first call
    that finds it done (on the CPU, the next call)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def all_ids(buf: rb.PrioritizedReplayBuffer, adds: int) -> np.ndarray:
    return np.arange(adds * buf.batch_size, dtype=np.int64)


def update_both(host, dev, ids: np.ndarray, priorities: np.ndarray, device) -> None:
    applied = host.update_priorities(ids, priorities)
    given = dev.update_priorities(torch.from_numpy(ids).to(device),
                                  torch.from_numpy(priorities).to(device))
    assert given == len(ids) >= applied


def assert_same(host, dev, adds: int, rtol: float = 0.0) -> None:
    ids = all_ids(host, adds + 4)
    np.testing.assert_allclose(dev.priorities(ids), host.priorities(ids), rtol=rtol)
    assert dev.max_priority == host.max_priority


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_device_updates_store_what_host_updates_store(device, alpha):
    host, dev = twins(device, alpha=alpha)
    rng = np.random.default_rng(0)
    for _ in range(5):
        # Stale ids (the ring wrapped: ids below 16 are gone), repeats (the last one
        # wins), zeros and values above the largest so far.
        ids = rng.integers(0, 44, 24)
        priorities = rng.choice([0.0, 0.5, 1.0, 2.5, 7.0], 24)
        update_both(host, dev, ids, priorities, device)
        # pow on the device may round differently from numpy's in the last bit
        assert_same(host, dev, 20, rtol=0.0 if alpha in (0.0, 1.0) else 1e-15)
        # new steps enter at the largest priority, the device's included
        for buf in (host, dev):
            buf.add_batch(np.arange(2, dtype=np.int64))
    assert_same(host, dev, 25, rtol=0.0 if alpha in (0.0, 1.0) else 1e-15)


def test_draws_after_device_updates_are_the_host_paths(device):
    host, dev = twins(device, alpha=1.0, normalize="buffer")
    ids = all_ids(host, 20)
    priorities = np.linspace(0.5, 4.0, len(ids))
    update_both(host, dev, ids, priorities, device)
    for _ in range(3):
        a_items, a_info = host.get_next(64, 2)
        b_items, b_info = dev.get_next(64, 2)
        assert torch.equal(a_items.cpu(), b_items.cpu())
        assert torch.equal(a_info.ids.cpu(), b_info.ids.cpu())
        assert torch.equal(a_info.probabilities.cpu(), b_info.probabilities.cpu())
        assert torch.equal(a_info.weights.cpu(), b_info.weights.cpu())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(-3, 60), min_size=0, max_size=12),
                          st.lists(st.sampled_from([0.0, 0.25, 1.0, 3.0]), min_size=12,
                                   max_size=12)), min_size=1, max_size=4),
       st.integers(0, 30), st.booleans())
def test_device_updates_match_the_host_path_property(updates, adds, clear):
    host, dev = twins(torch.device("cpu"), batch_size=2, max_length=8, adds=adds,
                      alpha=1.0)
    if clear:
        for buf in (host, dev):
            buf.clear()
            buf.add_batch(np.array([1, 2], np.int64))
    for ids, values in updates:
        ids_arr = np.array(ids, np.int64)
        update_both(host, dev, ids_arr, np.array(values[:len(ids)]), "cpu")
    assert_same(host, dev, adds + 2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_bad_device_update_writes_nothing_and_raises_at_the_next_call(device, bad):
    _, dev = twins(device)
    ids = all_ids(dev, 20)
    before = dev.priorities(ids)
    largest = dev.max_priority
    values = torch.tensor([2.0, bad, 9.0], dtype=torch.float64, device=device)
    ids_t = torch.tensor([30, 31, 32], device=device)
    assert dev.update_priorities(ids_t, values) == 3  # returns: checked on the device
    values.fill_(0.0)  # the caller reusing its tensor changes nothing reported
    device_done(device)
    with pytest.raises(ValueError, match=r"priorities\[1\] is (nan|inf|-1\.0) \(for id 31\); "
                                         r"1 bad value\(s\), nothing was updated \(found on "
                                         r"the device after"):
        dev.get_next(4)
    np.testing.assert_array_equal(dev.priorities(ids), before)
    assert dev.max_priority == largest
    dev.get_next(4)  # reported once; the buffer samples again


def test_the_next_update_reports_the_bad_one_before_applying(device):
    _, dev = twins(device)
    ids = torch.tensor([30, 31], device=device)
    dev.update_priorities(ids, torch.tensor([-2.0, 1.0], device=device))
    device_done(device)
    with pytest.raises(ValueError, match=r"priorities\[0\] is -2\.0"):
        dev.update_priorities(ids, torch.tensor([5.0, 6.0], device=device))
    before = dev.priorities(np.array([30, 31]))
    assert dev.update_priorities(ids, torch.tensor([5.0, 6.0], device=device)) == 2
    after = dev.priorities(np.array([30, 31]))
    assert not np.array_equal(before, after)
    np.testing.assert_allclose(after, np.array([5.0, 6.0]) ** 0.6)


def test_an_overflowing_device_update_is_refused_at_the_next_call(device):
    _, dev = twins(device, alpha=1.0)
    before = dev.priorities(all_ids(dev, 20))
    dev.update_priorities(torch.tensor([30, 31], device=device),
                          torch.tensor([1e308, 1e308], dtype=torch.float64, device=device))
    device_done(device)
    with pytest.raises(ValueError, match="expected a finite total priority"):
        dev.update_priorities(torch.tensor([30], device=device),
                              torch.tensor([1.0], device=device))
    np.testing.assert_array_equal(dev.priorities(all_ids(dev, 20)), before)


def test_bad_device_arguments_are_refused_at_once_and_change_nothing(device):
    _, dev = twins(device)
    before = dev.priorities(all_ids(dev, 20))
    with pytest.raises(ValueError, match=r"expected ids \[S\] \(or \[S, T\]\) and "
                                         r"priorities \[S\] of the same S, got ids of "
                                         r"shape \(3,\) and priorities of shape \(2,\)"):
        dev.update_priorities(torch.tensor([30, 31, 32], device=device),
                              torch.ones(2, device=device))
    with pytest.raises(ValueError, match="ids must be integers"):
        dev.update_priorities(torch.ones(2, device=device), torch.ones(2, device=device))
    np.testing.assert_array_equal(dev.priorities(all_ids(dev, 20)), before)
    assert dev.update_priorities(torch.zeros(0, dtype=torch.int64, device=device),
                                 torch.zeros(0, device=device)) == 0


def test_window_ids_update_their_first_step(device):
    host, dev = twins(device, alpha=1.0)
    _, info = dev.get_next(8, 3)
    priorities = np.arange(1.0, 9.0)
    host.update_priorities(info.ids.cpu().numpy(), priorities)
    dev.update_priorities(info.ids, torch.from_numpy(priorities).to(device))
    assert_same(host, dev, 20)
    # unstacked windows: a T-tuple of [S] ids
    _, info = dev.get_next(8, 2, time_stacked=False)
    host.update_priorities(tuple(i.cpu().numpy() for i in info.ids), priorities * 2)
    dev.update_priorities(info.ids, torch.from_numpy(priorities * 2).to(device))
    assert_same(host, dev, 20)


def test_state_dict_and_clear_settle_device_updates(device):
    host, dev = twins(device, alpha=1.0)
    ids = all_ids(dev, 20)[-6:]
    update_both(host, dev, ids, np.full(6, 50.0), device)
    assert dev._sampler.state_dict()["max_priority"] == 50.0
    dev.update_priorities(torch.from_numpy(ids).to(device),
                          torch.full((6,), 80.0, device=device))
    dev.clear()  # the update's outcome arrives after the clear: it notes nothing
    assert dev.max_priority == 1.0
    dev.add_batch(np.array([1, 2], np.int64))
    assert dev.priorities(np.array([40, 41])).tolist() == [1.0, 1.0]


def test_device_checks_queue_in_order_and_fill_up(device):
    checks = DeviceChecks(device, 2)
    for k in range(SLOTS):
        checks.push(torch.tensor([k, -k], dtype=torch.float64, device=device), k)
    assert checks.full
    with pytest.raises(RuntimeError, match="every slot is in use"):
        checks.push(torch.zeros(2, dtype=torch.float64, device=device), None)
    taken = checks.take(wait=True)
    assert [p for _, p in taken] == list(range(SLOTS))
    assert [s.tolist() for s, _ in taken] == [[k, -k] for k in range(SLOTS)]
    assert not len(checks)
    checks.push(torch.ones(2, dtype=torch.float64, device=device), "again")
    assert [p for _, p in checks.take(wait=True)] == ["again"]


def test_many_device_updates_without_a_sample(device):
    host, dev = twins(device, alpha=1.0)
    for k in range(3 * SLOTS):  # more than the slots in flight: the oldest are read
        update_both(host, dev, np.array([30 + k % 5]), np.array([1.0 + k]), device)
    assert_same(host, dev, 20)


def test_device_search_is_validated_and_auto_picks_by_capacity():
    assert device_search_for(None, 100, True) == "prefix"
    assert device_search_for("auto", AUTO_TREE_FROM - 1, True) == "prefix"
    assert device_search_for("auto", AUTO_TREE_FROM, True) == "tree"
    assert device_search_for("tree", 100, True) == "tree"
    with pytest.raises(ValueError, match=r"device_search must be 'auto' \(or None: by "
                                         r"capacity\) or a search.*got 'fast'"):
        device_search_for("fast", 100, True)
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.float32), 1, 16, storage="torch",
                                     sample_on_device=True, device_search="auto")
    assert buf.sampler.search == "prefix"
    rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.float32), 1, 16, device_search="auto")
    with pytest.raises(ValueError, match="applies to sampling on the device only"):
        rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.float32), 1, 16,
                                   device_search="prefix")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_updates_and_samples_never_synchronize_cuda():
    """torch's sync debug mode raises on any operation that makes the host wait."""
    device = torch.device("cuda")
    _, dev = twins(device, max_length=64, adds=80)
    uniform = rb.UniformReplayBuffer(rb.ArraySpec((3,), np.float32), 2, 64, storage="torch",
                                     device=device, seed=0, sample_on_device=True)
    for _ in range(2):  # two steps per row, for windows of 2
        uniform.add_batch(torch.ones(2, 3, device=device))
    _, info = dev.get_next(32, 2)
    priorities = torch.rand(32, device=device, dtype=torch.float64) + 0.1
    dev.update_priorities(info.ids, priorities)  # warm: pending adds flushed
    dev.get_next(32, 2)
    uniform.get_next(32, 2)
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            dev.update_priorities(info.ids, priorities)
            dev.get_next(32, 2)
            uniform.get_next(32, 2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(device)
    dev.priorities(info.ids.cpu().numpy()[:, 0])  # and the checks settle after


def test_device_updates_off_checks_on_the_host_at_once(device):
    _, dev = twins(device)
    dev.sampler.device_updates = False
    ids = torch.tensor([30, 31], device=device)
    with pytest.raises(ValueError, match=r"priorities\[1\] is nan \(for id 31\); 1 bad "
                                         r"value\(s\), nothing was updated$"):
        dev.update_priorities(ids, torch.tensor([1.0, float("nan")], device=device))
    assert dev.update_priorities(ids, torch.tensor([2.0, 3.0], device=device)) == 2
    np.testing.assert_allclose(dev.priorities(np.array([30, 31])),
                               np.array([2.0, 3.0]) ** 0.6)


def test_device_checks_are_the_default_on_cuda_only():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert checked_on_device(None, cuda, "prefix")
    # eager updates checked on the device are slower than the host check: the default
    # only where they are recorded
    assert not checked_on_device(None, cuda, "prefix", recorded=False)
    assert not checked_on_device(None, cpu, "prefix")
    assert checked_on_device(True, cpu, "prefix")
    assert not checked_on_device(False, cuda, "prefix")
    # the tree search sizes its writes on the host: it always checks there
    assert not checked_on_device(None, cuda, "tree")
    assert not checked_on_device(True, cpu, "tree")
    with pytest.raises(ValueError, match=r"device_updates must be True, False or None "
                                         r"\(on a CUDA device\), got 'yes'"):
        checked_on_device("yes", cpu, "prefix")  # type: ignore[arg-type]


def test_a_cpu_buffer_checks_on_the_host_by_default():
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 2, 8, storage="torch",
                                     seed=5, sample_on_device=True)
    buf.add_batch(np.arange(2, dtype=np.int64))
    assert buf.sampler.device_updates is None and not buf.sampler.checks_on_device
    with pytest.raises(ValueError, match=r"priorities\[0\] is nan \(for id 0\); 1 bad "
                                         r"value\(s\), nothing was updated$"):
        buf.update_priorities(torch.tensor([0]), torch.tensor([float("nan")]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_checks_are_the_default_for_a_buffer_on_cuda_that_records():
    default = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 2, 8, storage="torch",
                                         device="cuda", seed=5)
    assert default._captures is None and not default.sampler.checks_on_device
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 2, 8, storage="torch",
                                     device="cuda", seed=5, capture_samples=True)
    buf.add_batch(np.arange(2, dtype=np.int64))
    assert buf.sampler.checks_on_device
    ids = torch.tensor([0, 1], device="cuda")
    assert buf.update_priorities(ids, torch.tensor([1.0, -1.0], device="cuda")) == 2
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"priorities\[1\] is -1\.0 \(for id 1\)"):
        buf.get_next(4)
    tree = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 2, 8, storage="torch",
                                      device="cuda", seed=5, device_search="tree")
    assert not tree.sampler.checks_on_device
    eager = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 2, 8, storage="torch",
                                       device="cuda", seed=5, capture_samples=False)
    assert not eager.sampler.checks_on_device


def bad_update(dev: rb.PrioritizedReplayBuffer, device: torch.device) -> None:
    """A refused update (a NaN at index 1, id 31) that the device has finished."""
    dev.update_priorities(torch.tensor([30, 31], device=device),
                          torch.tensor([4.0, float("nan")], device=device))
    device_done(device)


BAD = r"priorities\[1\] is nan \(for id 31\); 1 bad value\(s\), nothing was updated"


@pytest.mark.parametrize("touch", ["get_next", "update_priorities", "state_dict", "save",
                                   "priorities", "max_priority"])
def test_every_host_touch_reports_a_bad_update_and_leaves_the_sums_as_they_were(
        device, touch, tmp_path):
    host, dev = twins(device, alpha=1.0)
    dev.priorities(all_ids(dev, 20))  # the new steps' priorities written
    before_leaves = dev.sampler._tree.leaves.clone()
    before_sums = dev.sampler._tree.sums().clone()
    bad_update(dev, device)
    calls = {
        "get_next": lambda: dev.get_next(4),
        "update_priorities": lambda: dev.update_priorities(
            torch.tensor([30], device=device), torch.tensor([2.0], device=device)),
        "state_dict": dev.state_dict,
        "save": lambda: dev.save(tmp_path / "ckpt"),
        "priorities": lambda: dev.priorities(np.array([30])),
        "max_priority": lambda: dev.max_priority,
    }
    with pytest.raises(ValueError, match=BAD):
        calls[touch]()
    assert torch.equal(dev.sampler._tree.leaves, before_leaves)
    assert torch.equal(dev.sampler._tree.sums(), before_sums)
    # reported once; afterwards the buffer is its host twin's, draws and state alike
    assert dev.max_priority == host.max_priority
    for _ in range(2):
        a_items, a_info = host.get_next(16, 2)
        b_items, b_info = dev.get_next(16, 2)
        assert torch.equal(a_items, b_items) and torch.equal(a_info.ids, b_info.ids)
        assert torch.equal(a_info.weights, b_info.weights)
    np.testing.assert_array_equal(dev.sampler.state_dict()["priorities"],
                                  host.sampler.state_dict()["priorities"])


def test_good_updates_queued_behind_a_bad_one_apply_and_the_bad_one_does_not(device):
    """Both queued before either outcome is read (a GPU running behind; on the CPU
    the sampler's own next call would report the bad one first, so the two are
    applied here directly)."""
    host, dev = twins(device, alpha=1.0)
    dev.priorities(all_ids(dev, 20))  # the new steps' priorities written
    sampler = dev.sampler
    updates = sampler._device_updates
    ids = all_ids(dev, 20)[-5:]
    updates.apply(dev._ring, sampler.key_base, sampler._tree,
                  torch.tensor([30, 31], device=device),
                  torch.tensor([4.0, float("nan")], dtype=torch.float64, device=device))
    updates.apply(dev._ring, sampler.key_base, sampler._tree,
                  torch.from_numpy(ids).to(device),
                  torch.full((5,), 3.0, dtype=torch.float64, device=device))
    sampler._tree.may_hold_empty = True
    host.update_priorities(ids, np.full(5, 3.0))
    with pytest.raises(ValueError, match=BAD):
        sampler.settle()
    assert_same(host, dev, 20)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(-3, 60), min_size=1, max_size=8),
                          st.lists(st.sampled_from([0.0, 1.0, 3.0, -1.0, float("nan")]),
                                   min_size=8, max_size=8)), min_size=1, max_size=5),
       st.integers(1, 30))
def test_mixed_good_and_bad_device_updates_match_the_host_path_property(updates, adds):
    """The host twin gets only the good batches (the host path refuses a bad one at
    once); the device one gets all, each bad one raising at the next call."""
    host, dev = twins(torch.device("cpu"), batch_size=2, max_length=8, adds=adds,
                      alpha=1.0)
    owed = False
    for ids, values in updates:
        ids_arr, vals = np.array(ids, np.int64), np.array(values[:len(ids)])
        bad = bool(np.isnan(vals).any() or (vals < 0).any())
        if bad:
            with pytest.raises(ValueError, match="nothing was updated$"):
                host.update_priorities(ids_arr, vals)
        else:
            host.update_priorities(ids_arr, vals)
        try:
            dev.update_priorities(torch.from_numpy(ids_arr), torch.from_numpy(vals))
            reported = False
        except ValueError as error:
            assert owed and "found on the device" in str(error)
            reported = True
            dev.update_priorities(torch.from_numpy(ids_arr), torch.from_numpy(vals))
        owed = bad or (owed and not reported)
    if owed:
        with pytest.raises(ValueError, match="found on the device"):
            dev.state_dict()
    assert_same(host, dev, adds + 2)
