"""Checkpoints while the buffer is in use: copy-on-write snapshots, checkpoint series,
processes killed mid-save, failing disks, and format-1 saves."""

import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer import persist

DATA = Path(__file__).parent / "data"


# ------------------------------------------------------------ a self-checking buffer
def spec(frame_stack=False):
    """Every leaf of step ``t`` in row ``r`` is a function of ``(t, r)``: a loaded buffer
    is consistent when each position's leaves agree with its ``step`` leaf."""
    obs = rb.ArraySpec((3, 4, 4) if frame_stack else (4, 4), np.uint8, "observation")
    return {"step": rb.ArraySpec((), np.int64), "row": rb.ArraySpec((), np.int64),
            "observation": obs, "value": rb.ArraySpec((5,), np.float32)}


def frame(t, r):
    """uint8-range int64 ``[..., 4, 4]`` frames of steps ``t`` and rows ``r`` (broadcast)."""
    t, r = np.asarray(t)[..., None, None], np.asarray(r)[..., None, None]
    return (np.arange(16, dtype=np.int64).reshape(4, 4) * 7 + t * 31 + r * 13) % 251


def items(t, rows, frame_stack=False):
    """The leaves of steps ``t`` in rows ``rows`` (int arrays of one shape ``S``)."""
    t, rows = np.broadcast_arrays(np.asarray(t, np.int64), np.asarray(rows, np.int64))
    if frame_stack:  # stacks of the last 3 frames, the first repeated at the start
        obs = np.stack([frame(np.maximum(t - k, 0), rows) for k in (2, 1, 0)], -3)
    else:
        obs = frame(t, rows)
    value = t[..., None] * 10 + rows[..., None] + np.arange(5)
    return {"step": t, "row": rows, "observation": obs.astype(np.uint8),
            "value": value.astype(np.float32)}


def item(t, B, frame_stack=False):
    """One ``add_batch`` of step ``t`` to ``B`` rows."""
    return items(np.full(B, t), np.arange(B), frame_stack)


def make(B=3, L=7, frame_stack=False, cls=rb.UniformReplayBuffer, **kw):
    return cls(spec(frame_stack), B, L, seed=1,
               frame_stack="observation" if frame_stack else None, **kw)


def assert_consistent(buf, frame_stack=False):
    """Each row holds consecutive steps ending at ``last_id``, every leaf matching."""
    everything = buf.gather_all()
    B, n = everything["step"].shape
    steps = np.arange(buf.last_id - n + 1, buf.last_id + 1)
    want = items(steps[None, :], np.arange(B)[:, None], frame_stack)
    for key in want:
        np.testing.assert_array_equal(everything[key], want[key], err_msg=key)


# ------------------------------------------------------------------- copy-on-write
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame_stack=st.booleans(), before=st.integers(0, 20),
       ops=st.lists(st.tuples(st.sampled_from(["add", "extend", "chunk", "clear0"]),
                              st.integers(1, 9)), max_size=25))
def test_a_snapshot_reads_what_the_buffer_held_when_it_was_taken(frame_stack, before, ops):
    """Chunks read between writes (adds, extends, wraps, clear(zero_storage)) give exactly
    the arrays of the moment the snapshot began: the reference is a full copy taken then."""
    B = 2
    buf = make(B, 6, frame_stack)
    t = 0
    for _ in range(before):
        buf.add_batch(item(t, B, frame_stack))
        t += 1
    with buf._lock:
        state, streams = buf.snapshot()
        reference = {name: [np.array(a) for a in rows._read(np.arange(rows.count))]
                     for name, rows in streams.items()}
    got = {name: [[] for _ in rows.specs] for name, rows in streams.items()}
    done = {name: 0 for name in streams}
    for op, n in ops:
        if op == "add":
            buf.add_batch(item(t, B, frame_stack))
            t += 1
        elif op == "extend":
            steps = [item(t + k, B, frame_stack) for k in range(n)]
            buf.extend({key: np.stack([s[key] for s in steps], 1) for key in steps[0]})
            t += n
        elif op == "clear0":
            buf.clear(zero_storage=True)
        else:
            for name, rows in streams.items():
                stop = min(rows.count, done[name] + n)
                with buf._lock:
                    for out, arr in zip(got[name], rows.read(done[name], stop)):
                        out.append(arr)
                done[name] = stop
    for name, rows in streams.items():
        with buf._lock:
            for out, arr in zip(got[name], rows.read(done[name], rows.count)):
                out.append(arr)
        for leaf, ref in zip(got[name], reference[name]):
            np.testing.assert_array_equal(np.concatenate(leaf), ref)
    with buf._lock:
        buf.release_snapshot()
    assert type(buf._storage) is rb.storage.NumpyStorage
    assert buf._codec is None or buf._codec.guard is None


def test_the_fused_writer_comes_back_after_a_save(tmp_path):
    buf = make()
    writer = buf._write_exact
    assert writer is not None
    buf.add_batch(item(0, 3))
    buf.save(tmp_path / "c")
    assert buf._write_exact is writer and type(buf._storage).__name__ == "NumpyStorage"


def snapshot_during(buf, frame_stack, blocked_add, then):
    """Start ``blocked_add`` (a thread's target adding step ``max_length`` to a full
    buffer) with the lock held; ``then()`` returns once that add waits, and a save's
    snapshot begins. The function ``then`` returned is called after the lock is let go
    (it unblocks the add). The snapshot must still read what the add overwrote."""
    L = buf.max_length
    with buf._lock:
        adder = threading.Thread(target=blocked_add)
        adder.start()
        after = then()
        state, streams = buf.snapshot()
        reference = {name: [np.array(a) for a in rows._read(np.arange(rows.count))]
                     for name, rows in streams.items()}
    after()
    adder.join(10)
    assert buf.last_id == L, "the add was written"
    with buf._lock:
        for name, rows in streams.items():
            for got, want in zip(rows.read(0, rows.count), reference[name]):
                np.testing.assert_array_equal(got, want, err_msg=name)
        buf.release_snapshot()
    assert_consistent(buf, frame_stack)


@pytest.mark.parametrize("frame_stack", [False, True])
def test_an_add_waiting_for_the_lock_as_a_snapshot_begins_preserves_what_it_overwrites(
        frame_stack):
    """An add that saw the fused writer before a save's snapshot paused it, then waited
    for the lock while the snapshot began, writes through the copy-on-write storage."""
    B, L = 3, 4
    buf = make(B, L, frame_stack)
    for t in range(L):  # full: the next add overwrites step 0
        buf.add_batch(item(t, B, frame_stack))
    lock, waiting = buf._lock, threading.Event()

    class Announcing:  # the buffer's lock, saying when an add starts to wait for it
        def __enter__(self):
            waiting.set()
            return lock.__enter__()

        def __exit__(self, *exc):
            return lock.__exit__(*exc)

    def then():
        assert waiting.wait(10), "the add never reached the lock"
        buf._lock = lock
        return lambda: None

    buf._lock = Announcing()
    snapshot_during(buf, frame_stack, lambda: buf.add_batch(item(L, B, frame_stack)), then)


@pytest.mark.parametrize("frame_stack", [False, True])
def test_an_add_held_by_the_rate_limiter_as_a_snapshot_begins_preserves_what_it_overwrites(
        frame_stack):
    """The rate limiter's wait lets go of the lock: a snapshot can begin while an add
    waits there, and the add then writes through the copy-on-write storage."""
    B, L = 3, 4
    limiter = rb.RateLimiter(1.0, 1, -np.inf, B * L)  # the fifth add waits for a sample
    buf = make(B, L, frame_stack)
    buf.rate_limiter = limiter
    for t in range(L):
        buf.add_batch(item(t, B, frame_stack))

    def then():
        lock = buf._lock
        lock.release()  # let the add reach the limiter's wait (which lets go of the lock)
        try:
            deadline = time.monotonic() + 10
            while limiter.inserts_blocked == 0:
                assert time.monotonic() < deadline, "the add was never held back"
                time.sleep(0.001)
        finally:
            lock.acquire()
        return lambda: buf.get_next(B)  # a sample lets the add go ahead

    snapshot_during(buf, frame_stack, lambda: buf.add_batch(item(L, B, frame_stack)), then)


@pytest.mark.parametrize("frame_stack, storage", [(False, "numpy"), (True, "numpy"),
                                                  (False, "torch"), (False, "mmap")])
def test_save_while_a_collector_adds_is_consistent_and_resumable(tmp_path, monkeypatch,
                                                                 frame_stack, storage):
    """A thread adds throughout a save made of many small chunks; the checkpoint is one
    consistent moment of the buffer, and the adds went on (none blocked for the save)."""
    monkeypatch.setattr(persist, "CHUNK_BYTES", 256)  # a chunk of one or two positions
    B, L = 3, 400
    where = {"path": tmp_path / "files"} if storage == "mmap" else {}
    buf = make(B, L, frame_stack, storage=storage, **where)
    for t in range(500):
        buf.add_batch(item(t, B, frame_stack))
    stop, added = threading.Event(), [500]

    def collect():
        while not stop.is_set():
            buf.add_batch(item(added[0], B, frame_stack))
            added[0] += 1

    thread = threading.Thread(target=collect)
    thread.start()
    try:
        buf.save(tmp_path / "c")
    finally:
        stop.set()
        thread.join()
    again = rb.load(tmp_path / "c")
    assert 500 <= again.last_id + 1 < added[0], "the adds ran during the save"
    assert_consistent(again, frame_stack)
    assert_consistent(buf, frame_stack)


# ------------------------------------------------------------------ checkpoint series
def test_keep_n_keeps_the_newest_and_each_loads(tmp_path):
    buf = make()
    written = []
    for t in range(5):
        buf.add_batch(item(t, 3))
        written.append(buf.save(tmp_path / "c", keep=2))
    assert rb.checkpoints(tmp_path / "c") == written[-2:]
    assert [p.name for p in written] == [f"ckpt-{n:06d}" for n in range(1, 6)]
    assert rb.load(tmp_path / "c").last_id == 4
    assert rb.load(written[-2]).last_id == 3  # one checkpoint, named directly
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == \
        ["ckpt-000004", "ckpt-000005"]
    with pytest.raises(ValueError, match="keep must be a positive int"):
        buf.save(tmp_path / "c", keep=0)


def test_load_checks_the_class_it_is_asked_for(tmp_path):
    make().save(tmp_path / "c")
    assert type(rb.load(tmp_path / "c", buffer_class=rb.UniformReplayBuffer)) is \
        rb.UniformReplayBuffer
    with pytest.raises(rb.CheckpointError, match="holds a UniformReplayBuffer, not a "
                                                 "PrioritizedReplayBuffer"):
        rb.load(tmp_path / "c", buffer_class=rb.PrioritizedReplayBuffer)


def test_an_abandoned_save_is_ignored_then_removed(tmp_path):
    buf = make()
    buf.add_batch(item(0, 3))
    buf.save(tmp_path / "c")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    partial = tmp_path / "c" / f".tmp-{dead}-abc"
    partial.mkdir()
    (partial / "leaf_000.npy").write_bytes(b"half")
    assert rb.load(tmp_path / "c").last_id == 0
    buf.add_batch(item(1, 3))
    buf.save(tmp_path / "c")
    assert not partial.exists()
    assert rb.load(tmp_path / "c").last_id == 1


def test_a_series_with_only_an_incomplete_save_says_so(tmp_path):
    (tmp_path / "c" / ".tmp-1-x").mkdir(parents=True)
    with pytest.raises(rb.CheckpointError, match=r"1 incomplete save\(s\) ignored"):
        rb.load(tmp_path / "c")


KILLED_SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_checkpoints import item, make
    buf = make(4, 20_000)
    t = 0
    while True:
        for _ in range(300):
            buf.add_batch(item(t, 4))
            t += 1
        buf.save({root!r}, keep=2)
        print(t - 1, flush=True)
""")


def test_a_save_killed_at_any_moment_leaves_the_last_checkpoint_loadable(tmp_path):
    """SIGKILL a process that adds and saves in a loop, at random moments and inside
    saves; after every kill the newest complete checkpoint loads, is consistent, and is
    one the process finished (or a later one it was publishing); partial saves are
    ignored."""
    root = tmp_path / "c"
    rng = random.Random(0)
    script = KILLED_SAVER.format(tests=str(Path(__file__).parent), root=str(root))
    finished, mid_save = [], 0
    deadline = time.monotonic() + 40
    for trial in range(8):
        if time.monotonic() > deadline:
            break
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                text=True)
        try:
            finished.append(int(proc.stdout.readline()))  # one save done at least
            if trial % 2:  # a random moment: adding or saving
                time.sleep(rng.uniform(0.0, 0.6))
            else:  # inside a save (its temporary directory is there), at a random point
                until = time.monotonic() + 10
                while not any(name.startswith(".tmp-") for name in os.listdir(root)) \
                        and time.monotonic() < until:
                    pass  # no sleep: a save lasts a few milliseconds
                time.sleep(rng.uniform(0.0, 0.002))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finished += [int(line) for line in proc.stdout.read().split()]
        mid_save += any(p.name.startswith(".tmp-") for p in root.iterdir())
        again = rb.load(root)
        assert again.last_id >= finished[-1], (trial, again.last_id, finished)
        assert_consistent(again)
        assert len(rb.checkpoints(root)) <= 3  # keep=2, plus one mid-publication
    # Half the kills wait for a save to begin, then kill within 2 ms: some land in one
    # unless every such save finished first (each takes 3-7 ms here).
    assert mid_save >= 1, f"none of {trial + 1} kills landed mid-save: the test tested nothing"


def test_a_full_disk_fails_the_save_and_touches_nothing(tmp_path):
    """RLIMIT_FSIZE makes writes past a size fail as a full disk does (EFBIG)."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        import numpy as np
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import replaybuffer as rb
        from test_checkpoints import assert_consistent, item, make
        buf = make(3, 500)
        for t in range(10):
            buf.add_batch(item(t, 3))
        first = buf.save({str(tmp_path / "c")!r})
        for t in range(10, 600):
            buf.add_batch(item(t, 3))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
        try:
            buf.save({str(tmp_path / "c")!r})
        except rb.CheckpointError as exc:
            print("ERROR", exc)
        assert rb.checkpoints({str(tmp_path / "c")!r}) == [first]
        assert rb.load({str(tmp_path / "c")!r}).last_id == 9
        buf.add_batch(item(600, 3))  # the buffer goes on, whole
        assert_consistent(buf)
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERROR cannot save to" in out.stdout and "File too large" in out.stdout
    assert ".npy" in out.stdout  # the file that could not be written is named
    assert out.stdout.strip().endswith("OK")
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["ckpt-000001"]


def test_a_read_only_disk_fails_the_save_and_touches_nothing(tmp_path, monkeypatch):
    buf = make()
    buf.add_batch(item(0, 3))
    first = buf.save(tmp_path / "c")
    buf.add_batch(item(1, 3))

    def read_only(file, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))

    monkeypatch.setattr(persist.streams, "open", read_only, raising=False)  # opens the data files
    with pytest.raises(rb.CheckpointError, match=r"Read-only file system: '.*leaf_000\.npy'"):
        buf.save(tmp_path / "c")
    monkeypatch.undo()
    assert rb.checkpoints(tmp_path / "c") == [first]
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["ckpt-000001"]
    assert buf.last_id == 1 and buf._write_exact is not None
    assert_consistent(buf)


# ----------------------------------------------------------------------- format 1
def test_format_1_saves_still_load_and_continue_exactly():
    """tests/data/format1_prioritized_frames was written by the format-1 code (0c83f67)
    with the draws that followed the save; a load continues with the same draws."""
    buf = rb.load(DATA / "format1_prioritized_frames")
    assert type(buf) is rb.PrioritizedReplayBuffer and buf.last_id == 8
    expected = np.load(DATA / "format1_prioritized_frames_expected.npz")
    items, info = buf.get_next(5, num_steps=2)
    np.testing.assert_array_equal(items["observation"], expected["obs"])
    np.testing.assert_array_equal(items["step"], expected["step"])
    np.testing.assert_array_equal(info.ids, expected["ids"])
    np.testing.assert_array_equal(info.weights, expected["w"])
    np.testing.assert_array_equal(info.probabilities, expected["p"])


def test_saving_over_a_format_1_save_moves_it_to_the_series(tmp_path):
    import shutil

    root = tmp_path / "old"
    shutil.copytree(DATA / "format1_prioritized_frames", root)
    buf = rb.load(root)
    buf.save(root, keep=2)  # the format-1 save counts as the oldest checkpoint
    assert (root / "manifest.json").is_file() and len(rb.checkpoints(root)) == 1
    buf.save(root, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-000001", "ckpt-000002"]
    assert rb.load(root).last_id == 8


def test_a_newer_format_names_the_version_needed(tmp_path):
    import json

    written = make().save(tmp_path / "c")
    manifest = json.loads((written / "manifest.json").read_text())
    manifest["version"] = persist.VERSION + 1
    manifest["checksum"] = persist.manifest_checksum(manifest)
    (written / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(rb.CheckpointError, match=f"format version {persist.VERSION + 1}; "
                                                 "this replaybuffer reads versions 1, 2: "
                                                 "load it with a newer replaybuffer"):
        rb.load(tmp_path / "c")


def test_metadata_rides_in_the_manifest(tmp_path):
    buf = make()
    buf.save(tmp_path / "c", metadata={"step": 123, "run": "a"})
    assert persist.read_manifest(tmp_path / "c")["metadata"] == {"step": 123, "run": "a"}
    with pytest.raises(ValueError, match="metadata must be a JSON-able dict"):
        buf.save(tmp_path / "c", metadata={"f": object()})
    with pytest.raises(ValueError, match="metadata must be a JSON-able dict"):
        buf.save(tmp_path / "c", metadata=[1])
    assert len(rb.checkpoints(tmp_path / "c")) == 1


def test_two_savers_into_one_series_both_succeed(tmp_path):
    """Threads saving two buffers into one path at once: each save publishes its own
    checkpoint number, and pruning the same old checkpoint twice is no error."""
    buffers = [make(), make()]
    for t, buf in enumerate(buffers):
        buf.add_batch(item(t, 3))
    errors = []

    def save_many(buf):
        try:
            for _ in range(15):
                buf.save(tmp_path / "c", keep=2)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=save_many, args=(b,)) for b in buffers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    done = rb.checkpoints(tmp_path / "c")
    assert 1 <= len(done) <= 2 and done[-1].name == "ckpt-000030"
    assert rb.load(tmp_path / "c").last_id in (0, 1)


# ------------------------------------------------- transition checkpoints by content
def transition_steps(buf, ts, rows=1):
    """Add steps ``ts``: every 50th ends an episode and every 7th has an out-of-sequence
    next observation, so the side store holds some of them."""
    for t in ts:
        obs = np.full((rows, 4), t, np.float32) + np.arange(rows, dtype=np.float32)[:, None]
        nxt = obs + (1.5 if t % 7 == 6 else 1.0)
        buf.add(obs, np.full(rows, t % 2), np.full(rows, t, np.float32), nxt,
                np.full(rows, t % 50 == 49))


def assert_same_draws(a, b, count=64):
    (x, xi), (y, yi) = a.sample(count), b.sample(count)
    for got, want in zip(y, x):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(yi.ids, xi.ids)


def test_a_large_nearly_empty_transition_buffer_saves_what_it_holds(tmp_path):
    """1,000 transitions in a 1M-capacity buffer: the save is sized by the transitions
    (it wrote an 8 MB side_ref before), and the load continues exactly."""
    spec = rb.ArraySpec((4,), np.float32)
    buf = rb.TransitionReplayBuffer(spec, rb.BoundedArraySpec((), np.int64, 0, 1), 10**6,
                                    seed=3)
    transition_steps(buf, range(1000))
    saved = buf.save(tmp_path / "c")
    total = sum(f.stat().st_size for f in saved.iterdir())
    assert total < 200_000, sorted((f.name, f.stat().st_size) for f in saved.iterdir())
    back = rb.load(tmp_path / "c")
    assert back.last_id == buf.last_id == 999
    assert_same_draws(buf, back)
    transition_steps(buf, range(1000, 1100))  # writes over nothing, ends more episodes
    transition_steps(back, range(1000, 1100))
    assert_same_draws(buf, back)
    assert back.state_dict()["state"]["side_ref"].shape == \
        buf.state_dict()["state"]["side_ref"].shape


def test_transition_saves_of_a_wrapped_ring_and_of_every_env_resume_exactly(tmp_path):
    """The live range of side_ref after the ring wraps (every position) and with several
    envs; saved, restored and continued, draws agree."""
    spec = rb.ArraySpec((4,), np.float32)
    buf = rb.TransitionReplayBuffer(spec, rb.BoundedArraySpec((), np.int64, 0, 1), 300,
                                    num_envs=3, seed=5)
    transition_steps(buf, range(40), rows=3)
    first = rb.load(buf.save(tmp_path / "a"))
    transition_steps(buf, range(40, 170), rows=3)  # 170 steps of 100 per row: wrapped
    transition_steps(first, range(40, 170), rows=3)
    assert_same_draws(buf, first)
    second = rb.load(buf.save(tmp_path / "b"))
    transition_steps(buf, range(170, 230), rows=3)
    transition_steps(second, range(170, 230), rows=3)
    assert_same_draws(buf, second)


def test_a_side_store_grown_and_cleared_saves_its_free_list_as_runs():
    """The free list is written as runs of descending slots: after a clear, one run,
    whatever the store's capacity; restored, the store hands out the same slots."""
    from replaybuffer.storage.side_store import SideStore

    specs = [rb.ArraySpec((2,), np.float32)]
    store = SideStore(specs, capacity=4)
    store.put([np.zeros((5000, 2), np.float32)])  # grows to 8192 slots
    store.clear()
    store.put([np.ones((3, 2), np.float32)])
    state = store.state_dict()
    assert state["capacity"] == 8192 and state["free"].shape == (1, 2)
    other = SideStore(specs)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.put([np.zeros((9, 2), np.float32)]),
                                  store.put([np.zeros((9, 2), np.float32)]))


def test_a_bad_side_ref_is_refused_naming_it_and_changes_nothing():
    spec = rb.ArraySpec((4,), np.float32)
    buf = rb.TransitionReplayBuffer(spec, rb.BoundedArraySpec((), np.int64, 0, 1), 100,
                                    seed=3)
    transition_steps(buf, range(60))
    state = buf.state_dict()
    other = rb.TransitionReplayBuffer(spec, rb.BoundedArraySpec((), np.int64, 0, 1), 100,
                                      seed=3)
    transition_steps(other, range(10))
    before = other.state_dict()
    for bad in (np.zeros(101, np.int64), np.zeros((2, 5), np.int64),
                np.zeros(5, np.float32)):
        broken = dict(state, state=dict(state["state"], side_ref=bad))
        with pytest.raises(rb.CheckpointError, match=r"side_ref: expected integers "
                                                     r"\[n <= 100\]"):
            other.load_state_dict(broken)
        after = other.state_dict()
        assert after["state"]["last_id"] == before["state"]["last_id"] == 9
        np.testing.assert_array_equal(after["state"]["side_ref"],
                                      before["state"]["side_ref"])


def test_transition_saves_with_full_size_side_refs_still_load_and_continue_exactly():
    """tests/data/format_transitions_full_side_ref was written by the code before
    checkpoints were sized by content (e353f95: side_ref of every position, the side
    store's whole free list), with the draws that followed its save and those after 30
    more steps; a load continues with the same draws."""
    buf = rb.load(DATA / "format_transitions_full_side_ref")
    expected = np.load(DATA / "format_transitions_full_side_ref_expected.npz")
    for prefix in ("a", "b"):
        if prefix == "b":
            for t in range(230, 260):
                obs = np.stack([np.full(3, t, np.float32), np.full(3, 100 + t, np.float32)])
                nxt = np.stack([np.full(3, t + 1, np.float32),
                                np.full(3, 101 + t, np.float32)])
                if t % 11 == 10:
                    nxt = nxt + 0.5
                buf.add(obs, np.array([t % 3, (t + 1) % 3]), np.full(2, t, np.float32), nxt,
                        np.array([t % 5 == 4, t % 7 == 6]), np.array([False, t % 13 == 12]))
        batch, info = buf.sample(16)
        got = {"obs": batch.observations, "act": batch.actions, "rew": batch.rewards,
               "next": batch.next_observations, "term": batch.terminated, "ids": info.ids}
        for key, value in got.items():
            np.testing.assert_array_equal(value, expected[f"{prefix}_{key}"], err_msg=key)
