"""Property-based tests: the buffers against an obviously-correct list model.

The reference model keeps, per row, a Python list of the values added (the last
``max_length`` of them). Every value is a counter that encodes where it came
from: ``EPOCH * epoch + ROW * row + id`` where ``id`` is the logical step id (adds
since the last ``clear``) and ``epoch`` counts ``clear`` calls, so a stale value
read after a ``clear`` (``clear`` only unlinks storage) or an evicted value is
recognisable. Each step is stored in a nested spec: an int64 scalar leaf holding
the counter and a float32 vector leaf derived from it.
"""

from __future__ import annotations

import collections
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybuffer
from replaybuffer import ArraySpec, BufferInfo, EmptyBufferError, UniformReplayBuffer
from replaybuffer.compat.tf_agents import PyUniformReplayBuffer

torch = pytest.importorskip("torch")

STORAGES = ["numpy", "torch"]
# Direct parametrization: it overrides any conftest fixture named ``storage``.
storages = pytest.mark.parametrize("storage", STORAGES)

EPOCH = 100_000
ROW = 1_000

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------- encoding
def encode(epoch: int, row: int, step_id: int) -> int:
    assert 0 <= step_id < ROW and 0 <= row < EPOCH // ROW
    return EPOCH * epoch + ROW * row + step_id


def decode(value: int) -> tuple[int, int, int]:
    """``(epoch, row, id)`` of a counter."""
    epoch, rest = divmod(int(value), EPOCH)
    row, step_id = divmod(rest, ROW)
    return epoch, row, step_id


def vec_of(counters) -> np.ndarray:
    """The float32 vector leaf derived from counters (exact in float32 for our range)."""
    c = np.asarray(counters, dtype=np.float64)
    return np.stack([c, c + 0.5, -c], axis=-1).astype(np.float32)


def make_spec():
    return {"counter": ArraySpec((), np.int64, "counter"),
            "nested": (ArraySpec((3,), np.float32, "vec"),)}


def make_items(counters, as_torch: bool = False):
    c = np.asarray(counters, dtype=np.int64)
    v = vec_of(c)
    if as_torch:
        c, v = torch.from_numpy(c), torch.from_numpy(v)
    return {"counter": c, "nested": (v,)}


def to_np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.cpu().numpy()
    return np.asarray(x)


def check_backend_type(x, storage: str) -> None:
    """torch storage returns tensors; numpy storage numpy arrays (or, for 0-d
    results, numpy scalars, which have ``.shape == ()`` and a dtype too)."""
    if storage == "tensorflow":
        import tensorflow as tf

        expected: type | tuple[type, ...] = tf.Tensor
    else:
        expected = torch.Tensor if storage == "torch" else (np.ndarray, np.generic)
    assert isinstance(x, expected), f"{storage} storage returned {type(x).__name__}"


def leaves_of(items, storage: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(counter, vec)`` of an item nest, as numpy, checking the nest structure."""
    assert isinstance(items, dict) and set(items) == {"counter", "nested"}
    assert isinstance(items["nested"], tuple) and len(items["nested"]) == 1
    c, v = items["counter"], items["nested"][0]
    if storage is not None:
        check_backend_type(c, storage)
        check_backend_type(v, storage)
    c, v = to_np(c), to_np(v)
    assert c.dtype == np.int64, c.dtype
    assert v.dtype == np.float32, v.dtype
    assert v.shape == c.shape + (3,), (c.shape, v.shape)
    np.testing.assert_array_equal(v, vec_of(c))
    return c, v


# ------------------------------------------------------------------------ model
class Model:
    """``batch_size`` Python lists, each holding the last ``max_length`` counters."""

    def __init__(self, batch_size: int, max_length: int):
        self.B, self.L = batch_size, max_length
        self.epoch = 0
        self.last_id = -1
        self.rows: list[list[int]] = [[] for _ in range(batch_size)]

    @property
    def n(self) -> int:
        return len(self.rows[0])

    @property
    def ids(self) -> list[int]:
        """Logical ids of the retained steps, oldest first (shared by all rows)."""
        return [decode(v)[2] for v in self.rows[0]]

    def next_counters(self, num_steps: int) -> np.ndarray:
        """``[B, num_steps]`` counters of the next ``num_steps`` adds."""
        first = self.last_id + 1
        return np.array([[encode(self.epoch, b, first + t) for t in range(num_steps)]
                         for b in range(self.B)], dtype=np.int64).reshape(self.B, num_steps)

    def add(self, num_steps: int = 1) -> None:
        for _ in range(num_steps):
            self.last_id += 1
            for b in range(self.B):
                self.rows[b].append(encode(self.epoch, b, self.last_id))
                del self.rows[b][:-self.L]

    def clear(self) -> None:
        self.rows = [[] for _ in range(self.B)]
        self.last_id = -1
        self.epoch += 1

    def counters(self) -> np.ndarray:
        return np.array(self.rows, dtype=np.int64).reshape(self.B, self.n)


def apply_op(buf, model: Model, op, as_torch: bool) -> None:
    kind = op[0]
    if kind == "add":
        buf.add_batch(make_items(model.next_counters(1)[:, 0], as_torch))
        model.add(1)
    elif kind == "extend":
        num_steps = op[1]
        buf.extend(make_items(model.next_counters(num_steps), as_torch))
        model.add(num_steps)
    elif kind == "clear":
        buf.clear(zero_storage=op[1])
        model.clear()
    else:  # pragma: no cover
        raise AssertionError(op)


def check_against_model(buf, model: Model, storage: str) -> None:
    assert buf.num_frames() == model.n * model.B
    assert len(buf) == model.n * model.B
    assert buf.last_id == model.last_id
    c, _ = leaves_of(buf.gather_all(), storage)
    assert c.shape == (model.B, model.n)
    np.testing.assert_array_equal(c, model.counters())


# ------------------------------------------------------------------- strategies
@st.composite
def layouts(draw):
    return draw(st.integers(1, 4)), draw(st.integers(1, 6))


def op_strategy(max_length: int, clear: bool = True):
    ops = [st.just(("add",)),
           st.tuples(st.just("extend"), st.integers(0, max_length + 3))]
    if clear:
        ops.append(st.tuples(st.just("clear"), st.booleans()))
    return st.one_of(*ops)


@st.composite
def scenarios(draw, min_ops: int = 0, max_ops: int = 10, clear: bool = True):
    """``(batch_size, max_length, ops, as_torch)``."""
    B, L = draw(layouts())
    ops = draw(st.lists(op_strategy(L, clear), min_size=min_ops, max_size=max_ops))
    as_torch = draw(st.booleans())
    return B, L, ops, as_torch


def build(storage: str, B: int, L: int, ops, as_torch: bool, seed: int | None = None):
    buf = UniformReplayBuffer(make_spec(), batch_size=B, max_length=L, storage=storage,
                              seed=seed)
    model = Model(B, L)
    for op in ops:
        apply_op(buf, model, op, as_torch and storage == "torch")
    return buf, model


# ============================================================ 1. writes & gather
@storages
@settings(max_examples=200, **SETTINGS)
@given(scenario=scenarios(max_ops=14))
def test_ops_match_model(storage, scenario):
    B, L, ops, as_torch = scenario
    buf = UniformReplayBuffer(make_spec(), batch_size=B, max_length=L, storage=storage)
    model = Model(B, L)
    check_against_model(buf, model, storage)  # empty: [B, 0, ...]
    for op in ops:
        apply_op(buf, model, op, as_torch and storage == "torch")
        check_against_model(buf, model, storage)


# TensorFlow's buffer keeps rows contiguous (TF-Agents' layout) where the others are
# slot-major: the same model pins its adds, extends, wraps, clears and gather_all.
# Fewer examples: every buffer traces its graph functions.
@settings(max_examples=30, **SETTINGS)
@given(scenario=scenarios(max_ops=14))
def test_tensorflow_ops_match_model(scenario):
    pytest.importorskip("tensorflow")
    test_ops_match_model.hypothesis.inner_test("tensorflow", scenario)


# =============================================================== 2. get_next
def normalize_sample(items, info, S, T, time_stacked, storage):
    """Check the shapes of a get_next result; return ``counter [S, T]``,
    ``ids [S, T]``, ``probabilities [S]`` (with S = 1 / T = 1 when None)."""
    assert isinstance(info, BufferInfo)
    outer = (() if S is None else (S,)) + (() if T is None else (T,))
    if T is not None and not time_stacked:
        assert isinstance(items, tuple) and len(items) == T
        assert isinstance(info.ids, tuple) and len(info.ids) == T
        step_outer = () if S is None else (S,)
        cs, ids = [], []
        for item, step_ids in zip(items, info.ids):
            c, _ = leaves_of(item, storage)
            check_backend_type(step_ids, storage)
            step_ids = to_np(step_ids)
            assert c.shape == step_outer and step_ids.shape == step_outer
            cs.append(c)
            ids.append(step_ids)
        axis = 0 if S is None else 1
        c, ids = np.stack(cs, axis=axis), np.stack(ids, axis=axis)
    else:
        c, _ = leaves_of(items, storage)
        check_backend_type(info.ids, storage)
        ids = to_np(info.ids)
    check_backend_type(info.probabilities, storage)
    probs = to_np(info.probabilities)
    assert c.shape == outer, (c.shape, outer)
    assert ids.shape == outer, (ids.shape, outer)
    assert ids.dtype == np.int64
    assert probs.dtype == np.float32
    assert probs.shape == (() if S is None else (S,))
    if S is None:
        c, ids, probs = c[None], ids[None], probs[None]
    if T is None:
        c, ids = c[:, None], ids[:, None]
    return c, ids, probs


def check_windows(model: Model, c: np.ndarray, ids: np.ndarray, probs: np.ndarray):
    """Every row of ``c`` is a contiguous slice of one model row, with matching ids."""
    T = c.shape[1]
    model_ids = model.ids
    valid_starts = model.n - T + 1
    assert valid_starts >= 1
    expected_p = np.float32(1.0 / (valid_starts * model.B))
    np.testing.assert_allclose(probs, expected_p, rtol=1e-6)
    starts = []
    for window, window_ids in zip(c.tolist(), ids.tolist()):
        epoch, row, _ = decode(window[0])
        assert epoch == model.epoch and 0 <= row < model.B, f"stale value {window[0]}"
        model_row = model.rows[row]
        assert window[0] in model_row, f"value {window[0]} is not retained (evicted?)"
        k = model_row.index(window[0])
        assert window == model_row[k:k + T], (window, model_row)
        assert window_ids == model_ids[k:k + T], (window_ids, model_ids, k)
        assert window_ids == list(range(window_ids[0], window_ids[0] + T))
        starts.append((row, window_ids[0]))
    return starts


@st.composite
def read_args(draw, max_length: int):
    S = draw(st.one_of(st.none(), st.integers(1, 5)))
    T = draw(st.one_of(st.none(), st.integers(1, max_length + 1)))
    return S, T, draw(st.booleans())


@storages
@settings(max_examples=150, **SETTINGS)
@given(data=st.data())
def test_get_next_windows(storage, data):
    B, L, ops, as_torch = data.draw(scenarios(max_ops=8))
    buf, model = build(storage, B, L, ops, as_torch, seed=data.draw(st.integers(0, 2**32)))
    queries = data.draw(st.lists(read_args(L), min_size=1, max_size=4))
    for S, T, time_stacked in [(None, None, True)] + queries:
        steps = T or 1
        if model.n < steps:
            with pytest.raises(EmptyBufferError):
                buf.get_next(S, T, time_stacked)
            continue
        for _ in range(4):
            items, info = buf.get_next(S, T, time_stacked)
            c, ids, probs = normalize_sample(items, info, S, T, time_stacked, storage)
            check_windows(model, c, ids, probs)
        # Support: many draws hit every valid (row, start) pair and nothing else.
        # (At most 4 * 6 pairs; missing one in 1500 uniform draws has probability
        # below 1e-25.)
        items, info = buf.get_next(1500, steps)
        c, ids, probs = normalize_sample(items, info, 1500, steps, True, storage)
        seen = set(check_windows(model, c, ids, probs))
        expected = {(row, model.ids[k]) for row in range(B)
                    for k in range(model.n - steps + 1)}
        assert seen == expected


# ==================================================== 3. deterministic pass
def expected_pass(model: Model, S, T, shift, drop_remainder):
    """The elements a deterministic pass should yield, as ``counter`` arrays."""
    n, B = model.n, model.B
    if S is None:
        groups = [(b, None) for b in range(B)]  # (row, None): no batch dim
    else:
        groups = []
        for g in range(0, B, S):
            rows = list(range(g, min(g + S, B)))
            if len(rows) < S and drop_remainder:
                continue
            groups.append((rows, S))
    if T is None:
        windows = [(i, None) for i in range(n)]  # one step, no time dim
    else:
        step = shift if shift is not None else T
        windows = []
        start = 0
        while start < n:
            length = min(T, n - start)
            if length < T and drop_remainder:
                break
            windows.append((start, length))
            start += step
    out = []
    for rows, batched in groups:
        for start, length in windows:
            def cell(r, start=start, length=length):
                if length is None:
                    return model.rows[r][start]
                return model.rows[r][start:start + length]
            if batched is None:
                out.append(np.array(cell(rows), dtype=np.int64))
            else:
                out.append(np.array([cell(r) for r in rows], dtype=np.int64))
    return out


@storages
@settings(max_examples=300, **SETTINGS)
@given(data=st.data())
def test_deterministic_pass(storage, data):
    B, L, ops, as_torch = data.draw(scenarios(max_ops=8))
    buf, model = build(storage, B, L, ops, as_torch)
    S = data.draw(st.one_of(st.none(), st.integers(1, B + 1)), label="S")
    T = data.draw(st.one_of(st.none(), st.integers(1, L + 1)), label="T")
    shift = data.draw(st.one_of(st.none(), st.integers(1, 3)), label="window_shift")
    drop = data.draw(st.booleans(), label="drop_remainder")

    kwargs = dict(single_deterministic_pass=True, sample_batch_size=S, num_steps=T,
                  window_shift=shift, drop_remainder=drop)
    all_dropped = drop and ((S is not None and S > B) or (T is not None and T > L))
    if all_dropped:
        with pytest.raises(ValueError, match="ALL data will be dropped"):
            buf.as_dataset(**kwargs)
        return
    ds = buf.as_dataset(**kwargs)
    if model.n == 0:
        with pytest.raises(EmptyBufferError):
            list(ds)
        return
    got = list(ds)
    expected = expected_pass(model, S, T, shift, drop)
    assert len(got) == len(expected), (len(got), len(expected))
    visited = collections.Counter()
    for (items, info), want in zip(got, expected):
        assert isinstance(info, BufferInfo)
        c, _ = leaves_of(items, storage)
        assert c.shape == want.shape, (c.shape, want.shape)
        np.testing.assert_array_equal(c, want)
        # ids: TF-Agents' physical row index row * max_length + id % max_length.
        check_backend_type(info.ids, storage)
        ids = to_np(info.ids)
        assert ids.shape == want.shape
        decoded = [decode(v) for v in want.reshape(-1).tolist()]
        physical = [row * L + step_id % L for _, row, step_id in decoded]
        np.testing.assert_array_equal(ids.reshape(-1), physical)
        assert info.probabilities == ()
        visited.update((row, step_id) for _, row, step_id in decoded)
    if (shift is None or T is None or shift == T) and not drop:
        retained = {(b, i) for b in range(B) for i in model.ids}
        assert set(visited) == retained
        assert all(count == 1 for count in visited.values()), visited
    # A second pass over the unchanged buffer yields the same elements.
    again = list(buf.as_dataset(**kwargs))
    assert len(again) == len(got)
    for (a, _), (b, _) in zip(again, got):
        np.testing.assert_array_equal(leaves_of(a)[0], leaves_of(b)[0])


# ====================================================== 4. seeds & save/load
def sample_np(buf, S, T, time_stacked=True):
    """A get_next result flattened to numpy arrays (or the exception type)."""
    try:
        items, info = buf.get_next(S, T, time_stacked)
    except EmptyBufferError:
        return "empty"
    if T is not None and not time_stacked:
        arrays = []
        for item, step_ids in zip(items, info.ids):
            arrays.extend(leaves_of(item))
            arrays.append(to_np(step_ids))
    else:
        arrays = list(leaves_of(items)) + [to_np(info.ids)]
    arrays.append(to_np(info.probabilities))
    return arrays


def assert_same_samples(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


@storages
@settings(max_examples=100, **SETTINGS)
@given(data=st.data())
def test_seeded_buffers_reproduce(storage, data):
    B, L = data.draw(layouts())
    seed = data.draw(st.integers(0, 2**63 - 1), label="seed")
    as_torch = data.draw(st.booleans())
    steps = data.draw(st.lists(st.one_of(op_strategy(L), st.tuples(st.just("sample"),
                                                                   read_args(L))),
                               max_size=14), label="steps")
    bufs = [UniformReplayBuffer(make_spec(), batch_size=B, max_length=L, storage=storage,
                                seed=seed) for _ in range(2)]
    models = [Model(B, L), Model(B, L)]
    for step in steps:
        if step[0] == "sample":
            S, T, stacked = step[1]
            assert_same_samples(sample_np(bufs[0], S, T, stacked),
                                sample_np(bufs[1], S, T, stacked))
        else:
            for buf, model in zip(bufs, models):
                apply_op(buf, model, step, as_torch and storage == "torch")
    if models[0].n:
        # Seeded random datasets reproduce too, with or without worker threads.
        workers = data.draw(st.sampled_from([None, 2]), label="num_parallel_calls")
        streams = [iter(buf.as_dataset(sample_batch_size=3, num_steps=1,
                                       num_parallel_calls=workers)) for buf in bufs]
        try:
            for _ in range(4):
                (a, ia), (b, ib) = next(streams[0]), next(streams[1])
                c, _ = leaves_of(a, storage)
                np.testing.assert_array_equal(c, leaves_of(b, storage)[0])
                np.testing.assert_array_equal(to_np(ia.ids), to_np(ib.ids))
                check_windows(models[0], c, to_np(ia.ids), to_np(ia.probabilities))
        finally:
            for it in streams:
                if hasattr(it, "close"):
                    it.close()


@storages
@settings(max_examples=80, **SETTINGS)
@given(data=st.data())
def test_save_load_round_trip(storage, data):
    B, L, ops, as_torch = data.draw(scenarios(max_ops=8))
    seed = data.draw(st.integers(0, 2**63 - 1), label="seed")
    buf, model = build(storage, B, L, ops, as_torch, seed=seed)
    load_storage = data.draw(st.sampled_from([None] + STORAGES), label="load_storage")
    queries = data.draw(st.lists(read_args(L), min_size=1, max_size=3), label="queries")
    more_ops = data.draw(st.lists(op_strategy(L, clear=False), min_size=1, max_size=3),
                         label="more_ops")
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "ckpt"
        # Saving twice into the same directory replaces the first save.
        buf.save(str(target))
        if data.draw(st.booleans(), label="save_again"):
            apply_op(buf, model, ("add",), False)
            buf.save(str(target))
        restored = replaybuffer.load(str(target), storage=load_storage)
    new_storage = load_storage or storage
    assert type(restored) is UniformReplayBuffer
    assert (restored.batch_size, restored.max_length) == (B, L)
    assert restored.storage == new_storage
    check_against_model(restored, model, new_storage)
    check_against_model(buf, model, storage)

    def compare_draws():
        for S, T, stacked in queries:
            assert_same_samples(sample_np(buf, S, T, stacked),
                                sample_np(restored, S, T, stacked))

    compare_draws()  # same sampler state
    for op in more_ops:  # adds continue from last_id + 1, in both buffers alike
        apply_op_to_all([buf, restored], model, op)
        check_against_model(restored, model, new_storage)
        check_against_model(buf, model, storage)
    compare_draws()


def apply_op_to_all(bufs, model: Model, op) -> None:
    """Apply one write op to several buffers and, once, to the model."""
    if op[0] == "add":
        for b in bufs:
            b.add_batch(make_items(model.next_counters(1)[:, 0]))
        model.add(1)
    elif op[0] == "extend":
        for b in bufs:
            b.extend(make_items(model.next_counters(op[1])))
        model.add(op[1])
    else:
        for b in bufs:
            b.clear(zero_storage=op[1])
        model.clear()


# ============================================== 5. TF-Agents compat buffer
@storages
@settings(max_examples=200, **SETTINGS)
@given(data=st.data())
def test_py_uniform_replay_buffer(storage, data):
    capacity = data.draw(st.integers(1, 6), label="capacity")
    as_torch = data.draw(st.booleans()) and storage == "torch"
    ops = data.draw(st.lists(st.one_of(st.integers(0, capacity + 3), st.just("clear")),
                             max_size=10), label="ops")
    buf = PyUniformReplayBuffer(make_spec(), capacity, seed=0, storage=storage)
    model: list[int] = []
    epoch = 0
    next_id = 0

    def check():
        assert buf.size == len(model)
        assert buf.num_frames() == len(model)
        c, _ = leaves_of(buf.gather_all(), storage)
        assert c.shape == (1, len(model))
        np.testing.assert_array_equal(c[0], model)
        if model:
            items, info = buf.get_next(sample_batch_size=8)
            c, _ = leaves_of(items, storage)
            assert c.shape == (8,)
            assert set(c.tolist()) <= set(model)
            np.testing.assert_allclose(to_np(info.probabilities),
                                       np.float32(1.0 / len(model)), rtol=1e-6)
        else:
            with pytest.raises(EmptyBufferError):
                buf.get_next()

    check()
    for op in ops:
        if op == "clear":
            buf.clear()
            model.clear()
            epoch += 1
            next_id = 0
        else:
            counters = [encode(epoch, 0, next_id + i) for i in range(op)]
            buf.add_batch(make_items(np.array(counters, dtype=np.int64).reshape(op),
                                     as_torch))
            next_id += op
            model.extend(counters)
            del model[:-capacity]
        check()
