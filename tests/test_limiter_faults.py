"""Rate limiters that never wait forever and never miscount (issue 28, items 4, 8, 9).

- A sample admitted by the limiter and then refused (an empty buffer, a failing draw)
  is not counted, in-process and in the shared buffer (item 4).
- An insert and a sample waiting on each other, neither able to go ahead, are a
  deadlock: one is refused with a ``ValueError`` naming it, the other goes on (item 8).
- A NaN or negative ``timeout`` is a bad argument at every public entry point, refused
  before anything is counted or written (item 9).

Every test that waits does so in a thread joined with a timeout, so a regression fails
in seconds instead of hanging the suite.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import re
import threading
import time

import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.arguments import check_timeout
from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.errors import EmptyBufferError

SPEC = rb.ArraySpec((), np.int64, "x")
DEADLOCK = "deadlock: the {} of 15 items waits for .* would wait forever"
BAD_TIMEOUT = "timeout must be None or a number of seconds >= 0, got {}"


def window_0_20() -> rb.RateLimiter:
    """The issue's window: ``[0, 20]``, one sample per insert, samples from one item."""
    return rb.RateLimiter(1.0, 1, 0.0, 20.0)


def local(limiter: rb.RateLimiter | None = None, max_length: int = 100) -> rb.ReplayBuffer:
    return rb.UniformReplayBuffer(SPEC, 1, max_length, seed=0, rate_limiter=limiter)


def shared(limiter: rb.RateLimiter | None = None) -> SharedReplayBuffer:
    return SharedReplayBuffer(SPEC, 2, 50, seed=0, rate_limiter=limiter)


def add(buffer, steps: int) -> None:
    for t in range(steps):
        buffer.add_batch(np.array([t], np.int64))


def in_thread(call) -> tuple[threading.Thread, dict]:
    """Run ``call`` in a daemon thread; its result or error lands in the dict."""
    out: dict = {}

    def run():
        try:
            out["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def wait_until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


# ------------------------------------------------- item 4: refused samples uncounted
def test_a_refused_local_sample_is_not_counted_and_holds_nothing_back():
    buffer = local(rb.SampleToInsertRatio(1.0, 2, 4.0))  # window [-2, 6]
    add(buffer, 3)
    with pytest.raises(EmptyBufferError, match="num_steps=5 is longer than a row of"):
        buffer.get_next(2, num_steps=5, block=False)
    assert buffer.stats().samples == 0
    # The window lets 5 items be sampled (diff 3 down to min_diff -2), all of them.
    assert buffer.get_next(5, block=False) is not None
    assert buffer.stats().samples == 5


def test_a_local_draw_that_fails_is_not_counted(monkeypatch):
    """Fault injection: the storage fails while gathering an admitted sample."""
    buffer = local(rb.SampleToInsertRatio(1.0, 2, 4.0))
    add(buffer, 3)
    gather = buffer._storage.gather

    def broken(positions):
        raise OSError("injected: the storage failed mid-read")

    monkeypatch.setattr(buffer._storage, "gather", broken)
    with pytest.raises(OSError, match="injected"):
        buffer.get_next(5)
    monkeypatch.setattr(buffer._storage, "gather", gather)
    assert buffer.stats().samples == 0
    assert buffer.get_next(5, block=False) is not None


def test_a_sample_that_can_never_be_read_is_refused_before_the_limiter_waits():
    """``num_steps`` beyond ``max_length`` is refused at once, not after a wait for
    admission that could only end in the same refusal (or never, without timeout)."""
    buffer = local(rb.MinSize(5), max_length=8)
    add(buffer, 1)  # the limiter holds every sample back
    thread, out = in_thread(lambda: buffer.get_next(1, num_steps=9, timeout=3))
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(out.get("error"), EmptyBufferError), out
    assert "exceeds max_length=8" in str(out["error"])
    stats = buffer.stats()
    assert (stats.samples, stats.samples_blocked) == (0, 0)


def test_a_refused_shared_sample_is_not_counted_and_holds_nothing_back():
    with shared(rb.SampleToInsertRatio(1.0, 2, 4.0)) as buffer:
        add(buffer, 3)
        with pytest.raises(EmptyBufferError, match="no row holds 5 step"):
            buffer.get_next(2, num_steps=5, block=False)
        assert buffer.stats().samples == 0
        assert buffer.get_next(5, block=False) is not None
        assert buffer.stats().samples == 5


def test_a_shared_draw_that_fails_gives_its_admission_back(monkeypatch):
    """Fault injection: the shared sampler fails after the limiter admitted (and, across
    processes, already counted) the sample."""
    with shared(rb.SampleToInsertRatio(1.0, 2, 4.0)) as buffer:
        add(buffer, 3)
        draw = buffer._sampler.draw

        def broken(count, steps, rng, *choice):
            raise OSError("injected: the draw failed")

        monkeypatch.setattr(buffer._sampler, "draw", broken)
        with pytest.raises(OSError, match="injected"):
            buffer.get_next(4)
        monkeypatch.setattr(buffer._sampler, "draw", draw)
        assert buffer.stats().samples == 0
        assert buffer.get_next(5, block=False) is not None


# ------------------------------------------------------ item 8: waits on each other
@pytest.mark.parametrize("make", [local, shared], ids=["local", "shared"])
def test_an_insert_that_deadlocks_with_a_waiting_sample_is_refused(make):
    """At diff 10 in [0, 20] a sample of 15 waits for inserts, and an insert of 15 would
    wait for samples: the insert is refused, the sample goes on once inserts come."""
    buffer = make(window_0_20())
    try:
        add(buffer, 10)
        thread, out = in_thread(lambda: buffer.get_next(15, timeout=10))
        wait_until(lambda: buffer.stats().samples_blocked == 1)
        time.sleep(0.05)  # the sampler is waiting (and, shared, has said so)
        started = time.monotonic()
        with pytest.raises(ValueError, match=DEADLOCK.format("insert")):
            buffer.extend(np.zeros((1, 15), np.int64), timeout=10)
        assert time.monotonic() - started < 5  # refused, not timed out
        stats = buffer.stats()
        assert (stats.inserts, stats.samples, len(buffer)) == (10, 0, 10)  # nothing moved
        add(buffer, 5)  # diff 15: the sample may go
        thread.join(10)
        assert not thread.is_alive() and "error" not in out, out
        assert buffer.stats().samples == 15
    finally:
        if isinstance(buffer, SharedReplayBuffer):
            buffer.close()


@pytest.mark.parametrize("make", [local, shared], ids=["local", "shared"])
def test_a_sample_that_deadlocks_with_a_waiting_insert_is_refused(make):
    buffer = make(window_0_20())
    try:
        add(buffer, 10)
        thread, out = in_thread(lambda: buffer.extend(np.zeros((1, 15), np.int64),
                                                      timeout=10))
        wait_until(lambda: buffer.stats().inserts_blocked == 1)
        time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(ValueError, match=DEADLOCK.format("sample")):
            buffer.get_next(15, timeout=10)
        assert time.monotonic() - started < 5
        assert buffer.stats().samples == 0
        assert buffer.get_next(5, timeout=5) is not None  # diff 5: the insert may go
        thread.join(10)
        assert not thread.is_alive() and out.get("result") is True, out
        assert (buffer.stats().inserts, len(buffer)) == (25, 25)
    finally:
        if isinstance(buffer, SharedReplayBuffer):
            buffer.close()


def sample_15(buffer: SharedReplayBuffer, results) -> None:
    """In a child process: wait to sample 15 items, report what happened."""
    try:
        results.put(("sampled", len(buffer.get_next(15, timeout=20)[0])))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(("error", repr(exc)))


def test_a_deadlock_across_processes_is_refused():
    """The sampler waits in another process: the insert still sees it (the control
    block's waiting calls) and is refused; the sampler goes on once inserts come."""
    spawn = mp.get_context("spawn")
    with shared(window_0_20()) as buffer:
        add(buffer, 10)
        results = spawn.Queue()
        child = spawn.Process(target=sample_15, args=(buffer, results), daemon=True)
        child.start()
        try:
            wait_until(lambda: buffer.stats().samples_blocked == 1, seconds=30)
            time.sleep(0.05)
            with pytest.raises(ValueError, match=DEADLOCK.format("insert")):
                buffer.extend(np.zeros((1, 15), np.int64), timeout=10)
            add(buffer, 5)
            assert results.get(timeout=20) == ("sampled", 15)
            child.join(20)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()


def test_calls_that_can_both_go_ahead_in_turn_are_not_refused():
    """The check refuses only a pair that are both held back: a sample waiting for
    inserts beside an insert that fits is not a deadlock."""
    buffer = local(window_0_20())
    add(buffer, 10)
    thread, out = in_thread(lambda: buffer.get_next(15, timeout=10))
    wait_until(lambda: buffer.stats().samples_blocked == 1)
    assert buffer.extend(np.zeros((1, 5), np.int64), timeout=10)  # diff 15
    thread.join(10)
    assert not thread.is_alive() and "error" not in out, out


def test_the_deadlock_condition_is_both_sides_held_back():
    limiter = window_0_20()
    limiter.inserts = 10  # diff 10 in [0, 20]
    assert limiter.deadlocked(15, 15, 10)  # needs diff <= 5 and >= 15
    assert not limiter.deadlocked(5, 15, 10)  # the insert goes
    assert not limiter.deadlocked(15, 5, 10)  # the sample goes


# ----------------------------------------------------- item 9: NaN and negative waits
@pytest.mark.parametrize("value", [math.nan, -1, -0.5, "1", True, [1.0]])
def test_the_timeout_check_refuses_what_could_never_end_a_wait(value):
    with pytest.raises(ValueError, match=BAD_TIMEOUT.format(re.escape(repr(value)))):
        check_timeout(value)


@pytest.mark.parametrize("value", [None, 0, 0.25, 3, math.inf, np.float32(1.5),
                                   np.int64(2)])
def test_the_timeout_check_takes_seconds_and_none(value):
    assert check_timeout(value) == (None if value is None else float(value))


def local_calls(buffer):
    return {"add_batch": lambda t: buffer.add_batch(np.array([0], np.int64), timeout=t),
            "extend": lambda t: buffer.extend(np.zeros((1, 2), np.int64), timeout=t),
            "get_next": lambda t: buffer.get_next(1, timeout=t)}


@pytest.mark.parametrize("call", ["add_batch", "extend", "get_next"])
@pytest.mark.parametrize("limiter", [None, "window"], ids=["no limiter", "limiter"])
@pytest.mark.parametrize("value", [math.nan, -1.0])
def test_a_local_entry_point_refuses_a_bad_timeout_and_changes_nothing(call, limiter,
                                                                         value):
    buffer = local(None if limiter is None else window_0_20())
    add(buffer, 2)
    before = (len(buffer), buffer.last_id, buffer.stats())
    thread, out = in_thread(lambda: local_calls(buffer)[call](value))
    thread.join(10)
    assert not thread.is_alive(), "waited on a timeout it should have refused"
    assert isinstance(out.get("error"), ValueError), out
    assert str(out["error"]) == BAD_TIMEOUT.format(repr(value))
    assert (len(buffer), buffer.last_id, buffer.stats()) == before


@pytest.mark.parametrize("call", ["add_batch", "extend", "get_next"])
@pytest.mark.parametrize("value", [math.nan, -1.0])
def test_a_shared_entry_point_refuses_a_bad_timeout_and_changes_nothing(call, value):
    with shared(window_0_20()) as buffer:
        add(buffer, 2)
        before = (len(buffer), buffer.stats())
        thread, out = in_thread(lambda: local_calls(buffer)[call](value))
        thread.join(10)
        assert not thread.is_alive(), "waited on a timeout it should have refused"
        assert isinstance(out.get("error"), ValueError), out
        assert str(out["error"]) == BAD_TIMEOUT.format(repr(value))
        assert (len(buffer), buffer.stats()) == before


def test_a_nan_timeout_never_reaches_a_wait_from_other_buffer_kinds():
    """Callers outside the checked entry points (transition buffers' ``sample``) meet
    the same check in the limiter before they would wait."""
    buffer = rb.TransitionReplayBuffer(rb.ArraySpec((2,), np.float32),
                                       rb.ArraySpec((), np.int64), 16, seed=0,
                                       rate_limiter=rb.MinSize(4))
    thread, out = in_thread(lambda: buffer.sample(1, timeout=math.nan))
    thread.join(10)
    assert not thread.is_alive(), "waited forever on timeout=nan"
    assert isinstance(out.get("error"), ValueError), out
    assert "timeout" in str(out["error"]) and "nan" in str(out["error"])
    assert buffer.stats().samples_blocked == 0  # refused before it was counted


def test_ray_get_next_checks_its_timeout_before_asking_any_shard():
    """Without starting Ray: the argument path of ``RayReplayBuffer.get_next`` refuses
    the timeout before it touches the buffer's state (an object with none here)."""
    from replaybuffer.distributed.ray_shards.buffer import RayReplayBuffer

    bare = RayReplayBuffer.__new__(RayReplayBuffer)
    for value in (math.nan, -2.0):
        with pytest.raises(ValueError, match=BAD_TIMEOUT.format(re.escape(repr(value)))):
            bare.get_next(4, timeout=value)
