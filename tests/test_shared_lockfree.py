"""SharedReplayBuffer without a lock on its hot paths (issue 24, items 1, 2 and 4): the
locks each path takes, the memory fences, the per-process rate-limiter counts and their
exact admission, and an admitted insert that fails."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer import MinSize, SampleToInsertRatio
from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.distributed.shared import counters, memory_fences
from replaybuffer.specs import ArraySpec

SPEC = {"row": ArraySpec((), np.int64), "step": ArraySpec((), np.int64),
        "obs": ArraySpec((3,), np.float32)}
FORK = mp.get_context("fork")


def items_for(rows: np.ndarray, steps: np.ndarray) -> dict[str, np.ndarray]:
    return {"row": rows.astype(np.int64), "step": steps.astype(np.int64),
            "obs": np.repeat(steps[:, None], 3, 1).astype(np.float32)}


def steps_of(rows: np.ndarray, first: int, count: int) -> dict[str, np.ndarray]:
    """``count`` steps from ``first`` for each of ``rows``: leaves ``[B, count, ...]``."""
    steps = np.tile(np.arange(first, first + count), (len(rows), 1))
    return {"row": np.repeat(rows[:, None], count, 1), "step": steps,
            "obs": np.repeat(steps[..., None], 3, 2).astype(np.float32)}


def ratio(high: float = 1000.0) -> SampleToInsertRatio:
    return SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1,
                               error_buffer=(0.0, high))


# ------------------------------------------------------------- locks per call
@pytest.mark.parametrize("limiter", [None, MinSize(1), ratio()],
                         ids=["no limiter", "MinSize", "SampleToInsertRatio"])
def test_a_uniform_add_batch_and_get_next_take_no_lock_after_the_first(limiter):
    with SharedReplayBuffer(SPEC, 2, 50, rate_limiter=limiter, seed=0) as buffer:
        rows = np.arange(2)
        buffer.add_batch(items_for(rows, np.zeros(2)))  # the claim (and first counts)
        buffer.extend(steps_of(rows, 1, 10))  # (the ratio's samples need inserts)
        buffer.get_next(8, timeout=5)  # this process's generator (numbered under the lock), and
        # the largest sample recorded (under the lock, once per new size)
        lock = buffer._lock
        before = lock.acquisitions
        for step in range(11, 41):
            buffer.add_batch(items_for(rows, np.full(2, step)))
        buffer.extend(steps_of(rows, 41, 5))
        for _ in range(10):
            items, info = buffer.get_next(8, 2, timeout=5)
            np.testing.assert_array_equal(items["step"], info.ids // 2)
        assert lock.acquisitions == before  # zero locks per insert and per sample
        assert len(buffer) == 92
        if limiter is not None:
            stats = buffer.stats()
            assert (stats.inserts, stats.samples) == (92, 8 + 80)


def test_a_prioritized_buffer_takes_one_lock_a_step_and_one_a_draw_or_update():
    """The counts the docs state: a step publishes its leaves (1: the draw hides a step
    being rewritten), a draw reads the tree (1 a round), an update changes it (1)."""
    with SharedReplayBuffer(SPEC, 2, 8, prioritized=True, seed=0) as buffer:
        rows = np.arange(2)
        buffer.add_batch(items_for(rows, np.zeros(2)))
        buffer.get_next(2)
        lock = buffer._lock
        before = lock.acquisitions
        buffer.add_batch(items_for(rows, np.ones(2)))
        assert lock.acquisitions - before == 1
        before = lock.acquisitions
        _, info = buffer.get_next(4)
        assert lock.acquisitions - before == 1
        before = lock.acquisitions
        buffer.update_priorities(info.ids, np.ones(4))
        assert lock.acquisitions - before == 1


def test_more_processes_than_slots_count_in_the_overflow_row_under_the_lock():
    with SharedReplayBuffer(SPEC, 1, 20, rate_limiter=MinSize(1), seed=0) as buffer:
        owners = buffer.layout.counter_owners
        owners[1:] = mp.parent_process().pid if mp.parent_process() else 1  # live pids
        owners[0] = counters.SLOTS  # every slot claimed by a live process
        rows = np.arange(1)
        buffer.add_batch(items_for(rows, np.zeros(1)))
        lock = buffer._lock
        before = lock.acquisitions
        for step in range(1, 6):
            buffer.add_batch(items_for(rows, np.full(1, step)))
        assert lock.acquisitions - before == 5  # the shared row is written under it
        assert buffer.layout.counters[0, counters.ADMITTED_INSERTS] == 6
        assert buffer.stats().inserts == 6


# ------------------------------------------------------------------- fences
def test_fences_are_callable_and_x86_needs_no_order_fence():
    memory_fences.order_fence()
    memory_fences.full_fence()
    memory_fences.check_available()
    if memory_fences.TOTAL_STORE_ORDER:
        assert memory_fences.order_fence is memory_fences._nothing


def test_a_weakly_ordered_processor_without_libatomic_is_refused(monkeypatch):
    monkeypatch.setattr(memory_fences, "_SEQ_CST_FENCE", None)
    monkeypatch.setattr(memory_fences, "TOTAL_STORE_ORDER", False)
    with pytest.raises(RuntimeError, match="libatomic.*apt-get install libatomic1"):
        SharedReplayBuffer(SPEC, 1, 4)


# ------------------------------------------------------- exact admission
@settings(max_examples=25, deadline=None)
@given(calls=st.lists(st.tuples(st.booleans(), st.integers(1, 4)), max_size=30))
def test_admission_decides_as_the_in_process_limiter(calls):
    """One process, calls that are never held back long: each insert (``extend`` of
    ``n`` steps) and sample (``get_next(n)``) goes ahead exactly when the in-process
    limiter, fed the same counts, says it may."""
    make = lambda: SampleToInsertRatio(samples_per_insert=2.0,  # noqa: E731
                                       min_size_to_sample=3, error_buffer=(0.0, 12.0))
    reference = make()
    with SharedReplayBuffer(SPEC, 1, 200, rate_limiter=make(), seed=0) as buffer:
        size = 0
        row = np.arange(1)
        for insert, n in calls:
            if insert:
                expected = reference.can_insert(n, size)
                got = buffer.extend(steps_of(row, size, n), block=False)
                if expected:
                    reference.inserts += n
                    size += n
            else:
                expected = reference.can_sample(n, size)
                got = buffer.get_next(n, block=False) is not None
                if expected:
                    reference.samples += n
            assert got == expected, (insert, n, size)
        stats = buffer.stats()
        assert (stats.inserts, stats.samples) == (reference.inserts, reference.samples)


def _insert_until_refused(buffer: SharedReplayBuffer, refusals: int, out) -> None:
    admitted, refused = 0, 0
    step = 0
    first, count = buffer.claim_rows(1)
    while refused < refusals:
        if buffer.add_batch(items_for(np.array([first]), np.array([step])), block=False):
            admitted, refused, step = admitted + 1, 0, step + 1
        else:
            refused += 1
    out.put(admitted)


def _sample_until_refused(buffer: SharedReplayBuffer, refusals: int, out) -> None:
    admitted, refused = 0, 0
    while refused < refusals:
        if buffer.get_next(1, block=False) is not None:
            admitted, refused = admitted + 1, 0
        else:
            refused += 1
    out.put(admitted)


def _race(buffer: SharedReplayBuffer, target, processes: int) -> list[int]:
    out = FORK.Queue()
    children = [FORK.Process(target=target, args=(buffer, 300, out))
                for _ in range(processes)]
    for child in children:
        child.start()
    counts = [out.get(timeout=120) for _ in children]
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    return counts


def test_racing_writers_fill_the_window_exactly_and_never_past_it():
    """4 processes insert as fast as they can with no sample: together they are admitted
    exactly up to ``max_diff`` (no lock decides; each reserves, fences, sums)."""
    with SharedReplayBuffer(SPEC, 4, 200, rate_limiter=ratio(150.0), seed=0) as buffer:
        counts = _race(buffer, _insert_until_refused, 4)
        assert sum(counts) == 150 == buffer.stats().inserts == len(buffer)


def test_racing_samplers_take_the_window_exactly_and_never_past_it():
    with SharedReplayBuffer(SPEC, 1, 200, rate_limiter=ratio(150.0), seed=0) as buffer:
        buffer.extend(steps_of(np.arange(1), 0, 120))
        counts = _race(buffer, _sample_until_refused, 4)
        stats = buffer.stats()
        assert sum(counts) == 120 == stats.samples  # inserts * 1.0 - samples >= 0
        assert stats.diff == 0


# ------------------------------------------- an admitted insert that fails
def test_an_admitted_insert_whose_write_fails_is_not_counted(monkeypatch):
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1,
                                  error_buffer=(-1000.0, 1000.0))  # inserts can wait
    with SharedReplayBuffer(SPEC, 2, 10, rate_limiter=limiter, seed=0) as buffer:
        rows = np.arange(2)
        buffer.add_batch(items_for(rows, np.zeros(2)))
        writer = buffer._writer  # writes a step's data through its fused writer
        write = writer._write_exact
        calls = []

        def fails_on_the_second_call(*args):
            calls.append(1)
            if len(calls) == 2:
                raise OSError("the device went away")
            return write(*args)

        monkeypatch.setattr(writer, "_write_exact", fails_on_the_second_call)
        with pytest.raises(OSError, match="went away"):
            buffer.extend(steps_of(rows, 1, 3))  # step 1 written, step 2 fails
        assert buffer.stats().inserts == 2 + 2  # the step that was written counts
        assert len(buffer) == 4 and buffer.steps_written().tolist() == [2, 2]
        with pytest.raises(OSError, match="went away"):
            calls.clear()
            calls.append(1)
            buffer.add_batch(items_for(rows, np.full(2, 2)))
        assert buffer.stats().inserts == 4 and len(buffer) == 4
        monkeypatch.setattr(writer, "_write_exact", write)
        buffer.add_batch(items_for(rows, np.full(2, 2)))  # the row goes on
        assert buffer.stats().inserts == 6 and len(buffer) == 6
        items, _ = buffer.get_next(200, timeout=5)
        assert set(items["step"].tolist()) == {0, 1, 2}


# ----------------------------------------------------------- the flat tree
@settings(max_examples=50, deadline=None)
@given(capacity=st.integers(1, 300), data=st.data())
def test_propagating_some_leaves_gives_the_tree_a_rebuild_gives(capacity, data):
    """One leaf (the scalar walk) or several (level by level), sum or min: the interior
    after :func:`propagate` is the interior :func:`rebuild` computes from the leaves."""
    from replaybuffer.sampling import flat_tree
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    for combine, identity in ((np.add, 0.0), (np.minimum, np.inf)):
        tree = np.full(flat_tree.tree_nodes(capacity), identity)
        flat_tree.set_leaves(tree, np.arange(capacity), rng.exponential(1.0, capacity))
        flat_tree.rebuild(tree, combine)
        for count in (1, data.draw(st.integers(1, 2 * capacity))):
            leaves = rng.integers(0, capacity, count)
            flat_tree.set_leaves(tree, leaves, rng.exponential(1.0, count))
            flat_tree.propagate(tree, leaves, combine)
            rebuilt = tree.copy()
            flat_tree.rebuild(rebuilt, combine)
            np.testing.assert_allclose(tree, rebuilt, rtol=1e-12)
