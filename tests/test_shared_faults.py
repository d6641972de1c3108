"""SharedReplayBuffer under faults (issue 28, items 2, 3, 5, 6, 7): threads sharing a
handle, a file system too small, a writer killed mid-step, a zero-item write, and
creations that fail or whose process ends without ``close()``."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.errors import SpecError
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
