"""Reproducers for the review of round 36 (``git diff 324fdec 108b677``): each test
failed on 108b677 and names the defect it pins."""

from __future__ import annotations

import numpy as np
import pytest

from replaybuffer import PrioritizedReplayBuffer


def filled_prioritized(storage: str = "numpy") -> PrioritizedReplayBuffer:
    buffer = PrioritizedReplayBuffer({"x": np.int64(0)}, 1, 10, storage=storage, seed=0)
    for i in range(6):
        buffer.add_batch({"x": np.array([i])})
    buffer.update_priorities(np.arange(6), np.arange(1.0, 7.0))
    return buffer


def held_priorities(buffer: PrioritizedReplayBuffer) -> tuple[bytes, float]:
    return np.asarray(buffer.priorities(np.arange(6))).tobytes(), buffer.max_priority


@pytest.mark.parametrize("ids", [np.array([True, False]), [True, False]])
def test_boolean_ids_are_refused_and_change_nothing(ids):
    """Found: the round made the sampler refuse non-integer ids (``int64_item_ids``:
    bool included) and the device path refuses ``torch.bool`` ids, but the buffers'
    host path (``checked_priorities``, shared by the local, shared and Ray buffers)
    converted booleans to 0 and 1 and updated items 0 and 1 without a word (a mask
    passed as ids)."""
    buffer = filled_prioritized()
    before = held_priorities(buffer)
    with pytest.raises(ValueError, match=r"ids must be integers \(pass BufferInfo.ids\), "
                                         r"got bool"):
        buffer.update_priorities(ids, np.array([50.0, 70.0]))
    assert held_priorities(buffer) == before
    with pytest.raises(ValueError, match="ids must be integers.*got bool"):
        buffer.priorities(ids)


def test_boolean_tensor_ids_on_the_host_are_refused_as_on_the_device():
    torch = pytest.importorskip("torch")
    buffer = filled_prioritized("torch")
    before = held_priorities(buffer)
    with pytest.raises(ValueError, match="ids must be integers.*got bool"):
        buffer.update_priorities(torch.tensor([True, False]), torch.tensor([50.0, 70.0]))
    assert held_priorities(buffer) == before


def test_boolean_priorities_are_refused_and_change_nothing():
    """Likewise a boolean array as priorities set them to 0 and 1 (the device path
    refuses ``torch.bool`` priorities: "expected numbers")."""
    buffer = filled_prioritized()
    before = held_priorities(buffer)
    with pytest.raises(ValueError, match="update_priorities: expected numbers, got bool"):
        buffer.update_priorities(np.arange(2), np.array([True, False]))
    assert held_priorities(buffer) == before


def test_boolean_ids_are_refused_by_the_shared_buffer_too():
    """The shared buffer checks its arguments with the same ``checked_priorities``: on
    108b677 a boolean mask updated its items 0 and 1."""
    from replaybuffer.distributed import SharedReplayBuffer

    with SharedReplayBuffer({"x": np.int64(0)}, 1, 10, prioritized=True, seed=0) as shared:
        for i in range(6):
            shared.add_batch({"x": np.array([i])})
        shared.update_priorities(np.arange(6), np.arange(1.0, 7.0))
        counts = np.bincount(np.asarray(shared.get_next(4000)[0]["x"]), minlength=6)
        with pytest.raises(ValueError, match="ids must be integers.*got bool"):
            shared.update_priorities(np.array([True, False]), np.array([500.0, 700.0]))
        after = np.bincount(np.asarray(shared.get_next(4000)[0]["x"]), minlength=6)
        # Item 1 would take ~700 / 714 of the draws had the mask been applied.
        assert after[1] < 1000 and abs(int(after[1]) - int(counts[1])) < 400
