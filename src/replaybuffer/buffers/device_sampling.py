"""Whether a buffer draws its samples on the torch storage's device.

Drawing on the device (:mod:`replaybuffer.sampling.torch_uniform`,
:mod:`replaybuffer.sampling.torch_prioritized`) keeps indices, probabilities and
weights on the GPU the data lives on, so a sample has no host round trip. It is the
default for torch storage on a device other than the CPU; on the CPU the host
samplers are faster (numpy), and device sampling is there to be asked for (tests).
"""

from __future__ import annotations

from typing import Any

ON_DEVICE_ONLY = ("sample_on_device", "device_search", "capture_samples")
"""Constructor keywords that only apply to a buffer on torch storage: a checkpoint
keeps them, and a restore into other storage drops them (it samples on the host)."""


def device_choices(sample_on_device: bool | None, on_device: bool,
                   capture_samples: bool | None = None,
                   device_search: str | None = None) -> dict[str, Any]:
    """The device keywords a buffer was given, for its checkpoint's config: only those
    not left to their default (``None``), so that a buffer built without them saves
    what it saved before they were kept, and an older checkpoint loads as such.

    ``on_device`` is the buffer's resolved choice (:func:`samples_on_device`). Where
    ``capture_samples`` or ``device_search`` is given but ``sample_on_device`` was left
    to the device's default (on a GPU: on), that choice is saved too: those keywords
    need it, and a load onto another device (``rb.load(path, device="cpu")``) would
    otherwise resolve the default there (off) and refuse them."""
    if sample_on_device is None and on_device and \
            (capture_samples is not None or device_search is not None):
        sample_on_device = True
    given = {"sample_on_device": sample_on_device, "capture_samples": capture_samples,
             "device_search": device_search}
    return {key: value for key, value in given.items() if value is not None}


def for_storage(config: dict[str, Any], storage: str, device: Any = None) -> dict[str, Any]:
    """``config`` (constructor keywords from a checkpoint) for a buffer rebuilt on
    ``storage`` and ``device``: the :data:`ON_DEVICE_ONLY` keywords dropped unless it is
    torch, and ``capture_samples`` dropped where that torch storage cannot record draws
    (the CPU with the storage's CPU layout of numpy records: a checkpoint of a CUDA
    buffer loaded with ``device="cpu"``), so that such a load samples eagerly rather
    than refusing the recordings it was saved with."""
    if storage != "torch":
        return {key: value for key, value in config.items() if key not in ON_DEVICE_ONLY}
    if config.get("capture_samples") and not _records_draws(device):
        return {key: value for key, value in config.items() if key != "capture_samples"}
    return config


def _records_draws(device: Any) -> bool:
    """Whether torch storage on ``device`` can serve recorded draws: they gather its
    packed blocks, which it keeps on every device but the CPU, where it keeps numpy
    records unless ``TorchStorage.numpy_views`` is switched off (tests)."""
    if _device_type(device) != "cpu":
        return True
    from replaybuffer.storage.torch_storage import TorchStorage

    return not TorchStorage.numpy_views


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


def captures_samples(capture_samples: bool | None, on_device: bool, device: Any) -> bool:
    """Whether a uniform or prioritized buffer serves ``get_next`` from recorded draws
    (:mod:`replaybuffer.buffers.captured_reads`): only where ``capture_samples`` is
    ``True`` (checked); ``None`` and ``False`` keep every draw eager. ``True`` on the
    CPU records the graph's CPU twin (the same static buffers and copies, for tests).
    Recording is asked for, not the default on CUDA, until its CUDA tests have run on a
    device (``benchmarks/gpu_check.sh``).

    Raises:
        ValueError: ``capture_samples`` is not a bool or None; or ``True`` where the
            buffer does not sample on the device, or on a device other than CUDA or
            the CPU.
    """
    if capture_samples is not None and not isinstance(capture_samples, bool):
        raise ValueError(f"capture_samples must be True, False or None, got "
                         f"{capture_samples!r}")
    if not capture_samples:
        return False
    if not on_device:
        raise ValueError("capture_samples=True records the draws made on the device: it "
                         "needs storage='torch' with sample_on_device (not False) and "
                         "no track_episodes")
    kind = _device_type(device)
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"capture_samples=True records CUDA graphs (or their CPU twin), "
                         f"not work on a {kind!r} device")
    return True


def _device_type(device: Any) -> str:
    import torch

    return torch.device(device if device is not None else "cpu").type


# Where "auto" turns from running sums to the sum tree. The running sums cost O(capacity)
# bytes per write (a cumsum), the tree a few launches per level: on an H100 (bench --gpu
# --scale) an update and a batch of 256 took 0.73-1.29 ms with the running sums against
# 10.4-15.5 ms with the tree from 2**17 to 2**26 slots; the sums' bytes would match the
# tree's launches only near 2**30 slots (sampling/torch_prioritized.py).
AUTO_TREE_FROM = 1 << 30
SEARCHES = ("prefix", "tree", "auto")


def device_search_for(device_search: str | None, capacity: int, on_device: bool) -> str:
    """The prioritized device search a buffer uses: ``device_search`` (``"prefix"``,
    ``"tree"``, or ``"auto"``/``None``: ``"prefix"`` below :data:`AUTO_TREE_FROM`
    slots, ``"tree"`` from there).

    Raises:
        ValueError: another value, or one other than ``None``/``"auto"`` given to a
            buffer that samples on the host (``on_device`` false).
    """
    if device_search is not None and device_search not in SEARCHES:
        raise ValueError(f"device_search must be 'auto' (or None: by capacity) or a "
                         f"search, and a search must be 'prefix' or 'tree', got "
                         f"{device_search!r}")
    if not on_device:
        if device_search not in (None, "auto"):
            raise ValueError(f"device_search={device_search!r} applies to sampling on the "
                             "device only (sample_on_device=True, or torch storage on a "
                             "GPU)")
        return "auto"
    if device_search in (None, "auto"):
        return "prefix" if capacity < AUTO_TREE_FROM else "tree"
    return device_search


def device_prioritized_sampler(capacity: int, alpha: float, beta: float, *,
                               device: Any, search: str | None, **kwargs: Any) -> Any:
    """A :class:`~replaybuffer.sampling.torch_prioritized.TorchPrioritizedSampler` on
    ``device`` with the search :func:`device_search_for` picks (``kwargs``: the
    sampler's schedule and normalization)."""
    from replaybuffer.sampling.torch_prioritized import TorchPrioritizedSampler

    return TorchPrioritizedSampler(capacity, alpha, beta, device=device,
                                   search=device_search_for(search, capacity, True),
                                   **kwargs)
