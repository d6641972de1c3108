"""Windows that stay within one episode (track_episodes / within_episodes)."""

import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from conftest import to_np
from replaybuffer.sampling import Ring
from replaybuffer.sampling.episodes import EpisodeIndex

FIRST, MID, LAST = 0, 1, 2
SPEC = {"step_type": rb.ArraySpec((), np.int32), "value": rb.ArraySpec((), np.int64)}


def steps_of(lengths):
    """Step types of consecutive episodes of the given lengths (each ends with a boundary)."""
    out = []
    for n in lengths:
        out += [FIRST] + [MID] * (n - 1) + [LAST]  # the LAST step is the boundary
    return out


def filled(kind, step_types, batch_size=1, max_length=50, **kwargs):
    """Row b holds values 1000 * b + id; every row gets the same step types."""
    cls = rb.PrioritizedReplayBuffer if kind == "prioritized" else rb.UniformReplayBuffer
    buf = cls(SPEC, batch_size, max_length, seed=0, track_episodes=True, **kwargs)
    for t, s in enumerate(step_types):
        buf.add_batch({"step_type": np.full(batch_size, s, np.int32),
                       "value": np.arange(batch_size) * 1000 + t})
    return buf


def valid_windows(step_types, batch_size, max_length, num_steps):
    """Brute force: (start id, row) of windows inside the ring and one episode."""
    last = len(step_types) - 1
    oldest = max(0, last + 1 - max_length)
    out = set()
    for s in range(oldest, last - num_steps + 2):
        if all(step_types[i] != FIRST for i in range(s + 1, s + num_steps)):
            out |= {(s, b) for b in range(batch_size)}
    return out


def test_index_segments_with_plain_integers():
    ring = Ring(2, 10)
    ring.last_id = 11  # holds 2..11
    index = EpisodeIndex()
    starts = np.zeros((12, 2), bool)
    starts[[0, 4, 7], 0] = True   # row 0: episodes start at 0, 4, 7
    starts[[5], 1] = True          # row 1: at 5
    index.record(0, starts, oldest_id=2)
    firsts, lengths, rows = index.segments(ring)
    assert firsts.tolist() == [2, 4, 7, 2, 5] and lengths.tolist() == [2, 3, 5, 3, 7]
    assert rows.tolist() == [0, 0, 0, 1, 1]
    assert index.count(ring, 3) == 0 + 1 + 3 + 1 + 5
    ids, r = index.sample(ring, 3, np.arange(10))
    assert list(zip(ids.tolist(), r.tolist())) == [
        (4, 0), (7, 0), (8, 0), (9, 0), (2, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)]
    assert index.within(ring, np.array([3, 4, 5, 2, 3]), np.array([0, 0, 0, 1, 1]), 3).tolist() \
        == [False, True, False, True, False]
    ids, r = index.outside(ring, 3)
    assert sorted(zip(ids.tolist(), r.tolist())) == [
        (2, 0), (3, 0), (3, 1), (4, 1), (5, 0), (6, 0), (10, 0), (10, 1), (11, 0), (11, 1)]


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_windows_never_cross_into_the_next_episode(kind):
    types = steps_of([3, 1, 5, 2, 4])
    buf = filled(kind, types, batch_size=2)
    items, info = buf.get_next(2000, num_steps=3, within_episodes=True)
    st_, value = items["step_type"], items["value"]
    assert not (st_[:, 1:] == FIRST).any()
    starts = {(int(v) % 1000, int(v) // 1000) for v in value[:, 0]}
    assert starts == valid_windows(types, 2, 50, 3)  # every valid window is drawn
    if kind == "uniform":
        np.testing.assert_allclose(info.probabilities, 1 / len(starts), rtol=1e-6)
    plain, _ = buf.get_next(2000, num_steps=3)
    assert (plain["step_type"][:, 1:] == FIRST).any()  # without the option they do cross


def test_the_final_observation_window_is_kept():
    types = steps_of([2])  # FIRST, MID, LAST(boundary)
    buf = filled("uniform", types)
    items, _ = buf.get_next(50, num_steps=2, within_episodes=True)
    assert {tuple(v) for v in items["value"].tolist()} == {(0, 1), (1, 2)}


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=12),
       batch_size=st.integers(1, 3), max_length=st.integers(2, 15),
       num_steps=st.integers(1, 4), kind=st.sampled_from(["uniform", "prioritized"]))
def test_sampled_windows_match_a_brute_force_model(lengths, batch_size, max_length,
                                                   num_steps, kind):
    types = steps_of(lengths)
    buf = filled(kind, types, batch_size, max_length)
    valid = valid_windows(types, batch_size, max_length, num_steps)
    if num_steps > max_length:
        return
    if not valid:
        with pytest.raises(rb.EmptyBufferError):
            buf.get_next(4, num_steps, within_episodes=True)
        return
    items, info = buf.get_next(64, num_steps, within_episodes=True)
    values = items["value"]
    got = {(int(v) % 1000, int(v) // 1000) for v in values[:, 0]}
    assert got <= valid
    np.testing.assert_array_equal(values[:, 1:] - values[:, :-1], 1)
    if kind == "uniform":
        np.testing.assert_allclose(info.probabilities, 1 / len(valid), rtol=1e-6)
    else:  # all priorities equal: uniform over the valid windows too
        np.testing.assert_allclose(info.probabilities, 1 / len(valid), rtol=1e-5)


def test_prioritized_within_episodes_follows_priorities():
    types = steps_of([3, 3])  # ids 0..7; windows of 2 within episodes start at 0,1,2,4,5,6
    buf = filled("prioritized", types, alpha=1.0)
    buf.update_priorities(np.arange(8), np.arange(1.0, 9.0))
    items, info = buf.get_next(400, num_steps=2, within_episodes=True)
    starts = items["value"][:, 0]
    assert set(starts.tolist()) <= {0, 1, 2, 4, 5, 6}
    mass = sum(i + 1.0 for i in (0, 1, 2, 4, 5, 6))
    np.testing.assert_allclose(info.probabilities, (starts + 1) / mass, rtol=1e-5)


def test_episode_starts_are_forgotten_as_the_ring_wraps_and_on_clear():
    types = steps_of([3] * 10)  # 40 steps into a ring of 7
    buf = filled("uniform", types, max_length=7)
    items, info = buf.get_next(500, num_steps=3, within_episodes=True)
    assert set(items["value"][:, 0].tolist()) == {s for s, _ in valid_windows(types, 1, 7, 3)}
    assert len(buf._episodes._keys) <= 3
    buf.clear()
    with pytest.raises(rb.EmptyBufferError):
        buf.get_next(1, within_episodes=True)


def test_extend_and_datasets_and_save(tmp_path):
    types = np.array(steps_of([4, 2, 3]), np.int32)
    buf = rb.UniformReplayBuffer(SPEC, 1, 30, seed=2, track_episodes=True)
    buf.extend({"step_type": types[None], "value": np.arange(len(types))[None]})
    expected = {s for s, _ in valid_windows(types.tolist(), 1, 30, 3)}
    it = iter(buf.as_dataset(32, num_steps=3, num_parallel_calls=2, within_episodes=True))
    items, _ = next(it)
    it.close()
    assert set(items["value"][:, 0].tolist()) <= expected
    buf.save(tmp_path / "e")
    again = rb.load(tmp_path / "e")
    a, _ = buf.get_next(64, num_steps=3, within_episodes=True)
    b, _ = again.get_next(64, num_steps=3, within_episodes=True)
    np.testing.assert_array_equal(a["value"], b["value"])


def test_torch_storage_tracks_episodes_too(storage):
    types = steps_of([2, 3])
    buf = filled("uniform", types, **storage)
    items, _ = buf.get_next(100, num_steps=2, within_episodes=True)
    assert not (to_np(items["step_type"])[:, 1:] == FIRST).any()


def test_misuse_is_explained():
    with pytest.raises(rb.SpecError, match="needs a step_type leaf"):
        rb.UniformReplayBuffer({"value": rb.ArraySpec((), np.int64)}, track_episodes=True)
    plain = rb.UniformReplayBuffer(SPEC, 1, 5)
    plain.add_batch({"step_type": np.zeros(1, np.int32), "value": np.zeros(1, np.int64)})
    with pytest.raises(ValueError, match="track_episodes=True"):
        plain.get_next(within_episodes=True)
    with pytest.raises(ValueError, match="track_episodes=True"):
        plain.as_dataset(within_episodes=True)
    tracked = filled("uniform", steps_of([2]))
    with pytest.raises(ValueError, match="deterministic pass"):
        tracked.as_dataset(single_deterministic_pass=True, within_episodes=True)


def test_trajectories_from_a_driver():
    import gymnasium as gym

    from replaybuffer.collect import StepDriver
    from test_collect import Counter, zeros_policy

    env = gym.vector.SyncVectorEnv([lambda: Counter(2), lambda: Counter(3)])
    probe = StepDriver(env, zeros_policy)
    buf = rb.UniformReplayBuffer(probe.data_spec, 2, 40, seed=0, track_episodes=True)
    StepDriver(env, zeros_policy, [buf.add_batch], num_steps=40).run()
    items, _ = buf.get_next(500, num_steps=3, within_episodes=True)
    obs = items.observation  # [episode, t] per step
    assert (obs[:, :, 0] == obs[:, :1, 0]).all()  # one episode per window
    assert (np.diff(obs[:, :, 1], axis=1) == 1).all()


def test_the_index_stays_small_without_within_episode_reads():
    buf = filled("uniform", steps_of([2] * 3000), max_length=30)  # 9000 adds, never read
    held = len(buf._episodes._keys) + sum(len(k) for k in buf._episodes._new)
    assert held <= 30 + 256  # bounded by the starts held plus one merge interval


def test_prioritized_within_episodes_when_little_mass_is_valid():
    # Long episodes with heavy first steps followed by short ones: windows of 3 exist only
    # in the long episodes, whose starts carry almost none of the mass.
    types = steps_of([1, 1, 1, 1, 6])
    buf = filled("prioritized", types, alpha=1.0)
    n = len(types)
    buf.update_priorities(np.arange(n), np.where(np.arange(n) < 8, 1e6, 1e-6))
    items, info = buf.get_next(64, num_steps=3, within_episodes=True)
    expected = {s for s, _ in valid_windows(types, 1, 50, 3)}
    assert set(items["value"][:, 0].tolist()) <= expected


@settings(max_examples=150, deadline=None)
@given(batch_size=st.integers(1, 3), max_length=st.integers(1, 12),
       num_steps=st.integers(1, 4),
       chunks=st.lists(st.lists(st.lists(st.booleans(), min_size=3, max_size=3),
                                min_size=1, max_size=5), min_size=1, max_size=12))
def test_index_matches_brute_force_as_steps_arrive(batch_size, max_length, num_steps,
                                                   chunks):
    """The index is asked after every write, so its caches (interior segments, window
    counts) must follow each add and each eviction; a brute force recomputes from the
    step types every time. Windows are numbered row by row, then by start id."""
    ring, index = Ring(batch_size, max_length), EpisodeIndex()
    starts_of: list[list[bool]] = []  # per id: whether each row's step is FIRST
    for chunk in chunks:
        first_id = ring.last_id + 1
        starts = np.array([step[:batch_size] for step in chunk], bool)
        ring.last_id += len(chunk)
        starts_of += [list(step[:batch_size]) for step in chunk]
        index.record(first_id, starts, ring.oldest_id)
        oldest, last = ring.oldest_id, ring.last_id
        expected = [(s, b) for b in range(batch_size)
                    for s in range(oldest, last - num_steps + 2)
                    if not any(starts_of[i][b] for i in range(s + 1, s + num_steps))]
        assert index.count(ring, num_steps) == len(expected)
        ids, rows = index.sample(ring, num_steps, np.arange(len(expected), dtype=np.int64))
        assert list(zip(ids.tolist(), rows.tolist())) == expected
        every = [(s, b) for b in range(batch_size) for s in range(oldest, last + 1)]
        within = index.within(ring, np.array([s for s, _ in every], np.int64),
                              np.array([b for _, b in every], np.int64), num_steps)
        assert [w for w, sb in zip(within.tolist(), every) if w] == \
            [True] * len(expected)
        assert [sb for w, sb in zip(within.tolist(), every) if w] == expected


def _check_prioritized_within(buf, starts, num_steps, restore=False):
    """Draw windows of ``num_steps`` within episodes from ``buf`` and check them against
    a brute force over ``starts`` (per id since the last clear, per row: FIRST?)."""
    from replaybuffer.sampling.outside_mass import OutsideMass

    sampler, ring, index = buf._sampler, buf._ring, buf._episodes
    oldest, last, batch_size = ring.oldest_id, ring.last_id, ring.batch_size
    valid = {(s, b) for b in range(batch_size) for s in range(oldest, last - num_steps + 2)
             if not any(starts[i][b] for i in range(s + 1, s + num_steps))}
    if num_steps > ring.max_length:
        return
    outside = {(s, b) for b in range(batch_size) for s in range(oldest, last + 1)} - valid
    got_ids, got_rows = index.outside(ring, num_steps)
    assert sorted(zip(got_ids.tolist(), got_rows.tolist())) == sorted(outside)
    sampler._flush()
    leaves = sampler._sum.leaves
    mass = sum(float(leaves[ring.positions(s, b)]) for s, b in valid)
    if not valid or mass == 0.0:
        with pytest.raises(rb.EmptyBufferError):
            buf.get_next(8, num_steps, within_episodes=True)
        return
    # The cache as the previous draws and writes left it, against a fresh sum.
    fresh = OutsideMass(sampler.capacity).get(ring, num_steps, index, leaves)
    if sampler._outside is not None and sampler._outside._num_steps == num_steps:
        assert sampler._outside.get(ring, num_steps, index, leaves) == fresh
    items, info = buf.get_next(8, num_steps, within_episodes=True)
    drawn = [(int(v) % 1000, int(v) // 1000) for v in items["value"][:, 0]]
    assert set(drawn) <= valid
    expected = [float(leaves[ring.positions(s, b)]) / mass for s, b in drawn]
    np.testing.assert_allclose(info.probabilities, expected, rtol=1e-6)
    if restore:  # a saved and loaded copy draws what the original draws, bit for bit
        with tempfile.TemporaryDirectory() as path:
            buf.save(path)
            again = rb.load(path)
        a, info_a = buf.get_next(16, num_steps, within_episodes=True)
        b, info_b = again.get_next(16, num_steps, within_episodes=True)
        np.testing.assert_array_equal(a["value"], b["value"])
        for field in ("ids", "probabilities", "weights"):
            np.testing.assert_array_equal(getattr(info_a, field), getattr(info_b, field))


@settings(max_examples=100, deadline=None)
@given(batch_size=st.integers(1, 3), max_length=st.integers(2, 10),
       rounds=st.lists(st.tuples(
           st.lists(st.lists(st.sampled_from([FIRST, FIRST, MID, LAST]), min_size=3,
                             max_size=3), max_size=5),
           st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2),
                              st.sampled_from([0.0, 1e-9, 0.5, 3.0, 1e6])), max_size=4),
           st.integers(1, 4), st.sampled_from(["sample", "sample", "restore", "clear"])),
           min_size=1, max_size=12))
def test_prioritized_within_episodes_matches_brute_force_as_priorities_change(
        batch_size, max_length, rounds):
    """Each round adds steps, draws, updates priorities (outside steps too) and draws
    again (or saves and loads, or clears): every draw is a valid window with probability
    ``p / valid mass`` (brute force over the step types and the leaves), the cached
    outside mass equals a fresh sum bit for bit, and a loaded copy draws exactly what
    the original draws."""
    buf = rb.PrioritizedReplayBuffer(SPEC, batch_size, max_length, seed=3, alpha=1.0,
                                     track_episodes=True)
    sampler, ring = buf._sampler, buf._ring
    starts: list[list[bool]] = []
    for steps, updates, num_steps, action in rounds:
        for step in steps:
            buf.add_batch({"step_type": np.array(step[:batch_size], np.int32),
                           "value": np.arange(batch_size) * 1000 + len(starts)})
            starts.append([s == FIRST for s in step[:batch_size]])
        if ring.last_id < 0:
            continue
        _check_prioritized_within(buf, starts, num_steps)
        if updates:
            held = ring.last_id + 1 - ring.oldest_id
            ids = np.array([ring.oldest_id + i % held for i, _, _ in updates], np.int64)
            rows = np.array([r % batch_size for _, r, _ in updates], np.int64)
            buf.update_priorities((sampler.key_base + ids) * batch_size + rows,
                                  np.array([p for _, _, p in updates]))
        if action == "clear":
            buf.clear()
            starts = []
        else:
            _check_prioritized_within(buf, starts, num_steps, restore=action == "restore")


def test_the_outside_mass_follows_priorities_loaded_into_the_sampler():
    types = steps_of([3, 1, 4, 2])
    buf = filled("prioritized", types, batch_size=2, alpha=1.0)
    starts = [[s == FIRST] * 2 for s in types]
    _check_prioritized_within(buf, starts, 3)  # the outside mass is cached now
    state = buf._sampler.state_dict()
    state["priorities"] = np.asarray(state["priorities"]) * np.linspace(1, 3, buf._sampler.capacity)
    buf._sampler.load_state_dict(state)  # same episodes, other leaves
    _check_prioritized_within(buf, starts, 3)


@pytest.mark.parametrize("accept_rounds", ["rejection", "fallback"])
def test_prioritized_within_episodes_draws_follow_the_priorities(accept_rounds, monkeypatch):
    """Empirical frequencies of 40,000 draws against ``p / valid mass`` (chi-square, a
    fixed seed), by rejection and by the enumerating fallback."""
    from replaybuffer.sampling import episode_draws

    if accept_rounds == "fallback":
        monkeypatch.setattr(episode_draws, "ROUNDS", 0)
    types = steps_of([3, 1, 4, 2, 5])
    buf = filled("prioritized", types, batch_size=2, alpha=1.0)
    n = len(types)
    priorities = np.random.default_rng(1).uniform(0.1, 2.0, 2 * n)
    buf.update_priorities(np.arange(2 * n), priorities)  # item id = id * 2 + row
    valid = sorted(valid_windows(types, 2, 50, 3))
    weights = np.array([priorities[s * 2 + b] for s, b in valid])
    items, _ = buf.get_next(40_000, num_steps=3, within_episodes=True)
    drawn = items["value"][:, 0]
    counts = np.array([np.sum(drawn == b * 1000 + s) for s, b in valid])
    assert counts.sum() == 40_000
    expected = 40_000 * weights / weights.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    df = len(valid) - 1
    assert chi2 < df + 6 * np.sqrt(2 * df)
