"""Uniform samples from recorded draws (``capture_samples``: buffers/captured_reads.py,
sampling/captured_draws.py, sampling/graph_capture.py).

On the CPU the recordings are the traced twin of the CUDA graph (graph_capture.
TracedCapture: the same static buffers, in-place write head, copies out, invalidation
and generator, and host values frozen at record time as a graph freezes them), checked
byte for byte against the eager device path of a twin buffer built with the same seed.
The tests named ``..._cuda`` run the real CUDA graph where torch sees a GPU
(``benchmarks/gpu_check.sh`` runs them) and are skipped elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import replaybuffer as rb  # noqa: E402
from recorded_batches import assert_batches_survive_replays_and_restore  # noqa: E402
from replaybuffer.buffers.captured_reads import SampleCaptures  # noqa: E402
from replaybuffer.errors import EmptyBufferError  # noqa: E402
from replaybuffer.sampling import captured_draws  # noqa: E402
from replaybuffer.sampling.graph_capture import EagerCapture  # noqa: E402
from replaybuffer.storage.torch_packing import PackedLeaves  # noqa: E402
from replaybuffer.storage.torch_storage import TorchStorage  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

# Five leaves in four blocks (float32, int32, bool, uint8): a gather per block.
SPEC = {"obs": rb.ArraySpec((3,), np.float32), "action": rb.ArraySpec((), np.int32),
        "reward": rb.ArraySpec((), np.float32), "done": rb.ArraySpec((), np.bool_),
        "frame": rb.ArraySpec((2, 2), np.uint8)}


@pytest.fixture(autouse=True)
def packed_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch storage on the CPU with the device layout (packed blocks), which is what
    a recording gathers from."""
    monkeypatch.setattr(TorchStorage, "numpy_views", False)


def make(capture: bool | None, rows: int = 2, length: int = 7, device: str = "cpu",
         seed: int = 5, **kwargs) -> rb.UniformReplayBuffer:
    return rb.UniformReplayBuffer(SPEC, rows, length, storage="torch", device=device,
                                  sample_on_device=True, seed=seed,
                                  capture_samples=capture, **kwargs)


def items(rng: np.random.Generator, rows: int) -> dict:
    return {"obs": rng.random((rows, 3), dtype=np.float32),
            "action": rng.integers(-50, 50, rows).astype(np.int32),
            "reward": rng.random(rows).astype(np.float32),
            "done": rng.random(rows) < 0.3,
            "frame": rng.integers(0, 256, (rows, 2, 2)).astype(np.uint8)}


def flat(batch) -> list:
    """Every tensor of a ``get_next`` result, in a fixed order."""
    out, info = batch
    leaves = rb.nest.flatten(out)[0]
    return leaves + list(rb.nest.flatten(info.ids)[0]) + [info.probabilities]


def assert_same(a, b) -> None:
    """Byte for byte: the same dtypes, shapes, strides and values (NaN-free data)."""
    xs, ys = flat(a), flat(b)
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        assert torch.equal(x, y)


def draw_both(a, b, *args, **kwargs):
    """The same call on both buffers: both results, or both EmptyBufferError."""
    try:
        x = a.get_next(*args, **kwargs)
    except EmptyBufferError:
        with pytest.raises(EmptyBufferError):
            b.get_next(*args, **kwargs)
        return None
    y = b.get_next(*args, **kwargs)
    assert_same(x, y)
    return x


# ----------------------------------------------------------------- against eager
calls = st.tuples(st.sampled_from([None, 1, 2, 5]), st.sampled_from([None, 1, 2, 3, 7]),
                  st.booleans())


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3), length=st.integers(1, 7),
       program=st.lists(st.one_of(st.integers(1, 9), calls), min_size=1, max_size=30),
       seed=st.integers(0, 2**32 - 1))
def test_recorded_draws_match_the_eager_path(rows, length, program, seed):
    """Adds (an int: that many) and samples ((S, T, time_stacked)) interleaved, past
    wrap-around: the recorded buffer returns what the eager one does, byte for byte,
    and every key asked for twice with data is served by a recording."""
    a, b = make(True, rows, length, seed=seed), make(False, rows, length, seed=seed)
    assert a._captures is not None and b._captures is None
    rng = np.random.default_rng(seed)
    served: dict = {}
    for step in program:
        if isinstance(step, int):
            for _ in range(step):
                x = items(rng, rows)
                a.add_batch(x)
                b.add_batch(x)
            continue
        s, t, stacked = step
        if draw_both(a, b, s, t, stacked) is not None:
            served[(s or 1, t)] = served.get((s or 1, t), 0) + 1
    for key, count in served.items():
        assert (key in a._captures.draws) == (count > 1)


def test_batches_handed_out_are_never_overwritten():
    a = make(True)
    rng = np.random.default_rng(0)
    for _ in range(9):
        a.add_batch(items(rng, 2))
    a.get_next(4, 2)  # the warm-up
    held = [a.get_next(4, 2) for _ in range(3)]
    copies = [[t.clone() for t in flat(x)] for x in held]
    for _ in range(5):
        a.add_batch(items(rng, 2))
        a.get_next(4, 2)
    static = a._captures.draws[(4, 2)].output
    for x, saved in zip(held, copies):
        for t, s in zip(flat(x), saved):
            assert torch.equal(t, s)
            assert t.untyped_storage().data_ptr() != static.untyped_storage().data_ptr()
    # Different calls do not share memory either.
    assert flat(held[0])[0].untyped_storage().data_ptr() != \
        flat(held[1])[0].untyped_storage().data_ptr()


def test_growth_and_wrap_around_need_no_new_recording(monkeypatch):
    made = []
    original = captured_draws.CapturedUniformDraw.__init__

    def counting(self, *args, **kwargs):
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(captured_draws.CapturedUniformDraw, "__init__", counting)
    a, b = make(True, rows=2, length=5), make(False, rows=2, length=5)
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(23):  # from 1 step per row to past four wrap-arounds
        x = items(rng, 2)
        a.add_batch(x)
        b.add_batch(x)
        batch = draw_both(a, b, 64, 1)
        seen.update(batch[1].ids[:, 0].tolist())
    assert len(made) == 1
    # Served by the twin that freezes host values (TracedCapture), so the growing head
    # is read from its device scalar, as a graph's replay reads it.
    assert type(made[0].capture).__name__ == "TracedCapture"
    # The newest windows are drawn once written: ids up to the last, none overwritten.
    assert max(seen) == a._ring.last_id and min(seen) >= 0
    assert min(batch[1].ids[:, 0].tolist()) >= a._ring.last_id - 4


def test_clear_and_load_keep_recordings_over_the_same_blocks():
    a, b = make(True), make(False)
    rng = np.random.default_rng(2)
    for _ in range(10):
        x = items(rng, 2)
        a.add_batch(x)
        b.add_batch(x)
    for _ in range(3):
        draw_both(a, b, 8, 2)
    draw = a._captures.draws[(8, 2)]
    for buf in (a, b):
        buf.clear()
    for buf in (a, b):
        with pytest.raises(EmptyBufferError):
            buf.get_next(8, 2)
    x = items(rng, 2)
    for buf in (a, b):
        buf.add_batch(x)
        buf.add_batch(x)
    draw_both(a, b, 8, 2)
    state = b.state_dict()
    a.load_state_dict(state)
    draw_both(a, b, 8, 2)
    assert a._captures.draws[(8, 2)] is draw  # torch storage loads in place


def test_reallocated_blocks_are_recorded_again():
    """Where the storage's blocks are new tensors after a clear or restore, the old
    recordings (which read the old blocks) are dropped and made again."""
    a, b = make(True), make(False)
    rng = np.random.default_rng(3)
    for _ in range(6):
        x = items(rng, 2)
        a.add_batch(x)
        b.add_batch(x)
    for _ in range(2):
        draw_both(a, b, 5, 3)
    old = a._captures.draws[(5, 3)]
    storage = a._storage
    fresh = PackedLeaves([s.shape for s in storage.specs], storage._dtypes,
                         storage.capacity, storage.device)
    for dst, src in zip(fresh.views, storage.arrays):
        dst.copy_(src)
    storage._packed, storage.arrays = fresh, fresh.views  # what a reallocation does
    a.load_state_dict(b.state_dict())  # a restore: the generation moves
    assert draw_both(a, b, 5, 3) is not None  # a warm-up again, eager
    assert (5, 3) not in a._captures.draws
    draw_both(a, b, 5, 3)
    assert a._captures.draws[(5, 3)] is not old
    assert a._captures.draws[(5, 3)].blocks[0].data_ptr() == fresh.blocks[0].data_ptr()
    a.add_batch(x := items(rng, 2))
    b.add_batch(x)
    draw_both(a, b, 5, 3)


def test_state_dict_restore_is_bit_exact():
    a = make(True)
    rng = np.random.default_rng(4)
    for _ in range(12):
        a.add_batch(items(rng, 2))
    for _ in range(3):
        a.get_next(16, 2)
    state = a.state_dict()
    first = [a.get_next(16, 2) for _ in range(4)]
    a.load_state_dict(state)
    again = [a.get_next(16, 2) for _ in range(4)]
    for x, y in zip(first, again):
        assert_same(x, y)
    # A new buffer restored from the state (its recording made after its warm-up)
    # draws the same too.
    c = make(True, seed=99)
    c.load_state_dict(state)
    for x in first:
        assert_same(c.get_next(16, 2), x)
    # Reseeding restarts the recorded draws as it restarts eager ones.
    e = make(False)
    e.load_state_dict(state)
    a.reseed(7)
    e.reseed(7)
    for _ in range(3):
        draw_both(a, e, 16, 2)


def test_calls_a_recording_cannot_serve_are_eager():
    a, b = make(True), make(False)
    rng = np.random.default_rng(5)
    for _ in range(8):
        x = items(rng, 2)
        a.add_batch(x)
        b.add_batch(x)
    for _ in range(2):
        draw_both(a, b, 4, None)
    # A dataset's own generator: eager, and the same as the eager buffer's.
    ga, gb = np.random.default_rng(9), np.random.default_rng(9)
    assert_same(a.draw(4, None, rng=ga), b.draw(4, None, rng=gb))
    assert (4, 2) not in a._captures.draws
    # A rate limiter: eager (the limiter's bookkeeping is the read path's).
    limited = make(True, rate_limiter=rb.MinSize(1))
    limited.add_batch(items(rng, 2))
    for _ in range(3):
        limited.get_next(4)
    assert not limited._captures.draws
    # A save's snapshot wraps the storage: eager until released, then recorded again.
    snapshot = a.snapshot()
    draw_both(a, b, 4, None)
    a.release_snapshot()
    del snapshot
    draw_both(a, b, 4, None)


def test_recordings_are_bounded_and_another_sampler_drops_them(monkeypatch):
    from replaybuffer.buffers import captured_reads
    from replaybuffer.sampling.torch_uniform import TorchUniformSampler

    monkeypatch.setattr(captured_reads, "MAX_RECORDINGS", 3)
    a, b = make(True), make(False)
    rng = np.random.default_rng(10)
    for _ in range(6):
        x = items(rng, 2)
        a.add_batch(x)
        b.add_batch(x)
    for s in range(1, 7):
        for _ in range(3):
            draw_both(a, b, s, 2)
    assert set(a._captures.draws) == {(1, 2), (2, 2), (3, 2)}
    # Another sampler of the same kind: recordings of the old one dropped, new ones
    # made from the new sampler's generator.
    for buf in (a, b):
        buf._sampler = TorchUniformSampler(buf.device, 11)
    draw_both(a, b, 2, 2)
    assert not a._captures.draws
    draw_both(a, b, 2, 2)
    assert a._captures.draws[(2, 2)].generator is a._sampler.generator
    # A sampler of another kind (its draws differ): eager from then on.
    for buf in (a, b):
        buf._sampler = rb.sampling.UniformSampler(12)
    for _ in range(3):
        draw_both(a, b, 2, 2)
    assert not a._captures.draws


def filled_pair_wishing_for_recordings():
    """A buffer that wishes for recordings without requiring them (as
    ``record_samples(False)`` has it) and an eager one, given the same 5 batches; and
    the last batch."""
    a, b = make(True), make(False)
    a._captures.required = False
    rng = np.random.default_rng(6)
    for _ in range(5):
        x = items(rng, 2)
        a.add_batch(x)
        b.add_batch(x)
    return a, b, x


def assert_a_required_recording_raises(x, match: str) -> None:
    """With ``capture_samples=True`` the failed recording (the second call) raises."""
    required = make(True)
    required.add_batch(x)
    required.get_next(3)
    with pytest.raises(RuntimeError, match=match):
        required.get_next(3)


def test_a_failed_recording_warns_and_stays_eager(monkeypatch):
    def fail(self, *args, **kwargs):
        raise RuntimeError("no capture here")

    a, b, x = filled_pair_wishing_for_recordings()
    monkeypatch.setattr(captured_draws.CapturedUniformDraw, "__init__", fail)
    draw_both(a, b, 3, 2)
    with pytest.warns(RuntimeWarning, match="no capture here"):
        draw_both(a, b, 3, 2)
    draw_both(a, b, 3, 2)
    assert a._captures.disabled == "no capture here"
    assert_a_required_recording_raises(x, "capture_samples=True.*no capture here")


def test_a_recording_that_reads_the_host_warns_and_stays_eager(monkeypatch):
    """The CPU twin refuses a host read while recording, as a graph's capture does:
    the buffer warns and samples eagerly (or raises, with capture_samples=True)."""
    sequence = captured_draws.CapturedUniformDraw._sequence

    def reads_the_head(self):
        if int(self.last_id) >= 0:  # a host read: frozen, or refused, in a graph
            sequence(self)

    monkeypatch.setattr(captured_draws.CapturedUniformDraw, "_sequence", reads_the_head)
    a, b, x = filled_pair_wishing_for_recordings()
    draw_both(a, b, 3, 2)
    with pytest.warns(RuntimeWarning, match=r"read a tensor on the host \(Tensor.__int__\)"):
        draw_both(a, b, 3, 2)
    draw_both(a, b, 3, 2)
    assert not a._captures.draws
    assert_a_required_recording_raises(x, "capture_samples=True.*on the host")


# ------------------------------------------------------------------ the option
def test_capture_samples_choices_and_errors(monkeypatch):
    assert make(None)._captures is None  # asked for only (True)
    assert make(False)._captures is None
    # A buffer that does not record keeps the read path's draw: no check per call.
    assert "draw" not in vars(make(False)) and "draw" in vars(make(True))
    for bad in ("yes", 1, 0.0):
        with pytest.raises(ValueError, match="capture_samples must be True, False or None"):
            make(bad)
    with pytest.raises(ValueError, match="capture_samples=True.*sample_on_device"):
        rb.UniformReplayBuffer(SPEC, 2, 7, capture_samples=True)  # numpy storage
    with pytest.raises(ValueError, match="capture_samples=True.*sample_on_device"):
        rb.UniformReplayBuffer(SPEC, 2, 7, storage="torch", sample_on_device=False,
                               capture_samples=True)
    with pytest.raises(ValueError, match="capture_samples=True.*sample_on_device"):
        rb.UniformReplayBuffer({**SPEC, "step_type": rb.ArraySpec((), np.int32)}, 2, 7,
                               storage="torch", track_episodes=True, capture_samples=True)
    # No torch ops on the CPU by default: the leaves are numpy records, not blocks.
    with monkeypatch.context() as patch:
        patch.setattr(TorchStorage, "numpy_views", True)
        with pytest.raises(ValueError, match="capture_samples=True.*cannot be recorded"):
            make(True)
    # numpy storage with the default, or False, never needs torch for the choice.
    assert rb.UniformReplayBuffer(SPEC, 2, 7)._captures is None


# ------------------------------------------------------------------ the pieces
def test_eager_capture_sets_the_scalar_and_copies_out():
    scalar = torch.zeros((), dtype=torch.int64)
    output = torch.zeros(4, dtype=torch.int64)

    def fn():
        output.copy_(torch.arange(4) + scalar)

    capture = EagerCapture()
    capture.record(fn, scalar, output)
    first = capture.run(10)
    second = capture.run(20)
    assert first.tolist() == [10, 11, 12, 13] and second.tolist() == [20, 21, 22, 23]
    assert first.data_ptr() != output.data_ptr() and second.data_ptr() != first.data_ptr()


def test_packed_blocks_gathered_elsewhere_give_the_storage_s_leaves():
    storage = TorchStorage([rb.ArraySpec((3,), np.float32), rb.ArraySpec((), np.int32),
                            rb.ArraySpec((), np.float32), rb.ArraySpec((2, 2), np.uint8)],
                           10)
    packing = storage.packing
    assert packing is not None and len(packing.blocks) == 3  # float32, int32, uint8
    storage.arrays[0][4] = torch.tensor([1.0, 2.0, 3.0])
    assert packing.blocks[0][4, :3].tolist() == [1.0, 2.0, 3.0]  # views, no copy
    flat_positions = torch.tensor([4, 0, 4])
    blocks = [torch.index_select(b, 0, flat_positions) for b in packing.blocks]
    got = packing.leaves(blocks, (3,), range(4))
    want = storage.gather(flat_positions)
    for x, y in zip(got, want):
        assert torch.equal(x, y) and x.shape == y.shape and x.stride() == y.stride()


def test_the_cpu_layout_of_numpy_records_has_no_packing_to_record(monkeypatch):
    monkeypatch.setattr(TorchStorage, "numpy_views", True)
    storage = TorchStorage([rb.ArraySpec((3,), np.float32)], 10)
    assert storage.packing is None
    with pytest.raises(ValueError, match="packed blocks"):
        SampleCaptures(storage, None, 1, 10, required=True)


# ------------------------------------------------------------------ CUDA graphs
@needs_cuda
def test_graph_matches_eager_cuda():
    a, b = make(True, rows=3, length=50, device="cuda"), make(False, rows=3, length=50,
                                                               device="cuda")
    assert a._captures is not None and a._captures.graph  # the default on CUDA
    rng = np.random.default_rng(7)
    for round_ in range(70):  # past two wrap-arounds
        x = items(rng, 3)
        a.add_batch(x)
        b.add_batch(x)
        for s, t in [(256, 2), (32, None), (7, 3)]:
            draw_both(a, b, s, t)
    assert set(a._captures.draws) == {(256, 2), (32, None), (7, 3)}


@needs_cuda
def test_graph_batches_survive_later_replays_and_restore_cuda():
    a = make(True, rows=1, length=1000, device="cuda")
    rng = np.random.default_rng(8)
    for _ in range(300):
        a.add_batch(items(rng, 1))
    assert_batches_survive_replays_and_restore(a, flat)


@needs_cuda
def test_graph_on_another_stream_cuda():
    a, b = make(True, device="cuda"), make(False, device="cuda")
    rng = np.random.default_rng(9)
    for _ in range(10):
        x = items(rng, 2)
        a.add_batch(x)
        b.add_batch(x)
    draw_both(a, b, 64, 2)
    side = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(side):
            x = a.get_next(64, 2)
        y = b.get_next(64, 2)
        side.synchronize()
        assert_same(x, y)
        draw_both(a, b, 64, 2)
