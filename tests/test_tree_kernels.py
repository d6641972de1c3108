"""The compiled tree loops (numba) against the numpy loops: the same bits, the same
draws, and a package that works without numba. (tests/test_segment_tree.py runs every
tree property under both loops too.)"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.segment_tree import MinTree, SumTree


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool((a.view(np.uint64) == b.view(np.uint64)).all())


def test_numba_is_installed_for_the_tests():
    assert tree_kernels.numba is not None and tree_kernels.AVAILABLE


@pytest.mark.parametrize("capacity,width", [(1, 1024), (5, 1), (1000, 4), (70_000, 1024),
                                            (1 << 17, 64)])
def test_compiled_loops_give_the_numpy_trees_bits_and_draws(capacity, width):
    """The same updates and searches through both loops: every node, the total, the
    minimum and every slot found are identical (heavy-tailed values, zeros, repeated
    indices, targets at and past the total)."""
    rng = np.random.default_rng(capacity)
    trees = {mode: (SumTree(capacity, root_width=width, compiled=mode),
                    MinTree(capacity, root_width=width, compiled=mode))
             for mode in (False, True)}
    for step in range(25):
        count = int(rng.integers(1, 700))
        slots = rng.integers(0, capacity, count)
        values = rng.lognormal(0.0, 2.0, count) * (rng.random(count) < 0.8)
        if step == 7:
            values[: count // 2] = -0.0  # signed zeros: np.minimum keeps the right one
        for sums, mins in trees.values():
            sums.update(slots, values)
            mins.update(slots, values)
        (a, am), (b, bm) = trees[False], trees[True]
        assert same_bits(a.total(), b.total()) and same_bits(am.min(), bm.min())
        if a.total() > 0:
            targets = rng.random(300) * a.total()
            targets[:3] = [0.0, a.total(), np.nextafter(a.total(), 0.0)]
            assert np.array_equal(a.find_prefix(targets), b.find_prefix(targets))
        assert same_bits(a.nodes, b.nodes) and same_bits(am.nodes, bm.nodes)
        assert same_bits(a._upto, b._upto)


def test_compiled_needs_numba(monkeypatch):
    monkeypatch.setattr(tree_kernels, "AVAILABLE", False)
    with pytest.raises(ValueError, match="numba"):
        SumTree(8, compiled=True)
    assert SumTree(8).compiled is False


def test_import_and_sampling_without_numba():
    """With numba switched off the package imports, the trees use numpy, and a
    prioritized buffer samples (the fallback when the fast extra is not installed)."""
    code = ("import numpy as np, replaybuffer as rb\n"
            "from replaybuffer.sampling import tree_kernels\n"
            "assert not tree_kernels.AVAILABLE\n"
            "b = rb.PrioritizedReplayBuffer(rb.ArraySpec((2,), np.float32), 1, 100, seed=0)\n"
            "for i in range(50): b.add_batch(np.full((1, 2), i, np.float32))\n"
            "b.update_priorities(np.arange(50), np.arange(50) + 1.0)\n"
            "assert b._sampler._sum.compiled is False\n"
            "print(b.get_next(8)[1].ids.shape)\n")
    env = dict(os.environ, REPLAYBUFFER_NUMBA="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(8,)"


@pytest.mark.parametrize("normalize", ["batch", "buffer"])
def test_prioritized_draws_match_without_numba(normalize):
    """A prioritized buffer with heavy-tailed priorities (so draws descend the tree)
    samples the same ids, probabilities and weights, bit for bit, with the compiled
    loops here and with numba switched off in a subprocess."""
    code = ("import numpy as np, replaybuffer as rb, sys\n"
            f"b = rb.PrioritizedReplayBuffer(rb.ArraySpec((), np.float32), 1, 5000, seed=3,"
            f" normalize={normalize!r})\n"
            "b.extend(np.zeros((1, 5000), np.float32))\n"
            "rng = np.random.default_rng(5)\n"
            "b.update_priorities(np.arange(5000), rng.lognormal(0.0, 3.0, 5000))\n"
            "out = []\n"
            "for _ in range(20):\n"
            "    _, info = b.get_next(256, 2)\n"
            "    out += [info.ids, info.probabilities, info.weights]\n"
            "    b.update_priorities(info.ids, rng.lognormal(0.0, 3.0, 256))\n"
            "sys.stdout.write(np.concatenate([np.ascontiguousarray(a).view(np.uint8).ravel()"
            " for a in out]).tobytes().hex())\n")
    results = []
    for flag in ("1", "0"):
        env = dict(os.environ, REPLAYBUFFER_NUMBA=flag)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        results.append(out.stdout)
    assert results[0] and results[0] == results[1]


def test_probabilities_and_ratios_compiled_give_the_numpy_bits():
    """The compiled probabilities and weight ratios against the numpy reference, over
    values from subnormal to huge, with the batch's minimum and with a given floor."""
    from replaybuffer.sampling import importance

    rng = np.random.default_rng(11)
    for step in range(200):
        count = int(rng.integers(1, 600))
        values = rng.lognormal(0.0, float(rng.choice([0.5, 3.0, 30.0])), count)
        values = np.clip(values, 5e-324, 1e300)
        if step % 7 == 0:
            values[rng.integers(0, count)] = 5e-324  # a subnormal smallest value
        mass = float(values.sum()) * float(rng.choice([1.0, 1.5, 1e10]))
        floor = float(rng.choice([np.nan, values.min(), values.min() * 0.5]))
        want = importance._numpy(values, mass, floor)
        got = importance._compiled(values, mass, floor)
        for a, b in zip(want, got):
            assert a.dtype == b.dtype == np.float32
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@settings(max_examples=300, deadline=None)
@given(batch_size=st.integers(1, 5), max_length=st.integers(1, 40),
       adds=st.integers(1, 200), key_base=st.sampled_from([0, 7, 1000]),
       data=st.data())
def test_fused_update_maps_live_ids_and_writes_nothing_for_stale_ones(
        batch_size, max_length, adds, key_base, data):
    """The fused priority write of ``update_priorities`` (fused_update.write_live): all
    live ids map to the ring's positions and the tree it leaves is, bit for bit, the
    numpy tree's after the same update; any stale or negative id makes it report not
    all live and leave every node as it was (the numpy path then drops those)."""
    from replaybuffer.sampling.fused_update import write_live
    from replaybuffer.sampling.ring import Ring

    ring = Ring(batch_size, max_length)
    ring.last_id = adds - 1
    oldest = ring.oldest_id
    lo_item = (key_base + oldest) * batch_size
    hi_item = (key_base + ring.last_id + 1) * batch_size - 1
    items = np.array(data.draw(st.lists(st.integers(lo_item, hi_item), min_size=1,
                                        max_size=20)), np.int64)
    values = np.array(data.draw(st.lists(st.floats(0.0, 1e6), min_size=len(items),
                                         max_size=len(items))), np.float64)
    reference = SumTree(ring.capacity, root_width=4, compiled=False)
    fused = SumTree(ring.capacity, root_width=4, compiled=True)
    for tree in (reference, fused):
        tree.update(np.arange(ring.capacity), np.ones(ring.capacity))
    steps = items // batch_size - key_base
    want = ring.positions(steps, items % batch_size)
    reference.update(want, values)
    if data.draw(st.booleans()):  # a search read the running sums: the write makes them
        fused.search_arrays()
    target = fused.write_target(len(items), 1e6)
    positions = np.empty(len(items), np.int64)
    total = write_live(items, values, key_base, batch_size, oldest, ring.last_id,
                       max_length, *target, positions)
    fused.written(total)
    assert total >= 0.0 and np.array_equal(positions, want)
    assert same_bits(reference.nodes, fused.nodes) and same_bits(reference.total(),
                                                                  fused.total())
    # The wide root's running sums (left current by the write) and the search's limit.
    for a, b in zip(reference.search_arrays(), fused.search_arrays()):
        assert same_bits(np.asarray(a), np.asarray(b))
    # Each below the oldest live item id, above the newest, or negative.
    stale = data.draw(st.sampled_from([-1, lo_item - 1, hi_item + 1, -batch_size]))
    items[data.draw(st.integers(0, len(items) - 1))] = stale
    before = fused.nodes.copy()
    target = fused.write_target(len(items), 1e6)
    assert write_live(items, values * 2 + 1, key_base, batch_size, oldest,
                      ring.last_id, max_length, *target, positions) == -1.0
    assert same_bits(fused.nodes, before)
