"""Slot values in one flat device tensor, searched through their running sums.

The GPU counterpart of :class:`~replaybuffer.sampling.torch_tree.TorchSegmentTree`, with
the same verbs. A tree touches ``log2(capacity)`` levels one after another, each level a
handful of tiny kernels: on a GPU every kernel costs a launch (microseconds) while the
arithmetic is free, so a descent over a 1M-slot tree is ~200 launches. Here a batch of
draws is one ``cumsum`` of the slots (recomputed only after a write) and one
``searchsorted``: O(capacity) bytes, which the GPU moves in microseconds up to tens of
millions of slots, and a fixed, small number of launches at any capacity. Writes are a
scatter, with no ancestors to recompute and no host round trip (``torch.unique`` would
need one to size its output).
"""

from __future__ import annotations

import torch


class TorchPrefixSums:
    """``capacity`` float64 slot values on ``device`` and their inclusive running sums.

    Args:
        capacity: number of slots, >= 1.
        device: where the values live.
    """

    def __init__(self, capacity: int, device: torch.device):
        self.capacity = int(capacity)
        self.device = device
        # One slot past the end takes the writes that lose to a later write of the same
        # slot in one assign (see assign); it is never read.
        self._values = torch.zeros(self.capacity + 1, dtype=torch.float64, device=device)
        self._sums: torch.Tensor | None = None  # cumsum of the leaves, None when stale

    @property
    def leaves(self) -> torch.Tensor:
        """The slot values, float64 ``[capacity]`` (a view)."""
        return self._values[:self.capacity]

    def sums(self) -> torch.Tensor:
        """Inclusive running sums of the slots, float64 ``[capacity]`` (cached until the
        next write)."""
        if self._sums is None:
            self._sums = torch.cumsum(self.leaves, 0)
        return self._sums

    def root(self) -> torch.Tensor:
        """The total of every slot: a 0-d float64 tensor."""
        return self.sums()[-1]

    def smallest_positive(self) -> torch.Tensor:
        """The smallest slot value above 0 (``inf`` when none): a 0-d float64 tensor."""
        leaves = self.leaves
        return torch.where(leaves > 0, leaves, torch.inf).amin()

    def clear(self) -> None:
        """Every slot back to 0."""
        self._values.zero_()
        self._sums = None

    def assign(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """``slot[slots[k]] = values[k]`` (int64 and float64 ``[K]`` on the device), the
        last occurrence winning where a slot repeats."""
        if slots.shape[0] == 0:
            return
        # index_put_ with repeated indices keeps an arbitrary one on a GPU. A stable sort
        # puts each slot's occurrences together in call order; all but the last of each
        # run are sent to the scratch slot past the end, so every real slot is written
        # once, by its last occurrence, without a data-dependent size on the host.
        ordered, order = torch.sort(slots, stable=True)
        last = torch.ones_like(ordered, dtype=torch.bool)
        last[:-1] = ordered[1:] != ordered[:-1]
        target = torch.where(last, ordered, self.capacity)
        self._values.index_put_((target,), values[order])
        self._sums = None

    def load(self, values: torch.Tensor) -> None:
        """Replace every slot (float64 ``[capacity]``)."""
        self.leaves.copy_(values)
        self._sums = None

    def prefix_sums(self, ends: torch.Tensor) -> torch.Tensor:
        """The sum of slots ``[0, ends[k])`` for each ``k`` (int64 ``[E]``,
        ``0 <= ends <= capacity``), float64 ``[E]``."""
        sums = self.sums()
        before = sums[torch.clamp(ends - 1, min=0)]
        return torch.where(ends > 0, before, 0.0)

    def find(self, targets: torch.Tensor) -> torch.Tensor:
        """For each target (float64 ``[K]``, in ``[0, total)``) the slot ``i`` with
        ``sums[i - 1] <= target < sums[i]``, int64 ``[K]``.

        The first running sum above the target belongs to a slot of positive mass (an
        empty slot repeats its left neighbour's sum), so an empty slot is never found;
        a target that rounding carries to the total or past it is held just below the
        total, which lands on the last slot with mass.
        """
        sums = self.sums()
        below_total = torch.nextafter(sums[-1], sums.new_zeros(()))
        found = torch.searchsorted(sums, torch.minimum(targets, below_total), right=True)
        # Only a total of 0 leaves the range (the sampler reports that as an error
        # before these positions are read); keep even that in bounds.
        return found.clamp_(max=self.capacity - 1)
