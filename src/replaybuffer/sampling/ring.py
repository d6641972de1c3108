"""Ring bookkeeping: which logical steps a ``batch_size x max_length`` buffer holds.

The layout is TF-Agents': ``batch_size`` rows, each a ring of ``max_length``
slots. Every ``add_batch`` writes one step to every row at the same logical
*id*; ids count adds from 0 and are shared by all rows. ``last_id`` is the id
of the newest step (-1 when empty). Step ``id`` of row ``b`` lives in slot
``id % max_length``.

Storage is laid out slot-major, so one add writes ``batch_size`` consecutive
positions: ``position = (id % max_length) * batch_size + row``.

Everything here is pure integer arithmetic on numpy arrays or Python ints.
"""

from __future__ import annotations

import functools
from typing import Any, Union, overload

import numpy as np

_Scalar = Union[int, np.integer[Any]]


def items_per_row(last_id: int, max_length: int) -> int:
    """How many steps each row holds: ``min(last_id + 1, max_length)``."""
    return min(last_id + 1, max_length)


def oldest_id(last_id: int, max_length: int) -> int:
    """The id of the oldest retained step (0 until the ring wraps)."""
    return max(0, last_id + 1 - max_length)


def valid_start_range(last_id: int, max_length: int, num_steps: int) -> tuple[int, int]:
    """Half-open range ``[lo, hi)`` of start ids of ``num_steps`` windows.

    A window ``[start, start + num_steps)`` lies wholly inside the retained steps,
    so it never crosses the write head and never holds overwritten data. It may
    wrap physically from slot ``max_length - 1`` to slot 0: ids stay contiguous.
    ``hi <= lo`` means there is no valid window.
    """
    lo = oldest_id(last_id, max_length)
    return lo, max(lo, last_id + 2 - num_steps)


def positions(ids: np.ndarray, rows: np.ndarray | _Scalar, max_length: int,
              batch_size: int) -> np.ndarray:
    """Storage positions of (id, row) pairs; ``ids`` and ``rows`` broadcast."""
    return (ids % max_length) * batch_size + rows


@functools.lru_cache(maxsize=64)
def _device_offsets(device: Any, num_steps: int, step: int) -> Any:
    """``[0, step, ..., (num_steps - 1) * step]`` as an int64 tensor on ``device``, made
    there once (never written): a tensor built on the host each call would be copied
    from pageable memory, which waits for every kernel queued before it."""
    import torch

    return torch.arange(0, num_steps * step, step, device=device)


@functools.lru_cache(maxsize=64)
def _window_offsets(count: int, num_steps: int, step: int) -> np.ndarray:
    """``[0, step, ..., (num_steps - 1) * step]`` tiled ``count`` times (read-only)."""
    offsets = np.tile(np.arange(0, num_steps * step, step, dtype=np.int64), count)
    offsets.flags.writeable = False
    return offsets


def windows(starts: np.ndarray, num_steps: int, step: int = 1) -> np.ndarray:
    """``starts[:, None] + step * arange(num_steps)``: int64 ``[S, num_steps]``.

    Built as a repeat plus a cached tile of offsets: numpy broadcasts ``[S, 1] + [T]``
    with an inner loop of length ``T``, which costs 2.5x more for short windows.
    """
    if not isinstance(starts, np.ndarray):  # a tensor drawn on a device: stays there
        return starts[:, None] + _device_offsets(starts.device, num_steps, step)
    out = starts.astype(np.int64, copy=False).repeat(num_steps)
    out += _window_offsets(len(starts), num_steps, step)
    return out.reshape(len(starts), num_steps)


def window_positions(start_positions: np.ndarray, num_steps: int, max_length: int,
                     batch_size: int) -> np.ndarray:
    """Positions ``[S, num_steps]`` of windows starting at ``start_positions`` ``[S]``.

    Step ``k`` of a window is ``k`` slots later in the same row: ``k * batch_size``
    positions later, wrapping at the capacity.
    """
    return windows(start_positions, num_steps, batch_size) % (max_length * batch_size)


def table_rows(ids: np.ndarray, rows: np.ndarray | _Scalar, max_length: int) -> np.ndarray:
    """TF-Agents' physical row index ``row * max_length + id % max_length``.

    This is what TF-Agents reports as ``BufferInfo.ids`` in a deterministic pass.
    """
    return rows * max_length + ids % max_length


class Ring:
    """The mutable ring state of one buffer: shape and ``last_id``.

    Args:
        batch_size: number of rows (parallel environments), >= 1.
        max_length: slots per row, >= 1.
    """

    __slots__ = ("batch_size", "max_length", "last_id", "capacity")

    def __init__(self, batch_size: int, max_length: int):
        for name, value in (("batch_size", batch_size), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.last_id = -1
        # An attribute, not a property: len(buffer) == buffer.capacity guards many a
        # per-step add.
        self.capacity = self.batch_size * self.max_length
        """Positions in storage: ``batch_size * max_length``."""

    @property
    def items_per_row(self) -> int:
        return items_per_row(self.last_id, self.max_length)

    @property
    def num_frames(self) -> int:
        """Steps held across all rows: ``min((last_id + 1) * B, B * L)``."""
        return items_per_row(self.last_id, self.max_length) * self.batch_size

    @property
    def oldest_id(self) -> int:
        return oldest_id(self.last_id, self.max_length)

    def valid_start_range(self, num_steps: int) -> tuple[int, int]:
        return valid_start_range(self.last_id, self.max_length, num_steps)

    @overload
    def positions(self, ids: np.ndarray, rows: np.ndarray | _Scalar) -> np.ndarray: ...

    @overload
    def positions(self, ids: _Scalar, rows: np.ndarray) -> np.ndarray: ...

    def positions(self, ids: Any, rows: Any) -> np.ndarray:
        """Storage positions of (id, row) pairs; ``ids`` and ``rows`` broadcast."""
        return positions(ids, rows, self.max_length, self.batch_size)
