"""One suite over every buffer implementation: the buffer surface
(:class:`replaybuffer.protocols.Buffer`) behaves the same on the local buffers, the
shared-memory buffer and the Ray buffer.

What an implementation cannot do yet is a strict expected failure naming the issue that
adds it, so the gap is visible here and turns into a pass when it closes.

Buffers hold rows of self-describing items (each names its row and step). The Ray
buffers (2 shards, round-robin writes) are costly to start (an actor process per shard),
so each configuration is started once for the module and cleared between tests.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.distributed import NotSupportedError, SharedReplayBuffer
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.protocols import Buffer, PrioritizedBuffer

SPEC = {"row": rb.ArraySpec((), np.int64), "step": rb.ArraySpec((), np.int64),
        "obs": rb.ArraySpec((3,), np.float32)}
EPISODE_SPEC = {"step_type": rb.ArraySpec((), np.int32), "value": rb.ArraySpec((), np.int64)}
ROWS, LENGTH, SHARDS = 2, 4, 2
FIRST, MID, LAST = 0, 1, 2

LOCAL = ["uniform", "prioritized"]
SHARED = ["shared", "shared_prioritized"]
RAY = ["ray", "ray_prioritized"]
PRIORITIZED = ["prioritized", "shared_prioritized", "ray_prioritized"]


def gap(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=reason)


def kinds(names: list[str], **gaps: str) -> list:
    """``names`` as parameters, those in ``gaps`` marked as strict expected failures."""
    return [pytest.param(n, marks=gap(gaps[n])) if n in gaps else n for n in names]


# --------------------------------------------------------------------- the buffers
def local_buffer(kind: str, limiter: str | None = None, episodes: bool = False):
    """A local buffer (also each Ray shard's, made in the shard's process)."""
    spec = EPISODE_SPEC if episodes else SPEC
    extra = {"track_episodes": True} if episodes else {}
    if kind == "prioritized":
        buffer = rb.PrioritizedReplayBuffer(spec, ROWS, LENGTH, alpha=1.0, seed=0, **extra)
    else:
        buffer = rb.UniformReplayBuffer(spec, ROWS, LENGTH, seed=0, **extra)
    buffer.rate_limiter = make_limiter(limiter)
    return buffer


def make_limiter(limiter: str | None):
    if limiter == "min_size":
        return rb.MinSize(2)
    if limiter == "queue":
        return rb.Queue(4)
    return None


@pytest.fixture(scope="module")
def ray_buffers():
    """Ray buffers by configuration, started on first use (one local cluster)."""
    ray = pytest.importorskip("ray")
    from replaybuffer.distributed import RayReplayBuffer

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    here = str(Path(__file__).resolve().parent)  # shards import this module's factory
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    made: dict = {}

    def get(kind: str, limiter: str | None, episodes: bool):
        key = (kind, limiter, episodes)
        if key not in made:
            factory = functools.partial(local_buffer, kind.removeprefix("ray_") if
                                        kind != "ray" else "uniform", limiter, episodes)
            made[key] = RayReplayBuffer(factory, SHARDS, seed=0)
        else:
            made[key].clear()
        return made[key]

    yield get
    for buffer in made.values():
        buffer.close()
    if started:
        ray.shutdown()


@pytest.fixture
def make(request, tmp_path):
    """``make(kind, limiter=None, episodes=False)``: an empty buffer of that kind."""
    shared: list[SharedReplayBuffer] = []

    def build(kind: str, limiter: str | None = None, episodes: bool = False):
        if kind in LOCAL:
            return local_buffer(kind, limiter, episodes)
        if kind in SHARED:
            buffer = SharedReplayBuffer(EPISODE_SPEC if episodes else SPEC, ROWS, LENGTH,
                                        prioritized=kind == "shared_prioritized", alpha=1.0,
                                        rate_limiter=make_limiter(limiter), seed=0,
                                        track_episodes=episodes)
            shared.append(buffer)
            return buffer
        return request.getfixturevalue("ray_buffers")(kind, limiter, episodes)

    yield build
    for buffer in shared:
        buffer.close()


def items(step: int, rows: int = ROWS) -> dict:
    """One step for every row: ``row``, ``step`` and ``obs = [step, row, 0.5]``."""
    row = np.arange(rows, dtype=np.int64)
    obs = np.stack([np.full(rows, step), row, np.full(rows, 0.5)], 1).astype(np.float32)
    return {"row": row, "step": np.full(rows, step, np.int64), "obs": obs}


def fill(buffer, steps: range) -> None:
    for t in steps:
        assert buffer.add_batch(items(t)) is True
    buffer.flush()


def in_sequence(buffer) -> dict:
    """Keywords of an ``add_batch`` that keeps each row's steps in one sequence: a Ray
    buffer's round-robin writes spread them over shards (windows over them are refused,
    below), so its sequences go to shard 0."""
    return {"shard": 0} if getattr(buffer, "num_shards", 1) > 1 else {}


def fill_sequences(buffer, steps: range) -> None:
    """:func:`fill`, each row's steps in one sequence (:func:`in_sequence`)."""
    for t in steps:
        assert buffer.add_batch(items(t), **in_sequence(buffer)) is True
    buffer.flush()


def check_items(batch: dict) -> None:
    """Every sampled item is one that was written: its obs names its step and row."""
    np.testing.assert_array_equal(batch["obs"][..., 0], batch["step"])
    np.testing.assert_array_equal(batch["obs"][..., 1], batch["row"])


ALL = LOCAL + SHARED + RAY


# ------------------------------------------------------------------------- surface
@pytest.mark.parametrize("kind", ALL)
def test_satisfies_the_buffer_protocol(make, kind):
    buffer = make(kind)
    assert isinstance(buffer, Buffer)
    if kind in PRIORITIZED:
        assert isinstance(buffer, PrioritizedBuffer)


@pytest.mark.parametrize("kind", ALL)
def test_add_batch_and_extend_grow_len_and_ids_name_steps(make, kind):
    buffer = make(kind)
    assert len(buffer) == 0 and buffer.capacity >= ROWS * LENGTH
    assert buffer.add_batch(items(0)) is True
    block = {k: np.stack([v, items(2)[k]], 1) for k, v in items(1).items()}  # [B, 2, ...]
    assert buffer.extend(block) is True
    buffer.flush()
    assert len(buffer) == ROWS * 3
    batch, info = buffer.get_next(200)
    check_items(batch)
    assert set(batch["step"].tolist()) == {0, 1, 2}
    ids = np.asarray(info.ids)
    assert ids.shape == (200,) and ids.dtype == np.int64
    step_of = {}
    for i, step in zip(ids.tolist(), batch["step"].tolist()):
        assert step_of.setdefault(i, step) == step  # an id names one step
    assert np.asarray(info.probabilities).shape == (200,)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("size,steps", [(None, None), (3, None), (None, 2), (3, 2)])
def test_get_next_shapes(make, kind, size, steps):
    buffer = make(kind)
    fill_sequences(buffer, range(3))
    batch, info = buffer.get_next(size, steps)
    outer = tuple(n for n in (size, steps) if n is not None)
    assert batch["obs"].shape == outer + (3,) and batch["step"].shape == outer
    assert np.shape(info.ids) == outer
    check_items(batch)


@pytest.mark.parametrize("kind", ALL)
def test_get_next_unstacked_gives_a_tuple_of_steps(make, kind):
    buffer = make(kind)
    fill_sequences(buffer, range(3))
    batch, info = buffer.get_next(5, 2, time_stacked=False)
    assert isinstance(batch, tuple) and len(batch) == 2
    assert batch[0]["obs"].shape == (5, 3)
    np.testing.assert_array_equal(batch[1]["step"], batch[0]["step"] + 1)


@pytest.mark.parametrize("kind", ALL)
def test_windows_stay_in_one_row_and_behind_the_write_head(make, kind):
    buffer = make(kind)
    kept = LENGTH  # steps a row holds (one shard's, for the Ray buffers)
    written = 2 * kept  # wrapped around twice
    fill_sequences(buffer, range(written))
    batch, _ = buffer.get_next(400, 3)
    check_items(batch)
    assert (batch["row"] == batch["row"][:, :1]).all()
    np.testing.assert_array_equal(np.diff(batch["step"], axis=1), 1)
    assert batch["step"].min() >= written - kept and batch["step"].max() <= written - 1


@pytest.mark.parametrize("kind", ALL)
def test_wrap_around_keeps_the_newest_steps(make, kind):
    buffer = make(kind)
    written = buffer.capacity // ROWS + 3
    fill(buffer, range(written))
    assert len(buffer) == buffer.capacity
    batch, _ = buffer.get_next(2000)
    check_items(batch)
    kept = buffer.capacity // ROWS
    assert set(batch["step"].tolist()) == set(range(written - kept, written))
    assert set(batch["row"].tolist()) == set(range(ROWS))


# ---------------------------------------------------------------------- bad input
BAD = {
    "structure": ({k: v for k, v in items(9).items() if k != "obs"}, "structure"),
    "shape": ({**items(9), "obs": np.zeros((ROWS, 2), np.float32)}, "obs"),
    "dtype": ({**items(9), "step": np.full(ROWS, 1.5)}, "step"),
}


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_items_raise_a_spec_error_and_change_nothing(make, kind, bad):
    buffer = make(kind)
    fill(buffer, range(2))
    before = len(buffer)
    value, names = BAD[bad]
    with pytest.raises(SpecError, match=names):
        buffer.add_batch(value)
    buffer.flush()
    assert len(buffer) == before
    batch, _ = buffer.get_next(100)
    check_items(batch)
    assert set(batch["step"].tolist()) == {0, 1}


@pytest.mark.parametrize("kind", ALL)
def test_an_empty_buffer_raises_empty_buffer_error(make, kind):
    buffer = make(kind)
    with pytest.raises(EmptyBufferError):
        buffer.get_next(2)


# -------------------------------------------------------------------- iteration
@pytest.mark.parametrize("kind", ALL)
def test_as_dataset_streams_batches_of_the_asked_shape(make, kind):
    buffer = make(kind)
    fill_sequences(buffer, range(4))
    stream = iter(buffer.as_dataset(4, 2, num_parallel_calls=2))
    try:
        for _ in range(3):
            batch, info = next(stream)
            assert batch["obs"].shape == (4, 2, 3) and np.shape(info.ids) == (4, 2)
            check_items(batch)
    finally:
        stream.close()


# ----------------------------------------------------------------- rate limiting
@pytest.mark.parametrize("kind", ALL)
def test_stats_without_a_rate_limiter_are_none(make, kind):
    buffer = make(kind)
    fill(buffer, range(2))
    assert buffer.stats() is None


@pytest.mark.parametrize("kind", ["uniform", "shared", "ray"])
def test_stats_count_inserts_and_samples(make, kind):
    buffer = make(kind, limiter="min_size")
    fill(buffer, range(3))
    buffer.get_next(5)
    stats = buffer.stats()
    assert (stats.inserts, stats.samples, stats.size) == (ROWS * 3, 5, ROWS * 3)


@pytest.mark.parametrize("kind", kinds(["uniform", "shared"]))
def test_the_queue_limiter_holds_inserts_until_items_are_read(make, kind):
    buffer = make(kind, limiter="queue")  # Queue(4): two steps of two rows
    fill(buffer, range(2))
    with pytest.raises(rb.RateLimitedError):
        buffer.add_batch(items(2), timeout=0.2)
        buffer.flush()
    buffer.get_next(2)
    assert buffer.add_batch(items(3), timeout=5) is True
    buffer.flush()


# -------------------------------------------------------------------- priorities
@pytest.mark.parametrize("kind", PRIORITIZED)
def test_draws_follow_the_priorities_set(make, kind):
    buffer = make(kind)
    fill(buffer, range(2))  # 4 items: rows 0, 1 at steps 0, 1
    batch, info = buffer.get_next(400)
    by_item = {(int(r), int(s)): int(i)
               for r, s, i in zip(batch["row"], batch["step"], info.ids)}
    assert len(by_item) == 4
    priority = {item: 1.0 + 2 * item[1] + item[0] for item in by_item}  # 1, 2, 3, 4
    ids = np.array(list(by_item.values()))
    assert buffer.update_priorities(ids, np.array([priority[k] for k in by_item])) == 4
    batch, info = buffer.get_next(20_000)
    counts = np.array([((batch["row"] == r) & (batch["step"] == s)).sum()
                       for r, s in by_item])
    expected = np.array([priority[k] for k in by_item]) / 10 * 20_000
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 16.27  # 3 degrees of freedom, p = 0.001
    np.testing.assert_allclose(info.probabilities,
                               (1.0 + 2 * batch["step"] + batch["row"]) / 10, rtol=1e-5)
    assert float(np.max(info.weights)) == 1.0


# ------------------------------------------------------------ save, clear, episodes
@pytest.mark.parametrize("kind,call", [
    ("ray", lambda b, path: b.save(path)),
    ("ray", lambda b, path: b.add_batch(items(0), block=False))])
def test_what_a_buffer_cannot_do_yet_is_refused_by_name(make, kind, call, tmp_path):
    buffer = make(kind)
    with pytest.raises(NotSupportedError, match=type(buffer).__name__):
        call(buffer, tmp_path / "saved")
    assert isinstance(NotSupportedError(), NotImplementedError)



@pytest.mark.parametrize("kind", kinds(
    LOCAL + SHARED))  # Ray: refused by name, above
def test_save_and_load_round_trip(make, kind, tmp_path):
    buffer = make(kind)
    fill(buffer, range(3))
    buffer.save(tmp_path / "saved")
    loaded = rb.load(tmp_path / "saved")
    assert len(loaded) == len(buffer) == ROWS * 3
    batch, _ = loaded.get_next(200)
    check_items(batch)
    assert set(batch["step"].tolist()) == {0, 1, 2}


@pytest.mark.parametrize("kind", ALL)
def test_clear_empties_and_the_buffer_fills_again(make, kind):
    buffer = make(kind)
    fill(buffer, range(3))
    buffer.clear()
    assert len(buffer) == 0
    with pytest.raises(EmptyBufferError):
        buffer.get_next(2)
    fill(buffer, range(10, 12))
    batch, _ = buffer.get_next(100)
    check_items(batch)
    assert set(batch["step"].tolist()) == {10, 11}


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "shared", "shared_prioritized",
                                  "ray"])
def test_within_episodes_windows_never_cross_an_episode_start(make, kind):
    buffer = make(kind, episodes=True)
    step_types = [FIRST, MID, LAST, FIRST, MID, MID, LAST, FIRST]
    for t, step_type in enumerate(step_types):
        buffer.add_batch({"step_type": np.full(ROWS, step_type, np.int32),
                          "value": np.arange(ROWS) * 1000 + t}, **in_sequence(buffer))
    buffer.flush()
    stream = iter(buffer.as_dataset(64, 2, within_episodes=True))
    batch, _ = next(stream)
    # A window's second step is never the FIRST step of a new episode.
    assert (batch["step_type"][:, 1] != FIRST).all()
    np.testing.assert_array_equal(np.diff(batch["value"], axis=1), 1)


# ------------------------------------------- what one buffer does and shards cannot
@pytest.mark.parametrize("kind", RAY)
def test_ray_refuses_windows_over_round_robin_writes_until_cleared(make, kind):
    buffer = make(kind)
    fill(buffer, range(4))  # round-robin: each shard holds every other step of a row
    with pytest.raises(NotSupportedError, match=r"windows \(num_steps=2\) over "
                                                "round-robin writes"):
        buffer.get_next(4, 2)
    batch, _ = buffer.get_next(50)  # single steps are whole wherever they went
    check_items(batch)
    buffer.clear()
    fill_sequences(buffer, range(3))
    batch, _ = buffer.get_next(20, 2)
    np.testing.assert_array_equal(np.diff(batch["step"], axis=1), 1)


def ray_queue(buffer):
    return lambda: buffer.add_batch(items(0))


@pytest.mark.parametrize("case,setup,options,names", [
    ("queue", ray_queue, {"limiter": "queue"}, "round-robin add_batch into shards with "
                                               "a Queue rate limiter")])
def test_ray_refuses_what_shards_cannot_do_as_one_buffer(make, case, setup, options, names):
    """A Queue per shard bounds no whole (the test of the Queue limiter above): a
    round-robin write is refused by name, and the buffer is as it was."""
    buffer = make("ray", **options)
    call = setup(buffer)
    before = len(buffer)
    with pytest.raises(NotSupportedError, match=f"RayReplayBuffer does not support {names}"):
        call()
    buffer.flush()
    assert len(buffer) == before
