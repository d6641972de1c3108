"""The public seams other layers use instead of private members (issue 23):
BufferInfo's home, the draw a dataset stream takes, a buffer's weight among shards,
the storage and sampler objects, the device search choice, the protocols."""

import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer.protocols import BufferInfo, Checkpointable

SPEC = rb.ArraySpec((2,), np.float32, "x")


def filled(cls=rb.UniformReplayBuffer, **kwargs):
    buffer = cls(SPEC, batch_size=2, max_length=8, seed=0, **kwargs)
    for i in range(5):
        buffer.add_batch(np.full((2, 2), i, np.float32))
    return buffer


def test_buffer_info_is_one_class_everywhere():
    assert rb.BufferInfo is BufferInfo is rb.buffers.base.BufferInfo


def test_draw_with_a_spawned_generator_reproduces_get_next_streams():
    a, b = filled(), filled()
    ga, gb = a.spawn_rng(), b.spawn_rng()
    xa, ia = a.draw(4, 2, True, ga)
    xb, ib = b.draw(4, 2, True, gb)
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ia.ids, ib.ids)
    assert xa.shape == (4, 2, 2)


@pytest.mark.parametrize("num_steps, windows", [(1, 10), (2, 8), (5, 2), (6, 0)])
def test_window_mass_counts_valid_windows(num_steps, windows):
    assert filled().window_mass(num_steps) == windows


def test_window_mass_of_a_prioritized_buffer_is_its_priority_total():
    buffer = filled(rb.PrioritizedReplayBuffer, alpha=1.0)
    _, info = buffer.get_next(4)
    buffer.update_priorities(info.ids, np.full(4, 3.0))
    starts = buffer.window_mass(1)
    assert starts == pytest.approx(float(buffer.priorities(np.arange(10)).sum()))
    assert buffer.window_mass(2) < starts


def test_store_and_sampler_are_the_parts_the_buffer_uses():
    buffer = filled()
    assert buffer.store.arrays[0].shape == (16, 2)
    assert buffer.store.arrays[0][8:10].tolist() == [[4, 4], [4, 4]]
    assert isinstance(buffer.sampler, Checkpointable)
    assert isinstance(buffer, rb.Buffer) and not isinstance(buffer, rb.PrioritizedBuffer)
    assert isinstance(filled(rb.PrioritizedReplayBuffer), rb.PrioritizedBuffer)


def test_device_search_picks_the_device_samplers_search():
    pytest.importorskip("torch")
    for search in ("prefix", "tree"):
        buffer = rb.PrioritizedReplayBuffer(SPEC, 1, 16, storage="torch",
                                            sample_on_device=True, device_search=search)
        assert buffer.sampler.search == search


def test_device_search_without_device_sampling_is_refused():
    with pytest.raises(ValueError, match=r"device_search='tree' applies to sampling on the "
                                         r"device only"):
        rb.PrioritizedReplayBuffer(SPEC, 1, 16, device_search="tree")
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="search must be 'prefix' or 'tree', got 'x'"):
        rb.PrioritizedReplayBuffer(SPEC, 1, 16, storage="torch", sample_on_device=True,
                                   device_search="x")
