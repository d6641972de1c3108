"""A device sum tree searched over a cyclic range of positions: what
:class:`~replaybuffer.sampling.torch_prioritized.TorchPrioritizedSampler` draws and
weighs with ``search="tree"``, as :meth:`~replaybuffer.sampling.torch_prefix_sums.
TorchPrefixSums.draw` and :meth:`~replaybuffer.sampling.torch_prefix_sums.
TorchPrefixSums.range_mass` do for the running sums.

The valid window starts are the positions ``first`` to ``first + span - 1`` taken
cyclically, so a range that wraps is two segments of the tree, each bounded by two
prefix sums. Float64 rounding can carry a target past its segment's edge (odds about
1e-16), where the tree's path sums and the bounds may differ in the last bit: such a
search is redone at the middle of its segment instead of redrawn, which would need
the host.
"""

from __future__ import annotations

import numpy as np
import torch

from replaybuffer.device_copy import to_device
from replaybuffer.sampling.torch_tree import TorchSegmentTree


def tree_draw(tree: TorchSegmentTree, u: torch.Tensor, first: int, span: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions, mass)``: for uniform ``u`` (float64 ``[S]`` in [0, 1), on the
    tree's device) the slot positions drawn in proportion to their values within the
    cyclic range ``[first, first + span)`` (int64 ``[S]``), and the range's mass (0-d
    float64), all on the device."""
    if span == tree.capacity:
        mass = tree.root()
        return tree.find(u * mass), mass
    bounds, masses, mass = tree_segments(tree, first, span)
    u = u * mass
    # The second segment only where it has mass (rounding may carry u past the first's
    # share when the second is empty).
    first_segment = (u < masses[0]) | (masses[1] <= 0)
    start = torch.where(first_segment, bounds[0], bounds[2])
    positions = tree.find(start + torch.where(first_segment, u, u - masses[0]))
    # A target past its segment's edge (the module docstring): redone at its middle.
    outside = (positions - first) % tree.capacity >= span
    middle = start + torch.where(first_segment, masses[0], masses[1]) / 2
    return torch.where(outside, tree.find(middle), positions), mass


def tree_range_mass(tree: TorchSegmentTree, first: int, span: int) -> torch.Tensor:
    """The summed values of the cyclic range ``[first, first + span)`` (0-d float64 on
    the device)."""
    if span == tree.capacity:
        return tree.root()
    return tree_segments(tree, first, span)[2]


def tree_segments(tree: TorchSegmentTree, first: int, span: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sum tree's ``(bounds, masses, mass)`` of the cyclic position range
    ``[first, first + span)``: float64 tensors of each segment's prefix sums at its
    start and end (``[start0, end0, start1, end1]``, the second segment repeating the
    first's start when the range does not wrap, so that its mass is 0), the segments'
    masses and their total."""
    cap = tree.capacity
    ends = [first, min(first + span, cap)]
    ends += [0, first + span - cap] if first + span > cap else [first, first]
    bounds = tree.prefix_sums(to_device(np.array(ends, np.int64), tree.device))
    masses = bounds[1::2] - bounds[0::2]
    return bounds, masses, masses.sum()
