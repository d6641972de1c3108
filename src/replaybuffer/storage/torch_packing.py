"""Leaves of one dtype side by side in one tensor, so that one gather serves them all.

On a GPU a gather costs a kernel launch (5-10 us of host time, whatever its size) and
the bytes are nearly free: a step of the control workload (five leaves: float32
observation, action, reward, discount; int32 step type) gathered leaf by leaf is five
``index_select`` launches. Packed by dtype it is two, one per block: the float32 block
``[capacity, 17 + 6 + 1 + 1]`` and the int32 ``[capacity, 1]``; the frames workload's
five are three (its uint8 observation keeps a block of its own, so a gather of the
small leaves alone never reads frames).

Packing also makes a recorded sample small: a uniform ``sample(256)`` with next steps
(``replaybuffer bench --gpu --profile``, H100: 11 kernels, about 200 us of host time for
33 us of device time) is host-bound, and
:mod:`replaybuffer.sampling.captured_draws` records the whole of it in a CUDA graph that
gathers these blocks (the storage's ``packing``) into one static buffer: a replay and one copy out per call, whatever the block count.
The graph reads the write head from a device scalar, so writes need no new recording.

Each leaf is a view of its block (``[capacity, *shape]``, strided: a row of the block
per position), so writes, loads and zeroing through the views are what they were.
A gathered leaf is likewise a view of the gathered block (strided, not contiguous:
``.contiguous()`` where a consumer insists), as the CPU storage's leaves already are
of their gathered records.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


class PackedLeaves:
    """One ``[capacity, width]`` tensor per dtype on ``device``, and each leaf's view.

    Args:
        shapes: each leaf's shape (without the capacity axis), in leaf order.
        dtypes: each leaf's torch dtype.
        capacity: positions.
        device: where the blocks live.
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[torch.dtype],
                 capacity: int, device: torch.device):
        self.shapes = [tuple(s) for s in shapes]
        order, widths, self.columns = _layout(self.shapes, dtypes)
        self.blocks = [torch.zeros((capacity, w), dtype=d, device=device)
                       for d, w in zip(order, widths)]
        # A leaf alone in its block is the block reshaped, and gathers as it.
        self._alone = [widths[b] == n for b, _, n in self.columns]
        self.views = [self._leaf(self.blocks[b], i, (capacity,))
                      for i, (b, _, _) in enumerate(self.columns)]

    def _leaf(self, block: torch.Tensor, i: int, outer: tuple[int, ...]) -> torch.Tensor:
        """Leaf ``i``'s columns of ``block`` (``[N, width]``) as ``[*outer, *shape]``
        (``N`` = prod(outer)), a view."""
        _, first, n = self.columns[i]
        columns = block if self._alone[i] else block.narrow(1, first, n)
        return columns.view(outer + self.shapes[i])

    def gather(self, flat: torch.Tensor, outer: tuple[int, ...], which: Sequence[int]
               ) -> list[torch.Tensor]:
        """Leaves ``which`` at positions ``flat`` (int64 ``[N]``, in range, on the
        blocks' device), each ``[*outer, *shape]``: one ``index_select`` per block
        they use, and views of its rows."""
        rows: dict[int, torch.Tensor] = {}
        out = []
        for i in which:
            b = self.columns[i][0]
            block = rows.get(b)
            if block is None:
                block = rows[b] = torch.index_select(self.blocks[b], 0, flat)
            out.append(self._leaf(block, i, outer))
        return out

    def leaves(self, blocks: Sequence[torch.Tensor], outer: tuple[int, ...],
               which: Sequence[int]) -> list[torch.Tensor]:
        """Leaves ``which`` as views of gathered ``blocks`` (one ``[N, width]`` tensor per
        block, in block order, ``N`` = prod(outer)), each ``[*outer, *shape]``: what
        :meth:`gather` returns, from blocks gathered elsewhere (a captured draw's)."""
        return [self._leaf(blocks[self.columns[i][0]], i, outer) for i in which]

    def zero(self) -> None:
        """Every block back to zeros."""
        for block in self.blocks:
            block.zero_()


def _layout(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[torch.dtype]
            ) -> tuple[list[torch.dtype], list[int], list[tuple[int, int, int]]]:
    """The packing of leaves of ``shapes`` and ``dtypes``: the blocks' dtypes (in order
    of first appearance), their widths, and per leaf ``(its block, its first column,
    its columns)``."""
    order: list[torch.dtype] = []
    for d in dtypes:
        if d not in order:
            order.append(d)
    widths = [0] * len(order)
    columns = []
    for shape, d in zip(shapes, dtypes):
        b, n = order.index(d), math.prod(shape)
        columns.append((b, widths[b], n))
        widths[b] += n
    return order, widths, columns
