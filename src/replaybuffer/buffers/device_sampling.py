"""Whether a buffer draws its samples on the torch storage's device.

Drawing on the device (:mod:`replaybuffer.sampling.torch_uniform`,
:mod:`replaybuffer.sampling.torch_prioritized`) keeps indices, probabilities and
weights on the GPU the data lives on, so a sample has no host round trip. It is the
default for torch storage on a device other than the CPU; on the CPU the host
samplers are faster (numpy), and device sampling is there to be asked for (tests).
"""

from __future__ import annotations

from typing import Any


def samples_on_device(storage: str, device: Any, sample_on_device: bool | None,
                      track_episodes: bool) -> bool:
    """The buffer's choice: ``sample_on_device`` if given (checked), else whether
    ``storage`` is torch on a non-CPU ``device`` (and no episodes are tracked: the
    episode index lives on the host).

    Raises:
        ValueError: ``sample_on_device=True`` without torch storage, or with
            ``track_episodes``.
    """
    if sample_on_device is not None and not isinstance(sample_on_device, bool):
        raise ValueError(f"sample_on_device must be True, False or None, got "
                         f"{sample_on_device!r}")
    if sample_on_device is False:
        return False
    if storage != "torch":
        if sample_on_device:
            raise ValueError(f"sample_on_device=True needs storage='torch', got {storage!r}")
        return False
    if track_episodes:
        if sample_on_device:
            raise ValueError("sample_on_device=True cannot track episodes (the episode "
                             "index lives on the host): pass track_episodes=False")
        return False
    if sample_on_device:
        return True
    import torch

    return torch.device(device if device is not None else "cpu").type != "cpu"
