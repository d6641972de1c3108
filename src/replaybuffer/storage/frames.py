"""Frame deduplication for stacked image observations.

A stacked observation of ``K`` frames shares ``K - 1`` frames with the step before
it, so storing whole stacks keeps every frame ``K`` times. :class:`FrameStackCodec`
keeps each step's *newest* frame once, in a ring of ``max_length + K - 1`` frames per
row (so the frames behind the oldest retained step are still there), and replaces
the stacked leaf in storage by ``K`` frame references per step. Stacks, and so next
observations read as the second step of a window, are rebuilt at sample time.

References are chosen by content when a step is written, right to left:

* the newest frame is the step's own;
* frame ``k`` is the frame after it when both are equal (padding by repetition, as
  gymnasium's ``FrameStackObservation(padding_type="reset")`` does at episode starts),
  or else the newest frame of the step ``K - 1 - k`` steps earlier in the same row
  when they are equal (the sliding window of an ongoing episode);
* an all-zero frame is a zero frame (``padding_type="zero"``);
* any other frame (a stream that starts without padding, say) is kept in a side
  store owned by its step and dropped when that step is overwritten.

A rebuilt stack is always byte-identical to the one added. Memory per step: one frame,
``K`` int64 references and a frame id; side frames only where stacks do not slide.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec


class FrameStackCodec:
    """Encodes stacked frames into references to a frame ring, and decodes them back.

    Args:
        spec: the stacked observation's spec, e.g. uint8 ``[4, 84, 84]``.
        stack_axis: the axis of ``spec.shape`` that stacks frames (0 or -1, say).
        batch_size, max_length: the buffer's layout.
        path: the leaf's path, for messages.
    """

    def __init__(self, spec: ArraySpec, stack_axis: int, batch_size: int, max_length: int,
                 path: str):
        ndim = len(spec.shape)
        if ndim < 2 or not -ndim <= stack_axis < ndim:
            raise SpecError(f"frame deduplication of leaf {path} needs a stack axis within "
                            f"its shape {spec.shape}, got stack_axis={stack_axis}")
        self.spec, self.path = spec, path
        self.axis = stack_axis % ndim
        self.stack = spec.shape[self.axis]
        self.frame_shape = spec.shape[:self.axis] + spec.shape[self.axis + 1:]
        self.batch_size, self.max_length = batch_size, max_length
        self.slots = max_length + self.stack - 1  # frame ring per row
        # One extra all-zero frame at the end is what reference -1 reads.
        self.frames = np.zeros((self.slots * batch_size + 1,) + self.frame_shape, spec.dtype)
        self.frame_ids = np.full(self.slots * batch_size, -1, np.int64)  # id held per slot
        self.ref_spec = ArraySpec((self.stack,), np.int64, spec.name)
        # Side store: reference -2 - n reads extra frame n, owned by one step position.
        self.extras: dict[int, np.ndarray] = {}
        self.extra_owner: dict[int, list[int]] = {}  # step position -> its extra frames
        self.next_extra = 0

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes + self.frame_ids.nbytes + \
            sum(f.nbytes for f in self.extras.values())

    def _frame_position(self, ids: Any, rows: Any) -> Any:
        return (ids % self.slots) * self.batch_size + rows

    def encode(self, first_id: int, stacks: np.ndarray) -> tuple[np.ndarray, tuple]:
        """References ``[T * B, K]`` for time-major stacks ``[T * B, *spec.shape]`` of steps
        ``first_id ..``, and the writes to apply with :meth:`commit` once stored.

        Changes nothing itself, so a failure before the commit leaves the codec as it was.
        """
        B, K = self.batch_size, self.stack
        frames = np.moveaxis(np.asarray(stacks), self.axis + 1, 1)  # [T * B, K, *frame]
        steps = len(frames) // B
        refs = np.empty((len(frames), K), np.int64)
        pending: dict[int, tuple[int, np.ndarray]] = {}  # frame position -> (id, frame)
        extras: list[tuple[int, int, int, np.ndarray]] = []  # (step id, row, n, frame)
        for t in range(steps):
            step_id = first_id + t
            for row in range(B):
                i = t * B + row
                stack = frames[i]
                refs[i, K - 1] = step_id
                pending[self._frame_position(step_id, row)] = (step_id, stack[K - 1])
                for k in range(K - 2, -1, -1):
                    ref = self._match(stack, k, refs[i, k + 1], step_id - (K - 1 - k), row,
                                      pending)
                    if ref is None:  # no match: a side frame owned by this step
                        n = self.next_extra + len(extras)
                        extras.append((step_id, row, n, stack[k].copy()))
                        ref = -2 - n
                    refs[i, k] = ref
        return refs, (list(pending.items()), extras)

    def _match(self, stack: np.ndarray, k: int, next_ref: int, candidate: int, row: int,
               pending: dict) -> int | None:
        frame = stack[k]
        if _same_bytes(frame, stack[k + 1]):
            return next_ref
        if candidate >= 0:
            position = self._frame_position(candidate, row)
            held = pending.get(position)
            if held is not None and held[0] == candidate:
                if _same_bytes(frame, held[1]):
                    return candidate
            elif self.frame_ids[position] == candidate and \
                    _same_bytes(frame, self.frames[position]):
                return candidate
        if not _bytes(frame).any():
            return -1
        return None

    def commit(self, writes: tuple, first_id: int, num_steps: int) -> None:
        """Apply the writes returned by :meth:`encode` for steps ``first_id ..``."""
        frame_writes, extras = writes
        B, L = self.batch_size, self.max_length
        kept_from = max(first_id, first_id + num_steps - L)  # older ones were overwritten
        for step_id in range(kept_from, first_id + num_steps):
            for row in range(B):  # steps overwritten now release their side frames
                for n in self.extra_owner.pop((step_id % L) * B + row, ()):
                    self.extras.pop(n, None)
        for position, (step_id, frame) in frame_writes:
            self.frames[position] = frame
            self.frame_ids[position] = step_id
        for step_id, row, n, frame in extras:
            self.next_extra = max(self.next_extra, n + 1)
            if step_id >= kept_from:
                self.extras[n] = frame
                self.extra_owner.setdefault((step_id % L) * B + row, []).append(n)

    def decode(self, refs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Stacks ``[..., *spec.shape]`` from references ``[..., K]`` and rows ``[...]``."""
        zero = len(self.frames) - 1
        positions = np.where(refs >= 0, self._frame_position(refs, rows[..., None]), zero)
        stacked = self.frames.take(positions, 0, mode="clip")  # [..., K, *frame]
        side = refs < -1
        if side.any():  # rare: stacks that did not slide
            stacked[side] = np.stack([self.extras[int(-2 - r)] for r in refs[side]])
        if self.axis == 0:
            return stacked
        return np.ascontiguousarray(np.moveaxis(stacked, refs.ndim - 1, refs.ndim - 1
                                                + self.axis))

    def clear(self) -> None:
        self.frame_ids[:] = -1
        self.extras.clear()
        self.extra_owner.clear()

    def state_dict(self) -> dict[str, Any]:
        owners = [(owner, n) for owner, ns in self.extra_owner.items() for n in ns]
        return {"frames": self.frames[:-1].copy(), "frame_ids": self.frame_ids.copy(),
                "extra_ids": np.array([n for _, n in owners], np.int64),
                "extra_owners": np.array([o for o, _ in owners], np.int64),
                "extra_frames": np.stack([self.extras[n] for _, n in owners]) if owners
                else np.zeros((0,) + self.frame_shape, self.spec.dtype),
                "next_extra": self.next_extra}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        frames = np.asarray(state["frames"])
        ids = np.asarray(state["frame_ids"], np.int64)
        if frames.shape != self.frames[:-1].shape or ids.shape != self.frame_ids.shape:
            raise ValueError(f"frame ring of shape {frames.shape} for a codec holding "
                             f"{self.frames[:-1].shape}")
        self.frames[:-1] = frames
        self.frame_ids[:] = ids
        self.extras.clear()
        self.extra_owner.clear()
        for n, owner, frame in zip(np.asarray(state["extra_ids"]).tolist(),
                                   np.asarray(state["extra_owners"]).tolist(),
                                   np.asarray(state["extra_frames"])):
            self.extras[n] = np.array(frame)
            self.extra_owner.setdefault(owner, []).append(n)
        self.next_extra = int(state["next_extra"])


def _bytes(frame: np.ndarray) -> np.ndarray:
    """The frame's bytes: equality by value would merge -0.0 with 0.0 and NaN never."""
    return np.ascontiguousarray(frame).view(np.uint8)


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(_bytes(a), _bytes(b)))
