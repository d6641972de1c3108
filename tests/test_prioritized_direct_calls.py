"""The prioritized sample+update's direct calls against the general paths they skip:
compiled entry points called without numba's dispatch (``tree_kernels.direct_entry``:
the usual read's draws, the fused update's write), np.power's exponents kept as rows
(``priority_scale.exponent_row``), and ``get_next``'s one-attribute test of the
buffer's parts (``PrioritizedReplayBuffer._direct_reads``), bit for bit and with
nothing forgotten where a part is replaced.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer import PrioritizedReplayBuffer
from replaybuffer.sampling import tree_kernels
from replaybuffer.sampling.fused_update import write_live
from replaybuffer.sampling.priority_scale import exponent, exponent_row

from sampler_twins import bits  # noqa: E402

SPEC = {"obs": np.zeros(3, np.float32), "act": np.int64(0)}
needs_numba = pytest.mark.skipif(not tree_kernels.AVAILABLE, reason="needs numba")


def filled(seed, batch_size=2, max_length=40, adds=60, sigma=2.0):
    """A wrapped buffer with log-normal priorities (``sigma`` 2: drawn by descent)."""
    buf = PrioritizedReplayBuffer(SPEC, batch_size, max_length, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(adds):
        buf.add_batch({"obs": rng.random((batch_size, 3), dtype=np.float32),
                       "act": rng.integers(0, 9, batch_size)})
    ids = np.arange(buf._ring.oldest_id * batch_size, adds * batch_size)
    buf.update_priorities(ids, rng.lognormal(0.0, sigma, len(ids)))
    return buf


def tree_bits(buf):
    state = buf._sampler.state_dict()
    return bits(state["priorities"]), state["max_priority"]


# ------------------------------------------------------------- kept exponent rows
@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.sampled_from([2.0, 0.5, -1.0, 1.0, 0.0, 3.0, 0.6, 0.4]),
                       st.floats(-4.0, 4.0)),
       dtype=st.sampled_from([np.float32, np.float64]), count=st.integers(1, 600),
       seed=st.integers(0, 2**16), sigma=st.floats(0.0, 20.0))
def test_an_exponent_row_powers_as_the_python_float(value, dtype, count, seed, sigma):
    """np.power with exponent_row(value, dtype, count) against the Python float the
    numpy path passes: the same dtype and bits for every exponent, those numpy computes
    another way when given as a scalar (2, 0.5, -1: kept 0-d then) included, over bases
    from tiny to huge, zeros and ones."""
    rng = np.random.default_rng(seed)
    base = np.concatenate([rng.lognormal(0.0, sigma, count), [0.0, 1.0, -0.0]])[:count]
    base = base.astype(dtype)
    kept = exponent_row(value, dtype, count)
    assert kept.shape in ((), (count,)) and not kept.flags.writeable
    with np.errstate(all="ignore"):
        want = np.power(base, value)
        got = np.power(base, kept)
    assert want.dtype == got.dtype == dtype and bits(want) == bits(got)


def test_rows_are_kept_where_numpy_powers_a_row_alike():
    """The usual exponents (alpha 0.6 in float64, beta 0.4 in float32) are rows (the
    faster loop); those numpy special-cases as scalars stay 0-d."""
    assert exponent_row(0.6, np.float64, 256).shape == (256,)
    assert exponent_row(0.4, np.float32, 256).shape == (256,)
    for special in (2.0, 0.5):
        for dtype in (np.float32, np.float64):
            assert exponent_row(special, dtype, 8).shape == ()
            assert bits(exponent_row(special, dtype, 8)) == bits(exponent(special, dtype))


# ------------------------------------------------------------- direct entry points
@needs_numba
def test_a_direct_entry_is_the_compiled_kernel_for_those_types():
    """direct_entry resolves the overload numba's dispatch would call: the same result
    and the same writes; a plain function comes back as itself."""
    values = np.array([0.5, 2.0, 1.0])
    nodes = np.zeros(16)
    nodes[8 + np.arange(4)] = 1.0
    for n in range(7, 0, -1):
        nodes[n] = nodes[2 * n] + nodes[2 * n + 1]
    twins = nodes.copy(), nodes.copy()
    ids = np.array([0, 2, 3], np.int64)
    positions = np.empty(3, np.int64), np.empty(3, np.int64)
    args = (0, 1, 0, 3, 4)  # key_base, batch_size, oldest, last_id, max_length (all live)
    want = write_live(ids, values, *args, twins[0], 8, 1, 0, np.empty(0), positions[0])
    entry = tree_kernels.direct_entry(write_live, ids, values, *args, twins[1], 8, 1, 0,
                                      np.empty(0), positions[1])
    assert entry is not write_live
    got = entry(ids, values, *args, twins[1], 8, 1, 0, np.empty(0), positions[1])
    assert want == got == 0.0 and bits(twins[0]) == bits(twins[1])
    assert bits(positions[0]) == bits(positions[1])

    def plain(x):
        return x

    assert tree_kernels.direct_entry(plain, 1) is plain


@needs_numba
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), stride=st.sampled_from([1, 2, 3]),
       dtype=st.sampled_from([np.float64, np.float32]), sigma=st.sampled_from([0.3, 2.0]))
def test_updates_of_any_layout_write_what_the_general_update_writes(seed, stride, dtype,
                                                                   sigma):
    """update_priorities with ids and priorities as strided views (not what the write's
    entry point was made for: they must go through numba's dispatch), as read-only
    arrays and as plain C arrays, against lists of the same (the general path): the
    same count, tree bits and max_priority, and the same draws after."""
    short, general = filled(seed, sigma=sigma), filled(seed, sigma=sigma)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        ids = short.get_next(50)[1].ids
        general.get_next(50)
        # (live ids between the view's: read as if contiguous, they would write other
        # steps, not fall back to the general path as stale ones would)
        wide = np.repeat(ids[::-1], stride)
        wide[::stride] = ids
        view = wide[::stride]
        if stride == 3:
            view.flags.writeable = False
        priorities = rng.lognormal(0.0, 1.0, len(ids) * stride).astype(dtype)[::stride]
        assert short.update_priorities(view, priorities) == \
            general.update_priorities(list(ids), list(priorities))
        assert tree_bits(short) == tree_bits(general)
    got, want = short.get_next(64), general.get_next(64)
    assert bits(got[1].ids) == bits(want[1].ids)
    assert bits(got[1].weights) == bits(want[1].weights)


@needs_numba
def test_entry_points_follow_the_tree_a_clear_replaces():
    """A clear makes a new sum tree: the draws' and the write's entry points are made
    again for it (an entry made for the old one would read arrays of other sizes), and
    the buffer keeps reading what a twin built afresh reads."""
    buf = filled(3)
    buf.update_priorities(buf.get_next(32)[1].ids, np.linspace(0.1, 9.0, 32))
    sampler = buf._sampler
    old = sampler._sum
    assert sampler._descent_entry[0] is old and sampler._write_tree is old
    buf.clear()
    twin = PrioritizedReplayBuffer(SPEC, 2, 40, seed=3)
    twin._sampler.key_base = sampler.key_base
    twin._sampler._rng.bit_generator.state = sampler._rng.bit_generator.state
    for b in (buf, twin):
        for k in range(5):
            b.add_batch({"obs": np.full((2, 3), k, np.float32), "act": np.arange(2)})
    for accept_min in (2.0, 0.0, 2.0, 0.0):  # by descent, by rejection (forced)
        for b in (buf, twin):
            b._sampler._accept_min = accept_min
        got, want = buf.get_next(16), twin.get_next(16)
        assert bits(got[1].ids) == bits(want[1].ids)
        assert bits(got[1].weights) == bits(want[1].weights)
        priorities = np.geomspace(0.01, 100.0, 16)
        assert buf.update_priorities(got[1].ids, priorities) == \
            twin.update_priorities(want[1].ids, priorities)
        assert tree_bits(buf) == tree_bits(twin)
    assert sampler._sum is not old
    assert sampler._descent_entry[0] is sampler._sum
    assert sampler._rejection_entry[0] is sampler._sum
    assert sampler._write_tree is sampler._sum


# ------------------------------------------------------------- get_next's parts test
def parts_allow(buf):
    from replaybuffer.storage.base import identity
    return (buf._codec is None and buf._device_update is None
            and buf._storage.from_numpy is identity)


def test_direct_reads_says_what_the_parts_say():
    """The flag is the parts' test: numpy storage, no frame codec, no device sampling
    (True); a frame stack or torch storage (False). Torch storage drawn on the host
    takes the short path of another backend instead (``_direct_backend``, its
    ``wraps_fresh``: tests/test_prioritized_torch_reads.py); a frame stack neither."""
    plain = filled(1)
    assert plain._direct_reads is True and parts_allow(plain)
    assert plain._direct_backend is None
    framed = PrioritizedReplayBuffer({"f": np.zeros((2, 3), np.uint8), "a": np.int64(0)},
                                     1, 10, frame_stack="f", seed=0)
    assert framed._direct_reads is False and not parts_allow(framed)
    assert framed._direct_backend is None
    pytest.importorskip("torch")
    on_torch = PrioritizedReplayBuffer(SPEC, 1, 10, storage="torch", seed=0)
    assert on_torch._direct_reads is False and not parts_allow(on_torch)
    assert on_torch._direct_backend == on_torch._storage.wraps_fresh
    on_device = PrioritizedReplayBuffer(SPEC, 1, 10, storage="torch", seed=0,
                                        sample_on_device=True)
    assert on_device._direct_reads is False and on_device._direct_backend is None
    on_torch.add_batch({"obs": np.ones((1, 3), np.float32), "act": np.zeros(1, np.int64)})
    items, info = on_torch.get_next(4)
    assert tuple(items["obs"].shape) == (4, 3) and info.weights.shape == (4,)


def test_a_snapshot_and_its_release_decide_it_anew():
    """snapshot() wraps the storage and release_snapshot() unwraps it: each decides the
    flag again (a stale False is corrected; a storage whose from_numpy is not numpy's
    turns it off), and reads during a save go on reading what a twin reads."""
    buf, twin = filled(5), filled(5)
    buf._direct_reads = False  # stale: the snapshot must decide it again
    with buf._lock:
        buf.snapshot()
    assert buf._direct_reads is True and parts_allow(buf)
    got, want = buf.get_next(20), twin.get_next(20)
    assert bits(got[0]["obs"]) == bits(want[0]["obs"]) and bits(got[1].ids) == \
        bits(want[1].ids)
    # (the storage the release unwraps: its from_numpy now a stand-in, not numpy's)
    buf._storage.wrapped.from_numpy = lambda array: array
    with buf._lock:
        buf.release_snapshot()
    assert buf._direct_reads is False
    got, want = buf.get_next(20), twin.get_next(20)  # the general path, the same read
    assert bits(got[0]["obs"]) == bits(want[0]["obs"]) and bits(got[1].ids) == \
        bits(want[1].ids)


WATCHED = {"_codec", "_device_update", "_storage"}
"""The parts _direct_reads is made from (the limiter is asked under the lock)."""


def assignments(cls):
    """``{method name}`` of ``cls``'s own methods that assign ``self.<a watched part>``."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return set()
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            targets = (inner.targets if isinstance(inner, ast.Assign) else
                       [inner.target] if isinstance(inner, (ast.AugAssign, ast.AnnAssign))
                       else [])
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                            t.value.id == "self" and t.attr in WATCHED:
                        found.add(node.name)
    return found


def test_every_assignment_of_a_part_is_followed_by_a_refresh():
    """Every method of PrioritizedReplayBuffer and its bases that assigns the storage,
    the codec or the device update is construction (decided at the end of
    PrioritizedReplayBuffer.__init__) or one the buffer overrides with a refresh after
    it: a new assignment elsewhere fails here until it refreshes the flag."""
    own = PrioritizedReplayBuffer
    refreshed = {name for name, fn in vars(own).items() if callable(fn)
                 and "_refresh_direct_reads()" in inspect.getsource(fn)}
    assert {"__init__", "snapshot", "release_snapshot"} <= refreshed
    init = inspect.getsource(own.__init__).rstrip().splitlines()
    assert init[-1].strip() == "self._refresh_direct_reads()"  # after every part is set
    for cls in own.__mro__:
        for name in assignments(cls):
            assert name in refreshed, (f"{cls.__name__}.{name} assigns a part that "
                                       "PrioritizedReplayBuffer._direct_reads is made "
                                       "from, without a refresh after it")
