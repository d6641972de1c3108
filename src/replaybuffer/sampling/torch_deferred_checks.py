"""Small summaries computed on the device and read on the host only once they are there.

A priority update drawn on a GPU (:meth:`~replaybuffer.sampling.torch_prioritized.
TorchPrioritizedSampler.update_on_device`) checks its values there: whether any is NaN,
infinite or negative, and the smallest and largest it wrote. Reading those flags at
once would make the host wait for the device's whole queue (a synchronization, tens to
hundreds of microseconds behind a training step's kernels). Instead each summary is
copied into a slot of pinned host memory without waiting, with an event recorded
behind the copy; the owner asks for the summaries that have arrived at its next call
(``event.query()``, which never blocks) and acts on them then.

On the CPU there is nothing to wait for: a summary is ready when it is pushed, and
the owner reads it at its next call just the same, so the deferral (and the tests
of it) behave as on a GPU.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

# Summaries in flight at most (bounded pinned memory): an owner with every slot in use
# waits for the oldest before it pushes; a device this far behind is waited for anyway.
SLOTS = 16


class DeviceChecks:
    """A queue of float64 ``[width]`` summaries made on ``device``, each with a payload
    (what the owner needs to act on it: tensors kept for an error message, say).

    Args:
        device: where the summaries are computed.
        width: the length of every summary.
    """

    def __init__(self, device: torch.device, width: int):
        self.device = device
        self.width = int(width)
        self._cuda = device.type == "cuda"
        # Pinned memory is copied into without the host waiting (pageable memory is
        # not); it is allocated once, as its allocation itself synchronizes.
        self._host = torch.empty((SLOTS, self.width), dtype=torch.float64,
                                 pin_memory=self._cuda)
        self._events: list[Any] = [torch.cuda.Event() for _ in range(SLOTS)] \
            if self._cuda else []
        self._queue: deque[tuple[int, Any]] = deque()
        self._next = 0  # the slot the next push writes

    def __len__(self) -> int:
        """Summaries pushed and not yet taken."""
        return len(self._queue)

    @property
    def full(self) -> bool:
        """Whether every slot holds a summary not yet taken (take some before a push)."""
        return len(self._queue) == SLOTS

    def push(self, summary: torch.Tensor, payload: Any) -> None:
        """Queue ``summary`` (float64 ``[width]`` on the device) with ``payload``,
        without waiting for the device. The queue must not be :attr:`full`."""
        if self.full:
            raise RuntimeError("DeviceChecks.push: every slot is in use; take() first")
        slot = self._next
        self._next = (slot + 1) % SLOTS
        self._host[slot].copy_(summary, non_blocking=self._cuda)
        if self._cuda:
            self._events[slot].record(torch.cuda.current_stream(self.device))
        self._queue.append((slot, payload))

    def take(self, wait: bool = False) -> list[tuple[np.ndarray, Any]]:
        """The summaries that have arrived, oldest first, as float64 ``[width]`` numpy
        copies with their payloads; with ``wait``, every queued one (waiting for the
        device as needed). Those returned leave the queue."""
        out: list[tuple[np.ndarray, Any]] = []
        while self._queue:
            slot, payload = self._queue[0]
            if self._cuda:
                event = self._events[slot]
                if not event.query():
                    if not wait:
                        break
                    event.synchronize()
            self._queue.popleft()
            out.append((self._host[slot].numpy().copy(), payload))
        return out

    def clear(self) -> None:
        """Forget every queued summary (their payloads are dropped unread)."""
        self._queue.clear()
