"""as_dataset: the random stream (sync and prefetching) and the deterministic pass."""

import gc
import numpy as np
import pytest

import replaybuffer as rb
from conftest import to_np
from test_uniform_buffer import counter_buffer


def collect(dataset):
    return [(to_np(items), to_np(info.ids)) for items, info in dataset]


def values(dataset):
    return [x.tolist() for x, _ in collect(dataset)]


def test_deterministic_pass_single_frames(storage):  # item 17
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 3, 3, **storage)
    for t in range(3):
        buf.add_batch(np.arange(3) * 10 + t)
    assert values(buf.as_dataset(single_deterministic_pass=True)) == \
        [0, 1, 2, 10, 11, 12, 20, 21, 22]


def test_deterministic_pass_with_num_steps(storage):  # item 18
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 5, 4, **storage)
    for t in range(4):
        buf.add_batch(np.arange(5) * 10 + t)
    got = values(buf.as_dataset(single_deterministic_pass=True, num_steps=2))
    assert got == [[10 * b + 0, 10 * b + 1] if k == 0 else [10 * b + 2, 10 * b + 3]
                   for b in range(5) for k in range(2)]
    overlapping = values(buf.as_dataset(single_deterministic_pass=True, num_steps=2,
                                        window_shift=1))
    assert overlapping[:4] == [[0, 1], [1, 2], [2, 3], [3]]
    assert len(overlapping) == 20


def test_deterministic_pass_keeps_the_trailing_partial_window(storage):  # item 18
    buf = counter_buffer(storage, 1, 5, 5)
    assert values(buf.as_dataset(single_deterministic_pass=True, num_steps=2)) == \
        [[0, 1], [2, 3], [4]]
    assert values(buf.as_dataset(single_deterministic_pass=True, num_steps=2,
                                 drop_remainder=True)) == [[0, 1], [2, 3]]


def test_deterministic_pass_with_sample_batch(storage):  # item 19
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 4, 3, **storage)
    for t in range(3):
        buf.add_batch(np.arange(4) * 10 + t)
    got = values(buf.as_dataset(single_deterministic_pass=True, sample_batch_size=4))
    assert got == [[0, 10, 20, 30], [1, 11, 21, 31], [2, 12, 22, 32]]


def test_deterministic_pass_with_sample_batch_and_num_steps(storage):  # item 19
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 6, 4, **storage)
    for t in range(4):
        buf.add_batch(np.arange(6) * 10 + t)
    got = values(buf.as_dataset(single_deterministic_pass=True, sample_batch_size=3,
                                num_steps=2))
    assert got == [[[0, 1], [10, 11], [20, 21]], [[2, 3], [12, 13], [22, 23]],
                   [[30, 31], [40, 41], [50, 51]], [[32, 33], [42, 43], [52, 53]]]


def test_deterministic_pass_partial_group_and_no_straddling(storage):
    # 3 steps per row, windows of 2: TF-Agents would let a window straddle groups.
    buf = rb.UniformReplayBuffer(rb.ArraySpec((), np.int64), 3, 3, **storage)
    for t in range(3):
        buf.add_batch(np.arange(3) * 10 + t)
    got = values(buf.as_dataset(single_deterministic_pass=True, sample_batch_size=2,
                                num_steps=2))
    assert got == [[[0, 1], [10, 11]], [[2], [12]], [[20, 21]], [[22]]]
    dropped = values(buf.as_dataset(single_deterministic_pass=True, sample_batch_size=2,
                                    num_steps=2, drop_remainder=True))
    assert dropped == [[[0, 1], [10, 11]]]


def test_drop_remainder_that_drops_everything_raises(storage):  # item 20
    buf = counter_buffer(storage, 2, 3, 3)
    with pytest.raises(ValueError, match="ALL data will be dropped"):
        buf.as_dataset(single_deterministic_pass=True, sample_batch_size=3, drop_remainder=True)
    with pytest.raises(ValueError, match="ALL data will be dropped"):
        buf.as_dataset(single_deterministic_pass=True, num_steps=4, drop_remainder=True)


def test_deterministic_range_is_read_when_iteration_starts(storage):  # item 21
    buf = counter_buffer(storage, 2, 5, 0)
    dataset = buf.as_dataset(single_deterministic_pass=True)
    for t in range(2):
        buf.add_batch(np.array([t, 100 + t]))
    assert values(dataset) == [0, 1, 100, 101]
    buf.add_batch(np.array([2, 102]))
    assert values(dataset) == [0, 1, 2, 100, 101, 102]  # the same dataset, iterated again


def test_deterministic_pass_after_wrap_keeps_rows_apart(storage):  # item 22 (TF-Agents bug)
    buf = counter_buffer(storage, 2, 3, 5)
    assert values(buf.as_dataset(single_deterministic_pass=True)) == [2, 3, 4, 102, 103, 104]
    assert values(buf.as_dataset(single_deterministic_pass=True, num_steps=3)) == \
        [[2, 3, 4], [102, 103, 104]]


def test_deterministic_pass_info_holds_physical_rows(storage):  # item 23
    buf = counter_buffer(storage, 2, 3, 5)
    infos = [info for _, info in buf.as_dataset(single_deterministic_pass=True)]
    assert [int(to_np(i.ids)) for i in infos] == [2, 0, 1, 5, 3, 4]  # row * L + id % L
    assert all(i.probabilities == () for i in infos)
    _, info = next(iter(buf.as_dataset(single_deterministic_pass=True, sample_batch_size=2,
                                       num_steps=2)))
    assert to_np(info.ids).tolist() == [[2, 0], [5, 3]]


def test_deterministic_pass_on_an_empty_buffer_raises(storage):
    buf = counter_buffer(storage, 2, 3, 0)
    with pytest.raises(rb.EmptyBufferError, match="is empty"):
        list(buf.as_dataset(single_deterministic_pass=True))


@pytest.mark.parametrize("workers", [None, 1, 3])
def test_random_stream_shapes(storage, workers):
    buf = counter_buffer(storage, 2, 10, 10)
    it = iter(buf.as_dataset(4, num_steps=2, num_parallel_calls=workers))
    for _ in range(5):
        items, info = next(it)
        x = to_np(items)
        assert x.shape == (4, 2) and to_np(info.ids).shape == (4, 2)
        np.testing.assert_array_equal(x[:, 0] + 1, x[:, 1])


def test_prefetched_order_is_reproducible_with_several_workers(storage):
    def stream():
        buf = counter_buffer(storage, 2, 50, 50)
        it = iter(buf.as_dataset(8, num_parallel_calls=3, prefetch=5))
        out = [to_np(next(it)[0]) for _ in range(12)]
        it.close()
        return np.stack(out)
    np.testing.assert_array_equal(stream(), stream())


def test_prefetch_workers_stop_when_the_iterator_goes_away(storage):
    if storage["storage"] == "tensorflow":
        pytest.skip("tf.data runs parallel calls on its own thread pool, released with its "
                    "iterator: there are no Python worker threads to watch")
    buf = counter_buffer(storage, 2, 10, 10)
    it = iter(buf.as_dataset(4, num_parallel_calls=2))
    next(it)
    workers = list(it._threads)
    assert len(workers) == 2 and all(t.is_alive() for t in workers)
    del it
    gc.collect()
    for t in workers:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in workers)


def test_prefetch_iterator_recovers_after_an_error(storage):
    buf = counter_buffer(storage, 2, 10, 0)
    with iter(buf.as_dataset(4, num_parallel_calls=2)) as it:
        with pytest.raises(rb.EmptyBufferError):
            next(it)
        buf.add_batch(np.array([5, 105]))
        items, _ = next(it)  # prefetched errors were dropped; fresh workers see the data
        assert sorted(set(to_np(items).tolist())) <= [5, 105]
    with pytest.raises(StopIteration):  # closed by the context manager
        next(it)


def test_torch_adapter_feeds_a_dataloader(storage):
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    buf = counter_buffer(storage, 2, 10, 10)
    ds = buf.as_dataset(4, num_steps=2).to_torch()
    assert isinstance(ds, IterableDataset)
    loader = iter(DataLoader(ds, batch_size=None, num_workers=0))
    items, info = next(loader)
    assert isinstance(items, torch.Tensor) and tuple(items.shape) == (4, 2)
    full = list(DataLoader(buf.as_dataset(single_deterministic_pass=True).to_torch(),
                           batch_size=None))
    assert len(full) == 20
