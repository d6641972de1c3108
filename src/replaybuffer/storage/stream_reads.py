"""Reads of device memory issued on CUDA streams, which a later write into that memory
must wait for.

A gather (or a recorded graph of gathers) runs on whatever stream is current; a write
into the same tensors from another stream could overtake it on the device. The torch
storage and a transition buffer's device mirror therefore mark the reads issued since
their last write (:meth:`PendingReads.mark`, an event recorded per stream, reused: it
costs less than making one) and have the writing stream wait for them on the device
before they write (:meth:`PendingReads.wait`), never the host.
"""

from __future__ import annotations

from typing import Any

import torch


class PendingReads:
    """The reads of one device's tensors issued on CUDA streams since the last write.

    Args:
        device: the CUDA ``torch.device`` the tensors live on.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._events: dict[Any, Any] = {}  # stream -> its latest read's event
        self._pending: set[Any] = set()  # streams read on since the last wait()

    def mark(self) -> None:
        """Record the reads issued so far on the current stream."""
        stream = torch.cuda.current_stream(self.device)
        event = self._events.get(stream)
        if event is None:
            event = self._events[stream] = torch.cuda.Event()
        event.record(stream)
        self._pending.add(stream)

    def wait(self) -> None:
        """Make the current stream wait (on the device) for the reads marked on other
        streams since the last call; those on the current stream are ordered already."""
        if not self._pending:
            return
        stream = torch.cuda.current_stream(self.device)
        for other in self._pending:
            if other != stream:
                stream.wait_event(self._events[other])
        self._pending.clear()
