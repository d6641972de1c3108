"""Checkpoints and mmap files that survive faults (issue 28, items 3, 10 and 11; issue 27,
item 4): loads while another process saves into the series, a process killed while
the mmap journal is recreated, a file system too small for an mmap buffer, and
``load`` pointed at an mmap buffer."""

import multiprocessing
import time

import pytest

import replaybuffer as rb
from test_checkpoints import assert_consistent, item, make, spec


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
