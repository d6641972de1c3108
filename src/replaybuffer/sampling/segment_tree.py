"""Sum and min segment trees, for prioritized replay: the import path of
:mod:`replaybuffer.sampling.trees`, which holds them one concept per module (the
shape and layout, exact recomputation, the common tree, the sum tree and its search,
the min tree)."""

from replaybuffer.sampling.trees import (
    DEFAULT_ROOT_WIDTH,
    TOTAL_WIDTH,
    MinTree,
    SegmentTree,
    SumTree,
)

__all__ = ["DEFAULT_ROOT_WIDTH", "TOTAL_WIDTH", "MinTree", "SegmentTree", "SumTree"]
