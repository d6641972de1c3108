"""RayReplayBuffer's scaling parts on a local Ray cluster (num_cpus=2): batches in
flight (reproducible from the seed), batches from a fixed number of shards chosen by
mass (each item's marginal exact, chi-square tested), writers that send chunks in
order (issue 25).

Starting a shard costs a process, so the module shares two buffers of 3 shards,
cleared and reseeded by each test."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ray = pytest.importorskip("ray")

from ray_cluster import CountingMassHandle, start_local_cluster  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.distributed import RayReplayBuffer  # noqa: E402
from replaybuffer.sampling.sampler import make_rng  # noqa: E402

SPEC = {"x": rb.ArraySpec((), np.int64), "step_type": rb.ArraySpec((), np.int32)}
SHARDS = 3


def uniform():
    return rb.UniformReplayBuffer(SPEC, 1, 1000, seed=0)


def prioritized():
    return rb.PrioritizedReplayBuffer(SPEC, 1, 100, alpha=1.0, seed=0)


@pytest.fixture(scope="module")
def buffers():
    start_local_cluster()
    made = {"uniform": RayReplayBuffer(uniform, SHARDS, seed=0),
            "prioritized": RayReplayBuffer(prioritized, SHARDS, seed=0)}
    yield made
    for buffer in made.values():
        buffer.close()
    ray.shutdown()


@pytest.fixture
def make(buffers):
    def get(kind: str = "uniform", seed: int = 0, shards_per_batch: int | None = None):
        buffer = buffers[kind]
        buffer.clear()
        buffer._rng = make_rng(seed)  # as a new buffer with this seed would have
        buffer.shards_per_batch = shards_per_batch
        return buffer
    return get


def chi_square(counts: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    return float(((counts - expected) ** 2 / expected).sum()), len(counts) - 1


def below_critical(statistic: float, k: int) -> bool:
    """Wilson-Hilferty's p = 0.001 critical value of chi-square with k degrees."""
    return statistic < k * (1 - 2 / (9 * k) + 3.09 * np.sqrt(2 / (9 * k))) ** 3


def items(x, step_type: int = 1) -> dict:
    x = np.asarray(x, np.int64)
    return {"x": x, "step_type": np.full(x.shape, step_type, np.int32)}


def fill_shards(buffer: RayReplayBuffer, sizes: list[int]) -> None:
    """Shard i holds sizes[i] items, x = 100 * i + t."""
    for i, n in enumerate(sizes):
        buffer.extend(items((100 * i + np.arange(n))[None]), shard=i)
    buffer.flush()


def take(buffer: RayReplayBuffer, n: int, prefetch: int, size: int = 16,
         num_steps: int | None = None):
    stream = iter(buffer.as_dataset(size, num_steps, prefetch=prefetch))
    try:
        return [next(stream) for _ in range(n)], stream.in_flight()
    finally:
        stream.close()


def check_marginal(drawn: np.ndarray, part: int, weight: dict[int, float]) -> None:
    """Items drawn in parts of ``part`` from shards (x // 100) chosen by mass: the
    shards' part counts follow their masses, and within each shard the items follow
    their weights (two chi-square tests; items of one part are not independent)."""
    total = sum(weight.values())
    shards = sorted({x // 100 for x in weight})
    mass = {s: sum(w for x, w in weight.items() if x // 100 == s) for s in shards}
    per_shard = np.array([(drawn // 100 == s).sum() for s in shards])
    assert (per_shard % part == 0).all()
    parts = per_shard // part
    stat, k = chi_square(parts, np.array([mass[s] / total for s in shards]) * parts.sum())
    assert below_critical(stat, k)
    stat, k = 0.0, 0
    for s, got in zip(shards, per_shard):
        xs = [x for x in weight if x // 100 == s]
        counts = np.array([(drawn == x).sum() for x in xs])
        one, dof = chi_square(counts, np.array([weight[x] for x in xs]) / mass[s] * got)
        stat, k = stat + one, k + dof
    assert below_critical(stat, k)


@pytest.mark.parametrize("shards_per_batch", [None, 2])
def test_batches_in_flight_are_bounded_and_the_seed_fixes_their_order(make,
                                                                      shards_per_batch):
    runs = []
    for prefetch in (1, 5):
        buffer = make(seed=11, shards_per_batch=shards_per_batch)
        fill_shards(buffer, [10, 20, 30])
        batches, in_flight = take(buffer, 8, prefetch)
        assert in_flight == prefetch  # requested ahead while the learner trains
        runs.append(batches)
        other, _ = take(buffer, 8, prefetch)  # a second stream draws other batches
        assert any((x["x"] != y["x"]).any() for (x, _), (y, _) in zip(batches, other))
    for (a, info_a), (b, info_b) in zip(*runs):
        np.testing.assert_array_equal(a["x"], b["x"])
        local = (1 << 48) - 1  # the incarnation (a new one per clear) aside
        np.testing.assert_array_equal(info_a.ids & local, info_b.ids & local)


@pytest.mark.parametrize("shards_per_batch", [None, 1, 2])
@pytest.mark.parametrize("num_steps", [None, 3])
def test_batches_drawn_several_per_call_are_the_seeds_batches(make, shards_per_batch,
                                                              num_steps):
    runs = []
    for group in (1, 3):
        buffer = make(seed=12, shards_per_batch=shards_per_batch)
        fill_shards(buffer, [10, 20, 30])
        stream = iter(buffer.as_dataset(16, num_steps, prefetch=5, batches_per_call=group))
        batches = [next(stream) for _ in range(24)]
        # 5 .. 5 + 3 - 1 in flight while the learner trains (never below prefetch)
        assert 5 <= stream.in_flight() <= 5 + group - 1
        calls = [answer for pending in stream._pending for _, answer, _, _ in pending.calls]
        if group > 1:  # batches of a group that go to one shard share its call
            assert len({id(a) for a in calls}) < len(calls)
        stream.close()
        runs.append(batches)
    for (a, info_a), (b, info_b) in zip(*runs):
        for name in ("x", "step_type"):
            np.testing.assert_array_equal(a[name], b[name])
        local = (1 << 48) - 1
        np.testing.assert_array_equal(info_a.ids & local, info_b.ids & local)
        np.testing.assert_array_equal(info_a.probabilities, info_b.probabilities)
        if num_steps is not None:  # windows of consecutive steps of one shard
            np.testing.assert_array_equal(np.diff(a["x"], axis=1), 1)


def test_a_draw_answer_hands_out_its_batches_and_the_error_of_the_rest():
    from replaybuffer.distributed.ray_shards.draw_answers import (DrawAnswer,
                                                                  draw_packing, pack_draws)
    from replaybuffer.rate_limiter import RateLimitedError
    packing = draw_packing(SPEC)
    # leaves in the spec's flattened order (sorted keys): step_type, x
    drawn = [([np.full(n, k, np.int32), np.arange(n, dtype=np.int64) + 10 * k],
              np.arange(n, dtype=np.int64) * 2 + k, np.full(n, 0.5 / (k + 1), np.float32))
             for k, n in enumerate([2, 3])]
    payload = pack_draws(packing, SPEC, drawn, None)
    error = RateLimitedError("held back")
    answer = DrawAnswer(ray.put((payload, 2, error, 5.0, (0, -1, 0, 4))), packing,
                        [2, 3, 4], None)
    for k, (leaves, ids, probabilities) in enumerate(drawn):
        got, got_ids, got_probabilities = answer.part(k)
        np.testing.assert_array_equal(got["x"], leaves[1])
        np.testing.assert_array_equal(got["step_type"], leaves[0])
        np.testing.assert_array_equal(got_ids, ids)
        np.testing.assert_array_equal(got_probabilities, probabilities)
        assert got["x"].base is not None  # a view of the answer's one buffer
    with pytest.raises(RateLimitedError, match="held back"):
        answer.part(2)  # not drawn: the shard's in-band error
    # Leaves that are not the spec's layout, or too many bytes, are sent unpacked.
    from replaybuffer.distributed.ray_shards.draw_answers import PACK_MAX_BYTES
    n = PACK_MAX_BYTES // 12 + 1
    big = ([np.zeros(n, np.int32), np.zeros(n, np.int64)], np.zeros(n, np.int64),
           np.zeros(n, np.float32))
    assert pack_draws(packing, SPEC, [big], None) is None
    assert pack_draws(packing, SPEC, [([drawn[0][0][1]], *drawn[0][1:])], None) is None
    assert pack_draws(packing, SPEC, [(drawn[0][0][::-1], *drawn[0][1:])], None) is None


@pytest.mark.parametrize("group, prefetch", [(4, 4), (4, 8), (4, 2)])
def test_a_group_keeps_the_seeds_batches_and_prefetch_in_flight(make, group, prefetch):
    # docs/distributed/ray.md: the next group starts when the batches requested ahead
    # would fall below prefetch, so prefetch to prefetch + g - 1 stay in flight at any
    # g (the depth never drains at a group's turn). The batches are the seed's.
    runs = []
    for per_call in (1, group):
        buffer = make(seed=14, shards_per_batch=1)
        fill_shards(buffer, [10, 20, 30])
        stream = iter(buffer.as_dataset(8, prefetch=prefetch, batches_per_call=per_call))
        batches, depths = [], []
        for _ in range(3 * group):
            batches.append(next(stream))
            depths.append(stream.in_flight())
        stream.close()
        runs.append(batches)
        if per_call == group:
            assert min(depths) == prefetch
            assert max(depths) == prefetch + group - 1
        else:
            assert set(depths) == {prefetch}
    for (a, info_a), (b, info_b) in zip(*runs):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(info_a.probabilities, info_b.probabilities)


def test_the_next_group_is_started_while_prefetch_batches_of_this_one_are_left(
        make, monkeypatch):
    """The sliding look-ahead: with groups of 4 and prefetch 2, the pull that hands out
    a group's third batch (two of it left) first starts the next group, in one
    ``start_batches``; the depth after each pull is 3, 2, 5, 4, 3, 2, 5, ..."""
    buffer = make(seed=15, shards_per_batch=1)
    fill_shards(buffer, [10, 20, 30])
    started: list[int] = []  # per group started, the pulls made before it
    pulls = 0
    real = buffer.start_batches

    def counting(count, num_steps, rngs, *args, **kwargs):
        started.append(pulls)
        assert len(rngs) == 4  # whole groups, the first fill too
        return real(count, num_steps, rngs, *args, **kwargs)

    monkeypatch.setattr(buffer, "start_batches", counting)
    stream = iter(buffer.as_dataset(8, prefetch=2, batches_per_call=4))
    depths = []
    for pulls in range(10):
        next(stream)
        depths.append(stream.in_flight())
    stream.close()
    assert depths == [3, 2, 5, 4, 3, 2, 5, 4, 3, 2]
    # group k + 1 is started at the pull of group k's third batch (pull 4k + 2)
    assert started == [0, 2, 6]


def test_batches_per_call_below_one_is_refused_and_nothing_changes(make):
    buffer = make(seed=13)
    fill_shards(buffer, [4, 4, 4])
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match=f"batches_per_call must be a positive int, "
                                             f"got {bad!r}"):
            buffer.as_dataset(4, prefetch=2, batches_per_call=bad)
    assert len(buffer) == 12
    stream = iter(buffer.as_dataset(4, prefetch=2, batches_per_call=8))  # above prefetch
    batch, _ = next(stream)
    assert batch["x"].shape == (4,) and stream.in_flight() == 7  # a whole group of 8


def test_prefetch_below_one_and_bad_shard_counts_are_refused(make):
    buffer = make()
    fill_shards(buffer, [4, 0, 0])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"prefetch must be a positive int.*{bad!r}"):
            buffer.as_dataset(4, prefetch=bad)
    with pytest.raises(ValueError, match="shards_per_batch must be a positive int"):
        buffer.shards_per_batch = 0
    assert len(buffer) == 4 and buffer.shards_per_batch is None


def test_one_shard_per_batch_keeps_each_items_marginal_exact(make):
    buffer = make(seed=3, shards_per_batch=1)
    sizes = [5, 10, 15]
    fill_shards(buffer, sizes)
    batches, _ = take(buffer, 1500, prefetch=8, size=8)
    drawn = np.stack([b["x"] for b, _ in batches])
    assert ((drawn // 100) == (drawn[:, :1] // 100)).all()  # each batch from one shard
    check_marginal(drawn, 8, {100 * i + t: 1.0 for i, n in enumerate(sizes)
                              for t in range(n)})
    for _, info in batches[:50]:
        np.testing.assert_allclose(info.probabilities, 1 / 30, rtol=1e-6)


def test_a_fixed_number_of_shards_per_batch_follows_priorities(make):
    buffer = make("prioritized", seed=4, shards_per_batch=2)
    fill_shards(buffer, [2, 3, 3])
    by_x: dict[int, int] = {}
    while len(by_x) < 8:
        batch, info = buffer.get_next(64)
        by_x.update({int(x): int(i) for x, i in zip(batch["x"], info.ids)})
    xs = sorted(by_x)
    priority = {x: 1.0 + k for k, x in enumerate(xs)}  # 1 .. 8, total 36
    assert buffer.update_priorities(np.array([by_x[x] for x in xs]),
                                    np.array([priority[x] for x in xs])) == 8
    batches, _ = take(buffer, 600, prefetch=8, size=10)
    drawn = np.stack([b["x"] for b, _ in batches])
    assert all(len(set((row // 100).tolist())) <= 2 for row in drawn)  # <= 2 shards
    check_marginal(drawn, 5, priority)
    for b, info in batches[:50]:
        expected = np.array([priority[int(x)] for x in b["x"]]) / 36
        np.testing.assert_allclose(info.probabilities, expected, rtol=1e-5)


def test_a_batch_from_one_shard_is_handed_over_without_a_copy(make):
    buffer = make(seed=5, shards_per_batch=1)
    fill_shards(buffer, [50, 50, 50])
    batch, info = buffer.get_next(40_000)  # 320 KB: in Ray's object store
    # Mapped from the store, not copied on this side: read-only.
    assert not batch["x"].flags.writeable
    assert len(set((batch["x"] // 100).tolist())) == 1
    buffer.shards_per_batch = None
    batch, _ = buffer.get_next(40_000)  # parts of 3 shards: concatenated here
    assert batch["x"].flags.writeable and len(set((batch["x"] // 100).tolist())) == 3


def test_a_writer_sends_chunks_and_keeps_its_order(make):
    buffer = make(seed=6)
    writer = buffer.writer(0, chunk_steps=16, chunk_seconds=60)
    for t in range(0, 300, 3):  # add_batch and extend mixed
        if t % 2:
            writer.extend(items(np.arange(t, t + 3)[None]))
        else:
            for s in range(t, t + 3):
                writer.add_batch(items([s]))
    assert writer._outbox._seq[0] <= 300 // 16 + 1  # chunks, not a call per step
    assert buffer.describe()[0]["size"] < 300  # the last chunk waits for flush
    writer.flush()
    window, _ = buffer.get_next(1, 300)
    np.testing.assert_array_equal(window["x"][0], np.arange(300))
    steps, _ = buffer.get_next(5, 3, time_stacked=False)  # a 3-tuple of [5] steps
    assert isinstance(steps, tuple) and len(steps) == 3 and steps[0]["x"].shape == (5,)
    np.testing.assert_array_equal(steps[2]["x"], steps[0]["x"] + 2)


def test_a_writers_calls_go_to_its_own_shard_one_per_chunk(make):
    """A collector's remote calls per step do not grow with the shard count: its
    writer sends each chunk whole to its own shard, never split over the others."""
    buffer = make(seed=9)
    writer = buffer.writer(1, chunk_steps=16, chunk_seconds=60)
    for t in range(0, 160, 8):
        writer.extend(items(np.arange(t, t + 8)[None]))
    writer.flush()
    assert writer._outbox._seq == {1: 10}  # 160 steps, 10 chunks of 16, one shard
    assert [d["size"] for d in buffer.describe()] == [0, 160, 0]


def test_a_writer_sends_at_an_episode_end_and_after_chunk_seconds(make):
    buffer = make(seed=7)
    writer = buffer.writer(0, chunk_steps=64, chunk_seconds=60)
    for t, step_type in enumerate([0, 1, 1, 2]):  # FIRST, MID, MID, LAST
        writer.add_batch(items([t], step_type))
    writer._outbox.flush()  # the chunk went at the LAST step; wait for it to land
    assert buffer.describe()[0]["size"] == 4
    quick = buffer.writer(0, chunk_steps=64, chunk_seconds=0)
    quick.add_batch(items([9]))
    quick._outbox.flush()
    assert buffer.describe()[0]["size"] == 5
    with pytest.raises(ValueError, match="chunk_steps"):
        buffer.writer(0, chunk_steps=0)


def test_masses_are_asked_only_of_shards_no_answer_brought_them(make, monkeypatch):
    """Shards that answer draws bring their masses: the learner asks none of them; an
    empty shard, which no draw reaches, is asked, and items a writer (whose answers
    the learner never sees) puts in it are drawn once its answer comes."""
    from replaybuffer.distributed.ray_shards import sampling

    monkeypatch.setattr(sampling, "MASS_REFRESH_S", 0.2)
    buffer = make(seed=8)
    fill_shards(buffer, [10, 20, 0])
    asked = [0] * SHARDS
    handles = list(buffer._actors)
    buffer._actors[:] = [CountingMassHandle(h, asked, i) for i, h in enumerate(handles)]
    try:
        stream = iter(buffer.as_dataset(8, prefetch=2))
        next(stream)  # the first draw asks every shard (and waits): no mass known
        asked[:] = [0] * SHARDS
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # several refresh periods
            batch, _ = next(stream)
            assert ((batch["x"] // 100) < 2).all()
        assert asked[0] == asked[1] == 0 and asked[2] >= 1
        writer = buffer.writer(2, chunk_steps=4)
        writer.extend(items(200 + np.arange(4)[None]))
        writer.flush()
        deadline = time.monotonic() + 30.0
        while not ((next(stream)[0]["x"] // 100) == 2).any():
            assert time.monotonic() < deadline, "shard 2's new items never drawn"
        assert asked[0] == asked[1] == 0
    finally:
        buffer._actors[:] = handles


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=12).filter(lambda m: sum(m) > 0),
       st.integers(1, 40), st.integers(0, 2**32))
def test_picked_shards_are_what_generator_choice_draws(mass, size, seed):
    from replaybuffer.distributed.ray_shards.sampling import pick_shards

    p = np.asarray(mass) / np.sum(mass)
    expected = np.random.default_rng(seed).choice(len(p), size=size, p=p)
    got = pick_shards(np.random.default_rng(seed), p, size)
    np.testing.assert_array_equal(got, expected)
    assert (p[got] > 0).all()


def test_a_dataset_over_fifo_shards_reads_on_pull_in_order(buffers):
    """FIFO shards consume what they give: the dataset requests nothing ahead (prefetch
    0 under the look-ahead rule: one batch started at each pull), so each pull reads
    the next items in order and nothing is in flight between pulls."""
    def fifo():
        return rb.FIFOReplayBuffer(SPEC, 1, 100)

    with RayReplayBuffer(fifo, 1, seed=0) as buffer:
        buffer.extend(items(np.arange(16)[None]), shard=0)
        buffer.flush()
        stream = iter(buffer.as_dataset(4))
        for start in (0, 4, 8):
            batch, _ = next(stream)
            np.testing.assert_array_equal(batch["x"], np.arange(start, start + 4))
            assert stream.in_flight() == 0
        stream.close()
        for bad in ({"batches_per_call": 2}, {"batches_per_call": 0},
                    {"group_from_one_shard": True}, {"group_from_one_shard": 1}):
            with pytest.raises(ValueError, match="one batch at each pull"):
                buffer.as_dataset(4, **bad)  # read on pull: nothing to group, refused
        for bad in ({"prefetch": 2}, {"num_parallel_calls": 2}):
            with pytest.raises(ValueError, match="read each window once"):
                buffer.as_dataset(4, **bad)
        batch, _ = buffer.get_next(4, timeout=0)  # and nothing was consumed by them
        np.testing.assert_array_equal(batch["x"], np.arange(12, 16))
