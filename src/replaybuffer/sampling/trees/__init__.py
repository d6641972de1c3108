"""Sum and min segment trees over a fixed number of slots, for prioritized replay.

A wide root over a forest of binary trees in one flat float64 array, every node a pure
function of the current leaves (recomputed, never updated by deltas, so the tree after
any sequence of updates is bit-for-bit the tree built from scratch), and every batch
of ``K`` updates or searches walked together, one numpy call sequence per level and
none per item. One concept per module:

- :mod:`~replaybuffer.sampling.trees.layout`: the shape (wide root, binary subtrees,
  the total level), the flat heap layout and its constants;
- :mod:`~replaybuffer.sampling.trees.recompute`: exact recomputation of the levels
  along a batch's paths, by rows of 8, or whole (pure functions over the node array);
- :mod:`~replaybuffer.sampling.trees.segment`: :class:`SegmentTree`, the slots,
  checked and unchecked updates, the lazily recomputed upper levels, checkpoints;
- :mod:`~replaybuffer.sampling.trees.sum_tree`: :class:`SumTree`, totals, prefix sums
  and proportional search;
- :mod:`~replaybuffer.sampling.trees.descent`: the numpy search down a sum tree;
- :mod:`~replaybuffer.sampling.trees.min_tree`: :class:`MinTree`, the smallest value;
- :mod:`~replaybuffer.sampling.trees.validation`: the checks of public arguments.

The compiled loops (numba) are :mod:`replaybuffer.sampling.tree_kernels`; they give
the same bits as the numpy loops here.
"""

from replaybuffer.sampling.trees.layout import DEFAULT_ROOT_WIDTH, TOTAL_WIDTH
from replaybuffer.sampling.trees.min_tree import MinTree
from replaybuffer.sampling.trees.segment import SegmentTree
from replaybuffer.sampling.trees.sum_tree import SumTree

__all__ = ["DEFAULT_ROOT_WIDTH", "TOTAL_WIDTH", "MinTree", "SegmentTree", "SumTree"]
