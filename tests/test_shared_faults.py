"""SharedReplayBuffer under faults (issue 28, items 1, 2, 3, 5, 6, 7): a prioritized
writer or updater killed at a crash point or at random, threads sharing a handle, a file
system too small, a writer killed mid-step, a zero-item write, and creations that fail
or whose process ends without ``close()``."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from replaybuffer import RateLimiter
from replaybuffer.crash_points import CRASH_EXIT_CODE
from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.distributed.stress import soak_seconds
from replaybuffer.errors import SpecError
from replaybuffer.sampling import flat_tree
from replaybuffer.specs import ArraySpec
from replaybuffer.storage import mmap_storage
from replaybuffer.storage.shared_storage import StorageSpaceError

SPEC = {"row": ArraySpec((), np.int64), "step": ArraySpec((), np.int64),
        "obs": ArraySpec((3,), np.float32)}
SPAWN = mp.get_context("spawn")


def items_for(rows: np.ndarray, steps: np.ndarray) -> dict[str, np.ndarray]:
    """Items that name their own row and step (obs repeats the step)."""
    return {"row": rows.astype(np.int64), "step": steps.astype(np.int64),
            "obs": np.repeat(steps[:, None], 3, 1).astype(np.float32)}


# -------------------------------------------------------- item 2: threads of one process
PAYLOAD = 32 * 1024


def _add_tagged(buffer: SharedReplayBuffer, tags: range, errors: list) -> None:
    try:
        for tag in tags:
            buffer.add_batch({"tag": np.array([tag]),
                              "payload": np.full((1, PAYLOAD), tag % 251, np.uint8)})
    except BaseException as exc:  # reported to the test thread
        errors.append(exc)


def test_two_threads_of_one_process_lose_no_add_and_mix_no_step():
    """2 threads x N adds of 32 KB to one handle: every add is a step of its own, and
    every step holds the one write its tag names."""
    adds = 600
    spec = {"tag": ArraySpec((), np.int64), "payload": ArraySpec((PAYLOAD,), np.uint8)}
    with SharedReplayBuffer(spec, 1, 2 * adds, seed=0) as buffer:
        errors: list = []
        threads = [threading.Thread(target=_add_tagged,
                                    args=(buffer, range(t * adds, (t + 1) * adds), errors))
                   for t in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert buffer.steps_written().tolist() == [2 * adds]
        assert len(buffer) == 2 * adds
        items, _ = buffer.get_next(1, 2 * adds)  # the whole row, in step order
        tags = items["tag"][0]
        assert sorted(tags.tolist()) == list(range(2 * adds))  # every add counted
        expected = (tags % 251).astype(np.uint8)
        mixed = (items["payload"][0] != expected[:, None]).any(1)
        assert not mixed.any(), f"{int(mixed.sum())} steps mix two writes"


def _report_rows_and_add(buffer: SharedReplayBuffer, out) -> None:
    before = buffer.rows
    buffer.add_batch(items_for(np.arange(1), np.zeros(1)))
    out.put((before, buffer.rows))


def test_a_forked_child_writes_rows_of_its_own():
    """The writer's rows are its process's: a forked child forgets its parent's (and
    any thread lock a parent thread held) and claims rows of its own."""
    with SharedReplayBuffer(SPEC, 2, 4) as buffer:
        buffer.add_batch(items_for(np.arange(1), np.zeros(1)))
        fork = mp.get_context("fork")
        out = fork.Queue()
        child = fork.Process(target=_report_rows_and_add, args=(buffer, out))
        with buffer._writer._threads:  # as a parent thread mid-write would hold it
            child.start()
            assert out.get(timeout=30) == (None, (1, 1))
        child.join(60)
        assert buffer.rows == (0, 1) and buffer.steps_written().tolist() == [1, 1]


# ---------------------------------------------------- items 3 and 7: space and cleanup
def _no_space(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_no_space_is_refused_at_creation_and_the_directory_removed(monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", _no_space)
    with pytest.raises(StorageSpaceError) as caught:
        SharedReplayBuffer(SPEC, 4, 1000)
    error = caught.value
    message = str(error)
    assert str(error.directory) in message and str(error.directory).startswith("/dev/shm/")
    assert f"needs {error.needed:,} bytes" in message and f"{error.free:,} are free" in message
    assert error.needed >= 4 * 1000 * (8 + 8 + 12)  # the data alone
    assert isinstance(error, OSError)
    assert not Path(error.directory).exists()  # item 7: nothing left in /dev/shm


def test_a_buffer_larger_than_the_free_space_is_refused_before_reserving(monkeypatch):
    free = os.statvfs("/dev/shm")
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result(
        (free.f_bsize, free.f_frsize, free.f_blocks, 1, 1, *free[5:])))  # 1 block free
    reserved = []
    monkeypatch.setattr(os, "posix_fallocate", lambda *args: reserved.append(args))
    with pytest.raises(StorageSpaceError, match=f"{free.f_frsize:,} are free") as caught:
        SharedReplayBuffer(SPEC, 4, 1000)
    assert reserved == []
    assert not Path(caught.value.directory).exists()


def test_a_failed_creation_in_a_given_path_leaves_it_as_it_was(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "posix_fallocate", _no_space)
    new, empty = tmp_path / "new" / "buffer", tmp_path / "empty"
    empty.mkdir()
    for path in (new, empty):
        with pytest.raises(StorageSpaceError, match=str(path)):
            SharedReplayBuffer(SPEC, 2, 10, path=path)
    assert not new.exists() and (tmp_path / "new").is_dir()
    assert empty.is_dir() and list(empty.iterdir()) == []


def test_a_creation_failing_for_memory_removes_its_directory(monkeypatch):
    made: list[Path] = []
    original = mmap_storage.create_npy  # how every file of a new buffer is made and mapped

    def third_file_fails(file, *args, **kwargs):
        made.append(Path(file))
        if len(made) == 3:
            raise MemoryError("no memory for a map")
        return original(file, *args, **kwargs)

    monkeypatch.setattr(mmap_storage, "create_npy", third_file_fails)
    with pytest.raises(MemoryError):
        SharedReplayBuffer(SPEC, 2, 10)
    assert made and not made[0].parent.exists()


_KEPT: list[SharedReplayBuffer] = []  # alive until the child ends: no GC finalizer


def _make_and_end_without_close(out) -> None:
    buffer = SharedReplayBuffer(SPEC, 2, 10)
    buffer.add_batch(items_for(np.arange(1), np.zeros(1)))
    _KEPT.append(buffer)
    out.put(str(buffer.path))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_buffer_made_in_a_child_that_ends_without_close_leaves_no_directory(method):
    context = mp.get_context(method)
    out = context.Queue()
    child = context.Process(target=_make_and_end_without_close, args=(out,))
    child.start()
    path = Path(out.get(timeout=60))
    child.join(60)
    assert child.exitcode == 0
    assert not path.exists()


def test_a_fork_child_does_not_remove_its_parents_buffer():
    with SharedReplayBuffer(SPEC, 2, 10) as buffer:
        child = mp.get_context("fork").Process(target=len, args=(buffer,))
        child.start()
        child.join(60)
        assert child.exitcode == 0 and buffer.path.is_dir()


# ------------------------------------------------ item 5: len() after a killed writer
def _fill_then_die_mid_step(buffer: SharedReplayBuffer, steps: int) -> None:
    first, _ = buffer.claim_rows(1)
    for step in range(steps):
        buffer.add_batch(items_for(np.array([first]), np.array([step])))

    def killed_while_copying(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)  # versions say "being written" by now

    buffer._storage.write = killed_while_copying
    buffer.add_batch(items_for(np.array([first]), np.array([steps])))


@pytest.mark.parametrize("prioritized", [False, True])
def test_len_does_not_count_a_step_a_killed_writer_half_overwrote(prioritized):
    length = 6
    with SharedReplayBuffer(SPEC, 1, length, prioritized=prioritized, seed=1) as buffer:
        child = SPAWN.Process(target=_fill_then_die_mid_step, args=(buffer, length))
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL
        assert buffer.steps_written().tolist() == [length]
        items, _ = buffer.get_next(2_000)
        returned = set(items["step"].tolist())
        assert returned == set(range(1, length))  # step 0 is half overwritten
        assert len(buffer) == len(returned) == length - 1
        assert buffer.claim_rows(1) == (0, 1)  # a new writer continues the row
        buffer.add_batch(items_for(np.array([0]), np.array([length])))
        assert len(buffer) == length


# ------------------------------------------------------- item 6: a write of zero items
def test_a_write_of_zero_items_is_refused_and_changes_nothing():
    with SharedReplayBuffer(SPEC, 2, 4) as buffer:
        version = buffer.layout.version.copy()
        with pytest.raises(SpecError, match="add_batch: a batch of 0 items; expected "
                                            "at least 1"):
            buffer.add_batch(items_for(np.arange(0), np.zeros(0)))
        with pytest.raises(SpecError, match="extend: a batch of 0 items"):
            buffer.extend({k: v[:, None] for k, v in
                           items_for(np.arange(0), np.zeros(0)).items()})
        with pytest.raises(SpecError, match="claim_rows: a batch of 0 items"):
            buffer.claim_rows(0)
        assert buffer.rows is None and len(buffer) == 0
        assert buffer.layout.owner.tolist() == [0, 0]
        np.testing.assert_array_equal(buffer.layout.version, version)
        buffer.add_batch(items_for(np.arange(2), np.zeros(2)))  # later writes work
        assert buffer.rows == (0, 2) and len(buffer) == 2


# ------------------------------------ issue 28 item 1: the shared sum tree after kills
def assert_tree_whole(buffer: SharedReplayBuffer) -> None:
    """After the next call that takes the tree's lock (a draw, which repairs what a
    killed holder left): every interior node is the sum of its children, every
    committed step has a positive leaf and every step being written a zero one, and
    ``probabilities`` are leaf / total."""
    _, info = buffer.get_next(512)
    tree = buffer.layout.tree.copy()
    rebuilt = tree.copy()
    flat_tree.rebuild(rebuilt)
    np.testing.assert_allclose(tree, rebuilt, rtol=1e-9)
    rows, length = buffer.num_rows, buffer.max_length
    leaves = flat_tree.leaves_of(tree, np.arange(buffer.capacity))
    version = buffer.layout.version.copy()
    heads = buffer.steps_written()[np.arange(buffer.capacity) % rows]
    ids = version // 2 - 1
    committed = (version > 0) & (version % 2 == 0) & (ids < heads) & (ids >= heads - length)
    assert committed.any()
    assert (leaves[committed] > 0).all(), "a committed step cannot be drawn"
    assert (leaves[version % 2 == 1] == 0).all(), "a step being written can be drawn"
    steps, item_rows = np.divmod(info.ids, rows)
    positions = (steps % length) * rows + item_rows
    np.testing.assert_allclose(info.probabilities, leaves[positions] / leaves.sum(),
                               rtol=1e-5)


def _write_then_crash(buffer: SharedReplayBuffer, rows: int, steps: int) -> None:
    """Write ``steps`` steps to ``rows`` rows, then keep writing (the armed crash point
    ends the process), then updating priorities."""
    first, _ = buffer.claim_rows(rows)
    mine = np.arange(first, first + rows)
    for step in range(steps):
        buffer.add_batch(items_for(mine, np.full(rows, step)))
    rng = np.random.default_rng(0)
    while True:
        _, info = buffer.get_next(16)
        buffer.update_priorities(info.ids, rng.exponential(1.0, 16) + 0.1)


def crash_a_child(monkeypatch, buffer: SharedReplayBuffer, point: str, rows: int,
                  steps: int) -> None:
    """Run :func:`_write_then_crash` in a fresh process armed at ``point``; it must end
    there."""
    monkeypatch.setenv("REPLAYBUFFER_CRASH_AT", point)
    child = SPAWN.Process(target=_write_then_crash, args=(buffer, rows, steps))
    child.start()
    monkeypatch.delenv("REPLAYBUFFER_CRASH_AT")
    child.join(120)
    assert child.exitcode == CRASH_EXIT_CODE


@pytest.mark.parametrize("point, head", [
    ("shared.write.uncount:2", 5),       # step 1 counted out, step 5 not begun
    ("shared.priorities.update:6", 5),   # publishing step 5: leaves at max, versions odd
    ("shared.priorities.update:7", 6),   # update_priorities: new leaves, old interior
    ("shared.write.publish:6", 6),       # step 5's versions even, its row heads not moved
    ("shared.write.data:6", 5),          # step 5's data written, nothing published
])
def test_a_prioritized_writer_killed_at_a_crash_point_leaves_a_whole_tree(monkeypatch, point,
                                                                         head):
    """The next holder of the lock repairs the tree; the next claim of the rows repairs
    their heads; every committed step stays drawable, with the true probabilities."""
    length = 4
    with SharedReplayBuffer(SPEC, 3, length, prioritized=True, alpha=1.0, seed=0) as buffer:
        crash_a_child(monkeypatch, buffer, point, 3, 6)
        torn = buffer.layout.version % 2 == 1
        assert_tree_whole(buffer)
        assert buffer.claim_rows(3) == (0, 3)  # the killed writer's rows, with their steps
        assert buffer.steps_written().tolist() == [head] * 3  # a published step counts
        assert len(buffer) == 3 * length - 3 * int(torn.any())
        items, _ = buffer.get_next(3_000)
        assert set(items["step"].tolist()) == set(range(head - length + torn.any(), head))
        for step in range(head, head + 2):  # the rows go on, whole
            buffer.add_batch(items_for(np.arange(3), np.full(3, step)))
        assert_tree_whole(buffer)
        assert len(buffer) == 3 * length


@pytest.mark.parametrize("prioritized", [False, True])
def test_len_stays_exact_after_a_writer_killed_between_counting_out_and_overwriting(
        monkeypatch, prioritized):
    """Killed after counting its rows' oldest step out of ``held`` and before marking it
    overwritten: those steps are whole and drawable, and ``len()`` says so."""
    length = 4
    with SharedReplayBuffer(SPEC, 3, length, prioritized=prioritized, alpha=1.0,
                            seed=0) as buffer:
        crash_a_child(monkeypatch, buffer, "shared.write.uncount", 3, 6)
        assert buffer.layout.held.tolist() == [length - 1] * 3  # the writer's count
        assert len(buffer) == 3 * length
        if prioritized:
            assert_tree_whole(buffer)
        items, _ = buffer.get_next(len(buffer))  # a window is one step: all drawable
        assert set(items["step"].tolist()) == set(range(length))
        assert buffer.claim_rows(3) == (0, 3)
        buffer.add_batch(items_for(np.arange(3), np.full(3, length)))
        assert len(buffer) == 3 * length


def _claim(buffer: SharedReplayBuffer) -> None:
    buffer.claim_rows(2)


def test_a_writer_killed_while_claiming_leaves_its_rows_free(monkeypatch):
    with SharedReplayBuffer(SPEC, 2, 4) as buffer:
        monkeypatch.setenv("REPLAYBUFFER_CRASH_AT", "shared.claim")
        child = SPAWN.Process(target=_claim, args=(buffer,))
        child.start()
        monkeypatch.delenv("REPLAYBUFFER_CRASH_AT")
        child.join(120)
        assert child.exitcode == CRASH_EXIT_CODE
        assert buffer.layout.owner.tolist() == [child.pid] * 2  # it had marked them
        assert buffer.claim_rows(2) == (0, 2)  # an ended process's rows are free
        buffer.add_batch(items_for(np.arange(2), np.zeros(2)))
        assert len(buffer) == 2


def _update_forever(buffer: SharedReplayBuffer, ready) -> None:
    rng = np.random.default_rng()
    ready.set()
    while True:
        _, info = buffer.get_next(64)
        buffer.update_priorities(info.ids, rng.exponential(1.0, 64))


def _write_forever(buffer: SharedReplayBuffer, rows: int, ready) -> None:
    first, _ = buffer.claim_rows(rows)
    mine = np.arange(first, first + rows)
    ready.set()
    while True:
        steps = buffer.steps_written()[first]
        buffer.add_batch(items_for(mine, np.full(rows, steps)))


def test_writers_and_updaters_killed_at_random_moments_leave_a_whole_tree():
    """Issue 28 item 1 as reported: 1,024-row batches into a prioritized buffer, the
    writer (or a priority updater) killed with SIGKILL 0-4 ms into its work, again and
    again (``REPLAYBUFFER_SOAK_SECONDS`` runs it longer); after each kill every
    committed step is drawable and probabilities are priority over the true total."""
    rows, length = 1024, 4
    fork = mp.get_context("fork")  # a victim a few ms old: fork, not spawn
    rng = np.random.default_rng(0)
    deadline = time.monotonic() + soak_seconds(6.0)
    kills = 0
    with SharedReplayBuffer(SPEC, rows, length, prioritized=True, seed=0) as buffer:
        buffer.claim_rows(rows)
        for step in range(length):
            buffer.add_batch(items_for(np.arange(rows), np.full(rows, step)))
        buffer._writer.release_rows()  # the victims write these rows
        while time.monotonic() < deadline or kills < 4:
            ready = fork.Event()
            target, args = (_write_forever, (buffer, rows, ready)) if kills % 3 else \
                (_update_forever, (buffer, ready))
            victim = fork.Process(target=target, args=args)
            victim.start()
            assert ready.wait(60)
            time.sleep(float(rng.uniform(0.0, 0.004)))
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(60)
            kills += 1
            assert_tree_whole(buffer)
        assert buffer.claim_rows(rows) == (0, rows)
        assert_tree_whole(buffer)


def _write_steps(buffer: SharedReplayBuffer, rows: int, steps: int) -> None:
    first, _ = buffer.claim_rows(rows)
    mine = np.arange(first, first + rows)
    for step in range(steps):
        buffer.add_batch(items_for(mine, np.full(rows, step)))


@pytest.mark.parametrize("prioritized", [False, True])
def test_rows_left_with_unequal_heads_by_a_killed_publisher_are_claimed_again(prioritized):
    """A writer killed while publishing a step of 4 rows moved the heads of some rows and
    not others (here: every row but row 1 wrote step 5 whole, rows 0 and 2 moved their
    heads, row 3 did not; row 1 was still writing it). The next writer claims the 4 rows: the rows go back to step 5 (the
    step is written again), len() counts only what can be drawn, nothing torn."""
    rows, length = 4, 4
    with SharedReplayBuffer(SPEC, rows, length, prioritized=prioritized, seed=0) as buffer:
        child = SPAWN.Process(target=_write_steps, args=(buffer, rows, 6))
        child.start()
        child.join(120)
        assert child.exitcode == 0
        layout = buffer.layout
        # Undo step 5 partly, as a kill mid-publish leaves it: row 1 torn, row 3 unmoved.
        position = (5 % length) * rows
        layout.version[position + 1] = 2 * 5 + 1
        layout.next_id[[1, 3]] = 5
        assert buffer.claim_rows(rows) == (0, rows)
        np.testing.assert_array_equal(buffer.steps_written(), [5, 5, 5, 5])
        assert len(buffer) == rows * (length - 1)  # steps 2, 3, 4 of each row
        drawn = set()
        for _ in range(20):
            items, info = buffer.get_next(64)
            np.testing.assert_array_equal(items["row"], info.ids % rows)
            np.testing.assert_array_equal(items["step"], info.ids // rows)
            drawn.update(info.ids.tolist())
        assert drawn == {s * rows + r for s in (2, 3, 4) for r in range(rows)}
        buffer.add_batch(items_for(np.arange(rows), np.full(rows, 5)))  # written again
        assert len(buffer) == rows * length
        if prioritized:
            assert_tree_whole(buffer)


# ------------------------------------------------ the rate limiter's largest calls
def test_a_draw_that_fails_leaves_the_largest_sample_as_it_was(monkeypatch):
    """Fault injection: a draw of 16 items admitted, then failing, was never a sample: a
    later held-back extend of 5 items (which 16-item samples would make wait forever in
    a window of 20) is held back, not refused, and goes once samples make room."""
    def extend(buffer: SharedReplayBuffer, first: int, steps: int, **kwargs) -> bool:
        at = np.arange(first, first + steps)[None]
        return buffer.extend({"row": np.zeros_like(at), "step": at,
                              "obs": np.repeat(at[..., None], 3, 2).astype(np.float32)},
                             **kwargs)

    with SharedReplayBuffer(SPEC, 1, 50, seed=0,
                            rate_limiter=RateLimiter(1.0, 1, 0.0, 20.0)) as buffer:
        extend(buffer, 0, 20)  # diff 20: inserts wait for samples
        draw = buffer._sampler.draw

        def broken(*args, **kwargs):
            raise OSError("injected: the draw failed")

        monkeypatch.setattr(buffer._sampler, "draw", broken)
        with pytest.raises(OSError, match="injected"):
            buffer.get_next(16)
        monkeypatch.setattr(buffer._sampler, "draw", draw)
        assert buffer.stats().samples == 0
        assert extend(buffer, 20, 5, block=False) is False  # held back, not "forever"
        assert buffer.get_next(5, block=False) is not None
        assert extend(buffer, 20, 5, block=False) is True
        assert buffer.stats().inserts == 25 and len(buffer) == 25
