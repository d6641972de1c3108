"""One batch from the shards' parts: tagged with shard and incarnation, rescaled to
the whole buffer's probabilities, and (parts of several shards) concatenated and
interleaved. A batch of one part can be handed on as Ray gave it: arrays that were
contiguous in the shard are views of Ray's object store, read-only, not copied."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import numpy as np

from replaybuffer import nest
from replaybuffer.distributed.ray_shards.shard import INCARNATION_SHIFT
from replaybuffer.protocols import BufferInfo


class Part(NamedTuple):
    """What one shard gave towards a batch: its ``items`` (leaves ``[n, ...]``),
    int64 local ``ids``, float ``probabilities`` within the shard, and the shard's
    ``incarnation`` when it drew them."""

    shard: int
    items: Any
    ids: np.ndarray
    probabilities: np.ndarray
    incarnation: int


def concat(parts: list[Any]) -> Any:
    """Concatenate nests of arrays along their first axis."""
    structure = nest.flatten(parts[0])[1]
    leaves = [nest.flatten(part)[0] for part in parts]
    return structure.unflatten([np.concatenate(group) for group in zip(*leaves)])


def map_leaves(fn: Callable[[np.ndarray], np.ndarray], items: Any) -> Any:
    """``items`` with ``fn`` applied to each leaf."""
    leaves, structure = nest.flatten(items)
    return structure.unflatten([fn(leaf) for leaf in leaves])


def combine(parts: list[Part], mass: np.ndarray, num_shards: int, beta: float | None,
            rng: np.random.Generator, zero_copy: bool = True) -> tuple[Any, BufferInfo]:
    """The batch of the shards' ``parts``, in an order drawn from ``rng`` (several
    parts) or as the one part came (``zero_copy``; else copied, writable).

    Args:
        mass: float ``[num_shards]``, the sampling mass of each shard that could give
            (0 for the others): probabilities are relative to its total.
        num_shards: shards of the buffer (tagged into the ids).
        beta: the importance-sampling exponent of prioritized shards (``None``:
            uniform, no weights).

    Returns:
        ``(items, BufferInfo)``: int64 ids ``incarnation << 48 | local * num_shards +
        shard``, float32 probabilities over the whole buffer, float32 weights
        ``(P_min / P) ** beta`` over the batch (prioritized).
    """
    total = float(mass.sum())
    ids = [(p.incarnation << INCARNATION_SHIFT) | (p.ids * num_shards + p.shard)
           for p in parts]
    scaled = [p.probabilities * (mass[p.shard] / total) for p in parts]
    if len(parts) == 1:
        items, id_array = parts[0].items, ids[0]
        if not zero_copy:
            items = map_leaves(np.array, items)
        probabilities = scaled[0].astype(np.float32)
    else:
        order = rng.permutation(sum(len(p.ids) for p in parts))  # parts interleaved
        items = map_leaves(lambda a: a[order], concat([p.items for p in parts]))
        id_array = np.concatenate(ids)[order]
        probabilities = np.concatenate(scaled).astype(np.float32)[order]
    weights = None
    if beta is not None:  # prioritized: (P_min / P) ** beta over the batch
        p = probabilities.astype(np.float64)
        weights = np.power(p.min() / p, beta).astype(np.float32)
    return items, BufferInfo(id_array, probabilities, weights)


def shaped(items: Any, info: BufferInfo, sample_batch_size: int | None,
           num_steps: int | None, time_stacked: bool = True) -> tuple[Any, BufferInfo]:
    """A drawn batch (leaves ``[B, ...]`` or ``[B, T, ...]``) in the shape a caller of
    ``get_next(sample_batch_size, num_steps, time_stacked)`` asked for: without the
    batch axis when ``sample_batch_size`` is ``None`` (``B`` is 1; ids, probabilities
    and weights become scalars), and a ``T``-tuple of steps when ``time_stacked`` is
    false."""
    if sample_batch_size is None:
        items = map_leaves(lambda a: a[0], items)
        info = BufferInfo(info.ids[0], info.probabilities[0],
                          None if info.weights is None else info.weights[0])
    if not time_stacked and num_steps is not None:  # a T-tuple of steps
        axis = 0 if sample_batch_size is None else 1
        items = tuple(map_leaves(functools.partial(np.take, indices=t, axis=axis), items)
                      for t in range(num_steps))
    return items, info
