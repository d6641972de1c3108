"""Sampling on the torch storage's device (sampling/torch_*.py), on the CPU and any GPU.

Every test runs on the CPU (where the device samplers are chosen with
``sample_on_device=True``) and, where torch sees one, on the CUDA device too.
Pinned against references: the numpy sum tree's arithmetic, the host samplers'
distributions (chi-square), exact windows at the write head, and bit-exact restores.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybuffer as rb  # noqa: E402
from replaybuffer.errors import EmptyBufferError  # noqa: E402
from replaybuffer.sampling.torch_prefix_sums import TorchPrefixSums  # noqa: E402
from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler  # noqa: E402
from replaybuffer.sampling.torch_tree import TorchSegmentTree  # noqa: E402
from replaybuffer.sampling.torch_uniform import TorchUniformSampler  # noqa: E402

CPU = torch.device("cpu")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=["prefix", "tree"])
def search(request: pytest.FixtureRequest) -> str:
    """The prioritized sampler's search: running sums or a sum tree."""
    return request.param


def on(device: torch.device, x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x).to(device)


def chi2_999(df: int) -> float:
    """Upper 0.1% point of the chi-square distribution (Wilson-Hilferty, within 1%)."""
    z = 3.0902
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def counter_buffer(cls, device=CPU, batch_size=2, max_length=20, adds=20, search=None,
                   **kwargs):
    """Leaf value ``row * 1000 + add id``: a window's values give its row and steps.
    ``search`` picks the prioritized sampler's search (its default when None)."""
    buf = cls(rb.ArraySpec((), np.int64), batch_size, max_length, storage="torch",
              device=device, sample_on_device=True, seed=3, **kwargs)
    if search is not None:
        buf._sampler = TorchPrioritizedSampler(
            buf._sampler.capacity, kwargs.get("alpha", 0.6), seed=3, device=device,
            normalize=kwargs.get("normalize", "batch"), search=search)
    for t in range(adds):
        buf.add_batch(np.arange(batch_size, dtype=np.int64) * 1000 + t)
    return buf


# ------------------------------------------------------------------------- tree
def assign_randomly(structures, capacity, device, rng):
    """20 rounds of 30 random slot writes (repeats: the last occurrence wins; about 20%
    zeros) to each of ``structures`` (a min tree gets ``inf`` for 0), checked against a
    numpy array after every round; returns that array."""
    ref = np.zeros(capacity)
    for _ in range(20):
        slots = rng.integers(0, capacity, 30)
        values = rng.random(30) * (rng.random(30) < 0.8)
        for s, v in zip(slots, values):
            ref[s] = v
        for structure in structures:
            is_min = getattr(structure, "op", "sum") == "min"
            structure.assign(on(device, slots),
                             on(device, np.where(values > 0, values, np.inf) if is_min
                                else values))
        np.testing.assert_array_equal(structures[0].leaves.cpu().numpy(), ref)
    return ref


def check_sums_and_find(structure, ref, device, rng, past_total=False):
    """Total, prefix sums and search of a sum structure holding ``ref``: the slot whose
    running sums bracket each target, never an empty one (``past_total``: targets at
    the total and beyond land on the last slot with mass)."""
    capacity = len(ref)
    assert float(structure.root()) == pytest.approx(ref.sum(), rel=1e-12)
    ends = np.arange(capacity + 1)
    np.testing.assert_allclose(structure.prefix_sums(on(device, ends)).cpu().numpy(),
                               np.concatenate(([0.0], np.cumsum(ref))), rtol=1e-12, atol=1e-12)
    if ref.sum() == 0:
        return
    cumulative = np.cumsum(ref)
    targets = rng.random(500) * ref.sum()
    if past_total:
        targets = np.concatenate((targets, [ref.sum(), 2 * ref.sum()]))
    found = structure.find(on(device, targets)).cpu().numpy()
    expected = np.minimum(np.searchsorted(cumulative, targets, side="right"),
                          np.flatnonzero(ref)[-1])  # past the total: the last with mass
    near = np.isclose(targets[:, None], cumulative[None, :], rtol=1e-9).any(1)
    np.testing.assert_array_equal(found[~near], expected[~near])
    assert (ref[found] > 0).all()  # never an empty slot, even at the edges


@pytest.mark.parametrize("capacity", [1, 2, 7, 64, 1000])
def test_tree_matches_numpy_reference(capacity, device):
    rng = np.random.default_rng(capacity)
    tree = TorchSegmentTree(capacity, device, "sum")
    mins = TorchSegmentTree(capacity, device, "min")
    ref = assign_randomly([tree, mins], capacity, device, rng)
    positive = ref[ref > 0]
    assert float(mins.root()) == (positive.min() if positive.size else np.inf)
    check_sums_and_find(tree, ref, device, rng)
    # load rebuilds the same tree as the updates did
    other = TorchSegmentTree(capacity, device, "sum")
    other.load(on(device, ref))
    assert float(other.root()) == pytest.approx(ref.sum(), rel=1e-12)


def test_find_never_lands_on_empty_slots_at_the_end(device):
    tree = TorchSegmentTree(8, device, "sum")
    tree.assign(on(device, np.array([0, 3])), on(device, np.array([0.1, 0.2])))
    total = float(tree.root())
    found = tree.find(on(device, np.array([total, total * (1 + 1e-15), 0.0])))
    assert found.tolist() == [3, 3, 0]


@pytest.mark.parametrize("capacity", [1, 2, 7, 64, 1000])
def test_prefix_sums_match_numpy_reference(capacity, device):
    rng = np.random.default_rng(capacity)
    sums = TorchPrefixSums(capacity, device)
    ref = assign_randomly([sums], capacity, device, rng)
    positive = ref[ref > 0]
    assert float(sums.smallest_positive()) == (positive.min() if positive.size else np.inf)
    check_sums_and_find(sums, ref, device, rng, past_total=True)
    other = TorchPrefixSums(capacity, device)
    other.load(on(device, ref))
    np.testing.assert_array_equal(other.sums().cpu().numpy(), sums.sums().cpu().numpy())
    other.clear()
    assert float(other.root()) == 0.0


@pytest.mark.parametrize("capacity", [1, 5, 64])
def test_prefix_draw_matches_a_reference_within_its_range(capacity, device):
    """draw over a cyclic range (wrapping or not) lands where the running sums of the
    range, taken in order from ``first``, bracket ``u * mass``: never outside the range,
    never on an empty slot, even for u at 0 and just below 1."""
    rng = np.random.default_rng(capacity)
    sums = TorchPrefixSums(capacity, device)
    for _ in range(40):
        ref = rng.random(capacity) * (rng.random(capacity) < 0.6)
        sums.load(on(device, ref))
        first, span = int(rng.integers(capacity)), int(rng.integers(1, capacity + 1))
        order = (first + np.arange(span)) % capacity  # the range's slots, in order
        inside = np.isin(np.arange(capacity), order)
        u = np.concatenate((rng.random(300), [0.0, np.nextafter(1.0, 0.0)]))
        found, mass = sums.draw(on(device, u), first, span)
        found = found.cpu().numpy()
        assert float(mass) == pytest.approx(ref[order].sum(), rel=1e-12, abs=1e-300)
        assert float(sums.range_mass(first, span)) == float(mass)
        assert ((0 <= found) & (found < capacity)).all()  # even with no mass
        if ref[order].sum() == 0:
            continue
        assert inside[found].all() and (ref[found] > 0).all()
        cumulative = np.cumsum(ref[order])
        targets = u * cumulative[-1]
        last = np.flatnonzero(ref[order])[-1]
        expected = order[np.minimum(np.searchsorted(cumulative, targets, side="right"),
                                    last)]
        near = np.isclose(targets[:, None], cumulative[None, :], rtol=1e-9).any(1)
        np.testing.assert_array_equal(found[~near], expected[~near])
    sums.load(on(device, ref + (np.arange(capacity) == capacity - 1)))  # some mass
    found, _ = sums.draw(on(device, rng.random(50)))  # the whole range by default
    assert (sums.leaves.cpu().numpy()[found.cpu().numpy()] > 0).all()


_real_cumsum = torch.cumsum


def drifting_cumsum(rate):
    """torch.cumsum whose float sums drift upward by a relative ``rate`` per slot."""
    def cumsum(values, dim, **kwargs):
        out = _real_cumsum(values, dim, **kwargs)
        if out.is_floating_point():  # the integer ranks are exact on any device
            out.mul_(1 + rate * torch.arange(1, len(out) + 1, dtype=out.dtype,
                                             device=out.device))
        return out
    return cumsum


def test_zero_priorities_are_never_drawn_whatever_order_the_scan_adds_in(monkeypatch,
                                                                         device):
    # A drift far beyond rounding, so that draws land in the slivers often.
    monkeypatch.setattr(torch, "cumsum", drifting_cumsum(1e-3))
    buf = counter_buffer(rb.PrioritizedReplayBuffer, device, search="prefix",
                         batch_size=2, max_length=30, adds=45)
    tree = buf._sampler._tree
    assert not tree.may_hold_empty  # every stored priority is positive
    _, info = buf.get_next(1)
    ids = np.array([(buf._sampler.key_base + i) * 2 + r for i in range(15, 45)
                    for r in range(2)])
    priorities = np.where(np.arange(60) % 3 == 1, 0.0, 1.0 + np.arange(60) % 5)
    buf.update_priorities(ids, priorities)
    assert tree.may_hold_empty
    zero_ids = set(ids[priorities == 0].tolist())
    for num_steps in (1, 3):
        _, info = buf.get_next(4000, num_steps)
        drawn = info.ids.cpu().numpy().reshape(4000, -1)[:, 0]
        assert not zero_ids & set(drawn.tolist())
        assert (info.probabilities.cpu().numpy() > 0).all()
    buf.clear()
    assert not tree.may_hold_empty


def test_empty_slots_are_never_found_whatever_order_the_scan_adds_in(monkeypatch, device):
    """A GPU's cumsum associates differently from a loop, so an empty slot's running sum
    may exceed its left neighbour's by rounding (seen on an H100). Simulated here on any
    device by a scan that drifts upward by a relative 1e-12 per slot."""
    monkeypatch.setattr(torch, "cumsum", drifting_cumsum(1e-12))
    ref = np.where(np.arange(40) % 3 == 1, 0.0, 1.0)  # every third slot empty
    ref[30:] = 0.0  # and a run of empty slots at the end
    sums = TorchPrefixSums(40, device)
    sums.load(on(device, ref))
    cumulative = np.cumsum(ref)
    # Targets inside every drifted sliver: just past each slot's sequential sum.
    targets = np.concatenate((cumulative * (1 + 1e-12 * (np.arange(40) + 1.5)),
                              [cumulative[-1] * (1 - 1e-16)]))
    found = sums.find(on(device, np.minimum(targets, float(sums.root()) * (1 - 1e-15))))
    assert (ref[found.cpu().numpy()] > 0).all()
    for first, span in ((0, 40), (5, 20), (25, 30)):  # one piece and a wrapping one
        u = np.linspace(0.0, np.nextafter(1.0, 0.0), 4001)
        drawn, _ = sums.draw(on(device, u), first, span)
        assert (ref[drawn.cpu().numpy()] > 0).all()


def test_a_draw_stays_in_its_range_whatever_the_sums_outside_it(monkeypatch, device):
    """Unwritten slots are not held (may_hold_empty off): a scan that drifts downward
    leaves their sums below the range's last one, and the search over every slot may
    stray onto them; it is held inside the range."""
    monkeypatch.setattr(torch, "cumsum", drifting_cumsum(-1e-12))
    sums = TorchPrefixSums(40, device)
    sums.may_hold_empty = False  # as the sampler leaves it with positive priorities
    sums.load(on(device, np.where(np.arange(40) < 30, 1.0, 0.0)))
    u = np.linspace(0.0, np.nextafter(1.0, 0.0), 40001)
    for first, span in ((0, 30), (10, 20), (25, 5)):
        found, _ = sums.draw(on(device, u), first, span)
        found = found.cpu().numpy()
        assert found.min() >= first and found.max() < first + span
    sums.load(on(device, np.where((np.arange(40) < 8) | (np.arange(40) >= 30), 1.0, 0.0)))
    found, _ = sums.draw(on(device, u), 30, 18)  # wraps: [30, 40) then [0, 8)
    inside = (found.cpu().numpy() - 30) % 40 < 18
    assert inside.all()


def assert_no_mass_reported(buf, draw) -> None:
    """``draw()`` finds no mass: it raises ``EmptyBufferError`` at once, on the host and
    on the CPU's device sampler; on CUDA its check is deferred (no host wait in the
    draw: ``test_torch_prioritized_draw_checks.py``) and the next call that waits for
    the device's outcomes raises it."""
    if getattr(buf.sampler, "device", CPU).type == "cuda":
        draw()
        with pytest.raises(EmptyBufferError, match="priority 0"):
            buf.sampler.settle()
    else:
        with pytest.raises(EmptyBufferError, match="priority 0"):
            draw()


@pytest.mark.parametrize("search", ["prefix", "tree"])
def test_priorities_too_far_apart_to_sum_are_reported_as_the_host_does(search, device):
    """Priorities 2**66 apart: the valid windows' mass cancels in the running sums; the
    sampler checks the mass on the host, as for zeros, and raises as the host sampler
    does, instead of drawing outside the range."""
    bufs = [rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.float32), 1, 4, alpha=1.0,
                                       seed=0)]
    bufs.append(counter_buffer(rb.PrioritizedReplayBuffer, device, batch_size=1,
                               max_length=4, adds=0, search=search, alpha=1.0))
    for buf in bufs:
        for t in range(5):
            buf.add_batch(np.array([t], dtype=buf.data_spec.dtype))
        buf.update_priorities(np.array([1, 2, 3, 4]), np.array([1.0, 1.0, 1.0, 1e20]))
        assert_no_mass_reported(buf, lambda buf=buf: buf.get_next(4, 2))
    assert bufs[1]._sampler._empty.possible


@pytest.mark.parametrize("capacity", [3, 1000])
def test_prefix_sums_and_tree_find_the_same_slots(capacity, device):
    rng = np.random.default_rng(7)
    ref = rng.random(capacity) * (rng.random(capacity) < 0.7)
    tree, sums = TorchSegmentTree(capacity, device, "sum"), TorchPrefixSums(capacity, device)
    tree.load(on(device, ref))
    sums.load(on(device, ref))
    targets = on(device, rng.random(2000) * ref.sum())
    assert torch.equal(tree.find(targets), sums.find(targets))


# --------------------------------------------------------------------- uniform
@pytest.mark.parametrize("num_steps", [1, 3])
def test_uniform_windows_are_valid_and_uniform(num_steps, device):
    buf = counter_buffer(rb.UniformReplayBuffer, device, batch_size=2, max_length=10, adds=23)
    assert isinstance(buf._sampler, TorchUniformSampler)
    counts: dict[tuple[int, int], int] = {}
    for _ in range(200):
        items, info = buf.get_next(100, num_steps)
        assert isinstance(info.ids, torch.Tensor) and isinstance(info.probabilities,
                                                                 torch.Tensor)
        values = items.cpu().numpy()
        rows, steps = values // 1000, values % 1000
        assert (np.diff(steps, axis=1) == 1).all() and (rows == rows[:, :1]).all()
        assert steps.min() >= 13 and steps.max() <= 22  # never past the write head
        np.testing.assert_array_equal(info.ids.cpu().numpy(), steps)
        for r, s in zip(rows[:, 0], steps[:, 0]):
            counts[(r, s)] = counts.get((r, s), 0) + 1
    starts = 2 * (10 - num_steps + 1)
    assert len(counts) == starts
    assert info.probabilities.cpu().numpy() == pytest.approx(1 / starts)
    observed = np.array(list(counts.values()), float)
    assert chi_square(observed, np.full(starts, 20_000 / starts)) < chi2_999(starts - 1)


def test_uniform_with_one_row_wraps(device):
    buf = counter_buffer(rb.UniformReplayBuffer, device, batch_size=1, max_length=8, adds=13)
    items, info = buf.get_next(500, 4)
    steps = items.cpu().numpy()
    assert (np.diff(steps, axis=1) == 1).all() and steps.min() >= 5 and steps.max() <= 12


# ----------------------------------------------------------------- prioritized
@pytest.mark.parametrize("num_steps", [1, 4])
@pytest.mark.parametrize("alpha", [0.6, 1.0, 0.0])
def test_prioritized_follows_priorities(alpha, num_steps, device, search):
    B, L = 2, 10
    buf = counter_buffer(rb.PrioritizedReplayBuffer, device, search=search,
                         batch_size=B, max_length=L, adds=17,
                         alpha=alpha)
    assert isinstance(buf._sampler, TorchPrioritizedSampler)
    _, info = buf.get_next(1)  # item ids of the retained steps, by (id, row)
    ids = np.array([(buf._sampler.key_base + i) * B + r for i in range(7, 17)
                    for r in range(B)])
    priorities = np.arange(1.0, 21.0) % 7  # zeros among them: never drawn
    buf.update_priorities(ids, priorities)
    valid = np.array([i <= 16 - num_steps + 1 for i in range(7, 17) for _ in range(B)])
    mass = np.where(priorities > 0, priorities ** alpha, 0.0) * valid
    counts = np.zeros(len(ids))
    draws = 0
    for _ in range(100):
        items, info = buf.get_next(1000, num_steps)
        steps, rows = items.cpu().numpy() % 1000, items.cpu().numpy() // 1000
        assert (np.diff(steps, axis=1) == 1).all() and (rows == rows[:, :1]).all()
        index = (steps[:, 0] - 7) * B + rows[:, 0]
        np.testing.assert_allclose(info.probabilities.cpu().numpy(), mass[index] / mass.sum(),
                                   rtol=1e-6)
        counts += np.bincount(index, minlength=len(ids))
        draws += 1000
    assert counts[mass == 0].sum() == 0
    keep = mass > 0
    assert chi_square(counts[keep], draws * mass[keep] / mass.sum()) < chi2_999(keep.sum() - 1)


@pytest.mark.parametrize("normalize", ["batch", "buffer"])
def test_weights_and_probabilities_match_the_host_sampler(normalize, device, search):
    host = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.int64), 3, 12, seed=0,
                                      normalize=normalize)
    dev = counter_buffer(rb.PrioritizedReplayBuffer, device, search=search,
                         batch_size=3, max_length=12, adds=30,
                         normalize=normalize)
    for t in range(30):
        host.add_batch(np.arange(3, dtype=np.int64) * 1000 + t)
    rng = np.random.default_rng(1)
    _, info = host.get_next(50)
    ids = np.unique(info.ids)
    priorities = rng.random(len(ids)) * 5 + 0.1
    host.update_priorities(ids, priorities)
    dev.update_priorities(ids, priorities)
    items, info = dev.get_next(200, 2)
    np.testing.assert_allclose(dev.priorities(info.ids.cpu().numpy()[:, 0]),
                               host.priorities(info.ids.cpu().numpy()[:, 0]))
    values = host.priorities(info.ids.cpu().numpy()[:, 0])
    mass = host._sampler.valid_mass(host._ring, 2)
    assert dev._sampler.valid_mass(dev._ring, 2) == pytest.approx(mass, rel=1e-12)
    np.testing.assert_allclose(info.probabilities.cpu().numpy(), values / mass, rtol=1e-6)
    smallest = values.min() if normalize == "batch" else host._sampler._min.min()
    expected = np.minimum((smallest / values) ** host.beta, 1.0)
    np.testing.assert_allclose(info.weights.cpu().numpy(), expected, rtol=1e-5)


def test_bad_priorities_change_nothing(device, search):
    buf = counter_buffer(rb.PrioritizedReplayBuffer, device, search=search,
                         batch_size=1, max_length=10, adds=10)
    buf.update_priorities(np.arange(10), np.arange(1.0, 11.0))
    before = buf._sampler._tree.leaves.clone()
    state = torch.get_rng_state()
    for bad in (np.nan, -1.0, np.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            buf.update_priorities(np.arange(3), np.array([1.0, bad, 2.0]))
        assert torch.equal(buf._sampler._tree.leaves, before)
    with pytest.raises(ValueError, match="same S"):
        buf.update_priorities(np.arange(3), np.ones(2))
    assert torch.equal(buf._sampler._tree.leaves, before)
    assert torch.equal(torch.get_rng_state(), state)


def test_all_zero_priorities_raise(device, search):
    buf = counter_buffer(rb.PrioritizedReplayBuffer, device, search=search,
                         batch_size=1, max_length=10, adds=10)
    buf.update_priorities(np.arange(10), np.zeros(10))
    assert_no_mass_reported(buf, lambda: buf.get_next(4))


def test_stale_ids_and_clear(device, search):
    buf = counter_buffer(rb.PrioritizedReplayBuffer, device, search=search,
                         batch_size=1, max_length=5, adds=8)
    assert buf.update_priorities(np.array([0, 1, 7]), np.array([9.0, 9.0, 2.0])) == 1
    buf.clear()
    assert float(buf._sampler._tree.root()) == 0.0
    buf.add_batch(np.array([5], np.int64))
    items, info = buf.get_next(10)
    assert (items.cpu().numpy() == 5).all() and (info.ids.cpu().numpy() == 8).all()


# ----------------------------------------------------------------- restore
@pytest.mark.parametrize("cls, search", [(rb.UniformReplayBuffer, None),
                                         (rb.PrioritizedReplayBuffer, "prefix"),
                                         (rb.PrioritizedReplayBuffer, "tree")])
def test_restore_is_bit_exact(cls, search, tmp_path, device):
    buf = counter_buffer(cls, device, batch_size=2, max_length=10, adds=14, search=search)
    buf.get_next(7, 2)
    if cls is rb.PrioritizedReplayBuffer:
        buf.update_priorities(np.arange(0, 28, 3), np.linspace(0.5, 3.0, 10))
    buf.save(tmp_path / "ckpt")
    restored = rb.load(tmp_path / "ckpt")
    # A restore builds the host sampler (the default on the CPU); ask for the device one.
    fresh = counter_buffer(cls, device, batch_size=2, max_length=10, adds=0, search=search)
    fresh.restore_state({"last_id": buf._ring.last_id, "sampler": buf._sampler.state_dict()},
                   [a.cpu().numpy().copy() for a in buf._storage.arrays])
    for _ in range(3):
        (x, ix), (y, iy) = buf.get_next(16, 2), fresh.get_next(16, 2)
        assert torch.equal(x, y) and torch.equal(ix.ids, iy.ids)
        assert torch.equal(ix.probabilities, iy.probabilities)
    # The host sampler of the plain restore reads the same priorities and state.
    if cls is rb.PrioritizedReplayBuffer:
        ids = np.arange(0, 28, 3)
        np.testing.assert_allclose(restored.priorities(ids), buf.priorities(ids))


def test_sampler_state_dict_round_trip(device, search):
    a = TorchPrioritizedSampler(16, seed=5, device=device, search=search)
    b = TorchPrioritizedSampler(16, seed=6, device=device, search=search)
    ring = rb.sampling.Ring(2, 8)
    ring.last_id = 7
    a.on_add(ring, 0, 8)
    a.update_priorities(ring, np.arange(16), np.linspace(1, 2, 16))
    b.load_state_dict(a.state_dict())
    for _ in range(3):
        (ia, _), (ib, _) = a.sample(ring, 32, 3), b.sample(ring, 32, 3)
        assert torch.equal(ia.start_positions, ib.start_positions)


def test_a_state_dict_is_a_snapshot_not_the_live_priorities(device, search):
    sampler = TorchPrioritizedSampler(8, seed=0, device=device, search=search)
    ring = rb.sampling.Ring(1, 8)
    ring.last_id = 7
    sampler.on_add(ring, 0, 8)
    sampler.update_priorities(ring, np.arange(8), np.full(8, 2.0))
    state = sampler.state_dict()
    saved = state["priorities"].copy()
    sampler.update_priorities(ring, np.arange(8), np.full(8, 5.0))  # after the save
    np.testing.assert_array_equal(state["priorities"], saved)


def test_dataset_elements_are_reproducible(device):
    def elements():
        buf = counter_buffer(rb.UniformReplayBuffer, device, batch_size=2, max_length=10, adds=12)
        stream = iter(buf.as_dataset(8, 2))
        return [next(stream)[0] for _ in range(3)]
    for x, y in zip(elements(), elements()):
        assert torch.equal(x, y)


# --------------------------------------------------------------------- choice
def test_choice_of_sampler():
    spec = rb.ArraySpec((), np.int64)
    assert not isinstance(rb.UniformReplayBuffer(spec, storage="torch")._sampler,
                          TorchUniformSampler)  # CPU: the host sampler is faster
    with pytest.raises(ValueError, match="needs storage='torch'"):
        rb.UniformReplayBuffer(spec, sample_on_device=True)
    with pytest.raises(ValueError, match="track episodes"):
        rb.PrioritizedReplayBuffer({"step_type": rb.ArraySpec((), np.int32)},
                                   storage="torch", sample_on_device=True,
                                   track_episodes=True)
    assert TorchPrioritizedSampler(16).search == "prefix"
    with pytest.raises(ValueError, match="search must be 'prefix' or 'tree', got 'heap'"):
        TorchPrioritizedSampler(16, search="heap")
    with pytest.raises(ValueError, match="True, False or None"):
        rb.UniformReplayBuffer(spec, storage="torch", sample_on_device="yes")


def test_gpu_bench_smoke_on_the_cpu(capsys):
    from replaybuffer_bench import gpu

    assert gpu.main(["--device", "cpu", "--quick", "--workloads", "control",
                     "--no-torchrl", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "device: cpu" in out and "prioritized[prefix] sample(256)+next" in out
    assert "prioritized[tree] update+sample(256)" in out and "scalar 16,384" in out
    # the profile: one line per op, then the goals table joining it with the timings
    profiled = [line for line in out.splitlines() if line.startswith("  profile control")]
    assert len(profiled) == 6, out  # add x2, uniform, prioritized sample, update, cycle
    assert "| workload | op | ours us | TorchRL us | TorchRL / ours | kernels | copies " \
        "| syncs | device us |" in out
    goals = out[out.index("| workload | op | ours us |"):].splitlines()
    cycle = [line for line in goals
             if line.startswith("| control | prioritized[prefix] update+sample(256) |")]
    assert len(cycle) == 1 and ">= 2.5x TorchRL" in cycle[0], out


def test_gpu_bench_without_cuda_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    from replaybuffer_bench import gpu

    assert gpu.main(["--quick"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
