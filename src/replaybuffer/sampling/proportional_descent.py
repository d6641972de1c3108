"""Proportional draws by descent of the sum tree, inside the valid starts' range.

Targets are drawn uniformly inside the range's share of the prefix sums and found in
the sum tree (:meth:`~replaybuffer.sampling.trees.sum_tree.SumTree.find`), so the draw
is exact however little of the mass the range holds; used when a few high priorities
make rejection (:mod:`~replaybuffer.sampling.rejection`) keep too few candidates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.sampling.item_ids import ids_at
from replaybuffer.sampling.priority_range import range_segments
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.trees import SumTree

#: ``segments`` for :func:`draw_descending`: the whole tree.
WHOLE: Any = (None, None)


def draw_descending(tree: SumTree, ring: Ring, count: int, rng: np.random.Generator,
                    first: int, span: int, hi: int,
                    segments: tuple[np.ndarray, np.ndarray] | None,
                    u: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` starts of the cyclic position range ``[first, first + span)``, in
    proportion to their values in ``tree``, by descent: targets are drawn inside the
    range's share of the prefix sums. ``hi`` bounds the ids of valid starts;
    ``segments`` is :func:`~replaybuffer.sampling.priority_range.range_segments` output
    if known, or :data:`WHOLE` to draw over the whole tree and redraw the starts outside
    the range (cheaper while the range holds all but a sliver of the mass).

    Returns ``(positions, ids, values)`` (int64, int64, float64 ``[count]``).
    """
    spans: tuple[np.ndarray, np.ndarray] | None  # (starts, masses)
    if segments is WHOLE:  # the whole tree: exact too, since starts outside it are
        spans = None  # redrawn below, but rarely worth a prefix sum
        mass = tree.total()
    else:
        spans = segments if segments is not None else \
            range_segments(tree, first, span, ring.capacity)
        mass = float(spans[1].sum())
    if u is None:
        u = rng.random(count) * mass
    # Rounding can land a target a hair outside the range: redraw those (rare).
    for _ in range(100):
        if spans is None:
            targets = u
        elif len(spans[0]) == 1:
            targets = spans[0][0] + u
        else:
            starts, masses = spans
            targets = np.where(u < masses[0], starts[0] + u, starts[-1] + u - masses[0])
        positions, values = tree.find(targets)
        ids = ids_at(ring, positions)
        if ids.max() < hi:  # one reduction for the usual all-valid batch
            return positions, ids, values
        bad = ids >= hi
        u[bad] = rng.random(int(bad.sum())) * mass
    raise RuntimeError("prioritized sampling could not find valid windows")  # pragma: no cover
