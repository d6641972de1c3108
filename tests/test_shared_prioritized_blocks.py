"""A prioritized shared ``extend`` block in one lock section (issue 24 item 1): its
steps' versions go odd with no lock and a draw while its data is written hides the whole
run from the rows' heads (``rewrite_runs``), never sampling a step being overwritten;
against the plain tree model with extends, wraps, updates and mid-write draws."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from priority_model import modelled_buffer
from test_shared_faults import SPAWN, SPEC, assert_tree_whole, items_for
from test_shared_prioritized_batches import block_of, counted, drawn_steps

from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.distributed.shared import leaf_walks
from replaybuffer.distributed.shared.rewrite_runs import (rewrite_runs, rewrite_runs_numpy,
                                                         rewrite_runs_python)
from replaybuffer.sampling import flat_tree


def all_leaves(buffer: SharedReplayBuffer) -> np.ndarray:
    return flat_tree.leaves_of(buffer.layout.tree, np.arange(buffer.capacity))


class DrawAtWrite:
    """Wraps the writer's data write: before its ``at``-th call (0-based) of the next
    ``extend``, a draw of ``draws`` items runs and what it saw is kept; ``fail``: that
    call then raises instead of writing."""

    def __init__(self, buffer: SharedReplayBuffer, at: int, draws: int = 256,
                 fail: bool = False):
        self.buffer, self.at, self.draws, self.fail = buffer, at, draws, fail
        self.writer = buffer._writer
        self.write = self.writer._write_exact
        self.calls = 0
        self.seen: dict[str, Any] = {}

    def __call__(self, start: int, arrays: Any) -> Any:
        if self.calls == self.at:
            buffer = self.buffer
            locks = buffer._lock.acquisitions
            items, info = buffer.get_next(self.draws)
            self.seen = {"version": buffer.layout.version.copy(),
                         "leaves": all_leaves(buffer), "total": float(buffer.layout.tree[1]),
                         "items": items, "info": info,
                         "draw locks": buffer._lock.acquisitions - locks}
            if self.fail:
                raise OSError("the device went away")
        self.calls += 1
        return self.write(start, arrays)

    def extend(self, rows: np.ndarray, first_step: int, steps: int) -> None:
        self.writer._write_exact = self
        try:
            self.buffer.extend(block_of(rows, first_step, steps))
        finally:
            self.writer._write_exact = self.write


def test_a_draw_while_a_block_is_written_hides_all_its_steps():
    """Rows 2 of 4 steps, full; a block of 3 steps over steps 0, 1, 2 (unequal
    priorities): a draw before its second step's data finds all 3 steps' positions odd
    and at 0, the total over the one step left, and samples only it; after the block,
    the new steps are drawable at the largest priority."""
    length = 4
    with SharedReplayBuffer(SPEC, 2, length, prioritized=True, alpha=1.0, seed=0) as buffer:
        rows = np.arange(2)
        buffer.extend(block_of(rows, 0, length))
        ids = np.arange(2 * length)
        buffer.update_priorities(ids, np.arange(1.0, 2 * length + 1))
        mid = DrawAtWrite(buffer, at=1, draws=2_000)
        mid.extend(rows, length, 3)
        seen = mid.seen
        block = (np.arange(length, length + 3)[:, None] % length) * 2 + rows
        assert (seen["version"][block] % 2 == 1).all()
        assert (seen["leaves"][block.ravel()] == 0).all()
        assert seen["total"] == pytest.approx(7.0 + 8.0)  # step 3 of rows 0 and 1
        assert set(seen["items"]["step"].tolist()) == {3}
        np.testing.assert_allclose(seen["info"].probabilities,
                                   np.where(seen["info"].ids % 2, 8.0, 7.0) / 15.0,
                                   rtol=1e-6)
        assert seen["draw locks"] == 1
        assert drawn_steps(buffer) == {3, 4, 5, 6}
        leaves = all_leaves(buffer)
        assert (leaves[block.ravel()] == 8.0).all()  # the largest priority seen
        assert_tree_whole(buffer)
        assert len(buffer) == 2 * length == counted(buffer)


def test_a_failed_block_restores_the_old_priorities_a_draw_hid():
    """A draw hides the block's positions, then the block's second data write raises:
    its first step is published, the two others hold their old steps again, drawable at
    the priorities they had before (the copy kept before the versions went odd)."""
    length = 4
    with SharedReplayBuffer(SPEC, 2, length, prioritized=True, alpha=1.0, seed=0) as buffer:
        rows = np.arange(2)
        buffer.extend(block_of(rows, 0, length))
        buffer.update_priorities(np.arange(2 * length), np.arange(1.0, 2 * length + 1))
        before = all_leaves(buffer)
        mid = DrawAtWrite(buffer, at=1, fail=True)
        with pytest.raises(OSError, match="went away"):
            mid.extend(rows, length, 3)
        assert (mid.seen["leaves"][:6] == 0).all()  # steps 0, 1, 2 were hidden
        leaves = all_leaves(buffer)
        assert (leaves[:2] == 8.0).all()  # step 4, published at the largest
        np.testing.assert_array_equal(leaves[2:], before[2:])  # steps 1, 2, 3 as before
        assert buffer.steps_written().tolist() == [5, 5]
        assert drawn_steps(buffer) == {1, 2, 3, 4}
        assert_tree_whole(buffer)
        assert len(buffer) == 2 * length == counted(buffer)


# --------------------------------------------------------------- the runs
@settings(max_examples=100, deadline=None)
@given(num_rows=st.integers(1, 4), max_length=st.integers(1, 40), data=st.data())
def test_rewrite_runs_are_each_rows_odd_versions_from_its_head(num_rows, max_length, data):
    """Against a loop over each row's ids from its head, with runs longer than the
    first window: compiled (where numba is), numpy's windows, and the Python loop with
    an output too short (it counts them all)."""
    heads = np.array(data.draw(st.lists(st.integers(0, 3 * max_length), min_size=num_rows,
                                        max_size=num_rows)), np.int64)
    version = 2 * np.array(data.draw(st.lists(st.integers(0, 100), min_size=num_rows *
                                              max_length, max_size=num_rows * max_length)),
                           np.int64)
    for row in range(num_rows):
        run = data.draw(st.integers(0, max_length))
        for k in range(run):
            version[((heads[row] + k) % max_length) * num_rows + row] += 1
    odd = data.draw(st.lists(st.integers(0, len(version) - 1), max_size=4))
    version[odd] |= 1  # stray odd versions elsewhere
    expected = set()
    for row in range(num_rows):
        for k in range(max_length):
            position = int((heads[row] + k) % max_length) * num_rows + row
            if version[position] % 2 == 0:
                break
            expected.add(position)
    row_numbers = np.arange(num_rows)
    got = rewrite_runs(version, heads, row_numbers, max_length)
    assert sorted(got.tolist()) == sorted(expected)  # each position once
    numpy = rewrite_runs_numpy(version, heads, row_numbers, max_length)
    assert sorted(numpy.tolist()) == sorted(expected)
    out = np.empty(data.draw(st.integers(0, len(version))), np.int64)  # maybe too short
    found = rewrite_runs_python(version, heads, max_length, out)
    assert found == len(expected)
    assert out[:found].tolist() == sorted(expected, key=lambda p: (p % num_rows, (
        p // num_rows - heads[p % num_rows]) % max_length))[:len(out)]


# --------------------------------------------------------- reference model
@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 3), max_length=st.integers(1, 5),
       calls=st.lists(st.tuples(st.sampled_from(["extend", "extend mid-draw", "add",
                                                 "update"]),
                                st.integers(1, 11), st.integers(0, 10)), max_size=10),
       seed=st.integers(0, 2**16))
def test_extends_wraps_updates_and_draws_mid_block_keep_the_tree_of_a_model(
        count, max_length, calls, seed):
    """After any sequence of extends (some with a draw before one of their steps' data
    write), steps, wraps and updates: every leaf is the priority of the step its
    position holds (alpha 1), 0 elsewhere; a mid-block draw saw the model's leaves of
    the steps the block does not overwrite, 0 at every position of its block, and
    sampled none of the steps being overwritten; one lock section per block."""
    with modelled_buffer(SPEC, count, max_length, seed) as (buffer, rows, model, rng):
        lock = buffer._lock
        written = 0
        for kind, size, at in calls:
            if kind == "update":
                if written:
                    model.update(buffer, rng, size)
                continue
            steps = 1 if kind == "add" else size
            at %= steps
            block_start = written + at // max_length * max_length  # the draw's block
            block_size = min(max_length, written + steps - block_start)
            kept = range(max(0, block_start + block_size - max_length), block_start)
            draws = kind == "extend mid-draw" and written > 0 and len(kept) > 0
            before = lock.acquisitions
            if kind == "add":
                buffer.add_batch(items_for(rows, np.full(count, written)))
            elif draws:
                mid = DrawAtWrite(buffer, at, draws=64)
                mid.extend(rows, written, steps)
            else:
                buffer.extend(block_of(rows, written, steps))
            sections = lock.acquisitions - before - (mid.seen["draw locks"] if draws
                                                     else 0)
            assert sections == -(-steps // max_length)
            if draws:  # the model as the draw saw it: the blocks before published
                model.added(rows, range(written, block_start), block_start)
                seen = mid.seen
                np.testing.assert_allclose(seen["leaves"], model.leaves(kept), rtol=1e-12)
                assert set(seen["items"]["step"].tolist()) <= set(kept)
                assert seen["total"] == pytest.approx(seen["leaves"].sum(), rel=1e-9)
            retained = model.added(rows, range(written, written + steps), written + steps)
            written += steps
            assert len(buffer) == count * len(retained) == counted(buffer)
            np.testing.assert_allclose(all_leaves(buffer), model.leaves(), rtol=1e-12)
            rebuilt = buffer.layout.tree.copy()
            flat_tree.rebuild(rebuilt)
            np.testing.assert_allclose(buffer.layout.tree, rebuilt, rtol=1e-9)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 40), data=st.data())
def test_a_walk_of_each_leaf_gives_the_nodes_of_flat_tree_update_bit_for_bit(capacity,
                                                                              data):
    """Any leaves, in any order, repeats included (the last value wins): compiled (where
    numba is), in Python on the memoryview, and above the Python limit alike."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    tree = np.zeros(flat_tree.tree_nodes(capacity))
    flat_tree.update(tree, np.arange(capacity), rng.exponential(1.0, capacity))
    for _ in range(data.draw(st.integers(1, 4))):
        positions = np.array(data.draw(st.lists(st.integers(0, capacity - 1), min_size=1,
                                                max_size=40)), np.int64)
        values = rng.exponential(3.0, len(positions))
        expected = tree.copy()
        flat_tree.update(expected, positions, values)
        python = tree.copy()
        leaf_walks.walk_up_each_python(python.data, (positions + len(tree) // 2).tolist(),
                                       values.tolist())
        leaf_walks.walk_up_each(tree, positions, values)
        np.testing.assert_array_equal(python, expected)
        np.testing.assert_array_equal(tree, expected)


# ------------------------------------------------- compiled loops, loaded first
def _kernels_at_first_lock(buffer: SharedReplayBuffer, call: str, out: Any) -> None:
    """In a fresh process: how many compiled signatures each loop of the tree's lock
    sections had when ``call`` (a draw, or an extend after its claim) first took the
    buffer's lock."""
    from replaybuffer.distributed.shared import rewrite_runs as runs

    lock = buffer._lock
    enter = type(lock).__enter__
    seen: list[list[int]] = []

    class Recording(type(lock)):  # type: ignore[misc]
        def __enter__(self) -> None:
            seen.append([len(kernel.signatures) for kernel in (
                leaf_walks._compiled, leaf_walks._compiled_each, runs._compiled_runs)])
            enter(self)

    first = buffer.claim_rows(1)[0] if call == "extend" else 0  # (a claim: no tree)
    lock.__class__ = Recording
    if call == "draw":
        buffer.get_next(4)
    else:
        buffer.extend(block_of(np.array([first]), int(buffer.steps_written()[first]), 2))
    out.put(seen)


@pytest.mark.parametrize("call", ["draw", "extend"])
def test_a_process_loads_the_compiled_loops_before_it_first_takes_the_lock(call):
    """Loading them (and starting numba's runtime, up to a second on a loaded machine)
    inside the lock would hold every writer and sampler back meanwhile."""
    from replaybuffer.sampling import tree_kernels

    if not tree_kernels.AVAILABLE:
        pytest.skip("numba is not installed or is switched off: no compiled loops to load")
    with SharedReplayBuffer(SPEC, 3, 4, prioritized=True, seed=0) as buffer:
        buffer.claim_rows(2)
        buffer.extend(block_of(np.arange(2), 0, 3))
        buffer._writer.release_rows()
        out = SPAWN.Queue()
        child = SPAWN.Process(target=_kernels_at_first_lock, args=(buffer, call, out))
        child.start()
        seen = out.get(timeout=120)
        child.join(60)
        assert seen and all(count > 0 for count in seen[0]), seen


def test_the_block_kill_soak_scenario_holds_its_invariants(tmp_path):
    """The soak's ``shared_block_kill`` (block writers SIGKILLed mid-block while a
    sampler draws and checks each item), with a fixed seed: no failure, and
    its kills and checks made (once here: the soak draws it at random for longer)."""
    from soak import scenarios
    tally = scenarios.Tally()
    scenarios.shared_block_kill(np.random.default_rng(5), tmp_path, tally)
    assert not tally.failures, tally.failures
    assert tally.faults["sigkill_shared_block"] == 3 and tally.checks >= 12


@pytest.mark.parametrize("planted", [False, True])
def test_the_block_kill_checks_catch_draws_that_hide_only_the_heads(monkeypatch, planted):
    """A killed block's run (steps 8..10 of a row of 8 marked odd over steps 0..2, the
    head not moved, ``held`` counted down): the soak's checks pass, and fail when draws
    hide only each head's position (a planted bug) instead of the run."""
    from soak import scenarios, workloads
    from replaybuffer.distributed.shared import priorities as priorities_module
    if planted:
        def heads_only(version, heads, row_numbers, max_length):
            at = (heads % max_length) * len(heads) + row_numbers
            return at[version[at] % 2 == 1]
        monkeypatch.setattr(priorities_module, "rewrite_runs", heads_only)
    with SharedReplayBuffer(workloads.shared_spec(), 1, 8, prioritized=True,
                            seed=0) as buffer:
        for step in range(8):
            buffer.add_batch(workloads.shared_items(np.zeros(1), np.full(1, step)))
        layout = buffer.layout
        layout.held[0] = 5  # steps 3..7 whole
        layout.version[:3] = 2 * np.arange(8, 11) + 1  # the block's run from the head
        tally = scenarios.Tally(scenario="planted" if planted else "whole")
        scenarios.check_shared(buffer, tally, draws=8, blocks=True)
        odd_leaves = [f for f in tally.failures if "keep a positive leaf" in f]
        assert bool(odd_leaves) == planted, tally.failures
        assert planted or not tally.failures, tally.failures
