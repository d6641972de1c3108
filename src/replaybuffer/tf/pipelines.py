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
    so the order does not depend on ``num_parallel_calls`` nor on drawing ahead.

    Without ``num_parallel_calls`` and ``prefetch`` (``None``), the next element is
    drawn ahead of its pull in the background, as ``tf.data``'s injected prefetch
    does for TF-Agents' dataset (:func:`ahead_stream`); ``prefetch=0`` draws nothing
    ahead: an element sees the buffer as it is when pulled. Otherwise ``prefetch``
    elements (default ``2 * num_parallel_calls``) are kept ready."""
    if num_parallel_calls is None and prefetch is None:
        return only_own_prefetch(seeded(state, lambda seed: ahead_stream(
            state, structure, sample_batch_size, num_steps, seed)))
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

    dataset = seeded(state, stream)
    ahead = prefetch if prefetch is not None else 2 * (num_parallel_calls or 0)
    if ahead:
        return dataset.prefetch(ahead)
    return only_own_prefetch(dataset)  # sample on pull: nothing may run ahead


def seeded(state: TFRingState, stream: Callable[[tf.Tensor], tf.data.Dataset]
           ) -> tf.data.Dataset:
    """``stream(seed)``, the seed drawn from the buffer's generator when iteration
    starts (at the first pull)."""
    seeds = tf.data.Dataset.from_tensors(tf.constant(0, INT)).map(
        lambda _: state.spawn_seed())
    return seeds.flat_map(stream)


def only_own_prefetch(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` without the prefetch ``tf.data`` would inject after it: nothing runs
    ahead but what the pipeline itself prefetches."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False  # nothing to tune: no parallelism, buffers sized here
    return dataset.with_options(options)


def ahead_stream(state: TFRingState, structure: Any, sample_batch_size: int | None,
                 num_steps: int | None, seed: tf.Tensor) -> tf.data.Dataset:
    """Elements drawn one ahead of the pull, checked at the pull.

    A background thread (``prefetch(1)``) draws element ``i + 1`` with the key
    ``(seed, i + 1)`` while element ``i`` is used, so a sample holds the buffer as it
    was when it was drawn (steps added after are not in it, as in TF-Agents' dataset).
    At the pull the draw is checked: one made while the buffer had no window of
    ``num_steps`` (empty or too short), or one whose
    :attr:`~replaybuffer.tf.state.TFRingState.stamp` is gone, is drawn again with the
    same key from the buffer as it is then, which raises the empty-buffer error only
    if it still has no window. Nothing else differs from drawing at the pull: a buffer
    left unchanged gives the same elements.

    The stamp (:mod:`replaybuffer.tf.stamp`) tells them apart: a draw sets a new one
    before it reads; ``clear()`` and every restore (the buffer's own or of
    ``variables()`` through ``tf.train.Checkpoint``) change it; adds leave it. A
    batch whose stamp is still there, or was found by the draw after it, holds the
    buffer as it was drawn, as ``tf.data``'s own prefetch hands batches out.
    """
    draw = state.ahead_sample_function(sample_batch_size, num_steps)
    sample = state.sample_function(sample_batch_size, num_steps, True, True)
    stamp = state.stamp

    def ahead(i: tf.Tensor) -> Any:
        key = tf.random.experimental.stateless_fold_in(seed, i)
        fresh, drawn_with, leaves, ids, probabilities = draw(key)
        return key, fresh, drawn_with, tuple(leaves), ids, probabilities

    def at_pull(key: tf.Tensor, fresh: tf.Tensor, drawn_with: tf.Tensor, leaves: Any,
                ids: tf.Tensor, probabilities: tf.Tensor) -> Any:
        current = tf.logical_and(fresh, stamp.current(drawn_with))
        flat = tf.cond(current, lambda: (list(leaves), ids, probabilities),
                       lambda: sample(key))
        return unflatten_sample(structure, flat, num_steps, True)

    return tf.data.Dataset.counter(dtype=INT).map(ahead).prefetch(1).map(at_pull)


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
