"""A prioritized draw over running sums and its gather, recorded once per batch shape.

The prioritized counterpart of :class:`~replaybuffer.sampling.captured_draws.
CapturedUniformDraw`: what :meth:`~replaybuffer.sampling.torch_prioritized.
TorchPrioritizedSampler.sample` does with ``search="prefix"`` (uniform targets scaled
onto the valid starts' share of the running sums, one ``searchsorted``, the ids, the
windows, the probabilities and the importance ratios) and one ``index_select`` per
packed block, recorded into a :class:`~replaybuffer.sampling.graph_capture.Capture`.

Nothing that changes between calls is baked in. The write head (``last_id``) is the
capture's scalar, and the valid range, whether it wraps the ring, and both pieces of a
wrapping range are derived from it on the device (the eager path picks one branch on
the host; here both are computed and one is selected, with the same arithmetic, so the
bits are the eager path's). The running sums and slot values are read in place: the
owner refreshes the sums (one ``cumsum`` after a write, eagerly) before each run. The
item ids' base (``key_base``, moved by a ``clear``) is a 0-d device tensor filled when
it changes. The importance weights are the ratios raised to the call's ``beta`` after
the copy out (:meth:`CapturedPrioritizedDraw.run` leaves that to the sampler): a
``pow`` with a tensor exponent rounds differently from the eager path's Python-float
exponent in the last bit (seen on the CPU for beta 0.4), so taking beta as a device
scalar inside the recording would not give the eager path's bytes.
"""

from __future__ import annotations

from typing import Sequence

import torch

from replaybuffer.sampling.captured_draws import window_outputs
from replaybuffer.sampling.graph_capture import Capture
from replaybuffer.sampling.torch_prefix_sums import TorchPrefixSums


class CapturedPrioritizedDraw:
    """Prioritized draws of ``sample_batch_size`` windows of ``num_steps`` over a ring
    of ``batch`` rows by ``length`` steps whose ``priority ** alpha`` are ``sums``'
    slots, and the rows of ``blocks`` at their positions, recorded in ``capture``.

    Args:
        capture: where the sequence is recorded (it is recorded here, at once).
        generator: the sampler's device generator (the draws' source).
        sums: the sampler's running sums (read in place).
        blocks: the storage's packed blocks, ``[capacity, width]`` each, on the
            generator's device (read in place).
        batch, length: the ring's rows and steps per row (capacity ``batch * length``).
        sample_batch_size: ``S``, windows per call.
        num_steps: ``T``, steps per window, or ``None`` for single steps.
        normalize: the sampler's ``"batch"`` or ``"buffer"`` (the smallest value the
            ratios are relative to).
    """

    def __init__(self, capture: Capture, generator: torch.Generator, sums: TorchPrefixSums,
                 blocks: Sequence[torch.Tensor], batch: int, length: int,
                 sample_batch_size: int, num_steps: int | None, normalize: str):
        self.capture, self.generator, self.sums = capture, generator, sums
        self.blocks = list(blocks)
        self.batch, self.length, self.capacity = batch, length, batch * length
        if sums.capacity != self.capacity:
            raise ValueError(f"running sums of {sums.capacity} slots for a ring of "
                             f"{self.capacity}")
        self.sample_batch_size, self.num_steps = sample_batch_size, num_steps
        self.normalize = normalize
        device = self.blocks[0].device
        self.device = device
        steps = num_steps or 1
        # The static output: the blocks' rows, item ids, probabilities, ratios.
        self.outer, self.output, self.static = window_outputs(
            self.blocks, sample_batch_size, num_steps, 2)
        self.last_id = torch.zeros((), dtype=torch.int64, device=device)
        self.key_base = torch.zeros((), dtype=torch.int64, device=device)
        self._key_base = 0
        # Made here, never inside the recording (a tensor made while a CUDA graph is
        # captured is filled only when it is replayed): window offsets (item ids and
        # positions both grow by the rows per step), and the constants.
        self._offsets = torch.arange(steps, device=device) * batch
        self._zero = torch.zeros((), dtype=torch.float64, device=device)
        self._prefix = sums.exclusive_sums()  # the same tensor at every refresh
        capture.record(self._sequence, self.last_id, self.output)

    def _sequence(self) -> None:
        """The recorded work: :meth:`TorchPrioritizedSampler.sample`'s arithmetic with
        every input from :attr:`last_id`, :attr:`key_base` and the sums, every result
        into :attr:`output` (through :attr:`static`)."""
        L, B, cap, steps = self.length, self.batch, self.capacity, self.num_steps or 1
        last, prefix, zero = self.last_id, self._prefix, self._zero
        lo = torch.clamp_min(last + (1 - L), 0)  # ring.oldest_id
        span = (torch.maximum(lo, last + (2 - steps)) - lo) * B
        first = torch.where(span == cap, 0, torch.remainder(lo, L) * B)
        end = first + span
        u = torch.rand(self.sample_batch_size, dtype=torch.float64,
                       generator=self.generator, device=self.device)
        # Reads at device indices by torch.take: indexing with a 0-d integer tensor
        # would read the index back to the host (.item(), a sync, refused in a graph).
        start = torch.take(prefix, first)
        # One piece: [first, end).
        stop = torch.take(prefix, torch.clamp_max(end, cap))
        piece_mass = stop - start
        piece_targets = torch.minimum(torch.addcmul(start, u, piece_mass),
                                      torch.nextafter(stop, zero))
        # Two pieces: [first, capacity) then [0, end - capacity).
        total, tail = prefix[cap], torch.take(prefix, torch.clamp_min(end - cap, 0))
        head = total - start
        wrap_mass = head + tail
        v = u * wrap_mass
        wrapped = (v >= head) & (tail > 0)
        wrap_targets = torch.minimum(torch.where(wrapped, v - head, start + v),
                                     torch.nextafter(torch.where(wrapped, tail, total),
                                                     zero))
        wraps = end > cap
        targets = torch.where(wraps, wrap_targets, piece_targets)
        mass = torch.where(wraps, wrap_mass, piece_mass)
        found = torch.searchsorted(prefix[1:], targets, right=True)
        lowest = torch.where(wraps & wrapped, 0, first)
        highest = torch.where(wraps, torch.where(wrapped, end - cap - 1, cap - 1), end - 1)
        positions = torch.clamp(found, lowest, highest)
        values = self.sums.leaves[positions]
        slots = torch.div(positions, B, rounding_mode="floor") if B > 1 else positions
        ids = torch.remainder(slots - torch.remainder(lo, L), L) + lo
        item_ids = ids + self.key_base if B == 1 else \
            (self.key_base + ids) * B + torch.remainder(positions, B)
        *gathered, ids_out, probabilities, ratios = self.static
        if self.num_steps is None:
            ids_out.copy_(item_ids)
            flat = positions
        else:
            ids_out.copy_(item_ids[:, None] + self._offsets)
            flat = torch.remainder((positions[:, None] + self._offsets).reshape(-1), cap)
        for block, out in zip(self.blocks, gathered):
            torch.index_select(block, 0, flat, out=out)
        probabilities.copy_((values / mass).to(torch.float32))
        if self.normalize == "batch":
            smallest = values.amin()
        else:
            smallest = self.sums.smallest_positive()
        ratios.copy_((smallest / values).to(torch.float32))

    def run(self, last_id: int, key_base: int) -> torch.Tensor:
        """One call: the ring's write head ``last_id`` (a window must fit and the
        valid starts must hold mass: the caller checks) and the sampler's
        ``key_base`` in, a fresh copy of :attr:`output` out: each gathered block
        ``[S * T, width]``, the item ids (int64 ``[S, T]``, or ``[S]`` without
        ``num_steps``), the probabilities and the importance ratios (``smallest /
        value``, float32 ``[S]``; the weights are these to the power ``beta``)."""
        if key_base != self._key_base:
            self.key_base.fill_(key_base)
            self._key_base = key_base
        self.sums.exclusive_sums()  # refreshed after writes, in place, outside the recording
        return self.capture.run(last_id)
