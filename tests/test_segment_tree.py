"""Sum and min segment trees against a brute-force numpy array of the slots.

The model of a tree is a plain float64 array of its slots, updated one index at a
time in a Python loop (so a repeated index ends with its last value). Node arrays are
compared with a tree built here from scratch, independently of the tree's own code:
binary levels paired up from the leaves to the wide root's children, the root value
reduced over the total level (the lowest level of at most ``TOTAL_WIDTH`` nodes, or
the subtree roots), and the wide root's running sums summed by a Python loop. A sum
tree must match it bit for bit. Most properties run at several root widths: 1 (a
plain binary tree), 2 and 4 (forests of binary subtrees at these small capacities)
and the default (all wide root, for capacities up to 1024).

Every test runs twice: with the numpy loops and with the compiled ones
(:mod:`replaybuffer.sampling.tree_kernels`, numba is a test dependency), which must
give the same bits. Tests of the numpy loops' own bookkeeping (stale levels, rows)
build their trees with ``compiled=False``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.segment_tree import (
    DEFAULT_ROOT_WIDTH,
    TOTAL_WIDTH,
    MinTree,
    SumTree,
)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True, params=["numpy", "compiled"])
def loops(request, monkeypatch):
    """Trees built with the default ``compiled=None`` take this test's loops."""
    if request.param == "compiled":
        assert tree_kernels.numba is not None, "numba is a test dependency (the fast extra)"
        monkeypatch.setattr(tree_kernels, "AVAILABLE", True)
    else:
        monkeypatch.setattr(tree_kernels, "AVAILABLE", False)
    return request.param

TINY = 5e-324  # the smallest subnormal
WIDTHS = [1, 2, 4, DEFAULT_ROOT_WIDTH]


# --------------------------------------------------------------------- reference model
def reference_levels(leaves: np.ndarray, combine: np.ufunc, identity: float,
                     root_width: int = DEFAULT_ROOT_WIDTH) -> list[np.ndarray]:
    """Binary levels from the padded leaves (first) to the subtree roots (last)."""
    size = 1
    while size < len(leaves):
        size *= 2
    level = np.full(size, identity)
    level[:len(leaves)] = leaves
    levels = [level]
    while len(level) > root_width:
        level = combine(level[0::2], level[1::2])
        levels.append(level)
    return levels


def reference(leaves: np.ndarray, combine: np.ufunc, identity: float,
              root_width: int = DEFAULT_ROOT_WIDTH) -> tuple[np.ndarray, float]:
    """``(nodes, root)`` for ``leaves``: pad to a power of two, pair up level by level
    until at most ``root_width`` nodes remain; the root value reduces the lowest level
    of at most ``max(TOTAL_WIDTH, root_width)`` nodes."""
    levels = reference_levels(leaves, combine, identity, root_width)
    total_level = next(lv for lv in levels if len(lv) <= max(TOTAL_WIDTH, root_width))
    root = float(combine.reduce(np.ascontiguousarray(total_level)))
    # The nodes [0, width) are unused and hold the identity.
    return (np.concatenate([np.full(len(levels[-1]), identity)] + levels[::-1]), root)


def reference_runs(leaves: np.ndarray, root_width: int = DEFAULT_ROOT_WIDTH) -> np.ndarray:
    """The wide root's inclusive running sums of the subtree roots, by a Python loop."""
    runs, acc = [], 0.0
    for value in reference_levels(leaves, np.add, 0.0, root_width)[-1].tolist():
        acc = acc + value
        runs.append(acc)
    return np.array(runs)


def reference_nodes(leaves, combine, identity, root_width=DEFAULT_ROOT_WIDTH):
    return reference(leaves, combine, identity, root_width)[0]


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float64).view(np.int64)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool((bits(a) == bits(b)).all())


def apply(model: np.ndarray, indices: np.ndarray, values: np.ndarray) -> None:
    for i, v in zip(indices.tolist(), values.tolist()):  # one at a time: the last wins
        model[i] = v


def oracle_prefix(leaves: np.ndarray, targets: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.cumsum(leaves), targets, side="right")


# --------------------------------------------------------------------- strategies
capacities = st.one_of(st.integers(1, 20), st.sampled_from([31, 32, 33, 64, 100, 128, 129]))
widths = st.sampled_from(WIDTHS)

# Multiples of 1/16 up to 62.5: every sum of up to 129 of them, and every subtraction
# on the way down the tree, is exact in float64, so cumsum is an exact oracle.
exact_priorities = st.one_of(st.just(0.0), st.integers(0, 1000).map(lambda v: v / 16))

# Everything a sum tree accepts, from subnormals to 1e300 (129 of them still sum finitely).
any_priorities = st.one_of(
    st.just(0.0),
    st.just(TINY),
    st.floats(min_value=TINY, max_value=1e-300),
    st.floats(min_value=0.0, max_value=1e6),
    st.floats(min_value=0.0, max_value=1e300),
)

min_tree_values = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.just(np.inf))


@st.composite
def update_batches(draw, values, max_batches=8):
    """``(capacity, [(indices int64 [K], values float64 [K]), ...])`` with repeats."""
    capacity = draw(capacities)
    # A few hot indices, so a batch often names one several times.
    hot = draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=3))
    index = st.one_of(st.sampled_from(hot), st.integers(0, capacity - 1))
    batches = []
    for _ in range(draw(st.integers(1, max_batches))):
        k = draw(st.integers(0, 12))
        indices = draw(st.lists(index, min_size=k, max_size=k))
        vals = draw(st.lists(values, min_size=k, max_size=k))
        batches.append((np.array(indices, np.int64), np.array(vals, np.float64)))
    return capacity, batches


def build(cls, capacity, batches, identity, root_width=DEFAULT_ROOT_WIDTH):
    tree, model = cls(capacity, root_width=root_width), np.full(capacity, identity)
    for indices, values in batches:
        tree.update(indices, values)
        apply(model, indices, values)
    return tree, model


# --------------------------------------------------------------------- updates
@settings(max_examples=150, **SETTINGS)
@given(update_batches(any_priorities), widths)
def test_sum_tree_matches_brute_force(case, width):
    capacity, batches = case
    tree, model = SumTree(capacity, root_width=width), np.zeros(capacity)
    for indices, values in batches:
        tree.update(indices, values)
        apply(model, indices, values)
        assert same_bits(tree.get(np.arange(capacity)), model)
        nodes, total = reference(model, np.add, 0.0, width)
        assert same_bits(tree.nodes, nodes) and same_bits(tree.total(), total)
        assert same_bits(tree._upto, reference_runs(model, width))
        exact = math.fsum(model)
        assert 0.0 <= tree.total() and abs(tree.total() - exact) <= 1e-14 * exact
        assert abs(tree._runs[-1] - exact) <= 1e-14 * exact
    before = tree.nodes.copy(), tree.total()
    tree.rebuild()  # the same tree, bit for bit
    assert same_bits(tree.nodes, before[0]) and same_bits(tree.total(), before[1])


@settings(max_examples=100, **SETTINGS)
@given(update_batches(min_tree_values), widths)
def test_min_tree_matches_brute_force(case, width):
    capacity, batches = case
    tree, model = MinTree(capacity, root_width=width), np.full(capacity, np.inf)
    for indices, values in batches:
        tree.update(indices, values)
        apply(model, indices, values)
        assert np.array_equal(tree.get(np.arange(capacity)), model)
        # == rather than bits: which of -0.0 and 0.0 np.minimum returns is unspecified.
        nodes, smallest = reference(model, np.minimum, np.inf, width)
        assert np.array_equal(tree.nodes, nodes)
        assert tree.min() == model.min() == smallest


def test_repeated_index_last_value_wins():
    for cls in (SumTree, MinTree):
        tree = cls(5)
        tree.update(np.array([3, 1, 3, 3, 1]), np.array([1.0, 2.0, 5.0, 7.0, 4.0]))
        assert tree.get([1, 3]).tolist() == [4.0, 7.0]
        tree.update([0, 0], 9.0)  # a scalar value applies to every index
        assert tree.get(0) == 9.0
    assert tree.min() == 4.0
    many = np.arange(1000) % 7
    for width in WIDTHS:
        tree = SumTree(7, root_width=width)
        tree.update(many, np.arange(1000, dtype=np.float64))
        expected = np.zeros(7)
        apply(expected, many, np.arange(1000, dtype=np.float64))
        assert same_bits(tree.get(np.arange(7)), expected)
        assert same_bits(tree.nodes, reference_nodes(expected, np.add, 0.0, width))


def test_shapes_scalars_and_empty_batches():
    tree = SumTree(6)
    tree.update(2, 1.5)
    tree.update(np.array([[0, 1], [4, 5]]), np.array([[1.0, 0.0], [2.0, 0.5]]))
    tree.update([], [])
    tree.update(np.array([], np.int64), 3.0)
    assert tree.get(np.array([[2, 0], [4, 5]])).tolist() == [[1.5, 1.0], [2.0, 0.5]]
    assert tree.get([]).shape == (0,) and tree.total() == 5.0
    assert tree.find_prefix(np.array([[0.0, 1.0], [2.5, 4.9]])).tolist() == [[0, 2], [4, 5]]
    assert tree.find_prefix([]).dtype == np.int64 and tree.find_prefix([]).shape == (0,)
    assert tree.find_prefix(np.array([0, 1], np.int32)).tolist() == [0, 2]
    assert tree.prefix_sum(np.array([[0, 3], [5, 6]])).tolist() == [[0.0, 2.5], [4.5, 5.0]]
    assert tree.prefix_sum(4) == 2.5 and tree.prefix_sum(4).shape == ()
    assert tree.prefix_sum([]).dtype == np.float64 and tree.prefix_sum([]).shape == (0,)
    assert tree.prefix_sum(np.array([6], np.uint8)).tolist() == [5.0]


@pytest.mark.parametrize("width", WIDTHS + [2 * TOTAL_WIDTH])
@pytest.mark.parametrize("capacity", [1, 2, 3, 4, 5, 8, 9, 1000, 1023, 1024, 1025, 5000,
                                      TOTAL_WIDTH - 1, TOTAL_WIDTH, TOTAL_WIDTH + 1,
                                      2 * TOTAL_WIDTH + 1])
def test_capacity_layout(capacity, width):
    size = 1 << (capacity - 1).bit_length()
    tree = SumTree(capacity, root_width=width)
    mins = MinTree(capacity, root_width=width)
    assert tree.nodes.shape == (2 * size,) and tree.total() == 0.0 and mins.min() == np.inf
    assert tree.root_width == mins.root_width == min(size, width)
    leaves = np.arange(1, capacity + 1, dtype=np.float64)
    tree.update(np.arange(capacity), leaves)
    mins.update(np.arange(capacity), leaves)
    assert tree.total() == capacity * (capacity + 1) / 2 and mins.min() == 1.0
    assert (tree.nodes[size + capacity:] == 0.0).all()  # padding keeps the identity
    assert (mins.nodes[size + capacity:] == np.inf).all()
    assert (tree.nodes[:tree.root_width] == 0.0).all()  # unused, above the subtree roots
    assert (mins.nodes[:mins.root_width] == np.inf).all()
    assert tree.find_prefix([0.0, tree.total()]).tolist() == [0, capacity - 1]
    # Every slot boundary (exact: the sums are integers), and each slot's middle.
    ends = np.arange(capacity + 1)
    sums = ends * (ends + 1) / 2
    assert tree.prefix_sum(ends).tolist() == sums.tolist()
    assert tree.find_prefix(sums[:-1]).tolist() == list(range(capacity))
    assert tree.find_prefix(sums[:-1] + leaves / 2).tolist() == list(range(capacity))
    if capacity == 1:  # the root's only child is the only leaf
        assert tree.nodes[1] == 1.0 and tree.find_prefix([0.5]).tolist() == [0]


def test_update_recomputes_rather_than_adds_deltas():
    # Adding the delta 1 - 1e20 to a total of about 1e20 would lose every small slot.
    for width in WIDTHS:
        tree = SumTree(1000, root_width=width)
        tree.update(np.arange(1000), 1.0)
        tree.update([0], [1e20])
        tree.update([0], [1.0])
        assert tree.total() == 1000.0
        assert tree.prefix_sum([1000, 500]).tolist() == [1000.0, 500.0]
        tree.update(np.arange(1000), 0.0)
        assert tree.total() == 0.0 and not np.signbit(tree.total())


def test_millions_of_updates_do_not_drift():
    """2,000,000 updates in batches of 1000, priorities over 12 orders of magnitude.

    Capacity 10,007 has a wide root of 1024 subtrees of height 4 by default.
    """
    capacity, batch = 10_007, 1000
    rng = np.random.default_rng(0)
    sums, mins = SumTree(capacity), MinTree(capacity)
    assert sums.root_width == 1024
    model = np.zeros(capacity)
    for step in range(2000):
        # Distinct indices, so the model can take ``model[indices] = values``.
        indices = rng.choice(capacity, batch, replace=False)
        values = np.exp(rng.uniform(np.log(1e-8), np.log(1e4), batch))
        values[rng.random(batch) < 0.1] = 0.0
        if step >= 1900:  # priorities shrink: a delta-updated total would go negative
            values *= 1e-12
        sums.update(indices, values)
        mins.update(indices, values)
        model[indices] = values
    exact = math.fsum(model)
    assert sums.total() > 0.0
    assert abs(sums.total() - exact) <= 1e-9 * exact
    assert abs(sums.total() - np.sum(model)) <= 1e-9 * exact
    nodes, total = reference(model, np.add, 0.0)
    assert same_bits(sums.nodes, nodes) and same_bits(sums.total(), total)
    assert mins.min() == model.min()
    assert np.array_equal(mins.nodes, reference_nodes(model, np.minimum, np.inf))
    rebuilt = SumTree(capacity)
    rebuilt.load_state_dict(sums.state_dict())
    assert same_bits(rebuilt.nodes, sums.nodes) and same_bits(rebuilt.total(), sums.total())
    targets = rng.uniform(0.0, sums.total(), 4096)
    found = sums.find_prefix(targets)
    assert (found < capacity).all() and (model[found] > 0.0).all()
    ends = rng.integers(0, capacity + 1, 4096)
    cumsum = np.concatenate([[0.0], np.cumsum(model)])
    assert np.allclose(sums.prefix_sum(ends), cumsum[ends], rtol=1e-12, atol=0.0)


# --------------------------------------------------------------------- large trees
# Past TOTAL_WIDTH leaves the levels up to the total level are recomputed along the
# update paths (the ones above, whole when read). Past 8 * TOTAL_WIDTH leaves, unless
# searches are being made, heights 3, 6, ... are recomputed from rows of 8 instead, and
# the levels between them when read (along the recorded paths).
large_capacities = st.sampled_from([TOTAL_WIDTH + 1, 10_007, 2 * TOTAL_WIDTH,
                                    5 * TOTAL_WIDTH + 3, 37 * TOTAL_WIDTH + 1])
large_widths = st.sampled_from([1, 4, DEFAULT_ROOT_WIDTH, 2 * TOTAL_WIDTH])


@st.composite
def large_update_batches(draw, values):
    """``(capacity, [(indices, values), ...])``: small batches into a large tree, with
    repeats and neighbours (paths that share ancestors)."""
    capacity = draw(large_capacities)
    hot = draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=3))
    index = st.one_of(st.sampled_from(hot), st.integers(0, capacity - 1),
                      st.sampled_from(hot).map(lambda i: min(capacity - 1, i + 1)),
                      st.sampled_from(hot).map(lambda i: i ^ 64 if i ^ 64 < capacity else i))
    batches = []
    for _ in range(draw(st.integers(1, 5))):
        k = draw(st.integers(1, 40))
        indices = draw(st.lists(index, min_size=k, max_size=k))
        vals = draw(st.lists(values, min_size=k, max_size=k))
        batches.append((np.array(indices, np.int64), np.array(vals, np.float64)))
    return capacity, batches


@settings(max_examples=40, **SETTINGS)
@given(large_update_batches(any_priorities), large_widths, st.integers(0, 2**32 - 1))
def test_large_sum_tree_matches_brute_force(case, width, seed):
    capacity, batches = case
    rng = np.random.default_rng(seed)
    model = rng.random(capacity) * (rng.random(capacity) < 0.7)
    tree = SumTree(capacity, root_width=width)
    tree.update(np.arange(capacity), model)
    for indices, values in batches:
        tree.update(indices, values)
        apply(model, indices, values)
        nodes, total = reference(model, np.add, 0.0, width)
        assert same_bits(tree.total(), total)  # current, before anything syncs
        if rng.random() < 0.5:  # searches and prefix sums bring the rest up to date
            ends = rng.integers(0, capacity + 1, 8)
            exact = np.array([math.fsum(model[:end]) for end in ends.tolist()])
            # Sequential running sums of up to `width` subtrees, pairwise within them.
            rtol = (min(width, capacity) + 64) * 2.0 ** -52
            assert (np.abs(tree.prefix_sum(ends) - exact) <= rtol * exact).all()
            cumsum = np.concatenate([[0.0], np.cumsum(model)])
            targets = rng.random(16) * total
            found = tree.find_prefix(targets)
            assert (model[found] > 0.0).all()
            clear = np.abs(targets[:, None] - cumsum[None, 1:]).min(axis=1) > 1e-9 * total
            assert (found[clear] == oracle_prefix(model, targets[clear])).all()
        assert same_bits(tree.nodes, nodes) and same_bits(tree.total(), total)
        assert same_bits(tree._upto, reference_runs(model, width))
    before = tree.nodes.copy(), tree.total()
    tree.rebuild()
    assert same_bits(tree.nodes, before[0]) and same_bits(tree.total(), before[1])


@settings(max_examples=25, **SETTINGS)
@given(large_update_batches(min_tree_values), large_widths)
def test_large_min_tree_matches_brute_force(case, width):
    capacity, batches = case
    tree, model = build(MinTree, capacity, batches, np.inf, width)
    nodes, smallest = reference(model, np.minimum, np.inf, width)
    assert tree.min() == model.min() == smallest
    assert np.array_equal(tree.nodes, nodes)


def test_upper_levels_wait_until_read():
    """An update recomputes up to the total level; the rest, once, when read."""
    capacity = 4 * TOTAL_WIDTH  # leaves at height 0, the total level at height 2
    tree = SumTree(capacity, root_width=64, compiled=False)
    assert len(tree._total_level) == TOTAL_WIDTH and tree._total_lo == TOTAL_WIDTH
    model = np.arange(capacity, dtype=np.float64) % 7
    tree.update(np.arange(capacity), model)
    stale = tree._nodes[:TOTAL_WIDTH].copy()
    tree.update([5, 6000, 30_000], [100.0, 0.0, 3.5])
    apply(model, np.array([5, 6000, 30_000]), np.array([100.0, 0.0, 3.5]))
    assert tree.total() == model.sum() and not tree._synced
    assert same_bits(tree._nodes[:TOTAL_WIDTH], stale)  # above the total level: stale
    assert tree.prefix_sum([capacity - 1]) == model[:-1].sum() and tree._synced
    nodes, total = reference(model, np.add, 0.0, 64)
    assert same_bits(tree.nodes, nodes) and tree.total() == total


@pytest.mark.parametrize("capacity,row_heights", [(8 * TOTAL_WIDTH, [3]),
                                                  (64 * TOTAL_WIDTH - 3, [3, 6])])
def test_row_heights_and_stale_levels_between_them(capacity, row_heights):
    rng = np.random.default_rng(7)
    model = rng.random(capacity)
    sums, mins = SumTree(capacity, compiled=False), MinTree(capacity, compiled=False)
    sums.update(np.arange(capacity), model)
    mins.update(np.arange(capacity), model)
    assert sums._chunk_top == row_heights[-1] and mins._chunk_top == row_heights[-1]
    size, total_lo = sums._size, sums._total_lo
    recorded: list[np.ndarray] = []
    for step in range(40):  # 40 * 256 recorded leaves: too many to list
        slots = rng.integers(0, capacity, 256)
        values = rng.random(256) * (rng.random(256) < 0.9)
        for tree in (sums, mins):
            tree.update(slots, values)
        apply(model, slots, values)
        recorded.append(slots)
        nodes, total = reference(model, np.add, 0.0)
        assert same_bits(sums.total(), total) and mins.min() == model.min()
        for height in row_heights:  # current without a read
            level = slice(size >> height, size >> (height - 1))
            assert same_bits(sums._nodes[level], nodes[level])
        # Recorded paths, until there are too many to list: then every level is stale.
        if sum(map(len, recorded)) > sums._stale_max:
            assert sums._stale is True
        else:
            assert len(sums._stale) == len(recorded)
            # (Repeated slots with different values are recorded once, sorted.)
            assert all(np.array_equal(np.unique(a), np.unique(b))
                       for a, b in zip(sums._stale, recorded))
        if step in (2, 39):  # a read brings every level up to date
            assert same_bits(sums.nodes, nodes) and sums._stale == []
            assert np.array_equal(mins.nodes, reference_nodes(model, np.minimum, np.inf))
            assert same_bits(sums._upto, reference_runs(model))
            # Right after a read (searches being made), every level up to the total
            # level is recomputed along the paths: nothing goes stale.
            for tree in (sums, mins):
                tree.update([5, 77], [3.0, 0.5])
            apply(model, np.array([5, 77]), np.array([3.0, 0.5]))
            assert sums._stale == [] and not sums._synced
            nodes = reference_nodes(model, np.add, 0.0)
            assert same_bits(sums._nodes[total_lo:], nodes[total_lo:])
            recorded = []
    assert same_bits(sums.nodes, reference_nodes(model, np.add, 0.0))


def test_unchecked_assign_and_find_match_the_checked_calls():
    rng = np.random.default_rng(5)
    capacity = 3 * TOTAL_WIDTH + 5
    checked, unchecked = SumTree(capacity), SumTree(capacity)
    for k in (1, 2, 256, 5000):  # path levels for small batches, whole levels for large
        slots = rng.integers(0, capacity, k)
        values = rng.random(k) * (rng.random(k) < 0.9)
        checked.update(slots, values)
        unchecked.assign(slots, values, float(values.max()))
        assert same_bits(unchecked.nodes, checked.nodes)
        assert same_bits(unchecked.total(), checked.total())
    targets = rng.random(300) * checked.total()
    found, values = unchecked.find(targets)
    assert found.tolist() == checked.find_prefix(targets).tolist()
    assert same_bits(values, checked.get(found)) and (values > 0.0).all()
    # A bound that cannot rule out an overflow takes the path that can roll back.
    with pytest.raises(ValueError, match="expected a finite total priority"):
        unchecked.assign(np.array([0, 1]), np.array([1e308, 1e308]), 1e308)
    assert same_bits(unchecked.nodes, checked.nodes)


# --------------------------------------------------------------------- find_prefix
@settings(max_examples=150, **SETTINGS)
@given(update_batches(exact_priorities), widths,
       st.lists(st.floats(0.0, 1.0, exclude_max=True), max_size=20))
def test_find_prefix_equals_searchsorted(case, width, fractions):
    capacity, batches = case
    tree, model = build(SumTree, capacity, batches, 0.0, width)
    total = tree.total()
    if total == 0.0:
        return
    cumsum = np.cumsum(model)
    assert total == cumsum[-1]  # exact values: both sums are exact
    # Random targets, every prefix boundary (side='right' sends them to the next slot)
    # and 0 (the first slot with a priority > 0, past any leading zeros).
    targets = np.concatenate([np.array(fractions) * total, cumsum, [0.0]])
    targets = targets[targets < total]
    found = tree.find_prefix(targets)
    assert found.dtype == np.int64
    assert found.tolist() == oracle_prefix(model, targets).tolist()
    assert (model[found] > 0.0).all()


@settings(max_examples=200, **SETTINGS)
@given(update_batches(any_priorities), widths, st.lists(st.floats(0.0, 1.0), max_size=10))
def test_find_prefix_never_returns_a_zero_slot(case, width, fractions):
    """Rounding near the total, tiny and subnormal priorities, huge dynamic range."""
    capacity, batches = case
    tree, model = build(SumTree, capacity, batches, 0.0, width)
    total = tree.total()
    if total == 0.0:
        return
    below = [total]
    for _ in range(4):
        below.append(np.nextafter(below[-1], 0.0))
    cumsum = np.cumsum(model)
    targets = np.concatenate([
        np.array(fractions) * total, below, cumsum, np.nextafter(cumsum, np.inf), [0.0],
        [np.nextafter(total, np.inf), total * 2, 1e308]])
    found = tree.find_prefix(targets)
    assert ((found >= 0) & (found < capacity)).all()
    assert (model[found] > 0.0).all()
    last = np.flatnonzero(model > 0.0)[-1]
    assert (found[targets >= total] == last).all()
    # Away from every boundary, rounding cannot matter: the answer is the exact one.
    clear = np.abs(targets[:, None] - cumsum[None, :]).min(axis=1) > 1e-9 * total
    clear &= targets < total
    assert (found[clear] == oracle_prefix(model, targets[clear])).all()


# Found by search: the plain descent lands on a zero slot or past capacity here. The
# first three in a plain binary tree (root width 1), the others in forests of binary
# subtrees under a wide root.
ROUNDING_CASES = [
    ([5.556166232282319e-14, 0.0, 0.0008175250679505115, 0.0807368186701879, 0.0,
      1.3756707593331196e-13, 0.14484658125839722, 0.0], 0.22640092499672873, 1, 6),
    ([9.76138955453377e-20, 0.0, 6.480418362506277e-17, 0.0, 0.0, 9.515668685079615e-16],
     1.0164686660285695e-15, 1, 5),
    ([72.6927981528267, 8.718857459950344e-13, 6.112357255536909e-11, 0.0, 0.0,
      3.162327927150017e-13, 278.2033167629023], 350.8961149157913, 1, 6),
    ([1.8050800821563108e-07, 0.0, 0.0, 0.0, 7.051765917665876e-07, 0.0, 0.0, 0.0],
     8.856845999822186e-07, 4, 4),
    ([0.0, 6.813269893302704e-16, 1.7794845834606257e-15, 0.0, 0.0],
     2.460811572790896e-15, 2, 2),
]


@pytest.mark.parametrize("leaves,target,width,expected", ROUNDING_CASES)
def test_find_prefix_rounding_regressions(leaves, target, width, expected):
    tree = SumTree(len(leaves), root_width=width)
    tree.update(np.arange(len(leaves)), np.array(leaves))
    assert target < tree.total()
    # The case still exercises the guard: unguarded, the search ends on a zero.
    assert tree.nodes[tree._descend(np.array([target]))[0]] == 0.0
    assert tree.find_prefix([target]).tolist() == [expected]


@pytest.mark.parametrize("width", WIDTHS)
def test_find_prefix_at_and_past_the_total(width):
    tree = SumTree(7, root_width=width)
    tree.update(np.arange(7), [0.0, 1.0, 2.0, 0.0, 3.0, 0.0, 0.0])
    total = tree.total()
    targets = [0.0, 1.0, np.nextafter(total, 0.0), total, np.nextafter(total, np.inf), 1e300]
    assert tree.find_prefix(targets).tolist() == [1, 2, 4, 4, 4, 4]
    # The last positive slot is a subnormal, lost in the rounded total 3.0: a target just
    # below the total is inside slot 2, one at the total gets the last positive slot.
    tree.update([4], [TINY])
    assert tree.total() == 3.0
    assert tree.find_prefix([np.nextafter(3.0, 0.0), 3.0, 4.0]).tolist() == [2, 4, 4]


def test_wide_root_over_binary_subtrees_at_scale():
    """Capacity 100,000 by default: 1024 subtrees of height 7 under the wide root."""
    rng = np.random.default_rng(3)
    capacity = 100_000
    tree = SumTree(capacity)
    assert tree.root_width == 1024
    model = rng.integers(0, 64, capacity) / 16  # exact sums
    model[rng.random(capacity) < 0.3] = 0.0
    tree.update(np.arange(capacity), model)
    cumsum = np.cumsum(model)
    assert tree.total() == cumsum[-1]
    targets = np.concatenate([rng.uniform(0, cumsum[-1], 2000), cumsum[:-1:97], [0.0]])
    targets = targets[targets < cumsum[-1]]
    assert tree.find_prefix(targets).tolist() == oracle_prefix(model, targets).tolist()
    ends = np.concatenate([rng.integers(0, capacity + 1, 2000), [0, 1, capacity]])
    assert tree.prefix_sum(ends).tolist() == np.concatenate([[0.0], cumsum])[ends].tolist()


# --------------------------------------------------------------------- prefix_sum
@settings(max_examples=100, **SETTINGS)
@given(update_batches(exact_priorities), widths)
def test_prefix_sum_equals_cumsum_exactly(case, width):
    capacity, batches = case
    tree, model = build(SumTree, capacity, batches, 0.0, width)
    ends = np.arange(capacity + 1)
    expected = np.concatenate([[0.0], np.cumsum(model)])
    found = tree.prefix_sum(ends)
    assert found.dtype == np.float64 and same_bits(found, expected)


@settings(max_examples=100, **SETTINGS)
@given(update_batches(any_priorities), widths)
def test_prefix_sum_within_rounding_of_cumsum(case, width):
    capacity, batches = case
    tree, model = build(SumTree, capacity, batches, 0.0, width)
    ends = np.arange(capacity + 1)
    found = tree.prefix_sum(ends)
    assert found[0] == 0.0 and not np.signbit(found[0])
    assert same_bits(found[-1], tree.total())
    for end in range(1, capacity):
        exact = math.fsum(model[:end])
        assert abs(found[end] - exact) <= 1e-14 * exact
        assert abs(found[end] - np.cumsum(model)[end - 1]) <= 1e-13 * exact


# --------------------------------------------------------------------- persistence
def test_state_dict_round_trip_and_rebuild():
    rng = np.random.default_rng(1)
    for width in WIDTHS:
        tree = SumTree(37, root_width=width)
        tree.update(rng.integers(0, 37, 100), rng.random(100))
        state = tree.state_dict()
        assert state["leaves"].dtype == np.float64 and state["leaves"].shape == (37,)
        state["leaves"][0] = 123.0  # a copy: the tree does not see it
        assert tree.get(0) != 123.0
        before, total = tree.nodes.copy(), tree.total()
        tree.rebuild()
        assert same_bits(tree.nodes, before) and same_bits(tree.total(), total)
        other = SumTree(37, root_width=width)
        other.load_state_dict(tree.state_dict())
        assert same_bits(other.nodes, tree.nodes) and same_bits(other.total(), total)
    mins = MinTree(5)
    mins.update([1, 3], [2.0, -1.0])
    restored = MinTree(5)
    restored.load_state_dict(mins.state_dict())
    assert restored.min() == -1.0 and np.array_equal(restored.nodes, mins.nodes)
    with pytest.raises(ValueError, match="read-only"):
        tree.nodes[1] = 0.0


# --------------------------------------------------------------------- bad input
def loaded(cls, capacity=10, root_width=DEFAULT_ROOT_WIDTH):
    tree = cls(capacity, root_width=root_width)
    tree.update(np.arange(capacity), np.arange(1.0, capacity + 1.0))
    return tree


BAD_CALLS = {
    "index too large": (SumTree, "update", ([0, 10], [1.0, 1.0]),
                        r"update: expected indices in \[0, 10\), got 10 at position 1"),
    "negative index": (SumTree, "update", ([3, -1], [1.0, 1.0]),
                       r"expected indices in \[0, 10\), got -1 at position 1"),
    "huge unsigned index": (SumTree, "update", (np.array([2**64 - 1], np.uint64), [1.0]),
                            r"got 18446744073709551615 at position 0"),
    "float indices": (SumTree, "update", ([1.0], [1.0]),
                      r"expected integer indices, got dtype float64"),
    "bool indices": (SumTree, "update", (np.ones(10, bool), 1.0),
                     r"expected integer indices, got dtype bool"),
    "short values": (SumTree, "update", ([0, 1, 2], [1.0, 2.0]),
                     r"expected values of shape \(3,\) or a scalar, got shape \(2,\)"),
    "2-d values": (SumTree, "update", ([0, 1], [[1.0, 2.0]]),
                   r"expected values of shape \(2,\) or a scalar, got shape \(1, 2\)"),
    "string values": (SumTree, "update", ([0], ["1"]),
                      r"expected real-number values, got dtype <U1"),
    "nan priority": (SumTree, "update", ([0, 1], [1.0, np.nan]),
                     r"expected finite values >= 0, got nan at position 1"),
    "inf priority": (SumTree, "update", ([0, 1], [np.inf, 1.0]),
                     r"expected finite values >= 0, got inf at position 0"),
    "negative priority": (SumTree, "update", ([0, 1, 2], [1.0, 2.0, -1e-300]),
                          r"expected finite values >= 0, got -1e-300 at position 2"),
    "total overflows": (SumTree, "update", ([0, 1, 2], [1.0, 1e308, 1e308]),
                        r"expected a finite total priority, got inf"),
    "min tree nan": (MinTree, "update", ([0, 1], [np.nan, 1.0]),
                     r"expected values that are not NaN or -inf .*got nan at position 0"),
    "min tree -inf": (MinTree, "update", ([0, 1], [1.0, -np.inf]),
                      r"got -inf at position 1"),
    "min tree index": (MinTree, "update", ([11], [1.0]), r"expected indices in \[0, 10\)"),
    "get out of range": (SumTree, "get", ([0, 10],), r"get: expected indices in \[0, 10\)"),
    "get float": (MinTree, "get", (np.array([0.5]),), r"get: expected integer indices"),
    "nan target": (SumTree, "find_prefix", ([1.0, np.nan],),
                   r"find_prefix: expected finite targets >= 0, got nan at position 1"),
    "negative target": (SumTree, "find_prefix", ([-0.5],), r"got -0.5 at position 0"),
    "inf target": (SumTree, "find_prefix", ([np.inf],), r"got inf at position 0"),
    "string target": (SumTree, "find_prefix", (["a"],), r"expected real-number targets"),
    "end too large": (SumTree, "prefix_sum", ([0, 11],),
                      r"prefix_sum: expected indices in \[0, 11\), got 11 at position 1"),
    "negative end": (SumTree, "prefix_sum", ([-1],), r"got -1 at position 0"),
    "float ends": (SumTree, "prefix_sum", ([2.0],), r"prefix_sum: expected integer indices"),
    "state not a dict": (SumTree, "load_state_dict", ([1.0] * 10,),
                         r"expected a dict with 'leaves', got list"),
    "state without leaves": (SumTree, "load_state_dict", ({"rng": 1},),
                             r"expected a dict with 'leaves', got \['rng'\]"),
    "state wrong shape": (SumTree, "load_state_dict", ({"leaves": np.ones(11)},),
                          r"expected leaves of shape \(10,\), got shape \(11,\)"),
    "state scalar": (SumTree, "load_state_dict", ({"leaves": 1.0},),
                     r"expected leaves of shape \(10,\), got shape \(\)"),
    "state negative": (SumTree, "load_state_dict", ({"leaves": -np.ones(10)},),
                       r"expected finite leaves >= 0, got -1.0 at position 0"),
    "state overflows": (SumTree, "load_state_dict", ({"leaves": np.full(10, 1e308)},),
                        r"load_state_dict: expected a finite total priority"),
    "min state nan": (MinTree, "load_state_dict", ({"leaves": np.full(10, np.nan)},),
                      r"got nan at position 0"),
}


@pytest.mark.parametrize("width", [1, DEFAULT_ROOT_WIDTH])
@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_raises_and_changes_nothing(case, width):
    cls, method, args, pattern = BAD_CALLS[case]
    tree = loaded(cls, root_width=width)
    before = tree.nodes.copy()
    root = tree.total() if cls is SumTree else tree.min()
    with pytest.raises(ValueError, match=pattern):
        getattr(tree, method)(*args)
    assert same_bits(tree.nodes, before)
    nodes, expected_root = reference(np.arange(1.0, 11.0), cls._combine, cls._identity, width)
    assert same_bits(tree.nodes, nodes)
    assert same_bits(tree.total() if cls is SumTree else tree.min(), root)
    assert same_bits(root, expected_root)


def test_find_prefix_needs_a_positive_total():
    tree = SumTree(4)
    with pytest.raises(ValueError, match=r"expected a total priority > 0, got 0.0"):
        tree.find_prefix([0.0])
    tree.update([2], [1.0])
    tree.update([2], [0.0])
    with pytest.raises(ValueError, match=r"total priority > 0"):
        tree.find_prefix([0.0])


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True, None, "3"])
def test_capacity_must_be_a_positive_int(capacity):
    for cls in (SumTree, MinTree):
        with pytest.raises(ValueError, match=r"capacity must be a positive int, got"):
            cls(capacity)


@pytest.mark.parametrize("width", [0, -4, 3, 12, 2.0, True, None])
def test_root_width_must_be_a_power_of_two(width):
    for cls in (SumTree, MinTree):
        with pytest.raises(ValueError, match=r"root_width must be a power of two >= 1, got"):
            cls(8, root_width=width)

