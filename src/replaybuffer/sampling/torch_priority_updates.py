"""Priority updates made and checked on the device, with no host synchronization.

``update_priorities`` with ids and priorities that are tensors on the device of a
device-sampling prioritized buffer (on CUDA by default, :func:`checked_on_device`) (its ``BufferInfo.ids`` and, say, absolute TD errors
computed there) runs here: item ids become positions, stale ids are masked out, the
values are checked (NaN, infinite or negative: the batch is refused; a total that would
overflow: refused too) and the update is applied with the refusal as a mask, so a bad
batch writes nothing, all as device operations. Nothing is read back at once: the
check's outcome (:class:`~replaybuffer.sampling.torch_deferred_checks.DeviceChecks`)
is read at the next call on the buffer that arrives after the device made it (the
next update or sample, usually), and a refused batch raises its ``ValueError`` then.

What the deferral changes, against the host path (numpy ids or priorities):

- a bad batch is reported by a later call, not by its own; the buffer is unchanged
  by it all the same (its mask wrote nothing);
- the count returned is of the ids given (stale ones are skipped on the device,
  uncounted: counting them would wait for the device);
- the largest priority (new steps enter at it) is kept on the device too, so new
  steps enter at it before the host has read it.

Reading state that needs the outcome (``priorities``, ``max_priority``,
``state_dict``, ``valid_mass``) waits for it.

An update is about 40 small kernels. Where the owner sets
:attr:`DevicePriorityUpdates.recorder` (a buffer that records its samples,
``capture_samples``), updates of one size are recorded once into a
:class:`~replaybuffer.sampling.graph_capture.Capture` (:class:`RecordedUpdate`) and run
from it: the same arithmetic (:meth:`DevicePriorityUpdates.write`) with the ring's
write head and the item ids' base read from device scalars.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import torch

from replaybuffer.sampling.graph_capture import Capture
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.torch_deferred_checks import DeviceChecks
from replaybuffer.sampling.torch_prefix_sums import TorchPrefixSums

# The summary of one update: [refused (0: no, 1: a bad value, 2: an overflowing total),
# the smallest priority ** alpha written (inf: none), the largest (0: none), the
# largest priority written (raw)].
_REFUSED, _SMALLEST, _LARGEST, _RAW = range(4)
DEFERRED = ("found on the device after that update_priorities call returned: updates "
            "with device tensors are checked without waiting for the device and "
            "reported at the next call")


def checked_on_device(chosen: bool | None, device: torch.device, search: str,
                      recorded: bool = True) -> bool:
    """Whether a device sampler checks updates given as device tensors on the device:
    ``chosen`` (``TorchPrioritizedSampler.device_updates``) where it is a bool, else
    (``None``, the default) where ``device`` is CUDA and the buffer records its updates
    (``recorded``: ``capture_samples``, on by default on CUDA). There a host check would
    make the host wait for the device's queue twice per update; an eager update checked
    on the device launches about 44 kernels, which measured slower than the host check
    on an H200 (554 against 237 us), so it is the default only where it is recorded.
    Never for the ``"tree"`` search, whose writes size their output on the host anyway
    (``torch.unique``).

    Raises:
        ValueError: ``chosen`` is not True, False or None.
    """
    if chosen is not None and not isinstance(chosen, bool):
        raise ValueError(f"device_updates must be True, False or None (on a CUDA device), "
                         f"got {chosen!r}")
    if search != "prefix":
        return False
    return (device.type == "cuda" and recorded) if chosen is None else chosen


def device_arguments(ids: Any, priorities: Any, device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(item ids int64 [S], priorities [S])`` when both are tensors on ``device`` (ids
    of windows, ``[S, T]`` or a T-tuple, give their first step's); ``None`` otherwise
    (the host path takes them).

    Raises:
        ValueError: ids that are not integers, or shapes that do not match.
    """
    if isinstance(ids, tuple) and ids and isinstance(ids[0], torch.Tensor) and \
            ids[0].ndim == 1:
        ids = ids[0]
    if not (isinstance(ids, torch.Tensor) and isinstance(priorities, torch.Tensor)) or \
            ids.device != device or priorities.device != device:
        return None
    if ids.ndim == 2:
        ids = ids[:, 0]
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"update_priorities: ids must be integers (pass BufferInfo.ids), "
                         f"got {ids.dtype}")
    if priorities.dtype.is_complex or priorities.dtype == torch.bool:
        raise ValueError(f"update_priorities: expected numbers, got {priorities.dtype}")
    if ids.ndim != 1 or tuple(priorities.shape) != tuple(ids.shape):
        raise ValueError(f"update_priorities: expected ids [S] (or [S, T]) and "
                         f"priorities [S] of the same S, got ids of shape "
                         f"{tuple(ids.shape)} and priorities of shape "
                         f"{tuple(priorities.shape)}")
    return ids, priorities


class DevicePriorityUpdates:
    """The device side of a prioritized sampler's updates over its running sums.

    Args:
        device: where the sums live.
        alpha: the prioritization exponent.
    """

    def __init__(self, device: torch.device, alpha: float):
        self.device = device
        self.alpha = float(alpha)
        self.checks = DeviceChecks(device, 4)
        # The largest priority applied on the device (raw, 0-d float64, updated in
        # place so that a recorded update can read and write it), 0 before the first;
        # new steps enter at the larger of it and the host's.
        self._largest = torch.zeros((), dtype=torch.float64, device=device)
        self._has_largest = False
        self._epoch = 0  # clears so far: outcomes of updates before one note nothing
        # Where set, updates of one batch size are recorded (after one eager call)
        # and run from the recording: see RecordedUpdate.
        self.recorder: Callable[[], Capture] | None = None
        self._recorded: dict[int, RecordedUpdate] = {}
        self._calls: dict[int, int] = {}

    @property
    def largest(self) -> torch.Tensor | None:
        """The largest priority applied on the device (0-d float64; ``None`` before
        the first update since the last clear)."""
        return self._largest if self._has_largest else None

    def scale(self, values: torch.Tensor) -> torch.Tensor:
        """``values ** alpha`` (float64), a zero staying 0 when alpha is 0."""
        if self.alpha == 0.0:
            return torch.where(values > 0, 1.0, 0.0).to(torch.float64)
        return values if self.alpha == 1.0 else values.pow(self.alpha)

    def apply(self, ring: Ring, key_base: int, sums: TorchPrefixSums, item_ids: torch.Tensor,
              priorities: torch.Tensor) -> None:
        """Write ``priorities`` at the live ones of ``item_ids`` (int64 ``[S]``,
        ``S >= 1``) unless any is bad, and queue the outcome."""
        # Copies where the dtypes leave none: the caller may reuse its tensors before
        # the outcome is read, and the message names what was given.
        item_ids = item_ids.to(torch.int64, copy=True)
        values = priorities.to(torch.float64, copy=True)
        recorded = self._recording(ring, sums, int(item_ids.shape[0]))
        if recorded is None:
            summary = self.write(ring.last_id, ring.oldest_id, key_base, ring.batch_size,
                                 ring.max_length, sums, item_ids, values)
        else:
            summary = recorded.run(ring.last_id, key_base, item_ids, values)
            sums.mark_written()
        self._has_largest = True
        self.checks.push(summary, (self._epoch, values, item_ids))

    def write(self, last_id: Any, oldest_id: Any, key_base: Any, B: int, L: int,
              sums: TorchPrefixSums, item_ids: torch.Tensor, values: torch.Tensor
              ) -> torch.Tensor:
        """The device work of an update (``last_id``, ``oldest_id``, ``key_base``: ints,
        or 0-d int64 tensors in a recording; ``B``, ``L``: the ring's layout; item ids
        int64 ``[S]`` and values float64 ``[S]``): the write, masked, and the float64
        ``[4]`` summary of its outcome."""
        ids = item_ids - key_base if B == 1 else torch.div(item_ids, B, rounding_mode="floor") \
            - key_base
        # (item_ids >= 0 follows: a negative item id floors below every held id.)
        live = (ids >= oldest_id) & (ids <= last_id)
        positions = ids % L if B == 1 else (ids % L) * B + item_ids % B
        # Comparisons, each one kernel (torch.isfinite is four): NaN fails both.
        good = ((values >= 0) & (values < torch.inf)).all()
        scaled = self.scale(values)
        kept_scaled = torch.where(live, scaled, 0.0)
        # The host path's bound: the total before plus every value written.
        finite = sums.leaves.sum() + kept_scaled.sum() < torch.inf
        keep = live & good & finite
        sums.assign(positions, scaled, keep)
        largest_raw = torch.where(keep, values, 0.0).amax()
        torch.maximum(self._largest, largest_raw, out=self._largest)
        # 0 accepted, 1 a bad value, 2 an overflowing total (as few launches as we can).
        refused = torch.where(good, torch.where(finite, 0.0, 2.0), 1.0).to(torch.float64)
        return torch.stack([refused, torch.where(keep, scaled, torch.inf).amin(),
                            self.scale(largest_raw), largest_raw])

    def _recording(self, ring: Ring, sums: TorchPrefixSums, size: int
                   ) -> RecordedUpdate | None:
        """The recording for updates of ``size`` ids, made at the second such call;
        ``None`` where this one is eager."""
        if self.recorder is None:
            return None
        recorded = self._recorded.get(size)
        if recorded is not None:
            return recorded
        calls = self._calls[size] = self._calls.get(size, 0) + 1
        if calls < 2 or len(self._recorded) >= 8:
            return None
        try:
            recorded = RecordedUpdate(self.recorder(), self, ring.batch_size,
                                      ring.max_length, sums, size)
        except RuntimeError as exc:
            self.recorder = None
            warnings.warn(f"priority updates stay eager: recording one failed ({exc})",
                          RuntimeWarning, stacklevel=5)
            return None
        self._recorded[size] = recorded
        return recorded

    def outcomes(self, wait: bool) -> tuple[list[tuple[float, float, float]], str | None]:
        """The outcomes arrived (all of them with ``wait``): ``(smallest, largest)``
        ``priority ** alpha`` and the largest priority written by each accepted update
        since the last clear, and the error message of the first refused one
        (``None``: none refused)."""
        notes: list[tuple[float, float, float]] = []
        error = None
        for summary, (epoch, values, item_ids) in self.checks.take(wait):
            if summary[_REFUSED]:
                if error is None:
                    error = _message(summary, values, item_ids)
            elif epoch == self._epoch and summary[_LARGEST] > 0:
                notes.append((float(summary[_SMALLEST]), float(summary[_LARGEST]),
                              float(summary[_RAW])))
        return notes, error

    def forget(self) -> None:
        """A clear: the device's largest priority is forgotten, and outcomes of earlier
        updates note nothing (their errors are still raised)."""
        self._has_largest = False
        self._largest.zero_()
        self._epoch += 1


class RecordedUpdate:
    """:meth:`DevicePriorityUpdates.write` for ``size`` ids recorded in ``capture``:
    its inputs (ids, values, the write head, the item ids' base) are static device
    tensors set in place per run, its summary the recording's output. Recording
    writes nothing: the ids are -1 meanwhile (no id is live), so the warm-up run a
    CUDA graph's capture makes masks every write out."""

    def __init__(self, capture: Capture, updates: DevicePriorityUpdates, batch: int,
                 length: int, sums: TorchPrefixSums, size: int):
        device = updates.device
        self.capture, self.updates, self.sums = capture, updates, sums
        self.batch, self.length = batch, length
        self.item_ids = torch.full((size,), -1, dtype=torch.int64, device=device)
        self.values = torch.zeros(size, dtype=torch.float64, device=device)
        self.last_id = torch.zeros((), dtype=torch.int64, device=device)
        self.key_base = torch.zeros((), dtype=torch.int64, device=device)
        self._key_base = 0
        self.summary = torch.zeros(4, dtype=torch.float64, device=device)
        capture.record(self._sequence, self.last_id, self.summary)

    def _sequence(self) -> None:
        oldest = torch.clamp_min(self.last_id + (1 - self.length), 0)  # ring.oldest_id
        self.summary.copy_(self.updates.write(self.last_id, oldest, self.key_base,
                                              self.batch, self.length, self.sums,
                                              self.item_ids, self.values))

    def run(self, last_id: int, key_base: int, item_ids: torch.Tensor,
            values: torch.Tensor) -> torch.Tensor:
        """One update (int64 and float64 ``[size]``): its summary, a fresh tensor."""
        if key_base != self._key_base:
            self.key_base.fill_(key_base)
            self._key_base = key_base
        self.item_ids.copy_(item_ids)
        self.values.copy_(values)
        return self.capture.run(last_id)


def _message(summary: np.ndarray, values: torch.Tensor, item_ids: torch.Tensor) -> str:
    """The host path's error for a refused update (read back now: an error path)."""
    if summary[_REFUSED] == 2:
        return ("update_priorities: expected a finite total priority, got inf with these "
                f"values (float64 overflow); nothing was updated ({DEFERRED})")
    host = values.cpu().numpy()
    bad = ~np.isfinite(host) | (host < 0)
    i = int(np.flatnonzero(bad)[0])
    return (f"update_priorities: priorities must be finite and >= 0; priorities[{i}] is "
            f"{float(host[i])} (for id {int(item_ids[i])}); {int(bad.sum())} bad "
            f"value(s), nothing was updated ({DEFERRED})")
