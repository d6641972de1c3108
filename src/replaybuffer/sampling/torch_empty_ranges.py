"""Whether a range of a device sampler's priorities may have no mass.

A draw on the device (:class:`~replaybuffer.sampling.torch_prioritized.
TorchPrioritizedSampler`) reads its range's mass from the running sums or a sum tree
there. Where every value written is positive and large enough to survive in the sums,
every range of stored steps has mass and the draw need not check it (a check is a host
read, or on CUDA one queued: ``torch_prioritized.DrawMassChecks``). A value of 0, or one
below the total's last bit (about ``capacity * largest * 2**-52``: a range's mass is a
difference of running sums, where such a value can cancel to nothing, as a 0 does),
makes an empty range possible; from then until a clear or a restore, draws check their
mass, and the running sums hold their empty slots exactly
(:attr:`~replaybuffer.sampling.torch_prefix_sums.TorchPrefixSums.may_hold_empty`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replaybuffer.sampling.torch_prefix_sums import TorchPrefixSums


class EmptyRanges:
    """The values written since the last clear (scaled priorities, float64), as far as
    empty ranges go: :attr:`possible` and the smallest written.

    Args:
        capacity: the sampler's number of slots.
        sums: the running sums searched, whose ``may_hold_empty`` this keeps (``None``
            for a sum tree, which needs nothing held).
    """

    def __init__(self, capacity: int, sums: TorchPrefixSums | None):
        self.capacity = int(capacity)
        self._sums = sums
        self.smallest = math.inf
        self.possible = False
        self.forget()

    def forget(self) -> None:
        """No value written yet (a new or cleared sampler, or before a restore's)."""
        self.smallest = math.inf
        self.possible = False
        if self._sums is not None:
            self._sums.may_hold_empty = False

    def note(self, smallest: float, largest: float) -> None:
        """Values written, from ``smallest`` to ``largest``."""
        self.smallest = min(self.smallest, smallest)
        if not self.smallest > largest * self.capacity * 2.0**-52:
            self.possible = True
            if self._sums is not None:
                self._sums.may_hold_empty = True

    def unknown(self) -> None:
        """Values not yet known on the host were written (a device update in flight,
        which may write zeros): the sums hold empty slots until :meth:`settled`."""
        if self._sums is not None:
            self._sums.may_hold_empty = True

    def settled(self) -> None:
        """Every value written has been noted: the sums hold empty slots only where
        :attr:`possible`."""
        if self._sums is not None:
            self._sums.may_hold_empty = self.possible
