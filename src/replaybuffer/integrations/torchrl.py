"""TorchRL interop: one of our buffers behind the ``TensorDict`` interface TorchRL's
collectors, loss modules and training loops use.

    from replaybuffer.integrations.torchrl import TensorDictReplayBuffer

    buffer = TensorDictReplayBuffer(capacity=100_000, batch_size=256, prioritized=True)
    collector = SyncDataCollector(env, policy, frames_per_batch=200, total_frames=-1,
                                  replay_buffer=buffer)       # the collector extends it
    for _ in collector:                                      # yields None with a buffer
        sample = buffer.sample()                             # TensorDict [256]
        loss = loss_module(sample)                           # reads "priority_weight"
        ...
        buffer.update_tensordict_priority(sample)            # reads "td_error", "index"

What maps to what:

==============================  ==================================================
TorchRL                         here
==============================  ==================================================
``ReplayBuffer(storage=
LazyTensorStorage(N))``         ``TensorDictReplayBuffer(capacity=N)``
``TensorDictPrioritized
ReplayBuffer(alpha, beta)``     ``TensorDictReplayBuffer(N, prioritized=True,
                                alpha=..., beta=...)``
``extend(td)`` / ``add(td)``    the same; returns the new items' ``index``
``sample(batch_size)``          the same; adds ``"index"`` (and
                                ``"priority_weight"`` when prioritized)
``update_tensordict_priority``  the same (``priority_key``, default ``"td_error"``;
                                trailing dims reduced by max)
``update_priority(index, p)``   the same; indices of overwritten items are ignored
``len``, ``write_count``,       the same
``empty()``, ``__iter__``
``dumps(path)`` / ``loads``     a crash-safe checkpoint series (no pickle)
==============================  ==================================================

The layout is TorchRL's: the first ``ndim`` batch dimensions of what is extended are
items (``ndim=1``: a ``[T]`` batch is T items; ``ndim=2``: ``[n_envs, T]`` is
``n_envs * T`` items in time order per env), the rest of each leaf is the item's
shape. The item spec (keys, shapes, dtypes) is taken from the first ``extend``;
every later one must match it, and a mismatch raises :class:`~replaybuffer.SpecError`
naming the key, what was expected and what came, with nothing written. Storage is
our torch storage on ``device`` (default: the first batch's device), so sampling
never leaves it. Transforms, writers and samplers of TorchRL's are not taken: sample
first, then apply a transform to the sampled ``TensorDict``.

Needs ``tensordict`` (installed with TorchRL); TorchRL itself is not imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from replaybuffer.buffers import PrioritizedReplayBuffer, ReplayBuffer, UniformReplayBuffer
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.persist import load
from replaybuffer.specs import spec_from_example

__all__ = ["TensorDictReplayBuffer"]

#: Keys a sample carries besides the stored ones; extending with them is refused
#: (a sample fed back would otherwise store its own index).
INFO_KEYS = ("index", "priority_weight")


class TensorDictReplayBuffer:
    """A replay buffer of ``TensorDict`` items, on our uniform or prioritized buffer.

    Args:
        capacity: items kept; the oldest is overwritten once full.
        batch_size: default ``sample`` size (``sample(n)`` overrides it).
        prioritized: proportional prioritized replay (new items at the highest
            priority seen); samples carry float32 ``"priority_weight"`` ``[S]``.
        alpha, beta: prioritization exponent and importance-weight exponent.
        priority_key: the key ``update_tensordict_priority`` reads.
        ndim: how many leading batch dimensions of an extended ``TensorDict`` are items.
        device: where items are stored and samples returned (default: the device of
            the first extended batch, else CPU).
        seed: seeds the sampler; a buffer restored with :meth:`loads` goes on with the
            same draws.
    """

    def __init__(self, capacity: int, *, batch_size: int | None = None,
                 prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
                 priority_key: str = "td_error", ndim: int = 1, device: Any = None,
                 seed: int | None = None):
        if int(capacity) < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if batch_size is not None and int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        if ndim < 1:
            raise ValueError(f"ndim must be >= 1, got {ndim!r}")
        self._capacity = int(capacity)
        self._batch_size = batch_size
        self._prioritized = prioritized
        self._alpha, self._beta = alpha, beta
        self.priority_key = priority_key
        self._ndim = ndim
        self._device = None if device is None else torch.device(device)
        self._seed = seed
        self._buffer: ReplayBuffer | None = None  # built from the first batch's spec
        self._items: dict[Any, tuple[tuple[int, ...], torch.dtype]] = {}
        self._writes = 0

    # ------------------------------------------------------------------ writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Append the items of ``data`` (batch shape ``[*items, ...]`` with ``ndim``
        item dimensions); return their int64 ``index`` ``[N]``."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"extend takes a TensorDict, got {type(data).__name__}")
        if data.batch_dims < self._ndim:
            raise SpecError(f"extend: a TensorDict with at least ndim={self._ndim} batch "
                            f"dimension(s) was expected, got batch_size "
                            f"{tuple(data.batch_size)}")
        for key in INFO_KEYS:
            if key in data.keys():
                raise SpecError(f"extend: key {key!r} is what sample() adds; drop it "
                                f"(data.exclude({key!r})) before extending")
        items = data.reshape(-1) if self._ndim > 1 else data
        count = items.batch_size[0]
        if count == 0:
            return torch.empty(0, dtype=torch.int64)
        leaves = items.to_dict()  # nested dict of tensors, [N, *item shape]
        if self._buffer is None:
            buffer = self._build(leaves, items)
        else:
            buffer = self._buffer
            self._check(items)
        # One row of ``capacity`` slots: extend appends N consecutive steps to it.
        buffer.extend(_map(lambda x: x.unsqueeze(0), leaves))
        self._writes += count
        last = buffer.last_id
        return torch.arange(last - count + 1, last + 1, dtype=torch.int64)

    def add(self, data: TensorDictBase) -> int:
        """Append one item (a ``TensorDict`` with batch dims beyond the item's
        removed); return its index."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"add takes a TensorDict, got {type(data).__name__}")
        for _ in range(self._ndim):
            data = data.unsqueeze(0)
        return int(self.extend(data)[0])

    def _build(self, leaves: dict[str, Any], items: TensorDictBase) -> ReplayBuffer:
        """The buffer for the item spec of the first batch."""
        for key, value in items.items(include_nested=True, leaves_only=True):
            if not isinstance(value, torch.Tensor):
                raise SpecError(f"extend: key {key!r} holds {type(value).__name__}; only "
                                f"tensors can be stored")
        spec = spec_from_example(_map(lambda x: x[0], leaves))
        self._items = {key: (tuple(value.shape[1:]), value.dtype) for key, value
                       in items.items(include_nested=True, leaves_only=True)}
        if self._device is None:
            self._device = items.device if items.device is not None else torch.device("cpu")
        if self._prioritized:
            self._buffer = PrioritizedReplayBuffer(
                spec, 1, self._capacity, alpha=self._alpha, beta=self._beta,
                storage="torch", device=self._device, seed=self._seed)
        else:
            self._buffer = UniformReplayBuffer(spec, 1, self._capacity, storage="torch",
                                               device=self._device, seed=self._seed)
        return self._buffer

    def _check(self, items: TensorDictBase) -> None:
        """Raise :class:`SpecError` unless ``items`` has the first batch's keys, item
        shapes and dtypes (before anything is written)."""
        got = {key: value for key, value
               in items.items(include_nested=True, leaves_only=True)}
        if got.keys() != self._items.keys():
            missing = sorted(map(str, self._items.keys() - got.keys()))
            extra = sorted(map(str, got.keys() - self._items.keys()))
            raise SpecError(f"extend: the keys differ from the first batch's: missing "
                            f"{missing}, unexpected {extra}")
        for key, (shape, dtype) in self._items.items():
            value = got[key]
            if not isinstance(value, torch.Tensor) or tuple(value.shape[1:]) != shape \
                    or value.dtype != dtype:
                came = (f"{type(value).__name__}" if not isinstance(value, torch.Tensor)
                        else f"{tuple(value.shape[1:])} {value.dtype}")
                raise SpecError(f"extend: key {key!r}: expected items of shape {shape} "
                                f"{dtype}, got {came}")

    # ------------------------------------------------------------------ reading
    def sample(self, batch_size: int | None = None, return_info: bool = False
               ) -> TensorDictBase | tuple[TensorDictBase, dict[str, torch.Tensor]]:
        """Draw ``batch_size`` items with replacement: a ``TensorDict`` ``[S]`` with the
        stored keys, int64 ``"index"`` ``[S]`` and, when prioritized, float32
        ``"priority_weight"`` ``[S]``. ``return_info=True`` also returns those two
        as a dict, as TorchRL does.

        Raises:
            EmptyBufferError: nothing was added yet.
            ValueError: neither ``batch_size`` nor the constructor's was given.
        """
        size = batch_size if batch_size is not None else self._batch_size
        if size is None:
            raise ValueError("sample: pass batch_size, or give one to the constructor")
        if self._buffer is None:
            raise EmptyBufferError("sample: the buffer is empty (nothing was extended yet)")
        items, info = self._buffer.get_next(sample_batch_size=int(size))
        out = TensorDict(items, batch_size=[int(size)], device=self._device)
        extra = {"index": info.ids}
        if info.weights is not None:
            extra["priority_weight"] = info.weights
        for key, value in extra.items():
            out.set(key, value)
        return (out, extra) if return_info else out

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Samples of the constructor's ``batch_size``, without end."""
        if self._batch_size is None:
            raise ValueError("iterating needs the constructor's batch_size")
        while True:
            yield self.sample()

    # --------------------------------------------------------------- priorities
    def update_priority(self, index: Any, priority: Any) -> int:
        """Set the priorities of items by ``index`` (as ``sample`` returned it).

        ``priority``: one value per index, or a scalar for all. Indices of items
        overwritten since they were sampled are ignored; returns how many were set.

        Raises:
            ValueError: the buffer is not prioritized, or a priority is NaN, negative or
                infinite (nothing is set then).
        """
        if not self._prioritized:
            raise ValueError("update_priority: this buffer was built with "
                             "prioritized=False")
        if self._buffer is None:
            raise EmptyBufferError("update_priority: the buffer is empty")
        ids = _to_numpy(index).astype(np.int64, copy=False).reshape(-1)
        values = np.broadcast_to(_to_numpy(priority).astype(np.float64), ids.shape)
        assert isinstance(self._buffer, PrioritizedReplayBuffer)
        return self._buffer.update_priorities(ids, values)

    def update_tensordict_priority(self, data: TensorDictBase) -> int:
        """Update priorities from a sample that a loss module annotated: its
        ``"index"`` ``[S]`` and ``priority_key`` ``[S, ...]`` (trailing dims reduced by
        max, as TorchRL does)."""
        for key in ("index", self.priority_key):
            if key not in data.keys():
                raise KeyError(f"update_tensordict_priority: the TensorDict has no "
                               f"{key!r} key (keys: {sorted(map(str, data.keys()))})")
        priority = data.get(self.priority_key).detach()
        if priority.ndim > 1:
            priority = priority.flatten(1).amax(1)
        return self.update_priority(data.get("index"), priority)

    # ----------------------------------------------------------------- the rest
    def __len__(self) -> int:
        return 0 if self._buffer is None else len(self._buffer)

    @property
    def write_count(self) -> int:
        """Items extended so far, overwritten ones included (collectors read it)."""
        return self._writes

    @property
    def buffer(self) -> ReplayBuffer | None:
        """Our buffer underneath (``None`` until the first ``extend``)."""
        return self._buffer

    def empty(self) -> None:
        """Drop every item (the item spec is kept)."""
        if self._buffer is not None:
            self._buffer.clear()
        self._writes = 0

    def dumps(self, path: str | os.PathLike[str]) -> Path:
        """Checkpoint under ``path`` (our checkpoint series: CRC-checked, no pickle)."""
        if self._buffer is None:
            raise EmptyBufferError("dumps: nothing to save (nothing was extended yet)")
        return self._buffer.save(path, metadata={"write_count": self._writes})

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Replace the contents with the newest checkpoint under ``path``."""
        from replaybuffer.persist import read_manifest

        expected = PrioritizedReplayBuffer if self._prioritized else UniformReplayBuffer
        restored = load(path, storage="torch", device=self._device or "cpu",
                        buffer_class=expected)
        meta = read_manifest(path).get("metadata") or {}
        self._buffer, self._writes = restored, int(meta.get("write_count", len(restored)))
        self._device = torch.device(restored.device)

    def __repr__(self) -> str:
        kind = "prioritized" if self._prioritized else "uniform"
        return (f"TensorDictReplayBuffer({kind}, {len(self)}/{self._capacity} items, "
                f"device={self._device})")


def _map(fn: Any, tree: dict[str, Any]) -> dict[str, Any]:
    """``fn`` applied to every tensor of a nested dict (the shape ``to_dict`` gives)."""
    return {k: _map(fn, v) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)
