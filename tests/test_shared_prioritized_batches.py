"""A prioritized SharedReplayBuffer's ``extend`` (issue 24, item 1): a block of up to
``max_length`` steps written with no lock and published in one lock section, with the
guarantees of one step at a time: against a reference model, after a write that raises,
and after a writer killed at each moment of a block."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from priority_model import modelled_buffer
from test_shared_faults import SPAWN, SPEC, assert_tree_whole, items_for

from replaybuffer.crash_points import CRASH_EXIT_CODE
from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.distributed.shared.held_steps import held_steps
from replaybuffer.distributed.shared.priorities import span_positions
from replaybuffer.distributed.stress import soak_seconds
from replaybuffer import SampleToInsertRatio
from replaybuffer.sampling import flat_tree


def block_of(rows: np.ndarray, first_step: int, steps: int) -> dict[str, np.ndarray]:
    """``extend`` leaves ``[len(rows), steps]``: each item names its row and step."""
    ids = first_step + np.arange(steps)
    flat = items_for(np.repeat(rows, steps), np.tile(ids, len(rows)))
    return {k: v.reshape((len(rows), steps) + v.shape[1:]) for k, v in flat.items()}


def drawn_steps(buffer: SharedReplayBuffer, draws: int = 3_000) -> set[int]:
    items, info = buffer.get_next(draws)
    np.testing.assert_array_equal(items["step"], info.ids // buffer.num_rows)
    np.testing.assert_array_equal(items["row"], info.ids % buffer.num_rows)
    return set(items["step"].tolist())


def counted(buffer: SharedReplayBuffer) -> int:
    """The steps held whole, counted by runs from the heads and versions."""
    layout = buffer.layout
    return int(held_steps(layout.version, layout.next_id.copy(), buffer.max_length).sum())


# ------------------------------------------------------------------ positions
@settings(max_examples=60, deadline=None)
@given(num_rows=st.integers(1, 5), max_length=st.integers(1, 6), data=st.data())
def test_span_positions_are_each_steps_run_of_rows(num_rows, max_length, data):
    first = data.draw(st.integers(0, num_rows - 1))
    count = data.draw(st.integers(1, num_rows - first))
    step = data.draw(st.integers(0, 50))
    steps = data.draw(st.integers(1, max_length))
    start = (step % max_length) * num_rows + first
    got = span_positions(start, count, steps, num_rows, max_length)
    expected = [[((step + k) % max_length) * num_rows + first + j for j in range(count)]
                for k in range(steps)]
    assert got.tolist() == expected


@settings(max_examples=100, deadline=None)
@given(num_rows=st.integers(1, 4), max_length=st.integers(1, 6), data=st.data())
def test_held_steps_counts_the_whole_steps_after_the_run_of_torn_oldest(num_rows,
                                                                         max_length, data):
    """Against a loop over each row's ids: the steps held whole are those after the
    oldest run of positions that do not hold their step."""
    heads = np.array(data.draw(st.lists(st.integers(0, 3 * max_length), min_size=num_rows,
                                        max_size=num_rows)), np.int64)
    version = np.zeros(num_rows * max_length, np.int64)
    for row, head in enumerate(heads):
        for step in range(max(0, head - max_length), head):
            version[(step % max_length) * num_rows + row] = 2 * step + 2
    torn = data.draw(st.lists(st.integers(0, len(version) - 1), max_size=6))
    version[torn] += data.draw(st.sampled_from([-1, 1, 2 * max_length]))
    expected = []
    for row, head in enumerate(heads):
        ids = list(range(max(0, head - max_length), head))
        while ids and version[(ids[0] % max_length) * num_rows + row] != 2 * ids[0] + 2:
            ids.pop(0)
        expected.append(len(ids))
    assert held_steps(version, heads, max_length).tolist() == expected


# ----------------------------------------------------------- lock sections
def test_an_extend_takes_one_lock_section_per_block_of_max_length_steps():
    """1/T lock acquisitions per inserted step for a block of T steps (after the data,
    never before it), and one per step for ``add_batch``."""
    length = 4
    with SharedReplayBuffer(SPEC, 3, length, prioritized=True, seed=0) as buffer:
        rows = np.arange(2)
        buffer.claim_rows(2)
        lock = buffer._lock
        writer = buffer._writer
        write = writer._write_exact
        before_data: list[int] = []
        written = 0
        # sections: one per block of up to max_length steps, ceil(steps / length)
        for steps, sections in ((1, 1), (3, 1), (4, 1), (5, 2), (9, 3), (2, 1), (8, 2)):
            before = lock.acquisitions
            writer._write_exact = lambda *args, since=before: (
                before_data.append(lock.acquisitions - since) or write(*args))
            buffer.extend(block_of(rows, written, steps))
            writer._write_exact = write
            written += steps
            assert lock.acquisitions - before == sections, steps
            assert len(buffer) == 2 * min(written, length)
            # the data of a block's first step is written before any section; a later
            # block's after the sections of the blocks before it
            assert before_data[-steps] == 0
            assert before_data[-1] == (steps - 1) // length
            assert drawn_steps(buffer) == set(range(max(0, written - length), written))
        for step in range(written, written + 3):  # add_batch: one section a step
            before = lock.acquisitions
            buffer.add_batch(items_for(rows, np.full(2, step)))
            assert lock.acquisitions - before == 1
        assert drawn_steps(buffer) == set(range(written + 3 - length, written + 3))


# --------------------------------------------------------- reference model
@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 3), max_length=st.integers(1, 5),
       calls=st.lists(st.tuples(st.sampled_from(["extend", "add", "update"]),
                                st.integers(1, 11)), max_size=8),
       seed=st.integers(0, 2**16))
def test_extend_and_add_batch_keep_the_tree_of_a_reference_model(count, max_length, calls,
                                                                  seed):
    """Every leaf is the priority of the step its position holds (new steps at the
    largest priority seen, updated ones at theirs, alpha 1), 0 elsewhere; len() and
    what a sample can return are the retained steps."""
    with modelled_buffer(SPEC, count, max_length, seed) as (buffer, rows, model, rng):
        written = 0
        for kind, size in calls:
            if kind == "update":
                if written:
                    model.update(buffer, rng, size)
                continue
            steps = size if kind == "extend" else 1
            if kind == "extend":
                buffer.extend(block_of(rows, written, steps))
            else:
                buffer.add_batch(items_for(rows, np.full(count, written)))
            retained = model.added(rows, range(written, written + steps), written + steps)
            written += steps
            assert len(buffer) == count * len(retained) == counted(buffer)
            leaves = model.leaves()
            tree = buffer.layout.tree
            np.testing.assert_allclose(flat_tree.leaves_of(tree, np.arange(len(leaves))),
                                       leaves, rtol=1e-12)
            assert tree[1] == pytest.approx(leaves.sum(), rel=1e-9)
        if written:
            assert drawn_steps(buffer, 500) <= set(range(max(0, written - max_length),
                                                          written))


# --------------------------------------------------- a data write that raises
def test_an_extend_whose_write_fails_publishes_the_steps_before_and_keeps_the_rest():
    """Step 1 of a 3-step block fails: step 0 is published and counted, the positions
    steps 1 and 2 were to overwrite hold their old steps again, drawable."""
    length = 4
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1,
                                  error_buffer=(-1e6, 1e6))
    with SharedReplayBuffer(SPEC, 2, length, prioritized=True, alpha=1.0,
                            rate_limiter=limiter, seed=0) as buffer:
        rows = np.arange(2)
        buffer.extend(block_of(rows, 0, 4))
        writer = buffer._writer
        write = writer._write_exact
        calls: list[int] = []

        def fails_on_the_second_call(*args):
            calls.append(1)
            if len(calls) == 2:
                raise OSError("the device went away")
            return write(*args)

        writer._write_exact = fails_on_the_second_call
        with pytest.raises(OSError, match="went away"):
            buffer.extend(block_of(rows, 4, 3))  # step 4 written, step 5 fails
        writer._write_exact = write
        assert buffer.stats().inserts == 8 + 2  # the step that was written counts
        assert buffer.steps_written().tolist() == [5, 5]
        assert len(buffer) == 2 * length == counted(buffer)
        assert drawn_steps(buffer) == {1, 2, 3, 4}
        assert_tree_whole(buffer)
        buffer.extend(block_of(rows, 5, 3))  # the rows go on
        assert len(buffer) == 2 * length
        assert drawn_steps(buffer) == {4, 5, 6, 7}
        assert_tree_whole(buffer)


def test_a_clear_while_a_failing_extend_writes_restores_no_step_from_before_it():
    """A clear between the block's hide and its failed write: the steps the block
    did not write are from before the clear, so they are not restored to draws."""
    with SharedReplayBuffer(SPEC, 2, 4, prioritized=True, alpha=1.0, seed=0) as buffer:
        rows = np.arange(2)
        buffer.extend(block_of(rows, 0, 4))
        writer = buffer._writer
        write = writer._write_exact
        calls: list[int] = []

        def clears_then_fails_on_the_second_call(*args):
            calls.append(1)
            if len(calls) == 2:
                buffer.clear()
                raise OSError("the device went away")
            return write(*args)

        writer._write_exact = clears_then_fails_on_the_second_call
        with pytest.raises(OSError, match="went away"):
            buffer.extend(block_of(rows, 4, 3))
        writer._write_exact = write
        assert buffer.steps_written().tolist() == [5, 5]
        assert len(buffer) == 2  # step 4, written after the clear's floor
        assert drawn_steps(buffer) == {4}
        leaves = flat_tree.leaves_of(buffer.layout.tree, np.arange(buffer.capacity))
        assert np.count_nonzero(leaves) == 2
        rebuilt = buffer.layout.tree.copy()
        flat_tree.rebuild(rebuilt)
        np.testing.assert_allclose(buffer.layout.tree, rebuilt)


# ------------------------------------------------------ a writer killed midway
def _extend_then_crash(buffer: SharedReplayBuffer, rows: int, block: int) -> None:
    """Extend ``rows`` rows by blocks of ``block`` steps until the armed crash point
    ends the process."""
    first, _ = buffer.claim_rows(rows)
    mine = np.arange(first, first + rows)
    written = 0
    while True:
        buffer.extend(block_of(mine, written, block))
        written += block


# Rows 3, max_length 4, blocks of 3 steps: block 2 writes steps 6, 7, 8 over 2, 3, 4.
@pytest.mark.parametrize("point, before, head, after", [
    # publishing block 2 (one section a block): leaves at the entering priority,
    # their ancestors not yet, versions still odd
    ("shared.priorities.update:3", {5}, 6, {5}),
    # block 1 (steps 3, 4, 5 over slots 3, 0, 1) with step 3 written: the odd run from
    # the heads spans a fresh slot and two old steps, hidden by the draw
    ("shared.write.data:4", {2}, 3, {2}),
    # block 2 with step 6 written, step 7 half: every position hidden by the draw
    ("shared.write.data:7", {5}, 6, {5}),
    # block 2's versions published, its row heads not moved: the claim moves them
    ("shared.write.publish:3", {5}, 9, {5, 6, 7, 8}),
    # block 2 counted out of held, nothing hidden yet
    ("shared.write.uncount:2", {2, 3, 4, 5}, 6, {2, 3, 4, 5}),
])
def test_a_writer_killed_inside_a_block_leaves_a_whole_tree(monkeypatch, point, before,
                                                            head, after):
    """A draw hides the odd run a block left from the heads; the next holder of the
    lock repairs the tree over the span of a section killed midway; the claim
    moves the heads past published steps; every committed step stays drawable with the
    true probabilities, and the steps held whole are counted exactly."""
    rows, length = 3, 4
    with SharedReplayBuffer(SPEC, rows, length, prioritized=True, alpha=1.0,
                            seed=0) as buffer:
        monkeypatch.setenv("REPLAYBUFFER_CRASH_AT", point)
        child = SPAWN.Process(target=_extend_then_crash, args=(buffer, rows, 3))
        child.start()
        monkeypatch.delenv("REPLAYBUFFER_CRASH_AT")
        child.join(120)
        assert child.exitcode == CRASH_EXIT_CODE
        assert_tree_whole(buffer)
        assert drawn_steps(buffer) == before
        assert counted(buffer) == rows * len(before) == len(buffer)
        assert buffer.claim_rows(rows) == (0, rows)  # the killed writer's rows
        assert buffer.steps_written().tolist() == [head] * rows
        assert drawn_steps(buffer) == after
        assert counted(buffer) == rows * len(after) == len(buffer)
        assert buffer.layout.held.tolist() == [len(after)] * rows  # recounted
        assert_tree_whole(buffer)
        buffer.extend(block_of(np.arange(rows), head, length))  # the rows go on, whole
        assert_tree_whole(buffer)
        assert len(buffer) == rows * length == counted(buffer)
        assert drawn_steps(buffer) == set(range(head, head + length))


@pytest.mark.parametrize("go_on", ["add_batch", "extend"])
def test_writes_after_a_killed_block_keep_the_writers_counts_exact(monkeypatch, go_on):
    """A block killed with most of it hidden leaves a run of torn steps at the oldest
    end; the next writer's short writes overwrite it a step at a time, and the counts
    it keeps (the rate limiter's first look) stay equal to the steps held whole."""
    rows, length = 3, 4
    with SharedReplayBuffer(SPEC, rows, length, prioritized=True, alpha=1.0,
                            seed=0) as buffer:
        monkeypatch.setenv("REPLAYBUFFER_CRASH_AT", "shared.write.data:7")
        child = SPAWN.Process(target=_extend_then_crash, args=(buffer, rows, 3))
        child.start()
        monkeypatch.delenv("REPLAYBUFFER_CRASH_AT")
        child.join(120)
        assert child.exitcode == CRASH_EXIT_CODE
        buffer.claim_rows(rows)
        mine = np.arange(rows)
        for step in range(6, 6 + length + 1):
            if go_on == "add_batch":
                buffer.add_batch(items_for(mine, np.full(rows, step)))
            else:
                buffer.extend(block_of(mine, step, 1))
            whole = counted(buffer)
            assert int(buffer.layout.held.sum()) == whole == len(buffer), step
            assert len(drawn_steps(buffer, 500)) == whole // rows
        assert_tree_whole(buffer)


def _extend_forever(buffer: SharedReplayBuffer, rows: int, ready) -> None:
    first, _ = buffer.claim_rows(rows)
    mine = np.arange(first, first + rows)
    ready.set()
    while True:
        buffer.extend(block_of(mine, int(buffer.steps_written()[first]), 3))


def test_writers_of_blocks_killed_at_random_moments_leave_a_whole_tree():
    """Blocks of 3 steps into 256 rows of 4, the writer killed with SIGKILL 0-4 ms into
    its work, again and again: after each kill the tree is whole, and after the next
    claim the rows' counts are the steps held whole and the rows go on."""
    rows, length = 256, 4
    fork = mp.get_context("fork")  # a victim a few ms old: fork, not spawn
    rng = np.random.default_rng(1)
    deadline = time.monotonic() + soak_seconds(4.0)
    kills = 0
    with SharedReplayBuffer(SPEC, rows, length, prioritized=True, seed=0) as buffer:
        buffer.claim_rows(rows)
        buffer.extend(block_of(np.arange(rows), 0, length))
        buffer._writer.release_rows()  # the victims write these rows
        while time.monotonic() < deadline or kills < 4:
            ready = fork.Event()
            victim = fork.Process(target=_extend_forever, args=(buffer, rows, ready))
            victim.start()
            assert ready.wait(60)
            time.sleep(float(rng.uniform(0.0, 0.004)))
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(60)
            kills += 1
            assert_tree_whole(buffer)
        assert buffer.claim_rows(rows) == (0, rows)
        assert buffer.layout.held.sum() == counted(buffer)
        head = int(buffer.steps_written()[0])
        buffer.extend(block_of(np.arange(rows), head, length))
        assert_tree_whole(buffer)
        assert len(buffer) == rows * length == counted(buffer)
