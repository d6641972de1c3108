"""Slot values in one flat device tensor, searched through their running sums.

The GPU counterpart of :class:`~replaybuffer.sampling.torch_tree.TorchSegmentTree`, with
the same verbs. A tree touches ``log2(capacity)`` levels one after another, each level a
handful of tiny kernels: on a GPU every kernel costs a launch (microseconds) while the
arithmetic is free, so a descent over a 1M-slot tree is ~200 launches. Here a batch of
draws is one ``cumsum`` of the slots (recomputed only after a write) and one
``searchsorted``: O(capacity) bytes, which the GPU moves in microseconds up to tens of
millions of slots, and a fixed, small number of launches at any capacity. Empty slots
are held at their left neighbour's running sum exactly, whatever order the GPU's scan
added in, so a search never lands on one. Writes are a scatter, with no ancestors to
recompute and no host round trip (``torch.unique`` would need one to size its output).
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
        # Exclusive running sums: [k] is the sum of slots [0, k), so [0] is 0 and [-1]
        # the total; a range's bounds are two reads of it, views that launch nothing.
        self._prefix = torch.zeros(self.capacity + 1, dtype=torch.float64, device=device)
        self._stale = False  # whether a write came after the last cumsum
        # Whether a slot inside the ranges searched may be empty: then the sums get
        # their empty slots held (_hold_empty), which costs a few passes over the
        # slots per write. An owner that knows every slot it searches is positive (the
        # sampler: no priority of 0 stored, unwritten slots never in a range) clears it.
        self.may_hold_empty = True
        self._zero = torch.zeros((), dtype=torch.float64, device=device)
        # Scratch of _hold_empty, made at its first call: every slot's index, and the
        # slot of each non-empty rank.
        self._slots: torch.Tensor | None = None
        self._by_rank: torch.Tensor | None = None

    @property
    def leaves(self) -> torch.Tensor:
        """The slot values, float64 ``[capacity]`` (a view)."""
        return self._values[:self.capacity]

    def _exclusive(self) -> torch.Tensor:
        if self._stale:
            leaves, sums = self.leaves, self._prefix[1:]
            torch.cumsum(leaves, 0, out=sums)
            if self.may_hold_empty:
                self._hold_empty(leaves, sums)
            self._stale = False
        return self._prefix

    def _hold_empty(self, leaves: torch.Tensor, sums: torch.Tensor) -> None:
        """Give every empty slot the running sum of the last non-empty slot before it
        (0 if none), in place."""
        # A GPU's parallel scan adds in another order than a loop does, so an empty
        # slot's running sum can differ from its left neighbour's in the last bit,
        # and a target between the two would find the empty slot (seen on an H100).
        # The last non-empty slot at or before each slot, without a host round trip:
        # an integer cumsum (exact) ranks the non-empty slots, a scatter files each
        # under its rank, a gather by rank reads it back. (torch.cummax does it in one
        # call but took 2.9 ms at 2**20 slots on an H100, and 200 ms at 2**26.)
        if self._slots is None or self._by_rank is None:
            self._slots = torch.arange(self.capacity, device=self.device)
            self._by_rank = torch.zeros(self.capacity + 1, dtype=torch.int64,
                                        device=self.device)
        positive = leaves > 0
        rank = torch.cumsum(positive, 0)
        by_rank = self._by_rank
        by_rank.scatter_(0, torch.where(positive, rank, 0), self._slots)
        held = sums[by_rank[rank]]  # by_rank[0] is junk: masked next
        sums.copy_(torch.where(rank > 0, held, 0.0))

    def exclusive_sums(self) -> torch.Tensor:
        """The exclusive running sums, float64 ``[capacity + 1]`` (``[k]``: slots
        ``[0, k)``), recomputed in place after a write: always the same tensor, so a
        recording may read it."""
        return self._exclusive()

    def sums(self) -> torch.Tensor:
        """Inclusive running sums of the slots, float64 ``[capacity]`` (recomputed after a
        write, when next read)."""
        return self._exclusive()[1:]

    def root(self) -> torch.Tensor:
        """The total of every slot: a 0-d float64 tensor."""
        return self._exclusive()[-1]

    def smallest_positive(self) -> torch.Tensor:
        """The smallest slot value above 0 (``inf`` when none): a 0-d float64 tensor."""
        leaves = self.leaves
        return torch.where(leaves > 0, leaves, torch.inf).amin()

    def clear(self) -> None:
        """Every slot back to 0."""
        self._values.zero_()
        self._prefix.zero_()
        self._stale = False

    def assign(self, slots: torch.Tensor, values: torch.Tensor,
               keep: torch.Tensor | None = None) -> None:
        """``slot[slots[k]] = values[k]`` (int64 and float64 ``[K]`` on the device), the
        last occurrence winning where a slot repeats; with ``keep`` (bool ``[K]``),
        only where it is true (the others write nothing: masks decided on the
        device, without a host round trip)."""
        if slots.shape[0] == 0:
            return
        if keep is not None:  # the others go to the scratch slot, never read
            slots = torch.where(keep, slots, self.capacity)
        # index_put_ with repeated indices keeps an arbitrary one on a GPU. A stable sort
        # puts each slot's occurrences together in call order; all but the last of each
        # run are sent to the scratch slot past the end, so every real slot is written
        # once, by its last occurrence, without a data-dependent size on the host.
        ordered, order = torch.sort(slots, stable=True)
        last = torch.ones_like(ordered, dtype=torch.bool)
        last[:-1] = ordered[1:] != ordered[:-1]
        target = torch.where(last, ordered, self.capacity)
        self._values.index_put_((target,), values[order])
        self._stale = True

    def mark_written(self) -> None:
        """Slots were written in place elsewhere (a recorded update): the running sums
        are recomputed when next read."""
        self._stale = True

    def load(self, values: torch.Tensor) -> None:
        """Replace every slot (float64 ``[capacity]``)."""
        self.leaves.copy_(values)
        self._stale = True

    def prefix_sums(self, ends: torch.Tensor) -> torch.Tensor:
        """The sum of slots ``[0, ends[k])`` for each ``k`` (int64 ``[E]``,
        ``0 <= ends <= capacity``), float64 ``[E]``."""
        return self._exclusive()[ends]

    def range_mass(self, first: int, span: int) -> torch.Tensor:
        """The total of the cyclic slot range ``[first, first + span)`` (modulo the
        capacity; ``0 <= first < capacity``, ``0 < span <= capacity``): 0-d float64."""
        prefix, end = self._exclusive(), first + span
        if end <= self.capacity:
            return prefix[end] - prefix[first]
        return (prefix[self.capacity] - prefix[first]) + prefix[end - self.capacity]

    def draw(self, u: torch.Tensor, first: int = 0, span: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots of the cyclic range ``[first, first + span)`` (default: every slot),
        each drawn with probability its value over the range's total: one slot per
        ``u`` (float64 ``[K]``, uniform in ``[0, 1)``), int64 ``[K]``, and that total
        (0-d float64).

        ``u`` scales onto the range's share of the running sums and one search finds
        the slots: the first running sum above a target belongs to a slot of positive
        mass, so an empty slot is never drawn. A target that rounding carries to the end
        of its share is held just below it, and a slot found outside the range is held
        at its edge. A range with no mass (which the caller reports) gives slots of the
        range all the same.
        """
        span = self.capacity if span is None else span
        prefix, end = self._exclusive(), first + span
        if end <= self.capacity:  # one piece: 5 kernels
            start, stop = prefix[first], prefix[end]
            mass = stop - start
            targets = torch.minimum(torch.addcmul(start, u, mass),
                                    torch.nextafter(stop, self._zero))
        else:  # [first, capacity) then [0, end - capacity): the share wraps
            start, total, stop = prefix[first], prefix[self.capacity], \
                prefix[end - self.capacity]
            head = total - start
            mass = head + stop
            v = u * mass
            # Into the second piece only where it has mass (rounding may carry v past
            # the head's share when it has none).
            wrapped = (v >= head) & (stop > 0)
            targets = torch.where(wrapped, v - head, start + v)
            limit = torch.where(wrapped, stop, total)
            targets = torch.minimum(targets, torch.nextafter(limit, self._zero))
        found = torch.searchsorted(prefix[1:], targets, right=True)
        # The search runs over every slot's sum, and outside the range they need not be
        # sorted to the bit (a GPU scan's rounding; unwritten slots are not held): a
        # search that strays is held inside the range's piece, whose slots all have
        # mass unless the owner says otherwise (may_hold_empty, then held exactly).
        if end <= self.capacity:
            return found.clamp_(first, end - 1), mass
        lowest = torch.where(wrapped, 0, first)
        highest = torch.where(wrapped, end - self.capacity - 1, self.capacity - 1)
        return torch.clamp(found, lowest, highest), mass

    def find(self, targets: torch.Tensor) -> torch.Tensor:
        """For each target (float64 ``[K]``, in ``[0, total)``) the slot ``i`` with
        ``sums[i - 1] <= target < sums[i]``, int64 ``[K]``.

        The first running sum above the target belongs to a slot of positive mass (an
        empty slot repeats its left neighbour's sum), so an empty slot is never found;
        a target that rounding carries to the total or past it is held just below the
        total, which lands on the last slot with mass.
        """
        prefix = self._exclusive()
        below_total = torch.nextafter(prefix[-1], self._zero)
        found = torch.searchsorted(prefix[1:], torch.minimum(targets, below_total),
                                   right=True)
        # Only a total of 0 leaves the range (the sampler reports that as an error
        # before these positions are read); keep even that in bounds.
        return found.clamp_(max=self.capacity - 1)
