"""Buffers on memory-mapped files: the same results as numpy storage, reopening, crashes
(SIGKILL, and a commit cut short), refusals that touch nothing, and a buffer larger than
the memory its process may allocate."""

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from test_checkpoints import assert_consistent, item, spec

TESTS = str(Path(__file__).parent)

CLASSES = {
    "uniform": lambda **kw: rb.UniformReplayBuffer(spec(), 3, 7, seed=1, **kw),
    "episodes": lambda **kw: rb.UniformReplayBuffer(
        {**spec(), "step_type": rb.ArraySpec((), np.int32)}, 3, 7, seed=1,
        track_episodes=True, **kw),
    "prioritized": lambda **kw: rb.PrioritizedReplayBuffer(spec(), 3, 7, seed=1, **kw),
    "fifo": lambda **kw: rb.FIFOReplayBuffer(spec(), 3, 7, **kw),
    "shuffled": lambda **kw: rb.ShuffledReplayBuffer(spec(), 3, 7, seed=1, **kw),
}


def step(t, buf):
    out = item(t, buf.batch_size)
    if "step_type" in buf.data_spec:
        out["step_type"] = np.full(buf.batch_size, 0 if t % 4 == 0 else 1, np.int32)
    return out


def play(buf, ops, t0=0):
    """Run ``ops`` on ``buf``; everything it returns, as arrays (errors as names)."""
    out, t = [], t0
    for op, n in ops:
        try:
            if op == "add":
                buf.add_batch(step(t, buf))
                t += 1
            elif op == "extend":
                steps = [step(t + k, buf) for k in range(n)]
                buf.extend({key: np.stack([s[key] for s in steps], 1) for key in steps[0]})
                t += n
            elif op == "sample":
                got, info = buf.get_next(2, num_steps=min(n, 2))
                out += [got["step"], got["value"], info.ids, info.probabilities]
                if isinstance(buf, rb.PrioritizedReplayBuffer):
                    buf.update_priorities(info.ids[:, 0], np.arange(1.0, 3.0))
            elif op == "clear":
                buf.clear()
        except rb.EmptyBufferError as exc:
            out.append(type(exc).__name__)
        out.append(np.int64(buf.last_id))
    return out, t


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, str):
            assert x == y
        else:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


OPS = st.lists(st.tuples(st.sampled_from(["add", "add", "extend", "sample", "sample",
                                          "clear"]), st.integers(1, 9)), max_size=30)


@pytest.mark.parametrize("kind", sorted(CLASSES))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(before=OPS, after=OPS)
def test_mmap_storage_behaves_as_numpy_and_resumes_exactly(tmp_path_factory, kind, before,
                                                           after):
    """A buffer on files returns what the same buffer in RAM returns; closed and reopened,
    it goes on returning exactly that."""
    path = tmp_path_factory.mktemp("mmap") / "buffer"
    ram, disk = CLASSES[kind](), CLASSES[kind](storage="mmap", path=path)
    got_ram, t = play(ram, before)
    got_disk, _ = play(disk, before)
    assert_same(got_ram, got_disk)
    disk.close()
    with pytest.raises(ValueError, match="is closed"):
        disk.add_batch(step(0, disk))
    again = rb.reopen(path)
    assert type(again) is type(ram) and again.last_id == ram.last_id
    assert_same(play(ram, after, t)[0], play(again, after, t)[0])


def test_steps_after_the_last_flush_come_back_on_reopen(tmp_path):
    buf = rb.PrioritizedReplayBuffer(spec(), 3, 50, seed=0, storage="mmap",
                                     path=tmp_path / "b")
    for t in range(20):
        buf.add_batch(item(t, 3))
    buf.flush()
    for t in range(20, 70):  # wraps the ring after the flush
        buf.add_batch(item(t, 3))
    del buf  # no close: as if the process had died
    again = rb.reopen(tmp_path / "b")
    assert again.last_id == 69
    assert_consistent(again)
    _, info = again.get_next(64)
    assert (info.ids >= (70 - 50) * 3).all()  # only retained steps are drawn
    # Steps in slots that were empty at the flush are drawn too: they came back with
    # the maximum priority, as adds bring them.
    assert ((info.ids // 3) % 50 >= 20).any()


def test_a_clear_after_the_last_flush_is_not_undone(tmp_path):
    buf = rb.UniformReplayBuffer(spec(), 3, 50, seed=0, storage="mmap", path=tmp_path / "b")
    for t in range(30):
        buf.add_batch(item(t, 3))
    buf.flush()
    buf.clear()
    for t in range(5):
        buf.add_batch(item(t, 3))
    del buf
    again = rb.reopen(tmp_path / "b")
    assert again.last_id == 4
    assert_consistent(again)


KILLED_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import replaybuffer as rb
    from test_checkpoints import item, spec
    buf = rb.UniformReplayBuffer(spec(), 4, 3_000, seed=0, storage="mmap", path={path!r})
    t = 0
    while True:
        buf.add_batch(item(t, 4))
        if t % 500 == 0:
            buf.flush()
        print(t, flush=True)
        t += 1
""")


def test_a_process_killed_while_adding_leaves_no_torn_step(tmp_path):
    """SIGKILL a process adding (and flushing now and then) at random moments: on
    reopen every retained step is whole and the newest step reported added is there."""
    rng = random.Random(0)
    for trial in range(4):
        path = tmp_path / f"b{trial}"
        proc = subprocess.Popen([sys.executable, "-c",
                                 KILLED_WRITER.format(tests=TESTS, path=str(path))],
                                stdout=subprocess.PIPE, text=True)
        try:
            proc.stdout.readline()
            time.sleep(rng.uniform(0.2, 1.0))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        added = [int(line) for line in proc.stdout.read().split()]
        again = rb.reopen(path)
        assert again.last_id >= (added[-1] if added else 0)
        assert_consistent(again)


CUT_COMMIT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    import replaybuffer as rb
    from replaybuffer.storage import mmap_storage
    from test_checkpoints import item, spec
    buf = rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path={path!r})
    for t in range(13):
        buf.add_batch(item(t, 2))
    def half_then_die(self, start, count, row):
        for name, array in self._data_arrays().items():  # half of one array, then death
            array[start:start + 1] = 255
            os._exit(0)
    mmap_storage.MmapStorage._apply = half_then_die
    buf.add_batch(item({step}, 2))
""")


@pytest.mark.parametrize("committed", [False, True])
def test_a_commit_cut_short_is_replayed_or_never_happened(tmp_path, committed):
    """A process that dies while copying a committed step to its place: reopening
    replays the journal (the step is kept, whole). One that dies before the commit
    point leaves the files as they were (the step is lost, nothing torn)."""
    path = tmp_path / "b"
    script = CUT_COMMIT.format(tests=TESTS, path=str(path), step=13)
    if not committed:  # die while staging: before the commit point
        script = script.replace("mmap_storage.MmapStorage._apply = half_then_die",
                                "buf._commit = lambda last_id: os._exit(0)")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    again = rb.reopen(path)
    assert again.last_id == (13 if committed else 12)
    assert_consistent(again)


def test_refusals_touch_nothing(tmp_path):
    buf = rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path=tmp_path / "b")
    for t in range(5):
        buf.add_batch(item(t, 2))
    with pytest.raises(rb.CheckpointError, match="in use by another buffer"):
        rb.reopen(tmp_path / "b")
    buf.close()
    before = {p: p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    with pytest.raises(rb.CheckpointError, match="not a new or empty directory"):
        rb.UniformReplayBuffer(spec(), 2, 10, storage="mmap", path=tmp_path / "b")
    with pytest.raises(rb.CheckpointError, match="reopen it with replaybuffer.reopen"):
        rb.load(tmp_path / "b" / "state")
    (tmp_path / "c").mkdir()
    with pytest.raises(rb.CheckpointError, match="holds no buffer on mmap storage"):
        rb.reopen(tmp_path / "c")
    records = tmp_path / "b" / "data" / "records.npy"  # every leaf here is packed
    np.save(records, np.zeros(5, np.int64))
    before[records] = records.read_bytes()
    with pytest.raises(rb.CheckpointError, match=r"records.npy: expected shape \(20,\) .*"
                                                 r"found shape \(5,\) dtype int64"):
        rb.reopen(tmp_path / "b")
    assert {p: p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()} == before
    with pytest.raises(ValueError, match="storage='mmap' needs path="):
        rb.UniformReplayBuffer(spec(), 2, 10, storage="mmap")
    with pytest.raises(ValueError, match="storage='mmap' needs path="):
        rb.UniformReplayBuffer(spec(), 2, 10, path=tmp_path / "d")


def test_a_checkpoint_of_an_mmap_buffer_loads_into_ram(tmp_path):
    buf = rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path=tmp_path / "b")
    for t in range(15):
        buf.add_batch(item(t, 2))
    buf.save(tmp_path / "ckpt")
    again = rb.load(tmp_path / "ckpt")  # into RAM: a checkpoint has no path
    assert again.storage == "numpy" and again.last_id == 14
    assert_consistent(again)


BIGGER_THAN_ALLOWED = textwrap.dedent("""
    import resource, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import replaybuffer as rb
    from test_checkpoints import items
    limit = {limit}
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        np.ones(2 * limit // 3, np.uint8)  # the limit binds anonymous memory ...
    except MemoryError:
        pass
    else:
        raise SystemExit("RLIMIT_DATA did not bind")
    spec = {{"step": rb.ArraySpec((), np.int64), "frame": rb.ArraySpec((64, 1024), np.uint8)}}
    buf = rb.UniformReplayBuffer(spec, 1, {steps}, seed=0, storage="mmap", path={path!r})
    assert buf.nbytes > 2 * limit  # ... not the files
    block, base = 20, np.arange(65536)
    for start in range(0, {steps}, block):
        steps = np.arange(start, start + block)
        frames = ((steps[:, None] + base) % 251).astype(np.uint8).reshape(1, block, 64, 1024)
        buf.extend({{"step": steps[None], "frame": frames}})
    got, _ = buf.get_next(16)
    for t, frame in zip(got["step"], got["frame"]):
        assert (frame.ravel() == (t + base) % 251).all()
    print(buf.nbytes, limit)
""")


def test_a_buffer_larger_than_the_memory_its_process_may_allocate(tmp_path):
    """A subprocess whose anonymous memory is capped (RLIMIT_DATA, 160 MB) fills a
    buffer of about 400 MB on files and reads it back right."""
    limit, steps = 160 << 20, 6_000
    out = subprocess.run([sys.executable, "-c", BIGGER_THAN_ALLOWED.format(
        tests=TESTS, limit=limit, steps=steps, path=str(tmp_path / "big"))],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    nbytes, cap = map(int, out.stdout.split())
    assert nbytes > 2 * cap


def test_inspect_describes_an_mmap_buffer(tmp_path, capsys):
    from replaybuffer.cli import main

    buf = rb.UniformReplayBuffer(spec(), 2, 10, seed=0, storage="mmap", path=tmp_path / "b")
    for t in range(3):
        buf.add_batch(item(t, 2))
    buf.flush()
    buf.add_batch(item(3, 2))
    assert main(["inspect", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "a buffer on mmap storage; its files hold last_id=3" in out
    assert "state from the last flush: last_id=2" in out and "data/records.npy" in out
