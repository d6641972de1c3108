"""A prioritized shared ``add_batch`` step: one lock section (the publish), the data
written with no lock, and a draw while it is written hiding the step being rewritten
(issue 24 item 1)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from priority_model import modelled_buffer
from test_shared_faults import SPEC, assert_tree_whole, items_for
from test_shared_prioritized_batches import counted

from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.distributed.shared import leaf_walks
from replaybuffer.sampling import flat_tree


def all_leaves(buffer: SharedReplayBuffer) -> np.ndarray:
    return flat_tree.leaves_of(buffer.layout.tree, np.arange(buffer.capacity))


class DrawsMidWrite:
    """Wraps the writer's data write: before it writes, the test's draw runs (the step's
    versions are odd, its leaves not yet published) and what it saw is kept."""

    def __init__(self, buffer: SharedReplayBuffer, draws: int):
        self.buffer, self.draws = buffer, draws
        self.writer = buffer._writer
        self.write = self.writer._write_exact
        self.seen: list[dict[str, Any]] = []
        self.locks_before_data: list[int] = []
        self.locks_at_call = 0

    def __call__(self, start: int, arrays: Any) -> Any:
        buffer = self.buffer
        self.locks_before_data.append(buffer._lock.acquisitions - self.locks_at_call)
        version = buffer.layout.version.copy()
        items, info = buffer.get_next(self.draws)
        self.seen.append({"version": version, "leaves": all_leaves(buffer),
                          "total": float(buffer.layout.tree[1]), "items": items,
                          "info": info})
        return self.write(start, arrays)

    def add(self, rows: np.ndarray, step: int) -> None:
        self.locks_at_call = self.buffer._lock.acquisitions
        self.writer._write_exact = self
        try:
            self.buffer.add_batch(items_for(rows, np.full(len(rows), step)))
        finally:
            self.writer._write_exact = self.write


def test_a_step_takes_one_lock_section_and_none_before_its_data():
    with SharedReplayBuffer(SPEC, 3, 4, prioritized=True, alpha=1.0, seed=0) as buffer:
        rows = np.arange(2)
        for step in range(4):
            buffer.add_batch(items_for(rows, np.full(2, step)))
        lock = buffer._lock
        mid = DrawsMidWrite(buffer, 0)
        mid.writer._write_exact = lambda start, arrays: (
            mid.locks_before_data.append(lock.acquisitions - mid.locks_at_call)
            or mid.write(start, arrays))
        for step in range(4, 10):  # rewriting the oldest steps
            mid.locks_at_call = lock.acquisitions
            buffer.add_batch(items_for(rows, np.full(2, step)))
            assert lock.acquisitions - mid.locks_at_call == 1
        assert mid.locks_before_data == [0] * 6
        assert len(buffer) == 8 == counted(buffer)


def test_a_draw_while_a_step_is_written_hides_it_and_draws_by_the_true_total():
    """The old step at the rewritten positions is never sampled while they are odd;
    their leaves are 0 after the draw and the probabilities are over the rest."""
    length = 3
    with SharedReplayBuffer(SPEC, 2, length, prioritized=True, alpha=1.0, seed=1) as buffer:
        rows = np.arange(2)
        for step in range(length):
            buffer.add_batch(items_for(rows, np.full(2, step)))
        _, info = buffer.get_next(6)
        buffer.update_priorities(info.ids, np.arange(1.0, 7.0))  # unequal leaves
        mid = DrawsMidWrite(buffer, 2_000)
        for step in range(length, 3 * length):
            mid.add(rows, step)
            seen = mid.seen[-1]
            writing = np.flatnonzero(seen["version"] % 2 == 1)
            assert len(writing) == 2  # the step's two positions, odd before the draw
            assert (seen["leaves"][writing] == 0).all()
            assert seen["total"] == pytest.approx(seen["leaves"].sum(), rel=1e-12)
            sampled = set(seen["items"]["step"].tolist())
            assert sampled == set(range(step - length + 1, step))  # the old step: never
            ids = seen["info"].ids
            positions = (ids // 2 % length) * 2 + ids % 2
            np.testing.assert_allclose(seen["info"].probabilities,
                                       seen["leaves"][positions] / seen["leaves"].sum(),
                                       rtol=1e-5)
            assert drawn_steps_now(buffer) == set(range(step - length + 1, step + 1))
            assert_tree_whole(buffer)
        assert len(buffer) == 2 * length == counted(buffer)


def drawn_steps_now(buffer: SharedReplayBuffer) -> set[int]:
    items, _ = buffer.get_next(2_000)
    return set(items["step"].tolist())


# --------------------------------------------------------- reference model
@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 3), max_length=st.integers(1, 4),
       calls=st.lists(st.tuples(st.sampled_from(["add", "add mid-draw", "update"]),
                                st.integers(1, 9)), max_size=14),
       seed=st.integers(0, 2**16))
def test_adds_wraps_updates_and_draws_mid_write_keep_the_tree_of_a_model(
        count, max_length, calls, seed):
    """After any sequence of steps (some with a draw while their data is written),
    wraps and updates: every leaf is the priority of the step its position holds (new
    steps at the largest seen, updated ones at theirs, alpha 1), 0 elsewhere; the
    interior sums the leaves; a mid-write draw saw the model's leaves with the
    rewritten positions at 0."""
    with modelled_buffer(SPEC, count, max_length, seed) as (buffer, rows, model, rng):
        mid = DrawsMidWrite(buffer, 64)
        written = 0
        for kind, size in calls:
            if kind == "update":
                if written:
                    model.update(buffer, rng, size)
            else:
                kept = range(max(0, written + 1 - max_length), written)  # past this add
                expected = model.leaves(kept)
                if kind == "add mid-draw" and any(step in kept for _, step in model.priority):
                    mid.add(rows, written)
                    seen = mid.seen[-1]
                    np.testing.assert_allclose(seen["leaves"], expected, rtol=1e-12)
                    assert set(seen["items"]["step"].tolist()) <= set(kept)
                else:
                    buffer.add_batch(items_for(rows, np.full(count, written)))
                written += 1
                retained = model.added(rows, range(written - 1, written), written)
                assert len(buffer) == count * len(retained) == counted(buffer)
            tree = buffer.layout.tree
            leaves = model.leaves()
            np.testing.assert_allclose(all_leaves(buffer), leaves, rtol=1e-12)
            rebuilt = tree.copy()
            flat_tree.rebuild(rebuilt)
            np.testing.assert_allclose(tree, rebuilt, rtol=1e-9)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 40), data=st.data())
def test_a_walk_up_gives_the_nodes_of_flat_tree_update_bit_for_bit(capacity, data):
    """Compiled (where numba is) and in Python on the memoryview alike."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    tree = np.zeros(flat_tree.tree_nodes(capacity))
    flat_tree.update(tree, np.arange(capacity), rng.exponential(1.0, capacity))
    for _ in range(data.draw(st.integers(1, 4))):
        start = data.draw(st.integers(0, capacity - 1))
        count = data.draw(st.integers(1, capacity - start))
        value = float(rng.exponential(3.0))
        expected = tree.copy()
        flat_tree.update(expected, np.arange(start, start + count), np.full(count, value))
        python = tree.copy()
        leaf_walks.walk_up_python(python.data, len(tree) // 2 + start, count, value)
        leaf_walks.walk_up(tree, len(tree) // 2 + start, count, value)
        np.testing.assert_array_equal(python, expected)
        np.testing.assert_array_equal(tree, expected)
