"""The TensorFlow backend beyond the shared suite: tf.function, tf.data, persistence,
TF-Agents' constructor and tutorial, and the TF-op index arithmetic against numpy's.

The behaviour every backend shares (checklist items 1-24) runs in test_uniform_buffer.py,
test_dataset.py and the other suites through the ``storage`` fixture's "tensorflow"
parameter: ``UniformReplayBuffer(..., storage="tensorflow")``, the Python ring over
TensorFlow variables. The TF-graph buffer is a class of its own, named here:
``replaybuffer.tf.TFUniformReplayBuffer``.
"""

import inspect
import itertools
import runpy
from pathlib import Path

import numpy as np
import pytest

import replaybuffer as rb
from conftest import to_np
from replaybuffer.sampling import deterministic as np_det
from replaybuffer.sampling import ring as np_ring

tf = pytest.importorskip("tensorflow")

from replaybuffer.tf import TFStorage, TFUniformReplayBuffer  # noqa: E402
from replaybuffer.tf import deterministic as tf_det  # noqa: E402
from replaybuffer.tf import ring as tf_ring  # noqa: E402

EMPTY = "is empty. Make sure to add items before sampling the buffer."
ROOT = Path(__file__).resolve().parents[1]


def counter(batch_size=2, max_length=5, adds=0, **kwargs):
    """int64 scalars: row b at add t holds 100 * b + t."""
    kwargs.setdefault("seed", 0)
    buf = TFUniformReplayBuffer(rb.ArraySpec((), np.int64), batch_size, max_length, **kwargs)
    for t in range(adds):
        buf.add_batch(np.arange(batch_size, dtype=np.int64) * 100 + t)
    return buf


def tensor_spec():
    return (tf.TensorSpec([3], tf.float32, "action"),
            (tf.TensorSpec([5], tf.float32, "lidar"), tf.TensorSpec([3, 2], tf.float32, "camera")))


# ------------------------------------------------------------------ construction
def test_the_tf_class_is_named_and_storage_tensorflow_keeps_the_class():
    buf = counter()
    assert type(buf) is TFUniformReplayBuffer and isinstance(buf, rb.UniformReplayBuffer)
    assert buf.storage == "tensorflow" and isinstance(buf.store, TFStorage)
    assert all(isinstance(v, tf.Variable) for v in buf.variables())
    assert type(rb.UniformReplayBuffer(rb.ArraySpec((), np.int64))) is rb.UniformReplayBuffer
    # UniformReplayBuffer(storage="tensorflow") is no longer swapped for the TF class: it
    # stays the generic class, its ring in Python over tensorflow storage.
    plain = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 2, 5, storage="tensorflow")
    assert type(plain) is rb.UniformReplayBuffer and isinstance(plain.store, TFStorage)
    plain.add_batch(np.arange(2, dtype=np.int64))
    assert isinstance(plain.get_next(2)[0], tf.Tensor)
    # So does episode tracking: the generic class over tensorflow storage.
    tracked = rb.UniformReplayBuffer({"step_type": rb.ArraySpec((), np.int32)}, 1, 4,
                                     storage="tensorflow", track_episodes=True)
    assert type(tracked) is rb.UniformReplayBuffer and tracked.storage == "tensorflow"
    tracked.add_batch({"step_type": np.zeros(1, np.int32)})
    assert isinstance(tracked.get_next(2)[0]["step_type"], tf.Tensor)


def _shared_tests() -> list:
    """The shared suite's tests of the ``storage`` fixture (checklist items 1-23)."""
    import test_dataset
    import test_uniform_buffer

    return [pytest.param(module, name, id=f"{module.__name__}::{name}")
            for module in (test_uniform_buffer, test_dataset)
            for name, fn in vars(module).items()
            if name.startswith("test_") and "storage" in inspect.signature(fn).parameters]


def _parameter_sets(fn) -> list[dict]:
    """Every combination of ``fn``'s ``pytest.mark.parametrize`` arguments."""
    sets: list[dict] = [{}]
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) \
            else list(mark.args[0])
        values = [v if len(names) > 1 else (v,) for v in mark.args[1]]
        sets = [{**base, **dict(zip(names, v))} for base in sets for v in values]
    return sets


# The TF class's plain random dataset draws one element ahead of the pull (issue 26);
# these shared tests are about sampling at the pull, its prefetch=0.
PULL_TIME_TESTS = {"test_random_dataset_sees_the_buffer_at_pull_time"}


class PullTimeTFBuffer(TFUniformReplayBuffer):
    def as_dataset(self, *args, **kwargs):
        kwargs.setdefault("prefetch", 0)
        return super().as_dataset(*args, **kwargs)


@pytest.mark.parametrize("module,name", _shared_tests())
def test_the_shared_suite_holds_for_the_named_class(module, name, monkeypatch):
    # The shared suite builds rb.UniformReplayBuffer(..., storage="tensorflow"), which is
    # the Python ring over TF variables; here the same tests run on the TF-graph class,
    # as they did when UniformReplayBuffer swapped itself for it.
    real, built = rb.UniformReplayBuffer, []
    cls = PullTimeTFBuffer if name in PULL_TIME_TESTS else TFUniformReplayBuffer

    def build(*args, **kwargs):
        if kwargs.get("storage") == "tensorflow":
            built.append(cls(*args, **kwargs))
            return built[-1]
        return real(*args, **kwargs)

    monkeypatch.setattr(rb, "UniformReplayBuffer", build)
    fn = getattr(module, name)
    for kwargs in _parameter_sets(fn):
        try:
            fn(storage={"storage": "tensorflow"}, **kwargs)
        except pytest.skip.Exception:
            return
    assert built, "the test built no buffer of the TF class"


def test_tf_agents_constructor_and_names():
    from replaybuffer.compat.tf_agents import TFUniformReplayBuffer as Compat

    assert Compat is TFUniformReplayBuffer
    buf = Compat(tensor_spec(), batch_size=3, max_length=4, scope="RB", device="cpu:*",
                 dataset_drop_remainder=True, dataset_window_shift=1)
    assert buf.capacity == 12 and buf.scope == "RB" and "CPU" in buf.device
    assert buf.data_spec[1][1] == rb.ArraySpec((3, 2), np.float32, "camera")
    names = [v.name for v in buf.variables()[:3]]
    assert names == ["RB/action:0", "RB/lidar:0", "RB/camera:0"]
    with pytest.raises(ValueError, match="ALL data will be dropped"):  # from the constructor
        buf.as_dataset(single_deterministic_pass=True, sample_batch_size=4)
    for t in range(3):
        buf.add_batch(tf.nest.map_structure(lambda s, t=t: tf.fill([3] + s.shape, float(t)),
                                            tensor_spec()))
    windows = [to_np(items[0])[:, 0].tolist()
               for items, _ in buf.as_dataset(single_deterministic_pass=True, num_steps=2)]
    assert windows == [[0, 1], [1, 2]] * 3  # shift 1, the partial [2] dropped
    with pytest.raises(ValueError, match="table_fn"):
        Compat(tensor_spec(), 1, table_fn=object())
    with pytest.raises(ValueError, match="storage must be 'tensorflow'"):
        TFUniformReplayBuffer(tensor_spec(), 1, storage="numpy")
    with pytest.raises(ValueError, match="track_episodes"):
        TFUniformReplayBuffer(tensor_spec(), 1, track_episodes=True)


def test_other_buffer_classes_run_eagerly_on_tensorflow_storage():
    buf = rb.PrioritizedReplayBuffer(rb.ArraySpec((2,), np.float32), 2, 4, seed=0,
                                     storage="tensorflow")
    buf.add_batch(np.ones((2, 2), np.float32))
    items, info = buf.get_next(3)
    assert isinstance(items, tf.Tensor) and tuple(items.shape) == (3, 2)


# ------------------------------------------------------------------ tf.function
def test_add_batch_and_get_next_inside_tf_function():
    buf = counter(batch_size=3, max_length=4)

    @tf.function
    def collect(step):
        buf.add_batch(step)

    @tf.function
    def sample():
        return buf.get_next(64, num_steps=2)

    for t in range(6):
        collect(tf.range(3, dtype=tf.int64) * 100 + t)
    assert buf.last_id == 5 and collect.experimental_get_tracing_count() == 1
    items, info = sample()
    x, ids = to_np(items), to_np(info.ids)
    np.testing.assert_array_equal(x[:, 0] + 1, x[:, 1])
    np.testing.assert_array_equal(x % 100, ids)
    assert set(ids[:, 0].tolist()) <= {2, 3, 4}  # the ring holds 2..5
    np.testing.assert_allclose(to_np(info.probabilities), 1 / 9)
    np.testing.assert_array_equal(to_np(buf.gather_all()),
                                  np.arange(3)[:, None] * 100 + np.arange(2, 6))

    @tf.function
    def everything():
        return buf.gather_all(), buf.num_frames(), buf.last_id

    gathered, frames, last_id = everything()
    assert int(frames) == 12 and int(last_id) == 5 and tuple(gathered.shape) == (3, 4)

    @tf.function
    def reset():
        buf.clear()

    reset()
    assert buf.last_id == -1
    with pytest.raises(tf.errors.InvalidArgumentError, match=EMPTY):  # known at run time
        sample()


def test_extend_inside_tf_function_with_unknown_length():
    buf = counter(batch_size=2, max_length=3)
    extend = tf.function(buf.extend, input_signature=[tf.TensorSpec([2, None], tf.int64)])
    extend(tf.constant([[0, 1], [100, 101]], tf.int64))
    extend(tf.constant([[2, 3, 4, 5], [102, 103, 104, 105]], tf.int64))  # longer than L
    assert buf.last_id == 5
    np.testing.assert_array_equal(to_np(buf.gather_all()), [[3, 4, 5], [103, 104, 105]])


def test_extend_with_unknown_length_casts_numpy_leaves():
    # A numpy leaf beside a tensor of unknown length takes its length from its own shape,
    # and is cast like any other (float64 into a float32 leaf). It was refused with
    # "expected shape (2, None)" whenever its dtype was not the stored one.
    spec = {"a": rb.ArraySpec((), np.int64), "b": rb.ArraySpec((), np.float32)}
    buf = TFUniformReplayBuffer(spec, 2, 3, seed=0)

    @tf.function(input_signature=[tf.TensorSpec([2, None], tf.int64)])
    def extend(a):
        buf.extend({"a": a, "b": np.array([[0.5, 1.5], [2.5, 3.5]])})  # float64

    extend(tf.constant([[0, 1], [100, 101]], tf.int64))
    items = buf.gather_all()
    np.testing.assert_array_equal(to_np(items["a"]), [[0, 1], [100, 101]])
    np.testing.assert_array_equal(to_np(items["b"]), [[0.5, 1.5], [2.5, 3.5]])
    assert items["b"].dtype == tf.float32


def test_bad_items_fail_when_traced_and_change_nothing():
    buf = counter(batch_size=2, max_length=4, adds=5)
    before = to_np(buf.gather_all())

    @tf.function
    def bad_shape():
        buf.add_batch(tf.zeros([3], tf.int64))

    @tf.function
    def bad_dtype():
        buf.add_batch(tf.zeros([2], tf.float32))

    @tf.function
    def too_long():
        return buf.get_next(2, num_steps=5)

    with pytest.raises(rb.SpecError, match=r"leaf <root>: expected shape \(2,\).*got \(3,\)"):
        bad_shape()
    with pytest.raises(rb.SpecError, match=r"leaf <root>: expected dtype int64.*got float32"):
        bad_dtype()
    with pytest.raises(rb.EmptyBufferError, match="exceeds max_length=4"):
        too_long()
    with pytest.raises(rb.SpecError, match="expected dtype int64.*got string"):
        buf.add_batch(tf.constant(["a", "b"]))

    # A batch dimension unknown when traced is checked when the graph runs.
    unknown = tf.function(buf.add_batch, input_signature=[tf.TensorSpec([None], tf.int64)])
    with pytest.raises(tf.errors.InvalidArgumentError):
        unknown(tf.zeros([3], tf.int64))
    assert buf.last_id == 4
    np.testing.assert_array_equal(to_np(buf.gather_all()), before)
    unknown(tf.constant([7, 8], tf.int64))
    assert buf.last_id == 5


def test_tensors_variables_and_safe_casts_are_accepted():
    buf = TFUniformReplayBuffer(tensor_spec(), 2, 4)
    step = (tf.Variable(tf.ones([2, 3], tf.float64)),
            (np.full((2, 5), 2, np.float64), tf.fill([2, 3, 2], 3.0)))
    buf.add_batch(step)
    action, (lidar, camera) = buf.gather_all()
    assert action.dtype == tf.float32 and to_np(action).tolist() == [[[1.0] * 3]] * 2
    assert (to_np(lidar) == 2).all() and (to_np(camera) == 3).all()


# ---------------------------------------------------------------------- tf.data
def test_datasets_are_tf_data_with_the_data_spec_as_element_spec():
    buf = TFUniformReplayBuffer(tensor_spec(), 4, 6, seed=1)
    for _ in range(6):
        buf.add_batch(tf.nest.map_structure(lambda s: tf.ones([4] + s.shape), tensor_spec()))
    random = buf.as_dataset(3, num_steps=2, num_parallel_calls=2)
    assert isinstance(random, tf.data.Dataset)
    items_spec, info_spec = random.element_spec
    assert items_spec == tf.nest.map_structure(
        lambda s: tf.TensorSpec([3, 2] + s.shape, s.dtype), tensor_spec())
    assert info_spec.ids == tf.TensorSpec([3, 2], tf.int64)
    assert info_spec.probabilities == tf.TensorSpec([3], tf.float32)
    one, _ = buf.as_dataset().element_spec
    assert one[1][1].shape == [3, 2]
    passes = {(None, None, False): [], (3, None, False): [None], (2, None, False): [2],
              (None, 2, False): [None], (None, 2, True): [2], (3, 2, True): [3, 2],
              (3, 2, False): [None, None]}
    for (S, T, drop), outer in passes.items():
        spec = buf.as_dataset(S, T, single_deterministic_pass=True,
                              drop_remainder=drop).element_spec
        assert spec[0][0].shape.as_list() == outer + [3], (S, T, drop)
        assert spec[1].probabilities == ()

    # Ordinary tf.data: transformations, and iteration inside tf.function.
    @tf.function
    def total(dataset):
        return dataset.take(5).reduce(tf.constant(0.0), lambda acc, e: acc + tf.reduce_sum(e))

    actions = random.map(lambda items, info: items[0])
    assert float(total(actions)) == 5 * 3 * 2 * 3
    steps = buf.as_dataset(single_deterministic_pass=True).map(lambda items, info: info.ids)
    assert sorted(int(x) for x in steps) == list(range(24))


def test_parallel_streams_are_reproducible_and_do_not_depend_on_parallelism():
    def first_elements(workers, prefetch=None):
        buf = counter(batch_size=3, max_length=20, adds=20, seed=7)
        it = iter(buf.as_dataset(16, num_steps=2, num_parallel_calls=workers,
                                 prefetch=prefetch))
        out = [(to_np(items), to_np(info.ids)) for items, info in itertools.islice(it, 6)]
        it.close()
        return out

    reference = first_elements(None)
    for workers, prefetch in ((1, None), (3, None), (3, 0), (None, 4)):
        for (a, ia), (b, ib) in zip(reference, first_elements(workers, prefetch)):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(ia, ib)
    assert not np.array_equal(reference[0][0], reference[1][0])  # fresh draws per element


def test_random_stream_sees_adds_and_empty_errors_are_typed_in_and_out_of_graphs():
    buf = counter(batch_size=2, max_length=3)
    dataset = buf.as_dataset(4)
    it = iter(dataset)
    with pytest.raises(rb.EmptyBufferError, match=EMPTY):
        next(it)
    buf.add_batch(np.array([5, 105]))
    items, _ = next(it)
    assert set(to_np(items).tolist()) <= {5, 105}

    @tf.function
    def first(ds):
        return next(iter(ds))[0]

    buf.clear()
    with pytest.raises(tf.errors.InvalidArgumentError, match=EMPTY):
        first(dataset)


# ------------------------------------------- the direct road of Python iteration
def ordered_spec():
    """An OrderedDict out of key order: optree keeps insertion order, tf.nest sorts keys,
    so the flat tensors of an element come in another order than the leaves."""
    from collections import OrderedDict

    return OrderedDict([("zeta", rb.ArraySpec((2,), np.float32)),
                        ("alpha", (rb.ArraySpec((), np.int64), rb.ArraySpec((3,), np.int32)))])


def filled(spec, batch_size=3, max_length=6, adds=8, seed=5):
    buf = TFUniformReplayBuffer(spec, batch_size, max_length, seed=seed)
    rng = np.random.default_rng(0)
    for _ in range(adds):
        buf.add_batch(tf.nest.map_structure(
            lambda s: (rng.standard_normal((batch_size,) + s.shape) * 100).astype(s.dtype),
            spec))
    return buf


def same_elements(fast, generic):
    assert type(fast[0]) is type(generic[0]) and type(fast[1]) is type(generic[1])
    tf.nest.assert_same_structure(fast, generic)
    for a, b in zip(tf.nest.flatten(fast), tf.nest.flatten(generic)):
        if a is None or b is None:  # BufferInfo.weights
            assert a is None and b is None
            continue
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("kwargs", [
    {"sample_batch_size": 4, "num_steps": 2}, {}, {"num_steps": 3},
    {"sample_batch_size": 5, "num_parallel_calls": 2},
    {"single_deterministic_pass": True, "sample_batch_size": 2, "num_steps": 2},
    {"single_deterministic_pass": True}])
def test_python_iteration_gives_tf_data_s_own_elements(kwargs):
    # Two buffers built alike: one iterated by ReplayIterator's direct road, the other
    # by TensorFlow's own iterator (the generic road) and inside tf.function.
    fast_buf, generic_buf, graph_buf = (filled(ordered_spec()) for _ in range(3))
    it = iter(fast_buf.as_dataset(**kwargs))
    assert it._pull is not None
    fast = list(itertools.islice(it, 7))
    generic = list(itertools.islice(generic_buf.as_dataset(**kwargs).tf_iterator(), 7))
    assert len(fast) == len(generic) > 0
    for a, b in zip(fast, generic):
        same_elements(a, b)

    @tf.function
    def first_two(dataset):
        it = iter(dataset)
        return next(it), next(it)

    for a, b in zip(fast, first_two(graph_buf.as_dataset(**kwargs))):
        same_elements(a, b)


def test_the_generic_road_is_taken_where_the_direct_one_is_missing(monkeypatch):
    import replaybuffer.tf.dataset as tf_dataset

    expected = list(itertools.islice(filled(ordered_spec()).as_dataset(4, 2), 3))
    monkeypatch.setattr(tf_dataset, "_get_next_op", None)
    it = iter(filled(ordered_spec()).as_dataset(4, 2))
    assert it._pull is None
    for a, b in zip(itertools.islice(it, 3), expected):
        same_elements(a, b)
    # Element specs with anything but dense tensors have no flat unpacker.
    ragged = tf.data.Dataset.from_tensors(tf.ragged.constant([[1], [2, 3]]))
    assert tf_dataset.flat_unpacker(ragged.element_spec, lambda v: v[0], 1) is None
    dense = tf.data.Dataset.from_tensors((tf.zeros(2), tf.ones(3)))
    assert tf_dataset.flat_unpacker(dense.element_spec, lambda v: v[0], 1) is None
    # build takes its values in its own order; the flat tensors come in the element's.
    unpack = tf_dataset.flat_unpacker(dense.element_spec, lambda v: (v[1], v[0]), 2)
    assert unpack(["x", "y"]) == ("x", "y")


def test_prefetch_keeps_the_replay_dataset_and_its_errors():
    from replaybuffer.tf import ReplayDataset

    buf = counter(batch_size=2, max_length=3)
    dataset = buf.as_dataset(4, num_parallel_calls=2).prefetch(3)
    assert isinstance(dataset, ReplayDataset)
    it = iter(dataset)
    with pytest.raises(rb.EmptyBufferError, match=EMPTY):
        next(it)
    buf.add_batch(np.array([5, 105]))
    items, info = next(it)
    assert set(to_np(items).tolist()) <= {5, 105} and info.probabilities.shape == (4,)


def test_gather_all_matches_numpy_at_every_fill_and_wrap():
    tf_buf = counter(batch_size=3, max_length=4)
    np_buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 3, 4)
    gather_in_graph = tf.function(tf_buf.gather_all)
    for t in range(11):
        for got in (tf_buf.gather_all(), gather_in_graph()):
            assert tuple(got.shape) == (3, min(t, 4))
            np.testing.assert_array_equal(to_np(got), np_buf.gather_all())
        step = np.arange(3, dtype=np.int64) * 100 + t
        tf_buf.add_batch(step)
        np_buf.add_batch(step)
    spec = tensor_spec()  # leaves of rank 1 and 2
    buf = TFUniformReplayBuffer(spec, 2, 3)
    for t in range(5):
        buf.add_batch(tf.nest.map_structure(lambda s, t=t: tf.fill([2] + s.shape, float(t)),
                                            spec))
    action, (lidar, camera) = buf.gather_all()
    assert tuple(camera.shape) == (2, 3, 3, 2)
    np.testing.assert_array_equal(to_np(camera)[:, :, 0, 0], [[2, 3, 4], [2, 3, 4]])


@pytest.mark.parametrize("max_length,num_steps,adds", [(5, 3, 1), (5, 3, 2), (5, 3, 0),
                                                       (80, 70, 1), (80, 70, 69)])
def test_no_window_messages_are_the_numpy_buffer_s(max_length, num_steps, adds):
    # Up to 64 steps the message comes from a table, beyond from string ops.
    tf_buf = counter(batch_size=2, max_length=max_length, adds=adds)
    np_buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 2, max_length)
    for t in range(adds):
        np_buf.add_batch(np.arange(2, dtype=np.int64) * 100 + t)
    with pytest.raises(rb.EmptyBufferError) as expected:
        np_buf.get_next(3, num_steps=num_steps)
    message = str(expected.value).replace("UniformReplayBuffer", "TFUniformReplayBuffer")
    with pytest.raises(rb.EmptyBufferError) as got:
        tf_buf.get_next(3, num_steps=num_steps)
    assert str(got.value) == message
    with pytest.raises(tf.errors.InvalidArgumentError) as in_graph:
        tf.function(lambda: tf_buf.get_next(3, num_steps=num_steps))()
    assert message in in_graph.value.message
    with pytest.raises(rb.EmptyBufferError) as from_dataset:
        next(iter(tf_buf.as_dataset(3, num_steps=num_steps)))
    assert str(from_dataset.value) == message


# ------------------------------------------------------------------ persistence
# Saves hold the numpy storage's slot-major order; the TF buffer stores rows: partly
# filled, wrapped (slot 0 is not the oldest) and wrapped exactly (it is).
@pytest.mark.parametrize("adds", [3, 12, 10])
def test_save_and_load_round_trip(tmp_path, adds):  # item 24 for the TF backend
    buf = counter(batch_size=3, max_length=5, adds=adds, seed=3)
    buf.get_next(4)  # move the generator off its seed
    buf.save(tmp_path / "tf")
    again = rb.load(tmp_path / "tf")
    assert type(again) is TFUniformReplayBuffer and again.last_id == adds - 1
    np.testing.assert_array_equal(to_np(again.gather_all()), to_np(buf.gather_all()))
    a, ia = buf.get_next(16, num_steps=2)
    b, ib = again.get_next(16, num_steps=2)
    np.testing.assert_array_equal(to_np(a), to_np(b))  # the generator state came back
    np.testing.assert_array_equal(to_np(ia.ids), to_np(ib.ids))
    again.add_batch(np.zeros(3, np.int64))
    assert again.last_id == adds

    as_numpy = rb.load(tmp_path / "tf", storage="numpy")
    assert type(as_numpy) is rb.UniformReplayBuffer
    np.testing.assert_array_equal(as_numpy.gather_all(), to_np(buf.gather_all()))
    as_numpy.save(tmp_path / "np")
    # A UniformReplayBuffer's save on tensorflow storage is a UniformReplayBuffer there
    # (the class UniformReplayBuffer(storage="tensorflow") builds).
    back = rb.load(tmp_path / "np", storage="tensorflow")
    assert type(back) is rb.UniformReplayBuffer and isinstance(back.store, TFStorage)
    np.testing.assert_array_equal(to_np(back.gather_all()), to_np(buf.gather_all()))


def test_a_fresh_process_loads_a_tensorflow_save(tmp_path):
    import subprocess
    import sys

    counter(adds=4).save(tmp_path / "tf")
    code = ("import sys, replaybuffer as rb\n"
            f"b = rb.load({str(tmp_path / 'tf')!r}, storage='numpy')\n"
            "assert 'tensorflow' not in sys.modules and b.last_id == 3\n"
            f"b = rb.load({str(tmp_path / 'tf')!r})\n"
            "assert type(b).__name__ == 'TFUniformReplayBuffer' and b.last_id == 3\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------- the tutorial (example)
def test_tutorial_example_prints_the_tutorials_shapes(capsys):
    runpy.run_path(str(ROOT / "examples" / "tf_agents_tutorial_tf.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    element = ("(TensorShape([4, 2, 3]), (TensorShape([4, 2, 5]), "
               "TensorShape([4, 2, 3, 2])))")
    assert lines == ["2", "Iterator trajectories:", f"[{element}, {element}, {element}]",
                     "Trajectories from gather all:",
                     "(TensorShape([32, 6, 3]), (TensorShape([32, 6, 5]), "
                     "TensorShape([32, 6, 3, 2])))"]


# ---------------------------------------------------- TF ops against numpy's ring
@pytest.mark.parametrize("last_id,L,T", list(itertools.product([-1, 0, 2, 4, 9, 13], [1, 3, 5],
                                                               [1, 2, 5])))
def test_ring_ops_match_numpy(last_id, L, T):
    B = 3
    assert int(tf_ring.items_per_row(tf.constant(last_id, tf.int64), L)) == \
        np_ring.items_per_row(last_id, L)
    lo, hi = tf_ring.valid_start_range(tf.constant(last_id, tf.int64), L, T)
    assert (int(lo), int(hi)) == np_ring.valid_start_range(last_id, L, T)
    ids = np.arange(20, dtype=np.int64)
    rows = ids % B
    # Storage is row-major: a position is TF-Agents' physical row index.
    positions = tf_ring.positions(ids, rows, L)
    np.testing.assert_array_equal(positions, np_ring.table_rows(ids, rows, L))
    np.testing.assert_array_equal(  # the checkpoint order maps onto the same positions
        tf_ring.slot_major_to_positions(np_ring.positions(ids, rows, L, B), L, B), positions)
    if hi > lo:  # every draw maps to the (start, row) pair the numpy sampler gives it
        draws = np.arange(int(hi - lo) * B, dtype=np.int64)
        got_ids, got_rows = tf_ring.draws_to_starts(tf.constant(draws), lo, B)
        starts = np_ring.positions(int(lo) + draws // B, draws % B, L, B)
        np.testing.assert_array_equal(got_ids, int(lo) + draws // B)
        np.testing.assert_array_equal(got_rows, starts % B)
    first = last_id + 1
    skip, positions = tf_ring.write_positions(tf.constant(first, tf.int64),
                                              tf.constant(T + 2, tf.int64), L, B)
    kept = np.arange(first + max(0, T + 2 - L), first + T + 2)
    assert int(skip) == max(0, T + 2 - L)
    np.testing.assert_array_equal(  # row by row, oldest step first: items[:, skip:]
        positions, np_ring.table_rows(kept[None, :], np.arange(B)[:, None], L).ravel())


@pytest.mark.parametrize("B,S,T,shift,drop", [
    (B, S, T, shift, drop) for B in (1, 3, 4) for S in (None, 2, 4) for T in (None, 1, 2, 3)
    for shift in (None, 1, 2) for drop in (False, True) if not (T is None and shift)])
def test_deterministic_plan_matches_numpy(B, S, T, shift, drop):
    first, frames = 7, 5
    groups = tf_det.row_groups(B, S, drop)
    plan = [tuple(int(x) for x in entry)
            for entry in zip(*tf_det.plan(tf.constant(frames, tf.int64), len(groups), T, shift,
                                          drop))]
    ours = []
    for g, offset, length in plan:
        ids, rows = tf_det.block(tf.constant(first, tf.int64), g, offset, length, groups, S, T)
        ours.append((to_np(ids).tolist(), to_np(rows).tolist()))
    expected = [(np.asarray(ids).tolist(), np.asarray(rows).tolist())
                for ids, rows in np_det.plan(first, frames, B, S, T, shift, drop)]
    assert ours == expected


def test_the_tf_datasets_feed_a_torch_dataloader_torch_tensors():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    buf = counter(batch_size=2, max_length=5, adds=5)
    items, info = next(iter(DataLoader(buf.as_dataset(4, num_steps=2).to_torch(),
                                       batch_size=None)))
    assert isinstance(items, torch.Tensor) and tuple(items.shape) == (4, 2)
    assert isinstance(info.ids, torch.Tensor)
    np.testing.assert_array_equal(items[:, 1].numpy(), items[:, 0].numpy() + 1)
    everything = list(DataLoader(buf.as_dataset(single_deterministic_pass=True).to_torch(),
                                 batch_size=None))
    assert len(everything) == 10 and all(isinstance(x, torch.Tensor) for x, _ in everything)
