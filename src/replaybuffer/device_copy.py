"""Host data onto a torch device without waiting for the device's queue.

On a CUDA device, a copy from ordinary (pageable) host memory is synchronous: it waits
for every kernel queued before it, so the host stops running ahead of the GPU and each
add or sample pays the GPU's whole queue as latency. :func:`to_device` stages the data
in page-locked memory from torch's caching host allocator and copies it asynchronously
on the current stream; the allocator keeps that block until the copy has run, so the
caller may reuse its array at once.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(data: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """``data`` (a numpy array or a CPU tensor, any shape and dtype) as a tensor on
    ``device``. On the CPU it is ``torch.from_numpy(data)`` (sharing the array's memory)
    or the tensor itself; on a CUDA device a new tensor, copied asynchronously."""
    tensor = torch.from_numpy(data) if isinstance(data, np.ndarray) else data
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    # pin_memory() returns memory that is pinned already as it is: the asynchronous
    # copy would then read the caller's own memory after it returns. Stage a copy.
    staged = torch.empty_like(tensor, pin_memory=True).copy_(tensor) \
        if tensor.is_pinned() else tensor.pin_memory()
    return staged.to(device, non_blocking=True)
