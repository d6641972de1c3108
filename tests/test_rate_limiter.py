"""Rate limiters: the window they keep, the configurations they refuse, waiting and
timeouts across threads, and every buffer kind they pace."""

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb

SPEC = rb.ArraySpec((), np.int64, "x")


def counter(batch_size=1, max_length=1000, cls=rb.UniformReplayBuffer, limiter=None):
    buf = cls(SPEC, batch_size, max_length, **({} if cls is rb.FIFOReplayBuffer
                                               else {"seed": 0}))
    buf.rate_limiter = limiter
    return buf


def add(buf, t, **kw):
    return buf.add_batch(np.full(buf.batch_size, t, np.int64), **kw)


# ------------------------------------------------------------------ the window
configs = st.one_of(
    st.builds(rb.MinSize, st.integers(1, 20)),
    st.builds(rb.Queue, st.integers(2, 20)),
    st.builds(rb.SampleToInsertRatio, st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0]),
              st.integers(1, 20), st.sampled_from([4.0, 8.0, 20.0])))


@settings(max_examples=150, deadline=None)
@given(limiter=configs, batch_size=st.sampled_from([1, 2]),
       ops=st.lists(st.tuples(st.sampled_from(["insert", "sample"]), st.integers(1, 3)),
                    max_size=80))
def test_the_diff_stays_in_the_window_and_neither_side_is_ever_stuck(limiter, batch_size,
                                                                    ops):
    """Under any sequence of non-blocking calls: samples start at min_size_to_sample,
    a call goes through exactly when the window allows it, a call that could leave both
    sides waiting is refused as an error, and whenever one side is held back the other
    would be let through (no state blocks both)."""
    buf = counter(batch_size, 100, limiter=limiter)
    lo, hi, spi = limiter.min_diff, limiter.max_diff, limiter.samples_per_insert
    largest = {"insert": 1, "sample": 1}
    t = 0
    for op, n in ops:
        before = (limiter.inserts, limiter.samples, len(buf))
        if op == "insert":
            fits = len(buf) + batch_size <= limiter.min_size_to_sample or \
                (limiter.inserts + batch_size) * spi - limiter.samples <= hi
            too_large = batch_size * spi + largest["sample"] > hi - lo
            call = lambda t=t: add(buf, t, block=False)  # noqa: E731
        else:
            fits = len(buf) >= limiter.min_size_to_sample and \
                limiter.inserts * spi - limiter.samples - n >= lo
            too_large = n + largest["insert"] * spi > hi - lo
            call = lambda n=n: buf.get_next(n, block=False) is not None  # noqa: E731
        if not fits and too_large:
            with pytest.raises(ValueError, match="it would wait forever"):
                call()
        else:
            assert call() is fits
            if fits:
                largest[op] = max(largest[op], batch_size if op == "insert" else n)
                t += op == "insert"
        if not fits:
            assert (limiter.inserts, limiter.samples, len(buf)) == before  # nothing moved
        if batch_size * spi + 1 <= hi - lo:  # no deadlock: one side can always go ahead
            assert limiter.can_insert(batch_size, len(buf)) or limiter.can_sample(1, len(buf))
        if len(buf) >= limiter.min_size_to_sample and limiter.samples:
            assert lo <= limiter.diff <= hi
    stats = buf.stats()
    assert (stats.inserts, stats.samples, stats.size) == (limiter.inserts, limiter.samples,
                                                         len(buf))


@pytest.mark.parametrize("make, message", [
    (lambda: rb.MinSize(0), r"min_size_to_sample \(0\) must be a positive integer"),
    (lambda: rb.SampleToInsertRatio(0, 10, 5.0), "samples_per_insert must be a positive"),
    (lambda: rb.SampleToInsertRatio(4.0, 10, 3.0), "must be at least 2 \\* max\\(1, "
                                                   "samples_per_insert\\) = 8.0 wide"),
    (lambda: rb.SampleToInsertRatio(1.0, 10, 0.5), "each would wait for the other forever"),
    (lambda: rb.SampleToInsertRatio(1.0, 10, (20.0, 40.0)),
     "min_diff \\(20.0\\) is above samples_per_insert \\* min_size_to_sample"),
    (lambda: rb.RateLimiter(1.0, 5, 10.0, 0.0), "must not exceed max_diff"),
    (lambda: rb.Queue(1), "a Queue's size must be an int >= 2"),
])
def test_configurations_that_would_deadlock_are_refused_with_the_reason(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_window_below_the_first_samples_warns_of_a_single_thread_deadlock():
    with pytest.warns(UserWarning, match="deadlocks a program that inserts and samples"):
        rb.SampleToInsertRatio(1.0, 10, (-5.0, 5.0))


def test_attaching_checks_the_buffer():
    with pytest.raises(ValueError, match=r"min_size_to_sample \(50\) is more than the buffer "
                                         r"can hold \(40\)"):
        counter(2, 20, limiter=rb.MinSize(50))
    limiter = rb.MinSize(5)
    counter(limiter=limiter)
    with pytest.raises(ValueError, match="attached to a buffer already"):
        counter(limiter=limiter)


@pytest.mark.parametrize("make", [
    lambda **kw: rb.ReplayBuffer(SPEC, 1, 20, sampler=rb.sampling.UniformSampler(0), **kw),
    lambda **kw: rb.UniformReplayBuffer(SPEC, 1, 20, seed=0, **kw),
    lambda **kw: rb.PrioritizedReplayBuffer(SPEC, 1, 20, seed=0, **kw),
    lambda **kw: rb.FIFOReplayBuffer(SPEC, 1, 20, **kw),
    lambda **kw: rb.ShuffledReplayBuffer(SPEC, 1, 20, seed=0, **kw),
], ids=["ReplayBuffer", "Uniform", "Prioritized", "FIFO", "Shuffled"])
def test_the_constructor_takes_a_limiter_as_the_setter_does(make):
    limiter = rb.MinSize(2)
    buf = make(rate_limiter=limiter)
    assert buf.rate_limiter is limiter
    add(buf, 0)
    assert buf.get_next(1, block=False) is None  # paced from the first add
    add(buf, 1)
    assert buf.get_next(1, block=False) is not None
    assert buf.stats().inserts == 2 and buf.stats().samples == 1
    with pytest.raises(ValueError, match="attached to a buffer already"):
        make(rate_limiter=limiter)
    with pytest.raises(ValueError, match=r"min_size_to_sample \(50\) is more than the "
                                         r"buffer can hold \(20\)"):
        make(rate_limiter=rb.MinSize(50))
    assert make().rate_limiter is None

def test_a_call_too_large_for_the_window_is_refused_not_left_waiting():
    buf = counter(limiter=rb.SampleToInsertRatio(1.0, 10, 10.0))
    for t in range(10):
        add(buf, t)
    with pytest.raises(ValueError, match="a sample of 25 items needs a window of 26.*"
                                         "it would wait forever"):
        buf.get_next(25, timeout=5)
    assert buf.stats().samples == 0


# ----------------------------------------------------------- waiting and timeouts
def test_a_sample_waits_for_inserts_and_a_timeout_changes_nothing():
    buf = counter(limiter=rb.MinSize(3))
    add(buf, 0)
    started = time.perf_counter()
    with pytest.raises(rb.RateLimitedError, match="sample of 2 items held back by MinSize"):
        buf.get_next(2, timeout=0.2)
    assert time.perf_counter() - started >= 0.2
    assert isinstance(rb.RateLimitedError("x"), TimeoutError)
    assert buf.get_next(2, block=False) is None
    stats = buf.stats()
    assert stats.samples == 0 and stats.samples_blocked == 2 and stats.sample_blocked_s >= 0.2

    def later():
        time.sleep(0.2)
        add(buf, 1)
        add(buf, 2)

    writer = threading.Thread(target=later)
    writer.start()
    started = time.perf_counter()
    items, _ = buf.get_next(2, timeout=20)
    writer.join()
    # Woken by the writer's inserts (0.2 s), not by the timeout: a liveness check.
    assert time.perf_counter() - started < 10
    assert set(items.tolist()) <= {0, 1, 2} and buf.stats().samples == 2


def test_an_insert_waits_for_the_learner():
    buf = counter(limiter=rb.SampleToInsertRatio(1.0, 2, 2.0))
    for t in range(4):  # up to the window's top: diff 4 = offset 2 + error 2
        assert add(buf, t, block=False)
    assert add(buf, 4, block=False) is False and len(buf) == 4
    with pytest.raises(rb.RateLimitedError, match="insert of 1 items"):
        add(buf, 4, timeout=0.05)
    assert len(buf) == 4 and buf.last_id == 3  # nothing written

    def learner():
        time.sleep(0.1)
        buf.get_next(1)

    thread = threading.Thread(target=learner)
    thread.start()
    started = time.perf_counter()
    assert add(buf, 4, timeout=20)
    thread.join()
    assert time.perf_counter() - started < 10  # woken by the sample, not the timeout
    assert buf.last_id == 4 and buf.stats().insert_blocked_s > 0


def test_a_queue_hands_every_item_to_the_learner_once_in_order():
    buf = counter(cls=rb.FIFOReplayBuffer, max_length=8, limiter=rb.Queue(5))
    got = []

    def learner():
        while len(got) < 40:
            items, _ = buf.get_next(1, timeout=10)
            got.append(int(items[0]))

    thread = threading.Thread(target=learner)
    thread.start()
    for t in range(40):
        add(buf, t, timeout=10)
        assert buf.stats().diff <= 5  # never more than 5 unread
    thread.join(timeout=20)
    assert got == list(range(40)) and buf.dropped == 0


def test_a_prefetching_dataset_waits_and_closes():
    buf = counter(limiter=rb.MinSize(10))
    it = iter(buf.as_dataset(4, num_parallel_calls=2))
    for t in range(10):
        add(buf, t)
    items, _ = next(it)
    assert items.shape == (4,)
    it.close()  # the workers, waiting on the limiter in short rounds, stop


def test_transitions_and_her_are_paced_too():
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    buf = rb.TransitionReplayBuffer.from_env(env, capacity=100)
    buf.rate_limiter = rb.MinSize(3)
    obs = np.zeros((1, 4), np.float32)
    assert buf.sample(2, block=False) is None
    for _ in range(3):
        assert buf.add(obs, np.array([0]), np.array([1.0], np.float32), obs,
                       np.array([False]), timeout=1)
    assert buf.sample(2, timeout=1) is not None and buf.stats().samples == 2

    goal = rb.ArraySpec((2,), np.float32)
    her = rb.HERBuffer({"observation": rb.ArraySpec((1,), np.float32), "achieved_goal": goal,
                        "desired_goal": goal}, rb.BoundedArraySpec((), np.int64, 0, 3), 20,
                       compute_reward=lambda a, d, info: -np.abs(a - d).sum(-1))
    her.rate_limiter = rb.SampleToInsertRatio(1.0, 2, 4.0)
    step = {"observation": np.zeros((1, 1), np.float32),
            "achieved_goal": np.zeros((1, 2), np.float32),
            "desired_goal": np.ones((1, 2), np.float32)}
    for t in range(2):  # one episode of two steps
        her.add(step, np.array([0]), np.array([0.0], np.float32), step, np.array([t == 1]))
    assert her.sample(4, block=False) is not None  # diff 2 * 1 - 4 = -2 = min_diff
    assert her.sample(1, block=False) is None and her.stats().samples == 4
    with pytest.raises(rb.RateLimitedError):
        her.sample(1, timeout=0.01)


def test_detaching_stops_the_pacing():
    buf = counter(limiter=rb.MinSize(5))
    add(buf, 0)
    assert buf.get_next(1, block=False) is None
    buf.rate_limiter = None
    assert buf.get_next(1, block=False) is not None and buf.stats() is None


def test_tensorflow_buffers_refuse_a_limiter():
    pytest.importorskip("tensorflow")
    from replaybuffer.tf import TFUniformReplayBuffer

    buf = TFUniformReplayBuffer(SPEC, 1, 10)
    with pytest.raises(ValueError, match="inside graphs"):
        buf.rate_limiter = rb.MinSize(1)
    assert buf.rate_limiter is None


@pytest.mark.parametrize("cls", ["TransitionReplayBuffer", "PrioritizedTransitionReplayBuffer",
                                 "RolloutBuffer"])
def test_transition_buffers_take_a_limiter_in_the_constructor(cls):
    limiter = rb.MinSize(2)
    buf = getattr(rb, cls)(rb.ArraySpec((2,), np.float32), rb.ArraySpec((), np.int64), 16,
                           seed=0, rate_limiter=limiter)
    assert buf.rate_limiter is limiter
    obs = np.zeros((1, 2), np.float32)
    buf.add(obs, np.zeros(1, np.int64), np.ones(1), obs + 1, np.zeros(1, bool))
    assert buf.sample(1, block=False) is None  # paced from the first add
    buf.add(obs + 1, np.zeros(1, np.int64), np.ones(1), obs + 2, np.zeros(1, bool))
    assert buf.sample(1, block=False) is not None
    assert buf.stats().inserts == 2 and buf.stats().samples == 1
    with pytest.raises(ValueError, match="attached to a buffer already"):
        getattr(rb, cls)(rb.ArraySpec((2,), np.float32), rb.ArraySpec((), np.int64), 16,
                         rate_limiter=limiter)


def test_her_buffer_takes_a_limiter_in_the_constructor():
    limiter = rb.MinSize(4)
    spec = {"observation": rb.ArraySpec((2,), np.float32),
            "achieved_goal": rb.ArraySpec((2,), np.float32),
            "desired_goal": rb.ArraySpec((2,), np.float32)}
    buf = rb.HERBuffer(spec, rb.ArraySpec((), np.int64), 16, seed=0,
                       compute_reward=lambda achieved, desired, info: np.zeros(len(achieved)),
                       rate_limiter=limiter)
    assert buf.rate_limiter is limiter and limiter.min_size_to_sample == 4
    with pytest.raises(ValueError, match=r"min_size_to_sample \(50\) is more than the "
                                         r"buffer can hold \(16\)"):
        rb.HERBuffer(spec, rb.ArraySpec((), np.int64), 16, rate_limiter=rb.MinSize(50))
