"""A shard's answer split into return values that Ray keeps inside its reply
(issue 25: answers just over Ray's inline limit went through the object store, about
1.4 ms more CPU per call): how the client splits (:func:`inline_runs`, against its
definition), what the shard answers per return value (an error mid-call included),
and, on a local cluster, that split answers give the seed's batches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ray = pytest.importorskip("ray")

from ray_cluster import start_local_cluster  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.distributed import RayReplayBuffer  # noqa: E402
from replaybuffer.distributed.ray_shards import draw_answers  # noqa: E402
from replaybuffer.distributed.ray_shards.draw_answers import (  # noqa: E402
    MAX_INLINE_RETURNS, draw_packing, inline_runs)
from replaybuffer.distributed.ray_shards.shard_draws import draw_batches  # noqa: E402
from replaybuffer.errors import EmptyBufferError  # noqa: E402
from replaybuffer.sampling.sampler import make_rng  # noqa: E402

SPEC = {"x": rb.ArraySpec((), np.int64), "obs": rb.ArraySpec((7,), np.float32)}
PACKING = draw_packing(SPEC)


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(1, 3000), min_size=1, max_size=12),
       num_steps=st.sampled_from([None, 1, 3]))
def test_inline_runs_are_the_greedy_split_under_the_limit(counts, num_steps):
    steps = num_steps or 1
    limit = draw_answers.INLINE_BYTES

    def fits(rows: int) -> bool:
        return PACKING.nbytes(rows, steps) <= limit

    runs = inline_runs(PACKING, counts, num_steps)
    # The obvious model: one return value when the whole answer fits or one batch
    # alone does not; else consecutive runs, each as long as still fits.
    if fits(sum(counts)) or not all(fits(n) for n in counts):
        assert runs is None
        return
    model, rows = [], 0
    for n in counts:
        if model and fits(rows + n):
            model[-1] += 1
            rows += n
        else:
            model.append(1)
            rows = n
    assert runs == (model if len(model) <= MAX_INLINE_RETURNS else None)
    if runs is not None:  # every run under the limit, the batches covered in order
        assert sum(runs) == len(counts)
        starts = np.cumsum([0] + runs)
        assert all(fits(sum(counts[a:b])) for a, b in zip(starts[:-1], starts[1:]))


class FailingAt:
    """A buffer whose ``draw`` raises EmptyBufferError from its ``fail_at``-th call."""

    def __init__(self, buffer, fail_at: int):
        self.buffer, self.fail_at, self.calls = buffer, fail_at, 0
        self.data_spec = buffer.data_spec

    def draw(self, *args, **kwargs):
        self.calls += 1
        if self.calls > self.fail_at:
            raise EmptyBufferError("held none")
        return self.buffer.draw(*args, **kwargs)


def filled() -> rb.UniformReplayBuffer:
    buffer = rb.UniformReplayBuffer(SPEC, 1, 500, seed=0)
    x = np.arange(300)[None]
    buffer.extend({"x": x, "obs": np.repeat(x[..., None], 7, -1).astype(np.float32)})
    return buffer


@pytest.mark.parametrize("fail_at", [5, 3, 2])
def test_each_return_value_answers_its_run_and_those_after_an_error_carry_it(fail_at):
    batches = [(4, 10 + k) for k in range(5)]
    whole = draw_batches(filled(), PACKING, ("get_next", batches, None, 0.0, False), False)
    assert len(whole) == 1 and whole[0][1] == 5  # no runs: one answer, as before
    split = draw_batches(FailingAt(filled(), fail_at), PACKING,
                         ("get_next", batches, None, 0.0, False, [2, 2, 1]), False)
    assert [drawn for _, drawn, _ in split] == \
        [min(2, max(0, fail_at - start)) for start in (0, 2, 4)]
    for (payload, drawn, error), start, size in zip(split, (0, 2, 4), (2, 2, 1)):
        assert (error is None) == (drawn == size)
        assert error is None or isinstance(error, EmptyBufferError)
        if drawn:  # the run's batches are the ones the whole answer holds
            got = PACKING.unpack_leaves(payload, 4 * drawn, 1)
            want = PACKING.unpack_leaves(whole[0][0], 20, 1)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b[4 * start:4 * (start + drawn)])


def test_an_error_at_the_first_batch_is_the_calls():
    with pytest.raises(EmptyBufferError):
        draw_batches(FailingAt(filled(), 0), PACKING,
                     ("get_next", [(4, 1), (4, 2)], None, 0.0, False, [1, 1]), False)


def uniform():
    return rb.UniformReplayBuffer(SPEC, 1, 1000, seed=0)


@pytest.fixture(scope="module")
def buffer():
    start_local_cluster()
    made = RayReplayBuffer(uniform, 2, seed=0)
    yield made
    made.close()
    ray.shutdown()


@pytest.mark.parametrize("shards_per_batch", [None, 1])
@pytest.mark.parametrize("num_steps", [None, 2])
def test_answers_split_to_stay_inline_are_the_seeds_batches(buffer, monkeypatch,
                                                           shards_per_batch, num_steps):
    buffer.clear()
    for shard in range(2):
        x = 1000 * shard + np.arange(200)[None]
        buffer.extend({"x": x, "obs": np.repeat(x[..., None], 7, -1).astype(np.float32)},
                      shard=shard)
    buffer.flush()
    buffer.shards_per_batch = shards_per_batch
    runs = []
    for limit in (draw_answers.INLINE_BYTES, PACKING.nbytes(2 * 8, num_steps or 1)):
        monkeypatch.setattr(draw_answers, "INLINE_BYTES", limit)  # read by the client
        buffer._rng = make_rng(5)  # as a new buffer with this seed would have
        stream = iter(buffer.as_dataset(8, num_steps, prefetch=6, batches_per_call=6))
        batches = [next(stream) for _ in range(18)]
        answers = {id(a): a for pending in stream._pending for _, a, _, _ in pending.calls}
        stream.close()
        split = sum(a._split is not None for a in answers.values())
        # small batches fit one return value; under a small limit a call of several
        # batches answers in several
        assert (split > 0) == bool(runs)
        runs.append(batches)
    for (a, info_a), (b, info_b) in zip(*runs):
        for name in ("x", "obs"):
            np.testing.assert_array_equal(a[name], b[name])
        np.testing.assert_array_equal(info_a.ids, info_b.ids)
        np.testing.assert_array_equal(info_a.probabilities, info_b.probabilities)


@ray.remote(num_returns=2)
def two_replies():
    return (b"x" * 1000, 0, None, 1.0, (0, -1, 0, 1)), (b"y" * 1000, 0, None, 1.0, (0, -1, 0, 1))


def test_a_split_calls_answers_are_freed_by_reference_counting(buffer):
    """The answers of one split call share what they fetched without holding one
    another (a list of them in each was a cycle, freed only by the collector)."""
    import gc
    import weakref

    refs = two_replies.remote()
    split = draw_answers.SplitReplies(refs)
    answers = [draw_answers.DrawAnswer(ref, PACKING, [1], None, split, n)
               for n, ref in enumerate(refs)]
    assert answers[1].reply()[0] == b"y" * 1000 and answers[0].reply()[0] == b"x" * 1000
    probes = [weakref.ref(answer) for answer in answers] + [weakref.ref(split)]
    gc.disable()
    try:
        del answers, split, refs
        assert all(probe() is None for probe in probes)
    finally:
        gc.enable()
