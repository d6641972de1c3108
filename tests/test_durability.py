"""Checkpoints and mmap files that survive faults (issue 28, items 3, 10 and 11; issue 27,
item 4): loads while another process saves into the series, a process killed while
the mmap journal is recreated, a file system too small for an mmap buffer, and
``load`` pointed at an mmap buffer."""

import errno
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer import crash_points
from replaybuffer.storage.memory import InsufficientSpaceError
from test_checkpoints import assert_consistent, item, items, make, spec

TESTS = str(Path(__file__).parent)


# ------------------------------------------------- item 10: loads while a save prunes
def _save_forever(root: str, ready: "multiprocessing.synchronize.Event",
                  stop: "multiprocessing.synchronize.Event") -> None:
    """Add a step and save with the default ``keep=1`` until ``stop`` is set."""
    buf = make()
    t = 0
    while not stop.is_set():
        buf.add_batch(item(t, 3))
        buf.save(root)
        ready.set()
        t += 1


def test_load_while_another_process_saves_and_prunes_the_series(tmp_path):
    """A process saves in a loop with ``keep=1`` (each save publishes one checkpoint and
    prunes the one before) while this one loads the series over and over for a few
    seconds: every load returns a complete, consistent checkpoint, never "missing"."""
    root = tmp_path / "c"
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    saver = context.Process(target=_save_forever, args=(str(root), ready, stop))
    saver.start()
    failures, loads = [], 0
    try:
        assert ready.wait(60), "the saving process never saved"
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                again = rb.load(root)
                assert_consistent(again)
            except (rb.CheckpointError, OSError) as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
            assert time.monotonic() - started < 10, "a load took too long: unbounded retries?"
            loads += 1
    finally:
        stop.set()
        saver.join(30)
        if saver.is_alive():
            saver.kill()
    assert saver.exitcode == 0
    assert loads > 20, f"only {loads} loads: the test tested little"
    assert not failures, f"{len(failures)} of {loads} loads failed: {failures[:3]}"


def test_a_checkpoint_being_loaded_is_not_pruned_until_the_load_ends(tmp_path):
    """A load pins the checkpoint it reads: saves with ``keep=1`` meanwhile publish
    theirs and leave it; the first save after the load prunes it."""
    from replaybuffer.persist import series

    buf = make()
    buf.add_batch(item(0, 3))
    first = buf.save(tmp_path / "c", keep=1)

    def read_while_saving(directory):
        assert directory == first
        for step in (1, 2):  # each would prune every older checkpoint
            buf.add_batch(item(step, 3))
            buf.save(tmp_path / "c", keep=1)
        assert directory.is_dir()  # still there, whole: the load goes on
        return rb.load(directory)

    loaded = series.read_newest(tmp_path / "c", read_while_saving)
    assert len(loaded) == 3 and len(series.checkpoints(tmp_path / "c")) == 2
    buf.save(tmp_path / "c", keep=1)
    assert series.checkpoints(tmp_path / "c") == [series.resolve(tmp_path / "c")]
    assert not first.exists()


def test_a_named_checkpoint_that_is_gone_is_not_swapped_for_another(tmp_path):
    """Only a series is re-resolved: a load of one named checkpoint directory that is
    removed says so, and corrupt files of a checkpoint still present are reported as
    before (no retry hides them)."""
    buf = make()
    buf.add_batch(item(0, 3))
    first = buf.save(tmp_path / "c", keep=2)
    buf.add_batch(item(1, 3))
    newest = buf.save(tmp_path / "c", keep=2)
    (newest / "leaf_000.npy").unlink()
    with pytest.raises(rb.CheckpointError, match=r"leaf_000.npy\) is missing"):
        rb.load(tmp_path / "c")
    assert rb.load(first).last_id == 0


# ------------------------------------- item 11: killed while the journal is recreated
JOURNAL_CRASH = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import replaybuffer as rb
    from test_checkpoints import item, items, spec
    buf = rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path={path!r})
    for t in range(5):  # the journal is created (2 rows) at the first add: crash point 1
        buf.add_batch(item(t, 2))
    print(buf.last_id, flush=True)
    steps = np.arange(5, 8)  # 6 rows: the journal is recreated larger, crash point 2
    buf.extend(items(steps[None, :], np.arange(2)[:, None]))
    raise SystemExit("the crash point was never reached")
""")


def test_a_process_killed_while_the_journal_is_recreated_reopens(tmp_path):
    """``REPLAYBUFFER_CRASH_AT=mmap.journal.recreate:2`` ends the process (``os._exit``)
    the second time a journal file is recreated, just after it was emptied: the state a
    real kill leaves there. Reopening treats the partial journal as absent and holds
    every committed step."""
    path = tmp_path / "b"
    env = {**os.environ, "REPLAYBUFFER_CRASH_AT": "mmap.journal.recreate:2"}
    out = subprocess.run([sys.executable, "-c", JOURNAL_CRASH.format(tests=TESTS,
                                                                    path=str(path))],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == crash_points.CRASH_EXIT_CODE, out.stderr[-2000:]
    committed = int(out.stdout.split()[-1])
    journals = sorted((path / "data").glob("journal_*.npy"))
    assert journals and min(p.stat().st_size for p in journals) == 0  # a partial journal
    again = rb.reopen(path)
    assert again.last_id == committed == 4
    assert_consistent(again)
    again.add_batch(item(5, 2))  # and it writes on: the journal is made anew
    again.close()
    assert rb.reopen(path).last_id == 5


# ------------------------------------------------ item 3: no space for an mmap buffer
def test_an_mmap_buffer_the_file_system_cannot_hold_is_refused(tmp_path, monkeypatch):
    """Space for the data files is reserved at creation (``posix_fallocate``); where the
    file system has too little, the constructor refuses, naming the path, the bytes
    needed and the bytes free, and leaves nothing behind."""
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    path = tmp_path / "b"
    with pytest.raises(InsufficientSpaceError,
                       match=r"cannot reserve \d+ bytes for .*b/data/\S+\.npy: the file "
                             r"system holds \d+ bytes free") as caught:
        rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path=path)
    assert caught.value.errno == errno.ENOSPC
    assert not path.exists()
    (tmp_path / "empty").mkdir()  # a directory given empty is left empty
    with pytest.raises(InsufficientSpaceError):
        rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path=tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []


def test_the_data_files_are_reserved_not_sparse(tmp_path):
    buf = rb.UniformReplayBuffer({**spec(), "frame": rb.ArraySpec((64, 64), np.uint8)}, 2,
                                 64, seed=0, storage="mmap", path=tmp_path / "b")
    for file in (tmp_path / "b" / "data").glob("*.npy"):
        if not file.name.startswith("journal_"):
            assert file.stat().st_blocks * 512 >= file.stat().st_size, file
    buf.close()


def test_reopen_on_a_full_file_system_is_refused_and_touches_nothing(tmp_path, monkeypatch):
    buf = rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path=tmp_path / "b")
    buf.add_batch(item(0, 2))
    buf.close()
    before = {p: p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(InsufficientSpaceError, match="records.npy"):
        rb.reopen(tmp_path / "b")
    assert {p: p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()} == before
    monkeypatch.undo()
    assert rb.reopen(tmp_path / "b").last_id == 0


def test_a_journal_the_file_system_cannot_hold_refuses_the_write_alone(tmp_path, monkeypatch):
    """A write that needs a larger journal on a full file system is refused (no SIGBUS
    later); the buffer holds what it held, and writes on once there is space."""
    buf = rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path=tmp_path / "b")
    for t in range(3):
        buf.add_batch(item(t, 2))

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    steps = np.arange(3, 7)  # 8 rows: more than the journal's 2
    with pytest.raises(InsufficientSpaceError, match=r"journal_records\.npy"):
        buf.extend(items(steps[None, :], np.arange(2)[:, None]))
    assert buf.last_id == 2
    assert_consistent(buf)
    monkeypatch.undo()
    buf.extend(items(steps[None, :], np.arange(2)[:, None]))
    assert buf.last_id == 6
    assert_consistent(buf)
    buf.close()
    again = rb.reopen(tmp_path / "b")
    assert again.last_id == 6
    assert_consistent(again)


# ----------------------------------------- issue 27 item 4: load of an mmap buffer
@pytest.mark.parametrize("where", ["", "data"])
def test_load_of_an_mmap_buffer_points_to_reopen(tmp_path, where):
    buf = rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path=tmp_path / "b")
    buf.add_batch(item(0, 2))
    buf.close()
    target = tmp_path / "b" / where if where else tmp_path / "b"
    message = (f"{tmp_path / 'b'} is a buffer on mmap storage, not a checkpoint: reopen it "
               f"with replaybuffer.reopen")
    with pytest.raises(rb.CheckpointError, match=message.replace(".", r"\.")):
        rb.load(target)
