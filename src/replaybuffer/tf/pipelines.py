"""The ``tf.data`` pipelines behind the TensorFlow buffer's ``as_dataset``.

Both read a :class:`~replaybuffer.tf.state.TFRingState` through its graph functions;
:class:`~replaybuffer.tf.ReplayDataset` wraps them for the buffer's errors and Python
iteration. Elements are ``(items, BufferInfo)``: items the data spec's nest with the
leading ``[S, T]`` dimensions the arguments ask for.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from replaybuffer.protocols import BufferInfo
from replaybuffer.tf import deterministic as det
from replaybuffer.tf import ring
from replaybuffer.tf.ring import INT
from replaybuffer.tf.state import TFRingState, unflatten_sample


def element_builder(structure: Any, count: int, probabilities: Any
                    ) -> Callable[[list[Any]], Any]:
    """Makes a dataset element ``(items, BufferInfo)`` from its tensors: the ``count``
    leaves in flatten order, then ``ids``, then ``probabilities`` unless it is given
    (the deterministic pass's ``()``)."""
    unflatten, n = structure.unflatten, count
    if probabilities is None:
        return lambda values: (unflatten(values[:n]), BufferInfo(values[n], values[n + 1]))
    return lambda values: (unflatten(values[:n]), BufferInfo(values[n], probabilities))


def random_dataset(state: TFRingState, structure: Any, sample_batch_size: int | None,
                   num_steps: int | None, num_parallel_calls: int | None,
                   prefetch: int | None) -> tf.data.Dataset:
    """The infinite random stream: element ``i`` is a sample drawn statelessly with the
    key ``(seed, i)``, ``seed`` drawn from the buffer's generator when iteration starts,
    so the order does not depend on ``num_parallel_calls``. Without parallelism or
    prefetch nothing runs ahead: an element sees the buffer as it is when pulled."""
    sample = state.sample_function(sample_batch_size, num_steps, True, True)

    def element(seed: tf.Tensor, i: tf.Tensor) -> Any:  # element i draws with (seed, i)
        key = tf.random.experimental.stateless_fold_in(seed, i)
        return unflatten_sample(structure, sample(key), num_steps, True)

    def stream(seed: tf.Tensor) -> tf.data.Dataset:
        counter = tf.data.Dataset.counter(dtype=INT)
        if num_parallel_calls is None:
            return counter.map(lambda i: element(seed, i))
        return counter.map(lambda i: element(seed, i),
                           num_parallel_calls=num_parallel_calls, deterministic=True)

    # The seed is drawn from the buffer's generator when iteration starts.
    seeds = tf.data.Dataset.from_tensors(tf.constant(0, INT)).map(
        lambda _: state.spawn_seed())
    dataset = seeds.flat_map(stream)
    ahead = prefetch if prefetch is not None else 2 * (num_parallel_calls or 0)
    if ahead:
        return dataset.prefetch(ahead)
    options = tf.data.Options()  # sample on pull: nothing may run ahead
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False  # nothing to tune: no parallelism, no buffer
    return dataset.with_options(options)


def deterministic_dataset(state: TFRingState, structure: Any,
                          sample_batch_size: int | None, num_steps: int | None,
                          shift: int | None, drop_remainder: bool) -> tf.data.Dataset:
    """One pass over every retained step in the order of
    :mod:`replaybuffer.sampling.deterministic`; the index range is read when iteration
    starts. ``BufferInfo.ids`` are physical row indices, ``probabilities`` ``()``."""
    L = state.max_length
    groups = det.row_groups(state.batch_size, sample_batch_size, drop_remainder)
    outer: list[int | None] = []
    if sample_batch_size is not None:
        uniform = all(rows == sample_batch_size for _, rows in groups)
        outer.append(sample_batch_size if uniform else None)
    if num_steps is not None:
        outer.append(num_steps if drop_remainder else None)
    shapes = [tuple(outer) + spec.shape for spec in state.specs]

    def read(first: tf.Tensor, group: tf.Tensor, offset: tf.Tensor, length: tf.Tensor
             ) -> Any:
        ids, rows = det.block(first, group, offset, length, groups, sample_batch_size,
                              num_steps)
        positions = ring.positions(ids, rows, L)  # also TF-Agents' physical rows
        leaves = state.critical_section.execute(lambda: state.storage.take(positions))
        leaves = [tf.ensure_shape(leaf, shape) for leaf, shape in zip(leaves, shapes)]
        physical = tf.ensure_shape(positions, tuple(outer))
        return structure.unflatten(leaves), BufferInfo(physical, ())

    def elements(first: tf.Tensor, num_frames: tf.Tensor) -> tf.data.Dataset:
        plan = det.plan(num_frames, len(groups), num_steps, shift, drop_remainder)
        return tf.data.Dataset.from_tensor_slices(plan).map(
            lambda g, o, n: read(first, g, o, n))

    start = tf.data.Dataset.from_tensors(tf.constant(0, INT)).map(
        lambda _: state.readable_range())
    return start.flat_map(elements)
