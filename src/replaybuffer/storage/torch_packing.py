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
gathers these blocks (found from the storage's leaf views by :meth:`PackedLeaves.over`)
into one static buffer: a replay and one copy out per call, whatever the block count.
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
        blocks: the blocks, if they exist already (:meth:`over`); else made as zeros.
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[torch.dtype],
                 capacity: int, device: torch.device,
                 blocks: Sequence[torch.Tensor] | None = None):
        self.shapes = [tuple(s) for s in shapes]
        order, widths, self.columns = _layout(self.shapes, dtypes)
        self.blocks = list(blocks) if blocks is not None else [
            torch.zeros((capacity, w), dtype=d, device=device) for d, w in zip(order, widths)]
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

    @classmethod
    def over(cls, views: Sequence[torch.Tensor]) -> PackedLeaves:
        """The packing that ``views`` (a packed storage's leaves, ``[capacity, *shape]``
        each, as :attr:`views` gives them) are views of, its blocks the tensors they
        share: no copy, so writes through the views are seen in the blocks.

        Raises:
            ValueError: the views are not leaves of blocks packed as this class packs
                them (numpy records, say, or tensors of their own).
        """
        if not views:
            raise ValueError("no leaves to find blocks of")
        capacity = int(views[0].shape[0])
        bases: list[tuple[int, torch.dtype]] = []  # (storage address, dtype) per block
        blocks: list[torch.Tensor] = []
        columns: list[tuple[int, int, int]] = []
        for v in views:
            n = math.prod(v.shape[1:])
            memory = v.untyped_storage()
            # A block is the whole of its memory, [capacity, width] (strides of axes
            # of size 1 say nothing, so the width comes from the memory's size).
            width = memory.nbytes() // max(1, capacity * v.element_size())
            first = int(v.storage_offset())
            if v.dim() == 0 or int(v.shape[0]) != capacity or n == 0 or \
                    memory.nbytes() != capacity * width * v.element_size() or \
                    first + n > width or \
                    (capacity > 1 and int(v.stride(0)) != width) or \
                    (n > 1 and _row_strides(v, capacity, n)[1:] != (1,)):
                raise ValueError(f"a leaf of shape {tuple(v.shape)} and strides "
                                 f"{v.stride()} is not the whole of its tensor's memory "
                                 f"packed as a block")
            key = (memory.data_ptr(), v.dtype)
            if key not in bases:
                bases.append(key)
                blocks.append(v.as_strided((capacity, width), (width, 1), 0))
            columns.append((bases.index(key), first, n))
        shapes = [tuple(v.shape[1:]) for v in views]
        dtypes = [v.dtype for v in views]
        _, widths, expected = _layout(shapes, dtypes)
        if expected != columns or widths != [int(b.shape[1]) for b in blocks]:
            raise ValueError("the leaves are packed in another order than this class's")
        return cls(shapes, dtypes, capacity, views[0].device, blocks)

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


def _row_strides(view: torch.Tensor, capacity: int, n: int) -> tuple[int, ...]:
    """The strides of ``view`` seen as ``[capacity, n]`` (``()`` where it cannot be)."""
    try:
        return tuple(view.view(capacity, n).stride())
    except RuntimeError:  # not contiguous within a position
        return ()
