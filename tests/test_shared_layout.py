"""The shared buffer's control layout: each row's heads in a cache line of its own (no
false sharing between writers of adjacent rows), packed above ``PADDED_ROWS``, and the
layout's version, which an attaching process checks."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.distributed.shared import layout as shared_layout
from replaybuffer.errors import CheckpointError
from replaybuffer.specs import ArraySpec

SPEC = {"row": ArraySpec((), np.int64), "step": ArraySpec((), np.int64)}
LINE = 64


def address(array: np.ndarray, index: int) -> int:
    """The byte address of ``array[index]`` (a 1-D view)."""
    return int(array.__array_interface__["data"][0]) + index * array.strides[0]


@pytest.mark.parametrize("num_rows", [2, 9, shared_layout.PADDED_ROWS])
def test_each_rows_heads_fill_a_cache_line_of_their_own(num_rows):
    with SharedReplayBuffer(SPEC, num_rows, 4) as buffer:
        layout = buffer.layout
        heads = layout.heads
        assert address(heads[:, 0], 0) % LINE == 0  # the array starts on a line
        lines = {}
        for row in range(num_rows):
            for field in (layout.next_id, layout.held):
                lines.setdefault(address(field, row) // LINE, set()).add(row)
        # Two fields per row, in one line, which no other row's fields share.
        assert sorted(lines.values(), key=min) == [{row} for row in range(num_rows)]
        assert address(layout.next_id, 1) - address(layout.next_id, 0) >= LINE


def test_above_padded_rows_the_heads_are_packed():
    """A sampler reads every row's head at every draw: above ``PADDED_ROWS`` rows they
    are packed (``next_id`` and ``held`` of a row side by side)."""
    num_rows = shared_layout.PADDED_ROWS + 1
    with SharedReplayBuffer(SPEC, num_rows, 2) as buffer:
        assert buffer.layout.heads.shape == (num_rows, 2)
        assert address(buffer.layout.next_id, 1) - address(buffer.layout.next_id, 0) == 16


@settings(max_examples=15, deadline=None)
@given(num_rows=st.sampled_from([3, shared_layout.PADDED_ROWS + 1]),
       batch=st.integers(1, 3), steps=st.integers(0, 11))
def test_heads_count_the_steps_written_and_the_padding_stays_zero(num_rows, batch, steps):
    """Against the obvious model: a row that took ``steps`` steps has head ``steps``
    and holds ``min(steps, max_length)``; every other column of ``heads`` stays 0; the
    samples are the steps written (one row: the writer's memoryview stores; several:
    its fills of strided views)."""
    length = 4
    with SharedReplayBuffer(SPEC, num_rows, length, seed=0) as buffer:
        for step in range(steps):
            buffer.add_batch({"row": np.arange(batch), "step": np.full(batch, step)})
        expected_heads = np.zeros(num_rows, np.int64)
        expected_heads[:batch] = steps
        np.testing.assert_array_equal(buffer.layout.next_id, expected_heads)
        np.testing.assert_array_equal(buffer.layout.held,
                                      np.minimum(expected_heads, length))
        np.testing.assert_array_equal(buffer.layout.heads[:, 2:], 0)
        assert len(buffer) == batch * min(steps, length)
        if steps:
            items = buffer.get_next(64)[0]
            assert set(items["step"].tolist()) <= set(range(max(0, steps - length), steps))
            assert set(items["row"].tolist()) <= set(range(batch))


def test_an_attach_to_another_layout_version_is_refused_and_the_buffer_unchanged():
    with SharedReplayBuffer(SPEC, 2, 4, seed=0) as buffer:
        buffer.add_batch({"row": np.arange(2), "step": np.zeros(2, np.int64)})
        handle = pickle.dumps(buffer)
        control = buffer.layout.control
        assert control[shared_layout.LAYOUT] == shared_layout.LAYOUT_VERSION
        control[shared_layout.LAYOUT] = 0  # as a buffer made before versions were kept
        with pytest.raises(CheckpointError, match="layout version 0 .* reads version 2"):
            pickle.loads(handle)
        control[shared_layout.LAYOUT] = shared_layout.LAYOUT_VERSION
        assert len(buffer) == 2
        np.testing.assert_array_equal(buffer.layout.next_id, [1, 1])
        other = pickle.loads(handle)  # the right version attaches
        assert len(other) == 2


def test_a_directory_of_the_packed_layout_is_refused_by_its_version(tmp_path):
    """Files of the layout before ``heads.npy`` (``next_id.npy``, ``held.npy``, a zero
    version) are refused by the version, before a file is found missing."""
    with SharedReplayBuffer(SPEC, 2, 4, path=tmp_path / "buffer") as buffer:
        handle = pickle.dumps(buffer)
        (tmp_path / "buffer" / "heads.npy").rename(tmp_path / "buffer" / "next_id.npy")
        buffer.layout.control[shared_layout.LAYOUT] = 0
        with pytest.raises(CheckpointError, match="layout version 0"):
            pickle.loads(handle)
