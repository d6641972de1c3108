"""A check both recorded-draw test files run on a CUDA graph
(``tests/test_captured_draws.py``, ``tests/test_captured_prioritized.py``)."""

from __future__ import annotations

from typing import Any, Callable

import torch


def assert_batches_survive_replays_and_restore(buffer: Any,
                                               flat: Callable[[Any], list]) -> None:
    """Batches handed out are never overwritten by later replays, and a restore of the
    state dict draws them again bit for bit (``flat``: every tensor of a batch)."""
    buffer.get_next(256, 2)
    state = buffer.state_dict()
    held = [buffer.get_next(256, 2) for _ in range(5)]
    copies = [[t.clone() for t in flat(x)] for x in held]
    for _ in range(20):
        buffer.get_next(256, 2)
    for x, saved in zip(held, copies):
        for t, s in zip(flat(x), saved):
            assert torch.equal(t, s)
    buffer.load_state_dict(state)
    for x in copies:
        for t, s in zip(flat(buffer.get_next(256, 2)), x):
            assert torch.equal(t, s)
