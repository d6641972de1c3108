"""Rebuilding stacks of frames from frame positions: :func:`gather_stacks`, the one
decode of frame dedup, for the local buffers' codec (:mod:`.frames`) and the shared
buffer's frame ring (:mod:`replaybuffer.distributed.shared.frame_ring`).

A stack axis of 0 gathers the frames in place (``[..., K, *frame]`` is the stack's
layout). Any other axis gathers frame ``k`` of every stack at once and copies it into
its strided place in the output: about 4x faster than gathering ``[..., K, *frame]``
and moving the axis into a contiguous copy, which reads and writes every byte twice,
the second time with the stack axis innermost (a stride of one element).
"""

from __future__ import annotations

import numpy as np


def gather_stacks(frames: np.ndarray, positions: np.ndarray, axis: int,
                  side: np.ndarray | None = None, side_frames: np.ndarray | None = None,
                  side_positions: np.ndarray | None = None) -> np.ndarray:
    """Stacks ``[..., *stack_shape]`` (contiguous), ``stack_shape`` the frame shape
    with ``K`` inserted at ``axis``.

    Args:
        frames: ``[N, *frame]``, the frames the positions index.
        positions: int64 ``[..., K]``, each stack's frames, oldest first (clipped to
            ``N - 1``; where ``side`` is set, any value).
        axis: the stack axis in ``stack_shape``, ``0 .. len(frame)``.
        side: bool ``[..., K]`` or ``None``: frames read from ``side_frames`` at
            ``side_positions`` (int64 ``[..., K]``) instead.
    """
    if axis == 0:  # frames gathered in place: [..., K, *frame]
        stacked = frames.take(positions, 0, mode="clip")
        if side is not None:  # rare: stacks that did not slide
            assert side_frames is not None and side_positions is not None
            stacked[side] = side_frames.take(side_positions[side], 0, mode="clip")
        return stacked
    lead = positions.ndim - 1
    frame_shape = frames.shape[1:]
    out = np.empty(positions.shape[:-1] + frame_shape[:axis] + positions.shape[-1:]
                   + frame_shape[axis:], frames.dtype)
    places = np.moveaxis(out, lead + axis, lead)  # a view [..., K, *frame]
    for k in range(positions.shape[-1]):
        got = frames.take(positions[..., k], 0, mode="clip")
        if side is not None and side[..., k].any():
            assert side_frames is not None and side_positions is not None
            mask = side[..., k]
            got[mask] = side_frames.take(side_positions[..., k][mask], 0, mode="clip")
        places[(slice(None),) * lead + (k,)] = got
    return out
