"""Sum and min trees in one device tensor each, searched and updated in batches.

The layout is the classic implicit binary heap: node 1 is the root, node ``k`` has
children ``2k`` and ``2k + 1``, and slot ``i`` is leaf ``size + i`` (``size`` the
capacity rounded up to a power of two; the padding leaves hold the identity). Every
operation is a fixed sequence of whole-batch torch operations, one step per level,
so it runs where the tensor lives (a GPU) without a host round trip and without
data-dependent control flow on the host.
"""

from __future__ import annotations

import torch


class TorchSegmentTree:
    """A sum tree (``op="sum"``) or min tree (``op="min"``) of float64 slot values.

    Args:
        capacity: number of slots, >= 1.
        device: where the nodes live.
        op: ``"sum"`` (identity 0) or ``"min"`` (identity ``inf``).
    """

    def __init__(self, capacity: int, device: torch.device, op: str = "sum"):
        if op not in ("sum", "min"):
            raise ValueError(f"op must be 'sum' or 'min', got {op!r}")
        self.capacity = int(capacity)
        self.device = device
        self.op = op
        self.depth = max(1, (self.capacity - 1).bit_length())
        self.size = 1 << self.depth
        self.identity = 0.0 if op == "sum" else float("inf")
        self.nodes = torch.full((2 * self.size,), self.identity, dtype=torch.float64,
                                device=device)

    @property
    def leaves(self) -> torch.Tensor:
        """The slot values, float64 ``[capacity]`` (a view)."""
        return self.nodes[self.size:self.size + self.capacity]

    def root(self) -> torch.Tensor:
        """The total (sum) or the smallest value (min): a 0-d float64 tensor."""
        return self.nodes[1]

    def clear(self) -> None:
        """Every slot back to the identity."""
        self.nodes.fill_(self.identity)

    def assign(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """``slot[slots[k]] = values[k]`` (int64 and float64 ``[K]`` on the device), the
        last occurrence winning where a slot repeats, then the ancestors recomputed."""
        k = slots.shape[0]
        if k == 0:
            return
        # Last occurrence wins: index_put_ with repeated indices picks an arbitrary one
        # on a GPU, so keep only each slot's last entry.
        unique, inverse = torch.unique(slots, return_inverse=True)
        last = torch.full(unique.shape, -1, dtype=torch.int64, device=self.device)
        last.scatter_reduce_(0, inverse, torch.arange(k, device=self.device), "amax")
        node = unique + self.size
        self.nodes[node] = values[last]
        self._recompute(node)

    def load(self, values: torch.Tensor) -> None:
        """Replace every slot (float64 ``[capacity]``) and rebuild all levels."""
        self.nodes.fill_(self.identity)
        self.nodes[self.size:self.size + self.capacity] = values
        lo = self.size
        while lo > 1:  # level by level, whole levels at once
            children = self.nodes[lo:2 * lo].view(-1, 2)
            self.nodes[lo // 2:lo] = children.sum(1) if self.op == "sum" \
                else children.amin(1)
            lo //= 2

    def _recompute(self, node: torch.Tensor) -> None:
        """Recompute the ancestors of leaf nodes ``node`` (int64 ``[K]``), level by level.
        Parents repeat where leaves share them; repeated writes write the same value."""
        nodes = self.nodes
        for _ in range(self.depth):
            node = node // 2
            left = nodes[2 * node]
            right = nodes[2 * node + 1]
            nodes[node] = left + right if self.op == "sum" else torch.minimum(left, right)

    def prefix_sums(self, ends: torch.Tensor) -> torch.Tensor:
        """Sum tree: the sum of slots ``[0, ends[k])`` for each ``k`` (int64 ``[E]``,
        ``0 <= ends <= capacity``), float64 ``[E]``."""
        # The path up from the leaf of slot ``end``: each right child adds its left
        # sibling. ``end == size`` (past the last leaf) is the whole tree.
        node = torch.clamp(ends + self.size, max=2 * self.size - 1)
        total = torch.zeros(ends.shape, dtype=torch.float64, device=self.device)
        nodes = self.nodes
        for _ in range(self.depth):
            total += torch.where((node & 1).bool(), nodes[node - 1], 0.0)
            node = node // 2
        return torch.where(ends >= self.size, nodes[1], total)

    def find(self, targets: torch.Tensor) -> torch.Tensor:
        """Sum tree: for each target (float64 ``[K]``, in ``[0, total)``) the slot ``i``
        whose prefix sums bracket it, int64 ``[K]``.

        Branch-free descent; the right child is taken only if it holds mass, so a
        target that rounding pushes past the last positive slot still lands on a slot
        of positive mass (never an empty or padding slot).
        """
        nodes = self.nodes
        node = torch.ones(targets.shape, dtype=torch.int64, device=self.device)
        t = targets.clone()
        for _ in range(self.depth):
            node = node * 2
            left = nodes[node]
            right = (t >= left) & (nodes[node + 1] > 0)
            t = t - torch.where(right, left, 0.0)
            node = node + right.long()
        return node - self.size
