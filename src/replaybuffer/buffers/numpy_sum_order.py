"""Row sums on a torch device in the order numpy adds them, so they agree bit for bit.

A transition buffer's host path sums each ``n``-step window's discounted rewards with
``terms.sum(-1)`` (float64 ``[S, n]``): numpy reduces a contiguous last axis from its
identity ``0.0`` plus a pairwise sum (below 8 terms one after another; up to 128
terms 8 running accumulators combined as a tree, then the rest one by one; beyond that
two halves, the first a multiple of 8 long). Float addition is not associative, so a
device sum in torch's order may differ from it in the last bit; the same additions in
the same order, one elementwise add each, give the same bits on any device.
"""

from __future__ import annotations

import torch

# numpy's pairwise summation: below this many terms, one after another; up to BLOCK
# terms, UNROLL running accumulators; beyond, two halves.
UNROLL = 8
BLOCK = 128


def row_sums_in_numpy_order(terms: torch.Tensor) -> torch.Tensor:
    """The sums over the last axis of ``terms`` (float64 ``[S, n]``, ``n >= 1``): float64
    ``[S]``, bit for bit ``terms.numpy().sum(-1)`` (a ``-0.0`` sum is ``0.0``, as
    numpy's is, for it starts from the identity ``0.0``)."""
    return _pairwise(terms, 0, terms.shape[-1]) + 0.0


def _pairwise(terms: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """numpy's pairwise sum of columns ``start .. start + count`` of ``terms``."""
    if count < UNROLL:
        total = terms[:, start]
        for k in range(start + 1, start + count):
            total = total + terms[:, k]
        return total
    if count <= BLOCK:
        whole = count - count % UNROLL
        # The 8 accumulators start at the first 8 columns; each later block of 8 adds
        # into them column by column (one elementwise add of [S, 8] per block).
        acc = terms[:, start:start + UNROLL]
        for k in range(start + UNROLL, start + whole, UNROLL):
            acc = acc + terms[:, k:k + UNROLL]
        # ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)): adjacent pairs, three times.
        while acc.shape[-1] > 1:
            acc = acc[:, 0::2] + acc[:, 1::2]
        total = acc[:, 0]
        for k in range(start + whole, start + count):
            total = total + terms[:, k]
        return total
    half = count // 2
    half -= half % UNROLL
    return _pairwise(terms, start, half) + _pairwise(terms, start + half, count - half)
