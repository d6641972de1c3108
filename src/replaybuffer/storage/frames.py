"""Frame deduplication for stacked image observations.

A stacked observation of ``K`` frames shares ``K - 1`` frames with the step before
it, so storing whole stacks keeps every frame ``K`` times. :class:`FrameStackCodec`
keeps each step's *newest* frame once, in a ring of ``max_length + K - 1`` frames per
row (so the frames behind the oldest retained step are still there), and replaces
the stacked leaf in storage by ``K`` frame references per step. Stacks, and so next
observations read as the second step of a window, are rebuilt at sample time.

References are chosen by comparing bytes when a step is written:

* the sliding window (the common case, one comparison): when the stack's first
  ``K - 1`` frames are the previous step's last ``K - 1`` (same row), the step reuses
  that step's references shifted by one, plus its own newest frame;
* otherwise frame by frame, right to left: the newest frame is the step's own; frame
  ``k`` is the frame after it when both are equal (padding by repetition, as
  gymnasium's ``FrameStackObservation(padding_type="reset")`` does at episode starts),
  or else the newest frame of the step ``K - 1 - k`` steps earlier in the same row
  when they are equal; an all-zero frame is a zero frame (``padding_type="zero"``);
  any other frame (a stream that starts without padding, say) is kept in a side
  store owned by its step and dropped when that step is overwritten.

A rebuilt stack is always byte-identical to the one added. Memory per step: one frame,
``K`` int64 references and a frame id; side frames only where stacks do not slide.

Stacks that belong to no step of their own (a transition buffer's true final
observation of an episode, see :mod:`replaybuffer.buffers.transitions`) are encoded
with :meth:`FrameStackCodec.encode_side` as the step after their owner: they share
the owner's frames and keep only what is new (usually one frame) as side frames.

Lifetimes: a reference to the ring frame of step ``s`` is only ever held by steps
``s .. s + K - 1`` of the same row (or by side stacks owned by them), and the ring
keeps ``max_length + K - 1`` frames per row, so a frame outlives every retained step
that reads it. Side frames are never shared between steps.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.frame_gather import gather_stacks
from replaybuffer.storage.frozen import FrozenRows

_Last = tuple[memoryview, tuple[int, ...], bool]
"""A row's newest step as :meth:`FrameStackCodec.encode` left it: the bytes of its last
``K - 1`` frames, its references, and whether those past the first are all ring or
zero references (side frames have one owner, so they are never shifted on)."""

_Extra = tuple[int, int, int, np.ndarray]
"""A side frame to store: ``(owner step id, row, side frame number, frame)``."""

_Writes = tuple[np.ndarray, Sequence[_Extra], Sequence[Optional[_Last]]]
"""What :meth:`FrameStackCodec.encode` leaves for :meth:`FrameStackCodec.commit`: the
stacks as frames ``[T * B, K, *frame]``, the side frames, and each row's newest step."""


class FrameStackCodec:
    """Encodes stacked frames into references to a frame ring, and decodes them back.

    A reference is an int64: ``s >= 0`` reads the ring frame of step ``s`` (in the row
    being read), ``-1`` an all-zero frame, ``-2 - n`` side frame ``n``.

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
        self.frame_bytes = self.frames[0].nbytes
        self._dtype = self.frames.dtype
        self._zero = bytes(self.frame_bytes)
        # Side store: reference -2 - n reads extra frame n, owned by one step position.
        self.extras: dict[int, np.ndarray] = {}
        self.extra_owner: dict[int, list[int]] = {}  # step position -> its extra frames
        self.next_extra = 0
        # The newest step of each row, for the one-comparison sliding-window match.
        self._last_id = -1
        self._last: Sequence[_Last | None] = [None] * batch_size
        self._one_ref = np.zeros((1, self.stack), np.int64)  # what encode returns for one step
        # While a save streams the frame ring, overwritten frames are preserved first.
        self.guard: FrozenRows | None = None

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes + self.frame_ids.nbytes + \
            sum(f.nbytes for f in self.extras.values())

    def _frame_position(self, ids: Any, rows: Any) -> Any:
        return (ids % self.slots) * self.batch_size + rows

    def _as_frames(self, stacks: np.ndarray) -> np.ndarray:
        """``[N, K, *frame]`` of the leaf's dtype: the stacks as their bytes are compared
        and stored (a value that casts to the dtype is compared as stored)."""
        if type(stacks) is not np.ndarray or stacks.dtype is not self._dtype:
            stacks = np.asarray(stacks, self._dtype)
        return stacks if self.axis == 0 else np.moveaxis(stacks, self.axis + 1, 1)

    def encode(self, first_id: int, stacks: np.ndarray) -> tuple[np.ndarray, _Writes]:
        """References int64 ``[T * B, K]`` for time-major stacks ``[T * B, *spec.shape]`` of
        steps ``first_id ..``, and the writes to apply with :meth:`commit` once stored.

        Changes nothing itself, so a failure before the commit leaves the codec as it was.
        The references may be a buffer the next call reuses: store (copy) them first.
        """
        B, F = self.batch_size, self.frame_bytes
        frames = self._as_frames(stacks)
        follows = self._last_id == first_id - 1
        if B == 1 and len(frames) == 1 and follows:  # add_batch of one row, the hot path
            data = frames[0].tobytes()  # one copy: compared now, kept for the next step
            previous = self._last[0]
            if previous is not None and previous[2] and data.startswith(previous[0]):
                # Shifting refs whose tail has no side frame leaves a tail without one.
                step_refs = previous[1][1:] + (first_id,)
                self._one_ref[0] = step_refs  # no allocation: storage copies it right away
                return self._one_ref, (frames, (), [(memoryview(data)[F:], step_refs, True)])
        # Each row's previous step, if it is the step just before first_id.
        last: list[_Last | None] = list(self._last) if follows else [None] * B
        added: list[bytes] = []  # every stack's bytes, for matches within this call
        extras: list[_Extra] = []  # (step id, row, n, frame)
        refs = []
        for i in range(len(frames)):
            step_id, row = first_id + i // B, i % B
            data = frames[i].tobytes()
            previous = last[row]
            if previous is not None and previous[2] and data.startswith(previous[0]):
                step_refs = previous[1][1:] + (step_id,)  # the window slid by one frame
            else:
                step_refs = self._match(data, frames[i], step_id, row, first_id, added,
                                        extras)
            added.append(data)
            refs.append(step_refs)
            last[row] = (memoryview(data)[F:], step_refs, min(step_refs[1:], default=-1) >= -1)
        return np.array(refs, np.int64), (frames, extras, last)

    def encode_side(self, owner_ids: np.ndarray, rows: np.ndarray, stacks: np.ndarray
                    ) -> tuple[np.ndarray, list[_Extra]]:
        """References int64 ``[N, K]`` for stacks ``[N, *spec.shape]`` that come after the
        stored steps ``owner_ids`` ``[N]`` of ``rows`` ``[N]`` without being stored as
        steps themselves (the true final observation of an episode, whose step's slot
        the next episode's first observation takes).

        Frames are matched as for a step ``owner_id + 1`` whose newest frame is not in
        the ring, so a stack that slid on from its owner's costs one side frame. Side
        frames are owned by the owner step and dropped when it is overwritten. Apply
        with :meth:`commit_side`; the owners must be written (committed) already.
        """
        frames = self._as_frames(stacks)
        extras: list[_Extra] = []
        refs = [self._match(frames[i].tobytes(), frames[i], int(owner) + 1, int(row), None, [],
                            extras, owner=int(owner))
                for i, (owner, row) in enumerate(zip(owner_ids, rows))]
        return np.array(refs, np.int64).reshape(len(frames), self.stack), extras

    def _match(self, data: bytes, frames: np.ndarray, step_id: int, row: int,
               first_id: int | None, added: list[bytes],
               extras: list[_Extra], owner: int | None = None
               ) -> tuple[int, ...]:
        """References of one stack (bytes ``data``, frames ``[K, *frame]``) of step
        ``step_id``, frame by frame. Steps from ``first_id`` on are this call's
        (``added``); earlier ones are read from the ring. ``owner``: the stack is a
        side stack of that step (its newest frame is not the ring's)."""
        K, F, B = self.stack, self.frame_bytes, self.batch_size
        view = memoryview(data)
        refs = [0] * K
        top = K - 1
        if owner is None:  # the newest frame is the step's own
            refs[top] = step_id
            top -= 1
            owner = step_id
        for k in range(top, -1, -1):
            start = k * F
            if k < K - 1 and data.startswith(view[start + F:start + 2 * F], start):
                refs[k] = refs[k + 1]
                continue
            candidate = step_id - (K - 1 - k)
            if 0 <= candidate <= owner:
                if first_id is not None and candidate >= first_id:
                    newest = memoryview(added[(candidate - first_id) * B + row])[(K - 1) * F:]
                    if data.startswith(newest, start):
                        refs[k] = candidate
                        continue
                else:
                    position = (candidate % self.slots) * B + row
                    if self.frame_ids[position] == candidate and \
                            data.startswith(self.frames[position], start):
                        refs[k] = candidate
                        continue
            if data.startswith(self._zero, start):
                refs[k] = -1
                continue
            n = self.next_extra + len(extras)  # no match: a side frame owned by the step
            extras.append((owner, row, n, frames[k].copy()))
            refs[k] = -2 - n
        return tuple(refs)

    def commit(self, writes: _Writes, first_id: int, num_steps: int) -> None:
        """Apply the writes returned by :meth:`encode` for steps ``first_id ..``."""
        frames, extras, last = writes
        B, L, S, K = self.batch_size, self.max_length, self.slots, self.stack
        end = first_id + num_steps
        kept_from = max(first_id, end - L)  # older ones were overwritten in this call
        if self.extra_owner:  # steps overwritten now release their side frames
            for step_id in range(kept_from, end):
                for row in range(B):
                    for n in self.extra_owner.pop((step_id % L) * B + row, ()):
                        self.extras.pop(n, None)
        if num_steps == 1 and B == 1:
            position = first_id % S
            if self.guard is not None:
                self.guard.preserve(slice(position, position + 1))
            self.frames[position] = frames[0, K - 1]
            self.frame_ids[position] = first_id
        elif num_steps == 1:  # one step of every row: consecutive ring positions
            start = (first_id % S) * B
            if self.guard is not None:
                self.guard.preserve(slice(start, start + B))
            self.frames[start:start + B] = frames[:, K - 1]
            self.frame_ids[start:start + B] = first_id
        else:  # the ring keeps the last S steps' frames; earlier ones would be overwritten
            written = min(num_steps, S)
            ids = np.arange(end - written, end, dtype=np.int64)
            positions = (self._frame_position(ids[:, None], np.arange(B))).ravel()
            if self.guard is not None:
                self.guard.preserve(positions)
            self.frames[positions] = frames[(num_steps - written) * B:, K - 1]
            self.frame_ids[positions] = np.repeat(ids, B)
        if extras:
            self._commit_extras(extras, kept_from)
        self._last, self._last_id = last, end - 1

    def commit_side(self, extras: list[_Extra]) -> None:
        """Apply the side frames returned by :meth:`encode_side`."""
        self._commit_extras(extras, -1)

    def _commit_extras(self, extras: Sequence[_Extra], kept_from: int) -> None:
        L, B = self.max_length, self.batch_size
        for step_id, row, n, frame in extras:
            self.next_extra = max(self.next_extra, n + 1)
            if step_id >= kept_from:
                self.extras[n] = frame
                self.extra_owner.setdefault((step_id % L) * B + row, []).append(n)

    def decode(self, refs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Stacks ``[..., *spec.shape]`` from references int64 ``[..., K]`` and rows ``[...]``."""
        zero = len(self.frames) - 1
        positions = np.where(refs >= 0, self._frame_position(refs, rows[..., None]), zero)
        side = refs < -1
        if not side.any():  # the usual case: every stack slid on, or was padding
            return gather_stacks(self.frames, positions, self.axis)
        # Rare (stacks that did not slide): the side frames, numbered in mask order.
        extras = np.stack([self.extras[int(-2 - r)] for r in refs[side]])
        numbers = np.zeros(refs.shape, np.int64)
        numbers[side] = np.arange(len(extras))
        return gather_stacks(self.frames, positions, self.axis, side, extras, numbers)

    def clear(self) -> None:
        self.frame_ids[:] = -1
        self.extras.clear()
        self.extra_owner.clear()
        self._last_id, self._last = -1, [None] * self.batch_size

    def state_dict(self) -> dict[str, Any]:
        """Everything but the frame ring itself (saved from :meth:`frozen_frames`): the
        frame ids, the side frames with their owners, and each row's newest step as
        :meth:`encode` matches against it: ``last_id``, ``last_tails`` uint8
        ``[B, (K - 1) * frame bytes]`` (its last ``K - 1`` frames), ``last_refs`` int64
        ``[B, K]`` and ``last_slides`` bool ``[B]`` (empty with ``last_id`` -1). The
        newest step decides the references of the next one (a sliding stack reuses it),
        so without it a restored buffer would store other, equally valid references and
        its saves would drift from the original's."""
        owners = [(owner, n) for owner, ns in self.extra_owner.items() for n in ns]
        lasts = [last for last in self._last if last is not None]
        held = self._last_id >= 0 and len(lasts) == len(self._last)
        tail = (self.stack - 1) * self.frame_bytes
        return {"frame_ids": self.frame_ids.copy(),
                "extra_ids": np.array([n for _, n in owners], np.int64),
                "extra_owners": np.array([o for o, _ in owners], np.int64),
                "extra_frames": np.stack([self.extras[n] for _, n in owners]) if owners
                else np.zeros((0,) + self.frame_shape, self.spec.dtype),
                "next_extra": self.next_extra,
                "last_id": self._last_id if held else -1,
                "last_tails": np.array([np.frombuffer(last[0], np.uint8) for last in lasts]
                                       if held else np.zeros((0, tail), np.uint8), np.uint8),
                "last_refs": np.array([last[1] for last in lasts] if held
                                      else np.zeros((0, self.stack)), np.int64),
                "last_slides": np.array([last[2] for last in lasts] if held else [],
                                        np.bool_)}

    @property
    def frame_spec(self) -> ArraySpec:
        """The spec of one ring frame (the stacked spec without its stack axis)."""
        return ArraySpec(self.frame_shape, self.spec.dtype, self.spec.name)

    def frozen_frames(self) -> FrozenRows:
        """The frame ring ``[slots * batch_size, *frame]`` frozen now, for a save to stream;
        :meth:`commit` preserves frames it overwrites until :attr:`guard` is reset."""
        self.guard = FrozenRows(lambda p: [self.frames[p]], len(self.frames) - 1,
                                [self.frame_spec], [f"{self.path} frames"])
        return self.guard

    def load_frames(self, start: int, frames: np.ndarray) -> None:
        """Write ring frames ``[n, *frame]`` at ring positions ``[start, start + n)``."""
        self.frames[start:start + len(frames)] = frames

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ids = np.asarray(state["frame_ids"], np.int64)
        if ids.shape != self.frame_ids.shape:
            raise ValueError(f"frame ids of shape {ids.shape} for a codec holding "
                             f"{self.frame_ids.shape}")
        if "frames" in state:  # format 1 kept the ring in the state
            frames = np.asarray(state["frames"])
            if frames.shape != self.frames[:-1].shape:
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
        self._last_id, self._last = -1, [None] * self.batch_size
        last_id = int(state.get("last_id", -1))  # saves from before it: frame by frame
        if last_id >= 0:
            tails = np.asarray(state["last_tails"], np.uint8)
            refs = np.asarray(state["last_refs"], np.int64)
            slides = np.asarray(state["last_slides"], np.bool_)
            tail = (self.stack - 1) * self.frame_bytes
            if tails.shape != (self.batch_size, tail) or \
                    refs.shape != (self.batch_size, self.stack) or \
                    slides.shape != (self.batch_size,):
                raise ValueError(f"newest-step state of shapes {tails.shape}, {refs.shape}, "
                                 f"{slides.shape} for {self.batch_size} rows of {self.stack} "
                                 "frames")
            self._last = [(memoryview(t.tobytes()), tuple(r), bool(f))
                          for t, r, f in zip(tails, refs.tolist(), slides)]
            self._last_id = last_id
