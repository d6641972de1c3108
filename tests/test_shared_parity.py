"""SharedReplayBuffer's parity with the local buffers (issue 24 item 3): clear(),
checkpoints, episodes and within_episodes reads, the Queue limiter, and what it refuses
by name (frame dedup, n-step)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer import Queue, RateLimitedError, crash_points
from replaybuffer.distributed import NotSupportedError, SharedReplayBuffer
from replaybuffer.distributed.shared import queue as shared_queue
from replaybuffer.errors import CheckpointError, EmptyBufferError, SpecError
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.shared_storage import SharedStorage

SPEC = {"row": ArraySpec((), np.int64), "step": ArraySpec((), np.int64),
        "obs": ArraySpec((3,), np.float32)}
EPISODES = {"step_type": ArraySpec((), np.int32), "row": ArraySpec((), np.int64),
            "step": ArraySpec((), np.int64)}
FIRST, MID, LAST = 0, 1, 2
SPAWN = mp.get_context("spawn")


def items_for(rows: np.ndarray, steps: np.ndarray) -> dict[str, np.ndarray]:
    """Items that name their own row and step (obs repeats the step)."""
    return {"row": rows.astype(np.int64), "step": steps.astype(np.int64),
            "obs": np.stack([steps, rows, steps], 1).astype(np.float32)}


def write_steps(buffer: SharedReplayBuffer, count: int, steps: int) -> np.ndarray:
    """Claim ``count`` rows and write ``steps`` self-describing steps to them; the rows."""
    first, _ = buffer.claim_rows(count)
    rows = np.arange(first, first + count)
    for _ in range(steps):
        buffer.add_batch(items_for(rows, buffer.steps_written()[rows]))
    return rows


def check_whole(batch: dict) -> None:
    """Every sampled item is one that was written whole."""
    np.testing.assert_array_equal(batch["obs"][..., 0], batch["step"])
    np.testing.assert_array_equal(batch["obs"][..., 1], batch["row"])
    np.testing.assert_array_equal(batch["obs"][..., 2], batch["step"])


def start(target, *args) -> mp.process.BaseProcess:
    process = SPAWN.Process(target=target, args=args)
    process.start()
    return process


def finish(process: mp.process.BaseProcess) -> None:
    process.join(60)
    assert process.exitcode == 0


def _write_for(buffer: SharedReplayBuffer, count: int, steps: int, pause: float) -> None:
    """A writer process: ``steps`` steps to ``count`` rows of its own."""
    first, _ = buffer.claim_rows(count)
    rows = np.arange(first, first + count)
    for _ in range(steps):
        buffer.add_batch(items_for(rows, buffer.steps_written()[rows]))
        if pause:
            time.sleep(pause)


def _wait_for_steps(buffer: SharedReplayBuffer, at_least: int) -> None:
    deadline = time.monotonic() + 30
    while buffer.steps_written().max() < at_least:
        assert time.monotonic() < deadline, "the writer process did not write"
        time.sleep(0.005)


# --------------------------------------------------------------------------- refusals
def test_n_step_is_refused_by_name():  # frame dedup it has: tests/test_shared_frames.py
    with pytest.raises(NotSupportedError, match="SharedReplayBuffer does not support "
                                                "n_step"):
        SharedReplayBuffer(SPEC, 2, 4, n_step=3)


# ------------------------------------------------------------------------------ clear
def test_clear_forgets_every_step_and_ids_go_on():
    with SharedReplayBuffer(SPEC, 3, 4, seed=0) as buffer:
        rows = write_steps(buffer, 2, 6)
        buffer.clear()
        assert len(buffer) == 0
        with pytest.raises(EmptyBufferError):
            buffer.get_next(3)
        with pytest.raises(EmptyBufferError):
            buffer.get_next(1, 2)
        buffer.add_batch(items_for(rows, buffer.steps_written()[rows]))  # step 6
        assert len(buffer) == 2
        batch, info = buffer.get_next(200)
        check_whole(batch)
        assert set(batch["step"].tolist()) == {6}
        np.testing.assert_allclose(info.probabilities, 0.5)
        with pytest.raises(EmptyBufferError):  # one step per row: no window of 2
            buffer.get_next(1, 2)
        for _ in range(5):  # wrap around past the floor: the newest 4 are held
            buffer.add_batch(items_for(rows, buffer.steps_written()[rows]))
        assert len(buffer) == 8
        batch, _ = buffer.get_next(500, 2)
        check_whole(batch)
        assert batch["step"].min() == 8 and batch["step"].max() == 11


def test_clear_of_a_prioritized_buffer_forgets_priorities_and_old_ids():
    with SharedReplayBuffer(SPEC, 2, 4, prioritized=True, alpha=1.0, seed=0) as buffer:
        write_steps(buffer, 2, 3)
        _, info = buffer.get_next(50)
        buffer.update_priorities(info.ids, np.full(50, 9.0))
        assert buffer.max_priority == 9.0
        buffer.clear()
        assert buffer.max_priority == 1.0 and len(buffer) == 0
        with pytest.raises(EmptyBufferError):
            buffer.get_next(1)
        assert buffer.update_priorities(info.ids, np.full(50, 5.0)) == 0  # stale ids
        with pytest.raises(EmptyBufferError):
            buffer.get_next(1)
        buffer.add_batch(items_for(np.arange(2), np.array([3, 3])))
        batch, _ = buffer.get_next(100)
        assert set(batch["step"].tolist()) == {3}


def _clear_and_report(buffer: SharedReplayBuffer, out) -> None:
    buffer.clear()
    out.put(len(buffer))


def test_a_clear_in_one_process_empties_the_buffer_for_all():
    with SharedReplayBuffer(SPEC, 2, 4, seed=0) as buffer:
        write_steps(buffer, 2, 3)
        out = SPAWN.Queue()
        finish(start(_clear_and_report, buffer, out))
        assert out.get(timeout=5) == 0 and len(buffer) == 0
        with pytest.raises(EmptyBufferError):
            buffer.get_next(1)


def test_clear_while_a_writer_process_goes_on_never_returns_an_older_step():
    with SharedReplayBuffer(SPEC, 2, 64, seed=0) as buffer:
        writer = start(_write_for, buffer, 2, 4000, 0.0002)
        try:
            _wait_for_steps(buffer, 20)
            for done in range(5):
                if done and not writer.is_alive():
                    break  # one clear under the writer at least
                heads = buffer.steps_written()
                buffer.clear()
                assert len(buffer) <= 2 * (buffer.steps_written() - heads).max() + 2
                deadline = time.monotonic() + 30
                while True:
                    try:
                        batch, _ = buffer.get_next(64, 2)
                        break
                    except EmptyBufferError:
                        assert time.monotonic() < deadline
                check_whole(batch)
                # Every step returned was written during or after the clear.
                assert (batch["step"] >= heads[batch["row"]]).all()
                np.testing.assert_array_equal(np.diff(batch["step"], axis=1), 1)
        finally:
            finish(writer)


# ------------------------------------------------------------------------ checkpoints
def test_a_read_straddling_the_first_clear_redraws_only_steps_since_it(monkeypatch):
    """A read draws (uniformly, nothing cleared yet), then stalls before its copy; the
    buffer is cleared and one step written over the oldest. The windows that step
    tore are drawn again among the steps since the clear only (the others, whole, were
    drawn before it)."""
    release, drawn, got = threading.Event(), [], []
    gather = SharedStorage.gather

    def stalled(storage, positions):
        if threading.current_thread().name == "reader" and not release.is_set():
            drawn.append(np.array(positions))
            release.wait(30)
        return gather(storage, positions)

    monkeypatch.setattr(SharedStorage, "gather", stalled)
    with SharedReplayBuffer(SPEC, 1, 4, seed=0) as buffer:
        write_steps(buffer, 1, 4)
        reader = threading.Thread(target=lambda: got.append(buffer.get_next(64)[0]),
                                  name="reader")
        reader.start()
        deadline = time.monotonic() + 10
        while not drawn:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        buffer.clear()
        buffer.add_batch(items_for(np.zeros(1), np.array([4])))  # over step 0
        release.set()
        reader.join(10)
        torn = int((drawn[0] == 0).sum())
        assert torn > 0
        steps = got[0]["step"]
        assert int((steps == 4).sum()) == torn and int((steps == 0).sum()) == 0


def test_save_and_load_into_a_local_buffer_keeps_rows_and_priorities(tmp_path):
    with SharedReplayBuffer(SPEC, 3, 4, prioritized=True, alpha=1.0, seed=0) as buffer:
        write_steps(buffer, 3, 6)  # wrapped: steps 2..5 held
        _, info = buffer.get_next(400)
        priorities = 1.0 + (info.ids % 3).astype(float)  # by row: 1, 2, 3
        buffer.update_priorities(info.ids, priorities)
        saved = buffer.save(tmp_path / "ckpt", keep=2)
        assert saved.name == "ckpt-000001"
        local = rb.load(tmp_path / "ckpt")
    assert isinstance(local, rb.PrioritizedReplayBuffer)
    assert (local.batch_size, local.max_length, len(local)) == (3, 4, 12)
    everything = local.gather_all()
    np.testing.assert_array_equal(everything["step"], np.tile(np.arange(2, 6), (3, 1)))
    np.testing.assert_array_equal(everything["row"], np.repeat(np.arange(3), 4)
                                  .reshape(3, 4))
    batch, _ = local.get_next(6000)
    counts = np.bincount(batch["row"], minlength=3)
    expected = np.array([1, 2, 3]) / 6 * 6000
    assert float(((counts - expected) ** 2 / expected).sum()) < 13.8  # 2 dof, p = 0.001


def test_a_checkpoint_of_uneven_rows_keeps_the_newest_common_steps(tmp_path):
    with SharedReplayBuffer(SPEC, 4, 8, seed=0) as buffer:
        first, _ = buffer.claim_rows(2)  # rows 0, 1 by this process: 5 steps
        for _ in range(5):
            buffer.add_batch(items_for(np.arange(2), buffer.steps_written()[:2]))
        _run(_write_for, buffer, 1, 3, 0.0)  # row 2 by another: 3 steps; row 3 unused
        buffer.save(tmp_path / "ckpt")
        local = rb.load(tmp_path / "ckpt")
        assert (local.batch_size, len(local)) == (3, 9)  # rows 0-2, their newest 3
        everything = local.gather_all()
        np.testing.assert_array_equal(everything["step"], [[2, 3, 4], [2, 3, 4], [0, 1, 2]])
        np.testing.assert_array_equal(everything["row"][:, 0], [0, 1, 2])
        restored = SharedReplayBuffer.load(tmp_path / "ckpt", seed=1)
        try:
            assert restored.num_rows == 4 and len(restored) == 9
            np.testing.assert_array_equal(restored.steps_written(), [5, 5, 3, 0])
            batch, _ = restored.get_next(600, 2)
            check_whole(batch)
            assert set(zip(batch["row"][:, 0].tolist(), batch["step"][:, 0].tolist())) == \
                {(0, 2), (0, 3), (1, 2), (1, 3), (2, 0), (2, 1)}
        finally:
            restored.close()


def _run(target, *args) -> None:
    finish(start(target, *args))


def test_load_into_a_shared_buffer_goes_on_where_it_stood(tmp_path):
    limiter = rb.SampleToInsertRatio(1.0, 2, 1000.0)
    with SharedReplayBuffer(SPEC, 2, 4, rate_limiter=limiter, seed=0) as buffer:
        rows = write_steps(buffer, 2, 5)
        buffer.get_next(7)
        stats = buffer.stats()
        buffer.save(tmp_path / "ckpt")
    restored = SharedReplayBuffer.load(tmp_path / "ckpt",
                                       rate_limiter=rb.SampleToInsertRatio(1.0, 2, 1000.0))
    try:
        after = restored.stats()
        assert (after.inserts, after.samples) == (stats.inserts, stats.samples) == (10, 7)
        np.testing.assert_array_equal(restored.steps_written(), [5, 5])
        restored.add_batch(items_for(rows, np.array([5, 5])))  # ids go on
        batch, info = restored.get_next(400, 4)
        check_whole(batch)
        assert set(batch["step"][:, 0].tolist()) == {2}
        np.testing.assert_array_equal(info.ids[:, -1] // 2, 5)
    finally:
        restored.close()
    wider = SharedReplayBuffer.load(tmp_path / "ckpt", num_rows=3)
    try:  # a row more, for another writer: new and empty
        np.testing.assert_array_equal(wider.steps_written(), [5, 5, 0])
        assert len(wider) == 8
        batch, _ = wider.get_next(200)
        assert set(batch["row"].tolist()) == {0, 1}
    finally:
        wider.close()


def test_a_local_checkpoint_loads_into_a_shared_buffer(tmp_path):
    local = rb.UniformReplayBuffer(EPISODES, 2, 5, track_episodes=True, seed=0)
    for t, kind in enumerate([FIRST, MID, LAST, FIRST, MID, MID, LAST]):
        local.add_batch({"step_type": np.full(2, kind, np.int32), "row": np.arange(2),
                         "step": np.full(2, t)})
    local.save(tmp_path / "local")
    shared = SharedReplayBuffer.load(tmp_path / "local", num_rows=3)
    try:
        assert shared.num_rows == 3 and len(shared) == 10
        np.testing.assert_array_equal(shared.steps_written(), [7, 7, 0])
        batch, _ = shared.get_next(300, 2, within_episodes=True)
        assert (batch["step_type"][:, 1] != FIRST).all()
        assert set(batch["step"][:, 0].tolist()) == {3, 4, 5}
    finally:
        shared.close()


def test_save_refuses_bad_arguments_and_leaves_the_buffer_as_it_was(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.txt").write_text("x")
    with SharedReplayBuffer(SPEC, 2, 4, seed=0) as buffer:
        write_steps(buffer, 2, 3)
        before = (len(buffer), buffer.steps_written().tolist())
        with pytest.raises(ValueError, match="keep must be a positive int"):
            buffer.save(tmp_path / "ckpt", keep=0)
        with pytest.raises(ValueError, match="metadata must be a JSON-able dict"):
            buffer.save(tmp_path / "ckpt", metadata={"x": object()})
        with pytest.raises(CheckpointError, match="it is a file"):
            buffer.save(tmp_path / "file")
        with pytest.raises(CheckpointError, match="holds no replaybuffer checkpoints"):
            buffer.save(tmp_path / "other")
        assert (len(buffer), buffer.steps_written().tolist()) == before
        assert not (tmp_path / "ckpt").exists()
    with pytest.raises(CheckpointError):
        SharedReplayBuffer.load(tmp_path / "nothing")


def test_load_refuses_too_few_rows_and_checkpoints_it_cannot_hold(tmp_path):
    with SharedReplayBuffer(SPEC, 2, 4, seed=0) as buffer:
        write_steps(buffer, 2, 1)
        buffer.save(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="num_rows=1: the checkpoint holds 2 rows"):
        SharedReplayBuffer.load(tmp_path / "ckpt", num_rows=1)
    fifo = rb.FIFOReplayBuffer(SPEC, 1, 4)
    fifo.save(tmp_path / "fifo")
    with pytest.raises(CheckpointError, match="FIFOReplayBuffer checkpoint a "
                                              "SharedReplayBuffer cannot hold"):
        SharedReplayBuffer.load(tmp_path / "fifo")


def test_saves_while_a_writer_process_goes_on_are_consistent(tmp_path):
    with SharedReplayBuffer(SPEC, 2, 32, seed=0) as buffer:
        writer = start(_write_for, buffer, 2, 3000, 0.0002)
        try:
            _wait_for_steps(buffer, 40)
            for n in range(4):
                buffer.save(tmp_path / "ckpt", keep=1)
                local = rb.load(tmp_path / "ckpt")
                assert len(local) > 0
                everything = local.gather_all()  # [rows, steps]
                check_whole(everything)
                np.testing.assert_array_equal(np.diff(everything["step"], axis=1), 1)
                assert len(rb.persist.checkpoints(tmp_path / "ckpt")) == 1
        finally:
            finish(writer)


# --------------------------------------------------------------------------- episodes
def reference_windows(step_types: list[list[int]], floors: list[int], length: int,
                      steps: int) -> set[tuple[int, int]]:
    """Windows ``(row, start id)`` within one episode, from each row's step types by
    id and the id its steps begin at since the last clear."""
    valid = set()
    for row, types in enumerate(step_types):
        head = len(types)
        oldest = max(head - length, floors[row], 0)
        for s in range(oldest, head - steps + 1):
            if all(types[i] != FIRST for i in range(s + 1, s + steps)):
                valid.add((row, s))
    return valid


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 6), rows=st.integers(1, 3), steps=st.integers(1, 4),
       plan=st.lists(st.tuples(st.lists(st.sampled_from([FIRST, MID, LAST]), min_size=1,
                                        max_size=8), st.booleans()), min_size=1, max_size=3),
       prioritized=st.booleans(), seed=st.integers(0, 2**16))
def test_within_episodes_draws_exactly_the_windows_of_a_reference(length, rows, steps, plan,
                                                                 prioritized, seed):
    """Writes (step types per add, the same in every row, plus a clear now and then)
    against a reference of the windows within one episode: reads draw among exactly
    those, with probability 1 / their count (uniform), and raise EmptyBufferError
    when there are none."""
    with SharedReplayBuffer(EPISODES, rows, length, prioritized=prioritized,
                            track_episodes=True, seed=seed) as buffer:
        types: list[list[int]] = [[] for _ in range(rows)]
        floors = [0] * rows
        for adds, clear in plan:
            for kind in adds:
                t = len(types[0])
                buffer.add_batch({"step_type": np.full(rows, kind, np.int32),
                                  "row": np.arange(rows), "step": np.full(rows, t)})
                for row in range(rows):
                    types[row].append(kind)
            if clear:
                buffer.clear()
                floors = [len(types[0])] * rows
        expected = reference_windows(types, floors, length, steps)
        if not expected:
            with pytest.raises(EmptyBufferError):
                buffer.get_next(4, steps, within_episodes=True)
            return
        batch, info = buffer.get_next(300, steps, within_episodes=True)
        got = set(zip(batch["row"][:, 0].tolist(), batch["step"][:, 0].tolist()))
        assert got <= expected
        if len(expected) <= 4:
            assert got == expected  # 300 draws miss one of 4 with p < 1e-30
        assert (batch["step_type"][:, 1:] != FIRST).all()
        np.testing.assert_array_equal(np.diff(batch["step"], axis=1), 1)
        # Every priority is the same (1): uniform over the valid windows either way.
        np.testing.assert_allclose(info.probabilities, 1 / len(expected), rtol=1e-5)


def test_prioritized_within_episodes_draws_by_priority_among_valid_windows():
    with SharedReplayBuffer(EPISODES, 1, 8, prioritized=True, alpha=1.0,
                            track_episodes=True, seed=0) as buffer:
        for t, kind in enumerate([FIRST, MID, MID, FIRST, MID, MID, MID, MID]):
            buffer.add_batch({"step_type": np.array([kind], np.int32), "row": np.zeros(1, np.int64),
                              "step": np.array([t])})
        ids = np.arange(8)  # one row: the item id is the step
        assert buffer.update_priorities(ids, ids + 1.0) == 8
        batch, info = buffer.get_next(20_000, 2, within_episodes=True)
        starts = batch["step"][:, 0]
        valid = np.array([0, 1, 3, 4, 5, 6])  # [2, 3] crosses the start at 3
        assert set(starts.tolist()) == set(valid.tolist())
        np.testing.assert_allclose(info.probabilities, (starts + 1) / 25, rtol=1e-5)
        counts = np.array([(starts == s).sum() for s in valid])
        expected = (valid + 1) / 25 * 20_000
        assert float(((counts - expected) ** 2 / expected).sum()) < 20.52  # 5 dof, p=.001


def test_episodes_need_a_step_type_leaf_and_track_episodes():
    with pytest.raises(SpecError, match="step_type"):
        SharedReplayBuffer(SPEC, 2, 4, track_episodes=True)
    with SharedReplayBuffer(EPISODES, 2, 4) as buffer:
        with pytest.raises(ValueError, match="track_episodes=True"):
            buffer.get_next(2, 2, within_episodes=True)
        with pytest.raises(ValueError, match="track_episodes=True"):
            buffer.as_dataset(2, 2, within_episodes=True)
    with SharedReplayBuffer(EPISODES, 2, 4, track_episodes=True,
                            rate_limiter=Queue(4)) as buffer:
        with pytest.raises(ValueError, match="Queue"):
            buffer.get_next(2, 2, within_episodes=True)


def _write_episodes(buffer: SharedReplayBuffer, count: int, episode: int, steps: int
                    ) -> None:
    """A writer process: episodes of ``episode`` steps to its own ``count`` rows; the
    ``step`` leaf is the step id, ``row`` the row."""
    first, _ = buffer.claim_rows(count)
    rows = np.arange(first, first + count)
    for t in range(steps):
        kind = FIRST if t % episode == 0 else (LAST if t % episode == episode - 1 else MID)
        buffer.add_batch({"step_type": np.full(count, kind, np.int32), "row": rows,
                          "step": np.full(count, t)})
        time.sleep(0.0002)  # so that the reader reads while it writes


def test_within_episodes_across_writer_processes_never_crosses_a_start():
    with SharedReplayBuffer(EPISODES, 4, 64, track_episodes=True, seed=0) as buffer:
        writers = [start(_write_episodes, buffer, 2, episode, 2000) for episode in (3, 5)]
        try:
            _wait_for_steps(buffer, 10)
            reads = 0
            while any(w.is_alive() for w in writers) or reads < 20:
                batch, _ = buffer.get_next(64, 3, within_episodes=True)
                reads += 1
                assert (batch["step_type"][:, 1:] != FIRST).all()
                np.testing.assert_array_equal(np.diff(batch["step"], axis=1), 1)
                assert (batch["row"] == batch["row"][:, :1]).all()
        finally:
            for writer in writers:
                finish(writer)


# ------------------------------------------------------------------------------ Queue
def test_a_queue_reads_each_window_once_oldest_first():
    with SharedReplayBuffer(SPEC, 2, 8, rate_limiter=Queue(8), seed=0) as buffer:
        write_steps(buffer, 2, 4)
        assert buffer.unread() == 8 and buffer.unread(2) == 4
        batch, info = buffer.get_next(3)
        assert list(zip(batch["step"].tolist(), batch["row"].tolist())) == \
            [(0, 0), (0, 1), (1, 0)]
        np.testing.assert_array_equal(info.probabilities, 1.0)
        with pytest.raises(RateLimitedError):
            buffer.get_next(6, timeout=0.05)  # 5 unread: held back, nothing consumed
        assert buffer.unread() == 5
        batch, _ = buffer.get_next(5)
        assert list(zip(batch["step"].tolist(), batch["row"].tolist())) == \
            [(1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
        with pytest.raises(RateLimitedError):
            buffer.get_next(1, timeout=0.05)
        assert buffer.dropped == 0


def test_a_queue_reads_windows_without_overlap_and_counts_dropped_steps(monkeypatch):
    with SharedReplayBuffer(SPEC, 1, 4, rate_limiter=rb.MinSize(1), seed=0) as plain:
        with pytest.raises(ValueError, match="Queue"):
            plain.unread()
    with SharedReplayBuffer(SPEC, 1, 4, rate_limiter=Queue(4), seed=0) as buffer:
        write_steps(buffer, 1, 4)
        batch, _ = buffer.get_next(2, 2)
        np.testing.assert_array_equal(batch["step"], [[0, 1], [2, 3]])
    monkeypatch.setattr(shared_queue, "UNPUBLISHED_WAIT_S", 0.05)
    with SharedReplayBuffer(SPEC, 2, 4, rate_limiter=Queue(8), seed=0) as buffer:
        write_steps(buffer, 1, 8)  # one row of two: it laps its oldest 4 steps
        assert buffer.unread() == 4
        with pytest.raises(EmptyBufferError, match="2 unread window"):
            buffer.get_next(3, 2)  # admitted by the count, 2 windows there
        batch, _ = buffer.get_next(4)
        np.testing.assert_array_equal(batch["step"], [4, 5, 6, 7])
        assert buffer.dropped == 4


def test_a_queue_dataset_reads_on_pull_in_order():
    with SharedReplayBuffer(SPEC, 2, 8, rate_limiter=Queue(8), seed=0) as buffer:
        write_steps(buffer, 2, 3)
        stream = iter(buffer.as_dataset(2, num_parallel_calls=2))  # no workers ahead
        first, _ = next(stream)
        assert buffer.unread() == 4  # nothing read ahead of the pull
        second, _ = next(stream)
        assert first["step"].tolist() == [0, 0] and second["step"].tolist() == [1, 1]


def _read_queue(buffer: SharedReplayBuffer, reads: int, out) -> None:
    got = []
    for _ in range(reads):
        batch, _ = buffer.get_next(2, timeout=30)
        got.extend(zip(batch["row"].tolist(), batch["step"].tolist()))
    out.put(got)


def test_a_queue_across_processes_returns_every_item_exactly_once():
    steps = 300
    with SharedReplayBuffer(SPEC, 2, 16, rate_limiter=Queue(8), seed=0) as buffer:
        out = SPAWN.Queue()
        readers = [start(_read_queue, buffer, steps // 2, out) for _ in range(2)]
        writer = start(_write_for, buffer, 2, steps, 0.0)
        got = [out.get(timeout=60) for _ in readers]
        for process in (writer, *readers):
            finish(process)
        everything = sorted(got[0] + got[1])
        assert everything == sorted((r, s) for r in range(2) for s in range(steps))
        for one in got:  # each reader saw the queue oldest first
            assert [s for _, s in one] == sorted(s for _, s in one)
        assert buffer.dropped == 0


def _stalled_queue_read(monkeypatch, buffer: SharedReplayBuffer):
    """Start a thread whose ``get_next(1)`` is stalled between claiming its window and
    copying it (the storage's first gather in that thread waits for the returned
    event); returns ``(thread, release event, list the batch lands in)``."""
    release, got = threading.Event(), []
    gather = SharedStorage.gather

    def stalled(storage, positions):
        if threading.current_thread().name == "reader" and not release.is_set():
            release.wait(30)
        return gather(storage, positions)

    monkeypatch.setattr(SharedStorage, "gather", stalled)
    reader = threading.Thread(target=lambda: got.append(buffer.get_next(1)[0]),
                              name="reader")
    reader.start()
    deadline = time.monotonic() + 10
    while buffer.unread() == 4:  # until its window is claimed
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return reader, release, got


def test_a_queue_window_claimed_and_not_yet_copied_is_never_overwritten(monkeypatch):
    """A reader descheduled between its claim and its copy: the writer, which the
    limiter lets go on, waits for the copy rather than overwrite the window."""
    with SharedReplayBuffer(SPEC, 1, 4, rate_limiter=Queue(4), seed=0) as buffer:
        write_steps(buffer, 1, 4)
        reader, release, got = _stalled_queue_read(monkeypatch, buffer)
        writer = threading.Thread(target=buffer.add_batch,
                                  args=(items_for(np.zeros(1), np.array([4])),))
        writer.start()  # step 4 overwrites step 0, which the reader holds
        writer.join(0.3)
        assert writer.is_alive() and buffer.steps_written().tolist() == [4]
        release.set()
        reader.join(10)
        writer.join(10)
        assert got[0]["step"].tolist() == [0]
        batch, _ = buffer.get_next(4)
        assert batch["step"].tolist() == [1, 2, 3, 4] and buffer.dropped == 0


def test_a_process_forked_while_a_queue_read_copies_reads_too(monkeypatch):
    """The read's thread lock is fresh in a forked child (the thread holding the
    parent's does not exist there), and the child pins in a slot of its own."""
    with SharedReplayBuffer(SPEC, 1, 4, rate_limiter=Queue(4), seed=0) as buffer:
        write_steps(buffer, 1, 4)
        reader, release, got = _stalled_queue_read(monkeypatch, buffer)
        pid = os.fork()
        if pid == 0:  # the child: one read, or the alarm ends it (a hang)
            import signal
            signal.alarm(20)
            try:
                batch, _ = buffer.get_next(1, timeout=10)
                os._exit(0 if batch["step"].tolist() == [1] else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        release.set()
        reader.join(10)
        assert os.waitstatus_to_exitcode(status) == 0
        assert got[0]["step"].tolist() == [0]


def test_a_queue_read_that_fails_after_its_claim_counts_its_windows_consumed(
        monkeypatch):
    with SharedReplayBuffer(SPEC, 1, 4, rate_limiter=Queue(4), seed=0) as buffer:
        write_steps(buffer, 1, 4)
        gather = SharedStorage.gather

        def failing(storage, positions):
            raise OSError("the copy failed")

        monkeypatch.setattr(SharedStorage, "gather", failing)
        with pytest.raises(OSError, match="the copy failed"):
            buffer.get_next(1)
        monkeypatch.setattr(SharedStorage, "gather", gather)
        assert buffer.dropped == 1 and buffer.unread() == 3
        assert (buffer.stats().inserts, buffer.stats().samples) == (4, 1)
        batch, _ = buffer.get_next(3)
        assert batch["step"].tolist() == [1, 2, 3]
        with pytest.raises(RateLimitedError):  # not admitted (nor EmptyBufferError)
            buffer.get_next(1, timeout=0.05)


def test_a_pin_left_by_a_killed_reader_does_not_stall_the_writers(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # ended and reaped: its pid names no process
    with SharedReplayBuffer(SPEC, 1, 4, rate_limiter=Queue(4), path=tmp_path / "b",
                            seed=0) as buffer:
        write_steps(buffer, 1, 4)
        assert buffer.get_next(1)[0]["step"].tolist() == [0]
        owners = np.load(tmp_path / "b" / "read_pin_owners.npy", mmap_mode="r+")
        pins = np.load(tmp_path / "b" / "read_pins.npy", mmap_mode="r+")
        slot = int(np.flatnonzero(owners == 0)[0])
        owners[slot], pins[slot, 0] = dead.pid, 1  # killed while copying step 0
        writer = threading.Thread(target=buffer.add_batch,
                                  args=(items_for(np.zeros(1), np.array([4])),))
        writer.start()
        writer.join(10)
        assert not writer.is_alive() and pins[slot, 0] == 0
        assert buffer.get_next(4)[0]["step"].tolist() == [1, 2, 3, 4]


def test_a_queue_window_lost_while_copied_is_replaced_dropped_and_counted(monkeypatch,
                                                                          tmp_path):
    """With every pin slot taken by other live processes a read goes unpinned: a window
    overwritten while copied is replaced by the next, counted in ``dropped``, and
    counted as read by the limiter (an admitted read never finds a window missing)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with SharedReplayBuffer(SPEC, 1, 4, rate_limiter=Queue(4), path=tmp_path / "b",
                                seed=0) as buffer:
            owners = np.load(tmp_path / "b" / "read_pin_owners.npy", mmap_mode="r+")
            owners[:] = sleeper.pid
            owners.flush()
            write_steps(buffer, 1, 4)
            reader, release, got = _stalled_queue_read(monkeypatch, buffer)
            buffer.add_batch(items_for(np.zeros(1), np.array([4])))  # laps step 0
            release.set()
            reader.join(10)
            assert got[0]["step"].tolist() == [1] and buffer.dropped == 1
            stats = buffer.stats()
            assert (stats.inserts, stats.samples) == (5, 2)
            batch, _ = buffer.get_next(3, timeout=5)
            assert batch["step"].tolist() == [2, 3, 4]
            with pytest.raises(RateLimitedError):  # not admitted, then EmptyBufferError
                buffer.get_next(1, timeout=0.05)
    finally:
        sleeper.kill()
        sleeper.wait()


# ----------------------------------------------------------------------- crash points
CRASHING = textwrap.dedent("""
    import pickle, sys
    with open(sys.argv[1], "rb") as fh:
        buffer = pickle.load(fh)           # attach to the parent's buffer
    if sys.argv[2] == "clear":
        buffer.clear()
    else:
        buffer.save(sys.argv[3])
    raise SystemExit("the crash point was never reached")
""")


def crash_in_child(buffer: SharedReplayBuffer, point: str, call: str, tmp_path,
                   target: str = "") -> None:
    handle = tmp_path / "handle.pickle"
    handle.write_bytes(pickle.dumps(buffer))
    env = {**os.environ, "REPLAYBUFFER_CRASH_AT": point,
           "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", CRASHING, str(handle), call, target],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == crash_points.CRASH_EXIT_CODE, out.stderr[-2000:]


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_clear_killed_midway_reads_as_done(tmp_path, prioritized):
    with SharedReplayBuffer(SPEC, 2, 4, prioritized=prioritized, path=tmp_path / "b",
                            seed=0) as buffer:
        rows = write_steps(buffer, 2, 6)
        crash_in_child(buffer, "shared.clear.floors", "clear", tmp_path)
        assert len(buffer) == 0
        with pytest.raises(EmptyBufferError):
            buffer.get_next(2)
        buffer.add_batch(items_for(rows, np.array([6, 6])))
        batch, _ = buffer.get_next(100)
        check_whole(batch)
        assert set(batch["step"].tolist()) == {6} and len(buffer) == 2


def test_a_save_killed_before_it_is_published_leaves_the_last_checkpoint(tmp_path):
    with SharedReplayBuffer(SPEC, 2, 4, path=tmp_path / "b", seed=0) as buffer:
        rows = write_steps(buffer, 2, 2)
        buffer.save(tmp_path / "ckpt")
        buffer.add_batch(items_for(rows, np.array([2, 2])))
        crash_in_child(buffer, "shared.save.publish", "save", tmp_path,
                       str(tmp_path / "ckpt"))
        assert len(rb.load(tmp_path / "ckpt")) == 4  # the first save's, whole
        assert [p.name for p in (tmp_path / "ckpt").iterdir()
                if p.name.startswith(".tmp-")]  # the abandoned one, until the next save
        buffer.save(tmp_path / "ckpt")
        assert len(rb.load(tmp_path / "ckpt")) == 6
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt-000002"]
