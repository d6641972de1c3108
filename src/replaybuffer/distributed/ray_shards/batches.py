"""One batch from the shards' parts: concatenated, tagged with shard and incarnation,
rescaled to the whole buffer's probabilities, interleaved."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from replaybuffer import nest
from replaybuffer.distributed.ray_shards.shard import INCARNATION_SHIFT
from replaybuffer.protocols import BufferInfo


def concat(parts: list[Any]) -> Any:
    """Concatenate nests of arrays along their first axis."""
    structure = nest.flatten(parts[0])[1]
    leaves = [nest.flatten(part)[0] for part in parts]
    return structure.unflatten([np.concatenate(group) for group in zip(*leaves)])


def map_leaves(fn: Callable[[np.ndarray], np.ndarray], items: Any) -> Any:
    """``items`` with ``fn`` applied to each leaf."""
    leaves, structure = nest.flatten(items)
    return structure.unflatten([fn(leaf) for leaf in leaves])


def combine(parts: dict[int, tuple[Any, ...]], mass: np.ndarray,
            incarnations: Sequence[int], beta: float | None,
            rng: np.random.Generator) -> tuple[Any, BufferInfo]:
    """The batch of the shards' ``parts`` (shard -> ``(items, local ids, probabilities,
    ...)`` as :meth:`~.shard.ShardActor.draw` returns them), in an order drawn from
    ``rng``.

    Args:
        mass: float ``[num_shards]``, each shard's sampling mass.
        incarnations: each shard's incarnation (tagged into the ids).
        beta: the importance-sampling exponent of prioritized shards (``None``:
            uniform, no weights).

    Returns:
        ``(items, BufferInfo)``: int64 ids ``incarnation << 48 | local * num_shards +
        shard``, float32 probabilities over the whole buffer, float32 weights
        ``(P_min / P) ** beta`` over the batch (prioritized).
    """
    num_shards = len(mass)
    total = float(sum(mass[i] for i in parts))
    shards = sorted(parts)
    items = concat([parts[i][0] for i in shards])
    ids = np.concatenate([(incarnations[i] << INCARNATION_SHIFT)
                          | (parts[i][1] * num_shards + i) for i in shards])
    probabilities = np.concatenate([parts[i][2] * (mass[i] / total) for i in shards]
                                   ).astype(np.float32)
    order = rng.permutation(len(probabilities))  # shard parts interleaved
    items = map_leaves(lambda a: a[order], items)
    ids, probabilities = ids[order], probabilities[order]
    weights = None
    if beta is not None:  # prioritized: (P_min / P) ** beta over the batch
        p = probabilities.astype(np.float64)
        weights = np.power(p.min() / p, beta).astype(np.float32)
    return items, BufferInfo(ids, probabilities, weights)
