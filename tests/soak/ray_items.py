"""What the soak's Ray faults write: numbered steps (writer ``w``, step ``t``, a payload
``t + w / 8`` that shows a torn item) and the shards' buffer (room for every step a
buffer's faults write: nothing is evicted)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

PAYLOAD = 16
STEPS = 240
"""Steps each collector writes in a fault (then one more after it)."""
SHARDS = 2
RAW = 10
"""A fault's raw writer's number past its collectors' (shard ``s``: ``RAW + s``)."""


def spec() -> dict[str, Any]:
    from replaybuffer.specs import ArraySpec
    return {"w": ArraySpec((), np.int64), "t": ArraySpec((), np.int64),
            "payload": ArraySpec((PAYLOAD,), np.float32)}


def items(w: int, t: np.ndarray) -> dict[str, np.ndarray]:
    """Steps ``t`` (int64 ``[T]``) of writer ``w`` as one row's ``extend`` items
    (leaves ``[1, T, ...]``)."""
    t = np.asarray(t, np.int64)
    payload = t.astype(np.float32) + np.float32(w / 8)
    return {"w": np.full((1, len(t)), w, np.int64), "t": t[None],
            "payload": np.repeat(payload[None, :, None], PAYLOAD, 2)}


def shard_buffer() -> Any:
    """A shard's buffer: one row, room for every step a buffer's faults write (nothing
    evicted), a rate limiter whose counters a restart restores."""
    import replaybuffer as rb
    buffer = rb.UniformReplayBuffer(spec(), 1, 16 * STEPS, seed=0)
    buffer.rate_limiter = rb.MinSize(1)
    return buffer


def worker_path() -> str:
    """The shards' ``PYTHONPATH``: the tests folder (this module's factory) and the
    caller's path, absolute (a worker's directory is not the caller's)."""
    here = Path(__file__).resolve().parent.parent
    parts = [str(here)] + [str(Path(p).resolve()) for p in
                           os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(parts)


