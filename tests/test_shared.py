"""SharedReplayBuffer: processes writing and sampling one buffer in shared memory."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer import MinSize, Queue, RateLimitedError, SampleToInsertRatio
from replaybuffer.distributed import BufferClosedError, SharedReplayBuffer
from replaybuffer.distributed.stress import run_stress, torn_items
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.sampling import flat_tree
from replaybuffer.specs import ArraySpec

SPEC = {"row": ArraySpec((), np.int64), "step": ArraySpec((), np.int64),
        "obs": ArraySpec((3,), np.float32)}
SPAWN = mp.get_context("spawn")


def chi_square_passes(counts: np.ndarray, expected: np.ndarray) -> bool:
    """Counts consistent with ``expected`` at the 0.999 level (critical value by the
    Wilson-Hilferty approximation, z = 3.09)."""
    k = len(counts) - 1
    critical = k * (1 - 2 / (9 * k) + 3.09 * np.sqrt(2 / (9 * k))) ** 3
    return float(((counts - expected) ** 2 / expected).sum()) < critical


def items_for(rows: np.ndarray, steps: np.ndarray) -> dict[str, np.ndarray]:
    """Items that name their own row and step (obs repeats the step)."""
    return {"row": rows.astype(np.int64), "step": steps.astype(np.int64),
            "obs": np.repeat(steps[:, None], 3, 1).astype(np.float32)}


def write_steps(buffer: SharedReplayBuffer, count: int, steps: int) -> None:
    """Claim ``count`` rows and write ``steps`` self-describing steps to them."""
    first, _ = buffer.claim_rows(count)
    rows = np.arange(first, first + count)
    for _ in range(steps):
        buffer.add_batch(items_for(rows, buffer.steps_written()[rows]))


def in_process(target, *args) -> None:
    process = SPAWN.Process(target=target, args=args)
    process.start()
    process.join(60)
    assert process.exitcode == 0


@pytest.fixture
def buffer():
    with SharedReplayBuffer(SPEC, 4, 10, seed=0) as made:
        yield made


# ------------------------------------------------------------------- reference model
@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 3), max_length=st.integers(1, 6),
       adds=st.lists(st.integers(1, 4), min_size=0, max_size=6),
       num_steps=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_samples_are_whole_windows_of_retained_steps(count, max_length, adds, num_steps,
                                                     seed):
    """Against a reference of what each row holds: every sample is a window of
    ``num_steps`` consecutive retained steps of one row, named by its ids."""
    with SharedReplayBuffer(SPEC, 3, max_length, seed=seed) as buffer:
        first, _ = buffer.claim_rows(count)
        rows = np.arange(first, first + count)
        written = 0
        for steps in adds:  # extend by `steps` steps at once
            ids = written + np.arange(steps)
            batch = items_for(np.repeat(rows, steps), np.tile(ids, count))
            buffer.extend({k: v.reshape((count, steps) + v.shape[1:])
                           for k, v in batch.items()})
            written += steps
            assert len(buffer) == count * min(written, max_length)
        if num_steps > min(written, max_length):
            with pytest.raises(EmptyBufferError):
                buffer.get_next(8, num_steps)
            return
        items, info = buffer.get_next(64, num_steps)
        steps, item_rows = np.divmod(info.ids, 3)
        np.testing.assert_array_equal(items["step"], steps)
        np.testing.assert_array_equal(items["row"], item_rows)
        assert set(item_rows.ravel()) <= set(rows.tolist())
        assert (np.diff(steps, axis=1) == 1).all()
        assert steps.min() >= written - max_length and steps.max() < written
        windows = count * (min(written, max_length) - num_steps + 1)
        np.testing.assert_allclose(info.probabilities, 1 / windows)


def test_uniform_draws_are_uniform_over_every_rows_windows():
    """Rows of unequal fill (two processes): each window equally likely (chi-square)."""
    with SharedReplayBuffer(SPEC, 3, 20, seed=1) as buffer:
        in_process(write_steps, buffer, 2, 30)  # rows 0-1 full (20 retained)
        write_steps(buffer, 1, 7)  # row 2: 7 steps
        items, info = buffer.get_next(30_000, 2)
        windows = {(r, s) for r in (0, 1) for s in range(10, 29)} | \
            {(2, s) for s in range(6)}
        got = list(zip(items["row"][:, 0].tolist(), items["step"][:, 0].tolist()))
        assert set(got) == windows
        counts = np.array([got.count(w) for w in sorted(windows)])
        assert chi_square_passes(counts, np.full(len(counts), counts.sum() / len(counts)))
        np.testing.assert_allclose(info.probabilities, 1 / len(windows))


# ------------------------------------------------------------------------ priorities
def test_prioritized_draws_follow_priorities_and_skip_stale_ids():
    with SharedReplayBuffer(SPEC, 2, 4, prioritized=True, alpha=1.0, beta=1.0,
                            seed=2) as buffer:
        write_steps(buffer, 2, 4)
        _, info = buffer.get_next(8)
        ids = np.arange(8)  # step * 2 + row: every item
        assert buffer.update_priorities(ids, np.arange(1.0, 9.0)) == 8
        items, info = buffer.get_next(40_000)
        drawn = np.bincount(items["step"] * 2 + items["row"], minlength=8)
        expected = np.arange(1.0, 9.0) / 36
        assert chi_square_passes(drawn, expected * 40_000)
        np.testing.assert_allclose(info.probabilities,
                                   (items["step"] * 2 + items["row"] + 1) / 36, rtol=1e-6)
        np.testing.assert_allclose(info.weights, info.probabilities.min() /
                                   info.probabilities, rtol=1e-5)
        first, _ = buffer.rows
        buffer.add_batch(items_for(np.array([0, 1]), np.array([4, 4])))  # overwrites step 0
        assert buffer.update_priorities(np.array([0, 1, 2]), np.ones(3)) == 1  # 0, 1 stale
        assert buffer.max_priority == 8.0


def test_bad_priorities_change_nothing():
    with SharedReplayBuffer(SPEC, 1, 4, prioritized=True, seed=3) as buffer:
        write_steps(buffer, 1, 4)
        tree = buffer.layout.tree.copy()
        with pytest.raises(ValueError, match=r"priorities\[1\] is nan"):
            buffer.update_priorities(np.array([0, 1]), np.array([1.0, np.nan]))
        with pytest.raises(ValueError, match="same S"):
            buffer.update_priorities(np.array([0, 1]), np.array([1.0]))
        with pytest.raises(ValueError, match="no item id"):
            buffer.update_priorities(np.array([-1]), np.array([1.0]))
        np.testing.assert_array_equal(buffer.layout.tree, tree)
    with SharedReplayBuffer(SPEC, 1, 4) as plain, \
            pytest.raises(ValueError, match="prioritized=True"):
        plain.update_priorities(np.array([0]), np.array([1.0]))


def test_flat_tree_against_cumulative_sums():
    rng = np.random.default_rng(0)
    for capacity in (1, 2, 5, 64, 100):
        tree = np.zeros(flat_tree.tree_nodes(capacity))
        values = np.zeros(capacity)
        for _ in range(5):
            leaves = rng.integers(0, capacity, 7)
            new = rng.exponential(1.0, 7) * (rng.random(7) > 0.2)
            flat_tree.update(tree, leaves, new)
            values[leaves] = new  # last wins, as in the tree
            assert tree[1] == pytest.approx(values.sum())
            if values.sum() == 0:
                continue
            targets = rng.random(50) * values.sum()
            found = flat_tree.find_prefix(tree, targets)
            np.testing.assert_array_equal(
                found, np.searchsorted(np.cumsum(values), targets, side="right"))
            np.testing.assert_array_equal(flat_tree.leaves_of(tree, found), values[found])


# -------------------------------------------------------------------- torn steps
def test_a_step_being_written_is_never_returned(buffer):
    """A position whose version says "being written" (a writer mid-step, or killed
    there) is drawn again, never returned; the check of the stress run catches a torn
    item when there is one."""
    write_steps(buffer, 4, 3)
    position = (1 % buffer.max_length) * buffer.num_rows + 2  # row 2, step 1
    buffer.layout.version[position] = 2 * 1 + 1
    items, info = buffer.get_next(5_000)
    assert not ((items["row"] == 2) & (items["step"] == 1)).any()
    assert len(set(zip(items["row"].tolist(), items["step"].tolist()))) == 11
    torn = {"payload": np.full((2, 2, 4), 7, np.uint8), "row": np.zeros((2, 2), np.int64),
            "step": np.array([[0, 1], [0, 1]]), "value": np.full((2, 2), 7, np.uint8)}
    from replaybuffer.distributed.stress import item_value
    torn["value"][:] = item_value(torn["row"], torn["step"])
    torn["payload"][:] = torn["value"][..., None]
    ids = torn["step"] * 1 + torn["row"]
    assert torn_items(torn, ids, 1) == 0
    torn["payload"][1, 1, 2] ^= 1  # one byte of another step
    assert torn_items(torn, ids, 1) == 1


def _write_and_die(buffer: SharedReplayBuffer) -> None:
    write_steps(buffer, 2, 5)
    os._exit(0)  # no close(): the rows are left owned by an ended process


def test_rows_of_an_ended_writer_are_reclaimed_with_their_steps():
    with SharedReplayBuffer(SPEC, 3, 10) as buffer:
        in_process(_write_and_die, buffer)  # rows 0-1, 5 steps each
        assert len(buffer) == 10
        assert buffer.claim_rows(2) == (0, 2)  # row 2 alone is not enough: the ended rows
        assert buffer.steps_written().tolist() == [5, 5, 0]
        write_steps(buffer, 2, 1)  # continues after the ended writer's steps
        assert len(buffer) == 12
        items, _ = buffer.get_next(200)
        assert set(items["step"].tolist()) == set(range(6))


# --------------------------------------------------------------------- bad input
def test_bad_items_raise_and_write_nothing(buffer):
    write_steps(buffer, 2, 2)
    before = (len(buffer), buffer.steps_written().copy(), buffer.layout.version.copy())
    good = items_for(np.arange(2), np.array([2, 2]))
    with pytest.raises(SpecError, match="structure"):
        buffer.add_batch({"row": good["row"], "step": good["step"]})
    with pytest.raises(SpecError, match="obs"):
        buffer.add_batch({**good, "obs": np.zeros((2, 4), np.float32)})
    with pytest.raises(SpecError, match="obs"):
        buffer.add_batch({**good, "obs": np.full((2, 3), "x")})
    with pytest.raises(SpecError, match="writes 2 rows"):
        buffer.add_batch(items_for(np.arange(3), np.zeros(3)))
    assert (len(buffer), buffer.steps_written().tolist()) == (before[0], before[1].tolist())
    np.testing.assert_array_equal(buffer.layout.version, before[2])


def test_bad_constructions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="Queue of size 9 needs a capacity"):
        SharedReplayBuffer(SPEC, 2, 4, rate_limiter=Queue(9))  # unread items must fit
    with pytest.raises(ValueError, match="more than the buffer can hold"):
        SharedReplayBuffer(SPEC, 2, 4, rate_limiter=MinSize(9))
    with pytest.raises(ValueError, match="num_rows"):
        SharedReplayBuffer(SPEC, 0, 4)
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="not a new or empty directory"):
        SharedReplayBuffer(SPEC, 2, 4, path=tmp_path)


def _claim_and_report(buffer: SharedReplayBuffer, count: int, out) -> None:
    try:
        out.put(buffer.claim_rows(count))
    except ValueError as exc:
        out.put(str(exc))


def test_no_free_rows_says_who_owns_them():
    with SharedReplayBuffer(SPEC, 2, 4) as buffer:
        buffer.claim_rows(1)  # row 0, owned by this (live) process
        out = SPAWN.Queue()
        in_process(_claim_and_report, buffer, 2, out)
        message = out.get(timeout=5)
        assert "no 2 adjacent free rows" in message and str(os.getpid()) in message
        in_process(_claim_and_report, buffer, 1, out)
        assert out.get(timeout=5) == (1, 1)


def _sample_when_told(buffer: SharedReplayBuffer, go, out) -> None:
    go.wait(30)
    try:
        buffer.get_next(1)
    except BufferClosedError as exc:
        out.put(str(exc))
    else:
        out.put("no error")


def test_a_closed_buffer_fails_clearly_in_other_processes(tmp_path):
    buffer = SharedReplayBuffer(SPEC, 2, 4, path=tmp_path / "shared")
    write_steps(buffer, 1, 2)
    go, out = SPAWN.Event(), SPAWN.Queue()
    child = SPAWN.Process(target=_sample_when_told, args=(buffer, go, out))
    child.start()
    buffer.close()
    go.set()
    child.join(60)
    assert "was closed by the process that made it" in out.get(timeout=5)
    assert (tmp_path / "shared").is_dir()  # a given path is left in place
    with pytest.raises(BufferClosedError):
        buffer.add_batch(items_for(np.arange(1), np.zeros(1)))


def test_a_temporary_directory_goes_with_close():
    buffer = SharedReplayBuffer(SPEC, 2, 4)
    path = buffer.path
    assert str(path).startswith("/dev/shm/") and path.is_dir()
    buffer.close()
    assert not path.exists()


# ------------------------------------------------------------------ rate limiting
def test_limiter_counts_are_shared_between_processes():
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=4,
                                  error_buffer=8)
    with SharedReplayBuffer(SPEC, 4, 50, rate_limiter=limiter, seed=4) as buffer:
        assert buffer.get_next(2, block=False) is None  # nothing in yet
        with pytest.raises(RateLimitedError, match="held back"):
            buffer.get_next(2, timeout=0.05)
        in_process(write_steps, buffer, 2, 6)  # 12 inserts in another process
        stats = buffer.stats()
        assert (stats.inserts, stats.samples, stats.size) == (12, 0, 12)
        assert stats.samples_blocked == 2
        # diff 12 > max_diff - ...: more inserts wait for samples
        assert buffer.add_batch(items_for(np.arange(1), np.zeros(1)), block=False) is False
        buffer.get_next(8)
        assert buffer.add_batch(items_for(np.arange(1), np.zeros(1)), block=False)
        assert buffer.stats().diff == 13 - 8


def test_as_dataset_prefetches_from_shared_memory(buffer):
    write_steps(buffer, 4, 6)
    stream = iter(buffer.as_dataset(16, 2, num_parallel_calls=2))
    for _ in range(5):
        items, info = next(stream)
        assert items["step"].shape == (16, 2)
        np.testing.assert_array_equal(items["step"], info.ids // 4)
    stream.close()


def test_pickled_handle_maps_the_same_files(buffer):
    write_steps(buffer, 1, 3)
    other = pickle.loads(pickle.dumps(buffer))
    assert len(other) == 3 and other.path == buffer.path
    items, _ = other.get_next(4)
    assert set(items["step"].tolist()) <= {0, 1, 2}


# ---------------------------------------------------------------------- stress
def test_stress_writers_samplers_updater_and_killed_writers():
    """4 writers, 2 samplers and a priority updater for 8 s under a
    SampleToInsertRatio, a fifth writer killed with SIGKILL again and again: no torn
    item, no hang, counts within the limiter's window."""
    report = run_stress(seconds=8.0)
    assert report.hung == []
    assert report.torn == 0
    assert report.sampled > 1000 and report.inserted > 1000 and report.updates > 0
    assert report.killed >= 3
    stats = report.stats
    assert stats.samples == report.sampled  # samplers are never killed
    assert stats.inserts >= report.inserted  # killed writers' inserts count too
    low, high = report.window
    assert low <= stats.diff <= high


def _send_wrong_spec(buffer: SharedReplayBuffer, out) -> None:
    try:
        buffer.add_batch({"row": np.zeros(1, np.int64), "step": np.zeros(1, np.int64),
                          "obs": np.zeros((1, 5), np.float32)})
    except SpecError as exc:
        out.put(str(exc))
    else:
        out.put("no error")


def test_a_writer_with_a_wrong_spec_fails_in_its_own_process(buffer):
    write_steps(buffer, 1, 3)
    before = (buffer.steps_written().tolist(), buffer.layout.version.copy())
    out = SPAWN.Queue()
    in_process(_send_wrong_spec, buffer, out)
    message = out.get(timeout=5)
    assert message.startswith("leaf ['obs']: expected shape (1, 3)") and "got (1, 5)" in message
    assert buffer.steps_written().tolist() == before[0]
    np.testing.assert_array_equal(buffer.layout.version, before[1])
    write_steps(buffer, 1, 1)  # this process goes on writing
    assert len(buffer) == 4


def test_min_size_counts_inserts_at_commit_and_holds_samples_back():
    """MinSize never holds an insert back: inserts are counted where they commit."""
    with SharedReplayBuffer(SPEC, 2, 10, rate_limiter=MinSize(4), seed=5) as buffer:
        write_steps(buffer, 1, 3)
        assert buffer.get_next(1, block=False) is None
        in_process(write_steps, buffer, 1, 2)  # another process: 5 in all
        stats = buffer.stats()
        assert (stats.inserts, stats.samples, stats.inserts_blocked) == (5, 0, 0)
        buffer.get_next(3)
        assert buffer.stats().samples == 3


def test_stats_are_python_numbers_as_the_local_buffers_are():
    """stats() of a shared buffer reads like a local buffer's: no numpy scalars in it."""
    spec = rb.ArraySpec((2,), np.float32)
    with SharedReplayBuffer(spec, 2, 10, rate_limiter=rb.MinSize(1)) as shared:
        stats = shared.stats()
    local = rb.UniformReplayBuffer(spec, 2, 10, rate_limiter=rb.MinSize(1)).stats()
    assert repr(stats) == repr(local)
    assert all(type(value) in (int, float) for value in stats), stats
