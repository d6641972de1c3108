"""The prioritized ``add_batch`` step's shortcut (:mod:`replaybuffer.distributed.shared.
prioritized_steps`) against the general path (``SharedWriter._write_step``), byte for
byte over every shared array, and a writer killed at each of its crash points (issue 24:
the shared prioritized step path)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_shared_faults import SPEC, assert_tree_whole, crash_a_child, items_for
from test_shared_inserts import state_of

import replaybuffer as rb
from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.distributed.shared import prioritized_steps

LIMITERS = {"none": lambda: None, "min_size": lambda: rb.MinSize(1),
            "ratio": lambda: rb.SampleToInsertRatio(1.0, 1, 1e9)}


def general_only(buffer: SharedReplayBuffer) -> SharedReplayBuffer:
    """``buffer`` with the prioritized step's shortcut off: every ``add_batch`` step
    written by ``_write_step``."""
    assert buffer._writer._quick is not None  # the shortcut is what the other one takes
    buffer._writer._quick = None
    return buffer


def act(buffer: SharedReplayBuffer, call: tuple, rows: int) -> object:
    """One call of the sequence: an add of step ``n`` (items naming it), a draw and an
    update of the drawn ids' priorities, an ``extend`` block, or a bad add."""
    kind, n = call
    first = buffer.rows[0] if buffer.rows else 0
    mine = np.arange(first, first + rows)
    step = int(buffer.steps_written()[first])
    try:
        if kind == "add":
            return buffer.add_batch(items_for(mine, np.full(rows, step)))
        if kind == "bad":  # a wrong dtype: refused before anything is written
            items = items_for(mine, np.full(rows, step))
            items["obs"] = items["obs"].astype(np.int64)
            return buffer.add_batch(items)
        if kind == "extend":
            t = 1 + n % 3
            steps = step + np.arange(t)
            items = items_for(np.repeat(mine, t), np.tile(steps, rows))
            return buffer.extend({k: v.reshape(rows, t, *v.shape[1:])
                                  for k, v in items.items()})
        _, info = buffer.get_next(4)
        return buffer.update_priorities(info.ids, 0.25 + (n % 7) * np.ones(len(info.ids)))
    except (rb.SpecError, ValueError) as error:
        return type(error), str(error)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 3), max_length=st.integers(1, 5),
       limiter=st.sampled_from(sorted(LIMITERS)), alpha=st.sampled_from([1.0, 0.6]),
       calls=st.lists(st.tuples(st.sampled_from(["add", "add", "add", "add", "draw",
                                                 "extend", "bad"]),
                                st.integers(0, 100)), min_size=1, max_size=24))
def test_the_prioritized_shortcut_writes_what_the_general_path_writes_byte_for_byte(
        rows, max_length, limiter, alpha, calls):
    """The same calls into a buffer with the shortcut and one without (the same seed):
    the same results, and after each call every shared array (data, versions, heads,
    held counts, the tree, the largest priority, ``tree_intent``, the limiter's
    counters) byte for byte the same, across the ring's wrap."""
    with SharedReplayBuffer(SPEC, rows, max_length, prioritized=True, alpha=alpha, seed=3,
                            rate_limiter=LIMITERS[limiter]()) as fast, \
            SharedReplayBuffer(SPEC, rows, max_length, prioritized=True, alpha=alpha,
                               seed=3, rate_limiter=LIMITERS[limiter]()) as plain:
        fast.claim_rows(rows)
        general_only(plain).claim_rows(rows)
        for call in calls:
            if call[0] == "draw" and len(fast) == 0:
                continue
            assert act(fast, call, rows) == act(plain, call, rows), call
            assert state_of(fast) == state_of(plain), call
        assert len(fast) == len(plain)


def test_a_usual_prioritized_add_takes_the_shortcut_and_one_lock(monkeypatch):
    """An ``add_batch`` step of a prioritized buffer goes through the shortcut (never
    ``_write_step``), taking the buffer's lock once."""
    with SharedReplayBuffer(SPEC, 1, 4, prioritized=True, seed=0) as buffer:
        buffer.add_batch(items_for(np.arange(1), np.zeros(1)))
        writer = buffer._writer
        calls = {"quick": 0, "step": 0}
        quick, step = writer._quick.write, writer._write_step

        def counted_quick(*args):
            calls["quick"] += 1
            return quick(*args)

        def counted_step(*args):
            calls["step"] += 1
            return step(*args)

        monkeypatch.setattr(writer._quick, "write", counted_quick)
        monkeypatch.setattr(writer, "_write_step", counted_step)
        locks = buffer._lock.acquisitions
        for t in range(1, 7):  # past the wrap
            buffer.add_batch(items_for(np.arange(1), np.full(1, t)))
        assert calls == {"quick": 6, "step": 0}
        assert buffer._lock.acquisitions - locks == 6
        assert_tree_whole(buffer)


def test_the_byte_comparison_catches_a_planted_change_of_the_shortcut(monkeypatch):
    """The byte-for-byte comparison fails when the shortcut leaves ``tree_intent``
    marked (a planted bug: the section's last store dropped)."""
    real = prioritized_steps.TREE_DIRTY

    class DropsTheClear:  # every store of TREE_DIRTY's 0 goes to a spare field instead
        def __init__(self, at):
            self.at = at

        def __getitem__(self, k):
            return self.at[k]

        def __setitem__(self, k, v):
            self.at[real if (k == real and v) else 3 if k == real else k] = v

    with SharedReplayBuffer(SPEC, 1, 3, prioritized=True, seed=0) as fast, \
            SharedReplayBuffer(SPEC, 1, 3, prioritized=True, seed=0) as plain:
        general_only(plain)
        quick = fast._writer._quick
        monkeypatch.setattr(quick, "_intent_at", DropsTheClear(quick._intent_at))
        for t in range(4):
            act(fast, ("add", 0), 1)
            act(plain, ("add", 0), 1)
        assert state_of(fast) != state_of(plain)


@pytest.mark.parametrize("point, head", [
    ("shared.write.uncount:1", 4),       # step 4 counted out, not begun
    ("shared.priorities.update:5", 4),   # publishing step 4: leaf at max, version odd
    ("shared.write.publish:5", 5),       # step 4's version even, its row head not moved
    ("shared.write.data:5", 4),          # step 4's data written, nothing published
])
def test_a_one_row_prioritized_writer_killed_in_the_shortcut_leaves_a_whole_tree(
        monkeypatch, point, head):
    """A one-row writer (the shortcut's memoryview stores) killed at each crash point of
    its step: the next lock holder repairs the tree, the next claim the head; every
    committed step stays drawable with its true probability, and the row goes on."""
    length = 4
    with SharedReplayBuffer(SPEC, 1, length, prioritized=True, alpha=1.0, seed=0) as buffer:
        crash_a_child(monkeypatch, buffer, point, 1, 5)
        torn = bool((buffer.layout.version % 2 == 1).any())
        assert_tree_whole(buffer)
        assert buffer.claim_rows(1) == (0, 1)
        assert buffer.steps_written().tolist() == [head]
        assert len(buffer) == length - int(torn)
        items, _ = buffer.get_next(2_000)
        assert set(items["step"].tolist()) == set(range(head - length + torn, head))
        for step in range(head, head + 2):
            buffer.add_batch(items_for(np.arange(1), np.full(1, step)))
        assert_tree_whole(buffer)
        assert len(buffer) == length


def test_a_child_forked_while_the_lock_is_held_takes_its_own_lock(tmp_path):
    """The lock is reopened in a forked child (found by the fork counter, not a pid
    read per acquisition): a child forked while its parent holds the lock waits for the
    parent to release it (its own ``flock``, its own thread lock), then takes it."""
    import os
    import select
    import time

    from replaybuffer.distributed.shared.process_lock import ProcessLock
    lock = ProcessLock(tmp_path / "lock")
    read_end, write_end = os.pipe()
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: take the lock, say so
            try:
                with lock:
                    os.write(write_end, b"x")
            finally:
                os._exit(0)
        time.sleep(0.3)
        took_while_held = select.select([read_end], [], [], 0)[0]
    ready = select.select([read_end], [], [], 30)[0]
    said = os.read(read_end, 1) if ready else b""
    if not ready:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert not took_while_held, "the child took the lock its parent held"
    assert said == b"x", "the child never took the lock once its parent let it go"
