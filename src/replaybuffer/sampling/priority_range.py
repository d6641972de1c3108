"""The mass a prioritized draw is proportional to: the valid starts' cyclic range.

In the slot-major layout the valid window starts of every row form one cyclic range of
storage positions ``[first, first + span)`` (:mod:`replaybuffer.sampling.prioritized`).
Its mass is the sum tree's total less the few positions outside it, or, when those
hold most of the mass, the sum over its (at most two) segments, from prefix sums.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling.trees import SumTree


def cyclic_sum(values: np.ndarray, start: int, count: int, size: int) -> float:
    """The sum of ``count`` (1 to ``size``) entries of ``values`` (float64 ``[size]``)
    from ``start``, wrapping past the end."""
    if count == 1:
        return float(values[start])
    end = start + count
    if end <= size:
        return float(values[start:end].sum())
    return float(values[start:].sum()) + float(values[:end - size].sum())


def range_segments(tree: SumTree, first: int, span: int, cap: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, masses)``, float64 ``[S]``: the prefix sum before each of the
    ``S <= 2`` position segments of the cyclic range ``[first, first + span)`` of a
    tree of ``cap`` slots, and the segment's mass."""
    ends = [first, min(first + span, cap)]
    if first + span > cap:  # the range wraps past the last position
        ends += [0, first + span - cap]
    bounds = tree.sums_before(np.array(ends, np.int64))
    return bounds[0::2], bounds[1::2] - bounds[0::2]


def require_mass(valid_mass: float, num_steps: int) -> None:
    """Raise :class:`~replaybuffer.errors.EmptyBufferError` unless ``valid_mass > 0``
    (every window of ``num_steps`` has priority 0)."""
    if not valid_mass > 0.0:
        raise EmptyBufferError(f"every window of num_steps={num_steps} has priority 0; "
                               "update_priorities with positive values first")
