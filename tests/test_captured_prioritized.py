"""Prioritized samples from recorded draws (``PrioritizedReplayBuffer(capture_samples=)``:
sampling/captured_prioritized.py, buffers/captured_reads.py).

On the CPU the recordings are the traced twin of the CUDA graph (graph_capture.
TracedCapture: host values frozen at record time as a graph freezes them), checked
byte for byte against the eager device path of a twin buffer built with the same seed
and given the same adds and priority updates (host and device updates, zeros, clears, wrap-around,
a beta schedule, both normalizations). The tests named ``..._cuda`` run the real CUDA
graph where torch sees a GPU (``benchmarks/gpu_check.sh`` runs them).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import replaybuffer as rb  # noqa: E402
from recorded_batches import assert_batches_survive_replays_and_restore  # noqa: E402
from replaybuffer.errors import EmptyBufferError  # noqa: E402
from replaybuffer.sampling.captured_prioritized import CapturedPrioritizedDraw  # noqa: E402
from replaybuffer.sampling.graph_capture import EagerCapture, TracedCapture  # noqa: E402
from replaybuffer.sampling.torch_prefix_sums import TorchPrefixSums  # noqa: E402
from replaybuffer.storage.torch_storage import TorchStorage  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

# Three blocks (float32, int64, uint8): a gather per block.
SPEC = {"obs": rb.ArraySpec((3,), np.float32), "action": rb.ArraySpec((), np.int64),
        "reward": rb.ArraySpec((), np.float32), "frame": rb.ArraySpec((2,), np.uint8)}


@pytest.fixture(autouse=True)
def packed_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch storage on the CPU with the device layout (packed blocks)."""
    monkeypatch.setattr(TorchStorage, "numpy_views", False)


def make(capture: bool | None, rows: int = 2, length: int = 7, device: str = "cpu",
         seed: int = 5, **kwargs) -> rb.PrioritizedReplayBuffer:
    return rb.PrioritizedReplayBuffer(SPEC, rows, length, storage="torch", device=device,
                                      sample_on_device=True, seed=seed,
                                      capture_samples=capture, **kwargs)


def items(rng: np.random.Generator, rows: int) -> dict:
    return {"obs": rng.random((rows, 3), dtype=np.float32),
            "action": rng.integers(-50, 50, rows),
            "reward": rng.random(rows).astype(np.float32),
            "frame": rng.integers(0, 256, (rows, 2)).astype(np.uint8)}


def flat(batch) -> list:
    out, info = batch
    return rb.nest.flatten(out)[0] + list(rb.nest.flatten(info.ids)[0]) + \
        [info.probabilities, info.weights]


def assert_same(a, b) -> None:
    """Byte for byte: the same dtypes, shapes, strides and values."""
    xs, ys = flat(a), flat(b)
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        assert torch.equal(x, y)


def draw_both(a, b, *args, **kwargs):
    """The same call on both buffers: both results, or both the same error."""
    try:
        x = a.get_next(*args, **kwargs)
    except (EmptyBufferError, ValueError) as error:
        with pytest.raises(type(error)):
            b.get_next(*args, **kwargs)
        return None
    y = b.get_next(*args, **kwargs)
    assert_same(x, y)
    return x


def fill(bufs, rng, rows: int, adds: int) -> None:
    for _ in range(adds):
        x = items(rng, rows)
        for buf in bufs:
            buf.add_batch(x)


# ----------------------------------------------------------------- against eager
calls = st.tuples(st.sampled_from([None, 1, 3, 8]), st.sampled_from([None, 1, 2, 4]),
                  st.booleans())
updates = st.tuples(st.just("update"), st.booleans(),
                    st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0, 1e-3, -1.0, np.nan]),
                             min_size=1, max_size=6))


def both(a, b, method: str, *args):
    """The same call on both buffers: both return, or both raise the same error."""
    try:
        x = getattr(a, method)(*args)
    except ValueError as error:
        with pytest.raises(ValueError) as caught:
            getattr(b, method)(*args)
        assert str(caught.value) == str(error)
        return None
    return x, getattr(b, method)(*args)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3), length=st.integers(1, 6),
       normalize=st.sampled_from(["batch", "buffer"]), beta_steps=st.sampled_from([0, 5]),
       program=st.lists(st.one_of(st.integers(1, 8), calls, updates, st.just("clear")),
                        min_size=1, max_size=30),
       seed=st.integers(0, 2**32 - 1))
def test_recorded_draws_match_the_eager_path(rows, length, normalize, beta_steps, program,
                                             seed):
    """Adds, samples ((S, T, time_stacked)), priority updates of the last sample's ids
    (on the device, recorded per size, or the host; zeros among them make the next
    draws eager; bad ones raise, on the device at the next call) and clears,
    interleaved past wrap-around: the recorded buffer returns and raises what the
    eager one does, byte for byte, and its priorities stay the same."""
    kwargs = {"normalize": normalize, "beta_steps": beta_steps, "beta_final": 1.0}
    a = make(True, rows, length, seed=seed, **kwargs)
    b = make(False, rows, length, seed=seed, **kwargs)
    assert a._captures is not None and b._captures is None
    for buf in (a, b):
        buf.sampler.device_updates = True  # the CUDA default, here on the CPU
    rng = np.random.default_rng(seed)
    last = None
    for step in program:
        if isinstance(step, int):
            fill((a, b), rng, rows, step)
        elif step == "clear":
            a.clear()
            b.clear()
        elif step[0] == "update":
            _, on_device, values = step
            if last is None:
                continue
            ids = last.ids if last.ids.ndim == 1 else last.ids[:, 0]
            n = min(len(values), ids.shape[0])
            priorities = torch.tensor(values[:n], dtype=torch.float64)
            args = (ids[:n], priorities) if on_device else \
                (ids[:n].numpy(), priorities.numpy())
            both(a, b, "update_priorities", *args)
        else:
            s, t, stacked = step
            drawn = draw_both(a, b, s, t, stacked)
            if drawn is not None and s is not None and stacked:
                last = drawn[1]
    ids = np.arange(0, (a.sampler.key_base + 40) * rows)
    both(a, b, "priorities", ids)  # an error still owed
    np.testing.assert_array_equal(a.priorities(ids), b.priorities(ids))
    assert a.sampler.sample_calls == b.sampler.sample_calls


@pytest.mark.parametrize("normalize", ["batch", "buffer"])
def test_recordings_serve_repeated_calls_and_batches_are_never_overwritten(normalize):
    a, b = make(True, normalize=normalize), make(False, normalize=normalize)
    rng = np.random.default_rng(0)
    fill((a, b), rng, 2, 9)
    draw_both(a, b, 4, 2)  # the warm-up
    held = [draw_both(a, b, 4, 2) for _ in range(3)]
    assert (4, 2) in a._captures.draws
    copies = [[t.clone() for t in flat(x)] for x in held]
    for _ in range(5):
        fill((a, b), rng, 2, 1)
        ids, priorities = held[0][1].ids[:, 0], torch.rand(4, dtype=torch.float64) + 0.1
        for buf in (a, b):
            buf.update_priorities(ids, priorities)
        draw_both(a, b, 4, 2)
    static = a._captures.draws[(4, 2)].output
    for x, saved in zip(held, copies):
        for t, s in zip(flat(x), saved):
            assert torch.equal(t, s)
            assert t.untyped_storage().data_ptr() != static.untyped_storage().data_ptr()


def test_state_dict_restore_is_bit_exact():
    a = make(True, beta_steps=10, beta_final=1.0)
    rng = np.random.default_rng(4)
    fill((a,), rng, 2, 12)
    for _ in range(3):
        _, info = a.get_next(16, 2)
        a.update_priorities(info.ids, torch.rand(16, dtype=torch.float64) + 0.5)
    state = a.state_dict()
    first = [a.get_next(16, 2) for _ in range(4)]
    a.load_state_dict(state)
    again = [a.get_next(16, 2) for _ in range(4)]
    for x, y in zip(first, again):
        assert_same(x, y)
    c = make(True, seed=99, beta_steps=10, beta_final=1.0)
    c.load_state_dict(state)
    for x in first:
        assert_same(c.get_next(16, 2), x)


def test_recorded_updates_write_what_eager_ones_write(monkeypatch):
    a, b = make(True, alpha=0.7), make(False, alpha=0.7)
    for buf in (a, b):
        buf.sampler.device_updates = True
    rng = np.random.default_rng(2)
    fill((a, b), rng, 2, 9)
    for k in range(7):
        if k == 5:  # the refused update is reported by the next call, on both
            for buf in (a, b):
                with pytest.raises(ValueError, match=r"priorities\[2\] is -1\.0"):
                    buf.get_next(4)
        _, info = draw_both(a, b, 4)
        values = torch.from_numpy(rng.random(4) * 5)
        if k == 4:
            values[2] = -1.0  # refused: raises at the next call, writes nothing
        both(a, b, "update_priorities", info.ids, values)
        fill((a, b), rng, 2, 1)  # new steps enter at the largest priority
    assert 4 in a.sampler._device_updates._recorded
    assert not b.sampler._device_updates._recorded
    written = []
    monkeypatch.setattr(TorchPrefixSums, "mark_written",
                        lambda self: written.append(self) or setattr(self, "_stale", True))
    # Stale ids (overwritten since: the ring wrapped) and ids not yet added write
    # nothing; after a clear (the item ids' base moves) new ids are written.
    for ids in ([0, 1, 2, 3], [60, 61, 62, 63]):
        both(a, b, "update_priorities", torch.tensor(ids), torch.full((4,), 9.0))
    assert written == [a.sampler._tree] * 2  # the recorded runs mark the sums stale
    np.testing.assert_array_equal(a.sampler._tree.leaves, b.sampler._tree.leaves)
    for buf in (a, b):
        buf.clear()
    fill((a, b), rng, 2, 8)
    _, info = draw_both(a, b, 4)
    assert int(info.ids.min()) >= 2 * a.sampler.key_base > 0
    both(a, b, "update_priorities", info.ids, torch.full((4,), 6.0))
    ids = np.arange(2 * a.sampler.key_base + 20)
    np.testing.assert_array_equal(a.priorities(ids), b.priorities(ids))
    assert np.nanmax(a.priorities(ids)) == 6.0 ** 0.7
    assert a.max_priority == b.max_priority
    draw_both(a, b, 8, 2)


def test_recording_an_update_writes_nothing():
    """The CPU twin runs the sequence once when recording, as a CUDA graph's capture
    does (its warm-up): that run writes nothing."""
    a = make(True)
    a.sampler.device_updates = True
    fill((a,), np.random.default_rng(3), 2, 9)
    _, info = a.get_next(3)
    values = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)
    a.update_priorities(info.ids, values)
    before = a.priorities(np.arange(30)).copy()
    largest = a.sampler._device_updates.largest.clone()
    a.update_priorities(info.ids, values)  # the second call of the size: recorded
    assert 3 in a.sampler._device_updates._recorded
    assert isinstance(a.sampler._device_updates._recorded[3].capture, TracedCapture)
    np.testing.assert_array_equal(a.priorities(np.arange(30)), before)
    assert torch.equal(a.sampler._device_updates.largest, largest)


def test_zero_priorities_and_other_calls_stay_eager():
    a, b = make(True), make(False)
    rng = np.random.default_rng(5)
    fill((a, b), rng, 2, 8)
    for _ in range(2):
        draw_both(a, b, 4, None)
    assert (4, None) in a._captures.draws
    runs = []
    draw = a._captures.draws[(4, None)]
    original = draw.run
    draw.run = lambda *args: runs.append(args) or original(*args)
    # A stored 0 may leave a range without mass: eager (which reports it)
    held = np.arange(4, 16)
    for buf in (a, b):
        buf.update_priorities(held, np.zeros(len(held)))
    for _ in range(2):
        draw_both(a, b, 4, None)
    assert not runs
    # A dataset's own generator: eager, the same as the eager buffer's
    ga, gb = np.random.default_rng(9), np.random.default_rng(9)
    assert_same(a.draw(4, None, rng=ga), b.draw(4, None, rng=gb))
    assert not runs


def test_a_bad_device_update_is_reported_by_a_recorded_call():
    a = make(True)
    a.sampler.device_updates = True
    fill((a,), np.random.default_rng(1), 2, 8)
    for _ in range(2):
        _, info = a.get_next(4)
    before = a.priorities(np.arange(16))
    a.update_priorities(info.ids, torch.tensor([1.0, float("nan"), 2.0, 3.0],
                                               dtype=torch.float64))
    with pytest.raises(ValueError, match=r"priorities\[1\] is nan"):
        a.get_next(4)
    np.testing.assert_array_equal(a.priorities(np.arange(16)), before)


def test_capture_samples_choices_and_errors():
    assert make(None)._captures is None  # the CPU: eager unless asked
    assert make(False)._captures is None
    with pytest.raises(ValueError, match=r"capture_samples=True: this buffer's draws "
                                         r"cannot be recorded: recorded prioritized draws "
                                         r"search running sums: device_search='prefix'"):
        make(True, device_search="tree")
    with pytest.raises(ValueError, match="capture_samples must be True, False or None, "
                                         "got 'yes'"):
        make("yes")
    with pytest.raises(ValueError, match="capture_samples=True records the draws made on "
                                         "the device"):
        rb.PrioritizedReplayBuffer(SPEC, 2, 7, capture_samples=True)


def test_the_tree_search_is_not_recorded_where_recordings_are_only_wished_for():
    """record_samples(required=False) (recordings wished for, not required): the
    tree search stays eager, without an error."""
    tree = make(False, device_search="tree")
    tree.record_samples(False)
    assert tree._captures is None
    prefix = make(False)
    prefix.record_samples(False)
    assert prefix._captures is not None and prefix._captures.prioritized


def test_a_draw_over_running_sums_of_another_size_is_refused():
    sums = TorchPrefixSums(10, torch.device("cpu"))
    with pytest.raises(ValueError, match="running sums of 10 slots for a ring of 12"):
        CapturedPrioritizedDraw(EagerCapture(), torch.Generator(), sums,
                                [torch.zeros(12, 1)], 2, 6, 4, None, "batch")


# ------------------------------------------------------------------------- CUDA
@needs_cuda
def test_graph_matches_eager_cuda():
    a = make(True, rows=3, length=50, device="cuda")
    b = make(False, rows=3, length=50, device="cuda")
    assert a._captures is not None and a._captures.graph  # the default on CUDA
    rng = np.random.default_rng(7)
    for _ in range(70):  # past a wrap-around
        fill((a, b), rng, 3, 1)
        for s, t in [(256, 2), (32, None), (7, 3)]:
            x = draw_both(a, b, s, t)
            if x is not None and t == 2:
                ids = x[1].ids[:, 0]
                priorities = torch.rand(256, device="cuda", dtype=torch.float64) + 0.1
                a.update_priorities(ids, priorities)
                b.update_priorities(ids, priorities)
    assert set(a._captures.draws) == {(256, 2), (32, None), (7, 3)}


@needs_cuda
def test_graph_batches_survive_later_replays_and_restore_cuda():
    a = make(True, rows=1, length=1000, device="cuda")
    fill((a,), np.random.default_rng(8), 1, 300)
    assert_batches_survive_replays_and_restore(a, flat)


@needs_cuda
def test_recorded_prioritized_steps_never_synchronize_cuda():
    a = make(True, rows=1, length=1000, device="cuda")
    fill((a,), np.random.default_rng(3), 1, 300)
    for _ in range(3):  # the warm-up and the recording
        _, info = a.get_next(256, 2)
        a.update_priorities(info.ids, torch.rand(256, device="cuda",
                                                 dtype=torch.float64) + 0.1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            _, info = a.get_next(256, 2)
            a.update_priorities(info.ids, torch.rand(256, device="cuda",
                                                     dtype=torch.float64) + 0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
