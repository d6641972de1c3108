"""Frame dedup in a shared buffer: :class:`SharedFrameRing`, the stacked-frame leaf kept
one frame per step in shared memory, each step holding ``K`` references.

As the local buffers' codec (:mod:`replaybuffer.storage.frames`, the same references
and the same matching by bytes): a row has a ring of ``max_length + K - 1`` frames, the
frame of step ``s`` at ring position ``(s % slots) * num_rows + row``; a step's stacked
leaf is stored as int64 ``[K]`` references: ``r >= 0`` the ring frame of step ``r`` of the
same row, ``-1`` an all-zero frame, ``-2 - n`` side frame ``n`` of the row. A step's
stack slides on from the previous one (one comparison), or is matched frame by frame
(a frame equal to the next one, the ring frame of the step ``K - 1 - k`` before, zero),
and what matches nothing is a side frame.

Who writes what. A writer owns its rows (:mod:`.writer`), so a row's ring frames and
side frames are written only by the row's writer, in the data phase of its step
(between the odd and the even version). Nothing needs a lock.

Why a reader never takes a torn stack. The frames a stack of step ``s`` references are
the ring frames of steps ``s - K + 1 .. s`` of its row and side frames owned by ``s``.
The ring frame of step ``j`` is overwritten by step ``j + max_length + K - 1 >=
s + max_length``, and a side frame owned by ``s`` is reused only by a step ``>= s +
max_length``; a row's steps are written in order, so either write comes after step
``s + max_length`` set the odd version of the position of ``s`` (the same position),
with the writer's fences between. A reader copies a step's references and frames
between its two version loads (:mod:`.sampling`): if it copied any frame byte a later
step wrote, its second load sees the version of ``s`` moved, and it draws again, as for
any other leaf. A writer killed mid-step leaves its step odd (never drawn); the frames
it wrote belong to steps no published stack references.

Writer state. Which step a row's stack last was (for the sliding match) lives in the
writing process; a process that claims rows starts without it. Frame-by-frame matching
checks a ring frame against ``frame_ids`` (shared, ``id + 1`` of the step whose frame is
at each ring position, written after the frame), so a new writer of a row taken over
from a killed one only references frames that were written whole, of steps below the
row's head.

Side frames. Stacks that neither slide nor are padding (a stream that starts without
padding, say) keep their unmatched frames in a per-row side area of ``side_frames``
frames, each marked with the step that owns it (``side_owner``, ``id + 1``). A slot is
free once its owner is overwritten (``owner <= s - max_length`` for the step ``s``
being written) or was never published (``owner >= s``). A step whose frames need more
free slots than its row has raises :class:`SideFramesFullError` before anything is
written: a call's steps (an ``extend``'s too) are all encoded before the first is
written, each seeing the frames and side slots of the steps before it (a
:class:`FramePlan`), so a refused call leaves the buffer unchanged, and the writer may
go on with other stacks.

Memory per step: one frame and ``K`` int64 references (and ``8 * K`` bytes less per
position than the stacked leaf), plus ``side_frames`` frames per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from replaybuffer import nest
from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.errors import CheckpointError, SpecError
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.frame_gather import gather_stacks
from replaybuffer.storage.shared_storage import SharedStorage

_Last = tuple[int, memoryview, tuple[int, ...], bool]
"""A row's newest step as this process wrote it: its id, the bytes of its last ``K - 1``
frames, its references, and whether those past the first are ring or zero references
(side frames have one owner, so they are never shifted on)."""


class SideFramesFullError(ValueError):
    """A stack needs more side frames than its row has free (see the module docstring);
    nothing was written."""


@dataclass(frozen=True)
class FrameOptions:
    """A shared buffer's frame dedup, checked: the stacked leaf (its ``frame_stack``
    name, its index among the flattened leaves and its path), the stack axis
    (normalised to ``0 .. ndim - 1``) and the side frames per row."""

    name: str
    leaf: int
    path: str
    stack_axis: int
    side_frames: int

    @classmethod
    def checked(cls, data_spec: Any, frame_stack: str, stack_axis: int, side_frames: int
                ) -> "FrameOptions":
        """The options for a buffer of ``data_spec`` (a nest of :class:`ArraySpec`).

        Raises :class:`SpecError` for a name that is no top-level leaf or an axis
        outside its shape, ``ValueError`` for ``side_frames`` below 1."""
        specs, _ = nest.flatten(data_spec)
        paths = nest.leaf_paths(data_spec)
        names = {p: i for i, p in enumerate(paths)}
        index = names.get(f"['{frame_stack}']", names.get(f".{frame_stack}"))
        if index is None:
            raise SpecError(f"frame_stack={frame_stack!r} names no top-level leaf; the "
                            f"data_spec's leaves are {list(paths)}")
        ndim = len(specs[index].shape)
        if isinstance(stack_axis, bool) or not isinstance(stack_axis, (int, np.integer)) \
                or ndim < 2 or not -ndim <= stack_axis < ndim:
            raise SpecError(f"frame deduplication of leaf {paths[index]} needs a stack axis "
                            f"within its shape {specs[index].shape}, got "
                            f"stack_axis={stack_axis!r}")
        if isinstance(side_frames, bool) or not isinstance(side_frames, (int, np.integer)) \
                or side_frames < 1:
            raise ValueError(f"side_frames must be a positive int (side frames per row), "
                             f"got {side_frames!r}")
        return cls(frame_stack, index, paths[index], int(stack_axis) % ndim, int(side_frames))

    def stored_specs(self, specs: Sequence[ArraySpec]) -> list[ArraySpec]:
        """``specs`` with the stacked leaf replaced by its int64 ``[K]`` references."""
        stored = list(specs)
        spec = specs[self.leaf]
        stored[self.leaf] = ArraySpec((spec.shape[self.stack_axis],), np.int64, spec.name)
        return stored


@dataclass
class FramePlan:
    """One call's steps as :meth:`SharedFrameRing.encode` encodes them before any is
    committed: the first step id and row, each encoded step's frames ``[count, K,
    *frame]``, each row's newest step (as :data:`_Last`), and the rows' side-slot owner
    marks int64 ``[count, side_frames]`` (copied at the first side frame taken)."""

    step: int
    first: int
    lasts: list[_Last | None]
    frames: list[np.ndarray] = field(default_factory=list)
    owners: np.ndarray | None = None
    method: str = "add_batch"


class SharedFrameRing:
    """The frames of one stacked leaf of a shared buffer (see the module docstring).

    Args:
        spec: the stacked leaf's spec, e.g. uint8 ``[4, 84, 84]``.
        options: the checked frame options.
        num_rows, max_length: the buffer's shape.
        storage: the buffer's storage, whose directory gets the files ``frames``
            ``[slots * num_rows + 1, *frame]`` (the last one all zero), ``frame_ids``
            int64 ``[slots * num_rows]``, ``side_frames`` ``[num_rows * side_frames,
            *frame]``, ``side_owner`` int64 ``[num_rows * side_frames]`` and
            ``frame_config`` int64 ``[4]``.
        create: make the files (before the layout reserves the directory), or attach.

    Raises:
        CheckpointError: (attaching) the files are of another frame configuration.
    """

    def __init__(self, spec: ArraySpec, options: FrameOptions, num_rows: int,
                 max_length: int, storage: SharedStorage, create: bool):
        self.spec, self.path, self.axis = spec, options.path, options.stack_axis
        self.leaf = options.leaf  # among the flattened leaves
        self.stack = K = spec.shape[self.axis]
        self.frame_shape = spec.shape[:self.axis] + spec.shape[self.axis + 1:]
        self.rows, self.length = num_rows, max_length
        self.slots = max_length + K - 1
        self.side_capacity = C = options.side_frames
        shared = storage.map
        # Zero-filled files (never written before the layout reserves them): ids and
        # owners are kept as ``id + 1`` so that 0 means none.
        self.frames = shared("frames", (self.slots * num_rows + 1,) + self.frame_shape,
                             spec.dtype)
        self.frame_ids = shared("frame_ids", (self.slots * num_rows,), np.int64)
        self.side = shared("side_frames", (num_rows * C,) + self.frame_shape, spec.dtype)
        self.side_owner = shared("side_owner", (num_rows * C,), np.int64)
        self._config = shared("frame_config", (4,), np.int64)
        self._expected = np.array([1, options.leaf, self.axis, C], np.int64)
        self._create = create
        if not create:
            self.check_config()
        self.frame_bytes = F = self.frames[0].nbytes
        self._dtype = self.frames.dtype
        self._zero = bytes(F)
        self._zero_position = len(self.frames) - 1
        self._tail = (K - 1) * F
        self.forget()

    def publish_config(self) -> None:
        """Write the frame configuration (the creator, once the layout reserved the
        directory's files), which attaching processes check."""
        if self._create:
            self._config[:] = self._expected

    def check_config(self) -> None:
        """Raises :class:`CheckpointError` when the files were made with another leaf,
        stack axis or side-frame count than this process's configuration."""
        found = self._config.tolist()
        if found != self._expected.tolist():
            raise CheckpointError(
                f"the shared buffer's frame ring was made for leaf index {found[1]}, "
                f"stack_axis={found[2]}, side_frames={found[3]}; this process expects "
                f"{self.path} (index {self._expected[1]}), stack_axis={self.axis}, "
                f"side_frames={self.side_capacity}")

    def forget(self) -> None:
        """Drop this process's newest-step state (rows just claimed, or a fork): the
        next stack of each row is matched frame by frame."""
        self._last: list[_Last | None] = [None] * self.rows

    @property
    def nbytes(self) -> int:
        """Bytes of the ring, its ids and the side area."""
        return self.frames.nbytes + self.frame_ids.nbytes + self.side.nbytes + \
            self.side_owner.nbytes

    def _as_frames(self, stacks: np.ndarray) -> np.ndarray:
        """``[N, K, *frame]`` of the leaf's dtype (stacks ``[N, *spec.shape]`` checked)."""
        if type(stacks) is not np.ndarray or stacks.dtype is not self._dtype:
            stacks = np.asarray(stacks, self._dtype)
        return stacks if self.axis == 0 else np.moveaxis(stacks, self.axis + 1, 1)

    # ------------------------------------------------------------------ writing
    def plan(self, step: int, first: int, count: int) -> "FramePlan":
        """The plan of one call's consecutive steps from ``step`` on, to rows ``first ..
        first + count - 1``, for :meth:`encode`."""
        return FramePlan(step, first, self._last[first:first + count])

    def encode(self, step: int, first: int, stacks: np.ndarray, plan: "FramePlan"
               ) -> tuple[np.ndarray, tuple[Any, ...]]:
        """References int64 ``[count, K]`` for stacks ``[count, *spec.shape]`` of step
        ``step`` of rows ``first ..``, and the writes for :meth:`commit`. Writes nothing:
        the steps of a call are encoded in order into ``plan`` (which sees the frames
        and side slots of the steps encoded before, as if committed), all of them before
        the first is committed, so that a refused step leaves the buffer unchanged.

        Raises:
            SideFramesFullError: a row has fewer free side frames than its stack needs.
        """
        frames = self._as_frames(stacks)
        F = self.frame_bytes
        count = len(frames)
        refs = np.empty((count, self.stack), np.int64)
        sides: list[tuple[int, int, np.ndarray]] = []  # (row, slot, frame)
        lasts: list[_Last] = []
        plan.frames.append(frames)
        for i in range(count):
            row = first + i
            data = frames[i].tobytes()
            last = plan.lasts[i]
            if last is not None and last[0] == step - 1 and last[3] and \
                    data.startswith(last[1]):
                step_refs = last[2][1:] + (step,)  # the window slid by one frame
            else:
                step_refs = self._match(data, frames[i], step, row, sides, plan)
            refs[i] = step_refs
            lasts.append((step, memoryview(data)[F:], step_refs,
                          min(step_refs[1:], default=-1) >= -1))
        plan.lasts[:] = lasts
        return refs, (frames, sides, lasts, step, first)

    def _match(self, data: bytes, frames: np.ndarray, step: int, row: int,
               sides: list[tuple[int, int, np.ndarray]], plan: "FramePlan"
               ) -> tuple[int, ...]:
        """References of one stack (bytes ``data``, frames ``[K, *frame]``) of ``step``,
        frame by frame, right to left; unmatched frames get side slots (``sides``)."""
        K, F = self.stack, self.frame_bytes
        view = memoryview(data)
        refs = [0] * K
        refs[K - 1] = step
        for k in range(K - 2, -1, -1):
            start = k * F
            if data.startswith(view[start + F:start + 2 * F], start):
                refs[k] = refs[k + 1]  # padding by repetition
                continue
            candidate = step - (K - 1 - k)
            if candidate >= plan.step:  # a step of this call: its frame, not yet written
                if data.startswith(plan.frames[candidate - plan.step][row - plan.first,
                                                                     K - 1].tobytes(), start):
                    refs[k] = candidate
                    continue
            elif candidate >= 0:
                position = (candidate % self.slots) * self.rows + row
                if self.frame_ids[position] == candidate + 1 and \
                        data.startswith(self.frames[position], start):
                    refs[k] = candidate
                    continue
            if data.startswith(self._zero, start):
                refs[k] = -1
                continue
            slot = self._free_slot(row, step, sides, plan)
            sides.append((row, slot, frames[k]))
            refs[k] = -2 - slot
        return tuple(refs)

    def _free_slot(self, row: int, step: int, sides: list[tuple[int, int, np.ndarray]],
                   plan: "FramePlan") -> int:
        """A side slot of ``row`` that no retained step of it owns (this call's earlier
        steps included) and that this step has not taken yet; marked in ``plan`` as
        taken by ``step``."""
        C = self.side_capacity
        if plan.owners is None:  # the rows' marks as this call leaves them, made once
            plan.owners = self.side_owner[plan.first * C:(plan.first + len(plan.lasts)) * C
                                          ].reshape(-1, C).copy()
        marks = plan.owners[row - plan.first]  # owner id + 1; 0: never used
        free = (marks == 0) | (marks <= step + 1 - self.length) | (marks > step)
        for taken_row, slot, _ in sides:
            if taken_row == row:
                free[slot] = False
        slots = np.flatnonzero(free)
        if not len(slots):
            raise SideFramesFullError(
                f"{plan.method}: frame_stack leaf {self.path}: row {row} needs more side "
                f"frames than the {C} it has (side_frames={C}) at step {step}; side frames "
                "keep the frames of stacks that neither slide on from the row's previous "
                "step nor are padding, until their step is overwritten. Give the buffer a "
                "larger side_frames; " + ("the load is refused" if plan.method == "load"
                                          else "nothing of this call was written"))
        marks[slots[0]] = step + 1
        return int(slots[0])

    def commit(self, writes: tuple[Any, ...]) -> None:
        """Write the frames :meth:`encode` returned, in the data phase of their step
        (after its odd versions, before its even ones)."""
        frames, sides, lasts, step, first = writes
        count = len(frames)
        position = (step % self.slots) * self.rows + first
        self.frames[position:position + count] = frames[:, self.stack - 1]
        if ARMED is not None:
            crash_point("shared.write.frames")
        self.frame_ids[position:position + count] = step + 1  # after the frames
        C = self.side_capacity
        for row, slot, frame in sides:
            self.side[row * C + slot] = frame
            self.side_owner[row * C + slot] = step + 1
        self._last[first:first + count] = lasts

    # ------------------------------------------------------------------ reading
    def decode(self, refs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Stacks ``[..., *spec.shape]`` from references int64 ``[..., K]`` of rows
        ``[...]`` (copied between the reader's two version loads)."""
        rows = rows[..., None]
        positions = np.where(refs >= 0, (refs % self.slots) * self.rows + rows,
                             self._zero_position)
        side = refs < -1
        if not side.any():  # the usual case: every stack slid on, or was padding
            return gather_stacks(self.frames, positions, self.axis)
        return gather_stacks(self.frames, positions, self.axis, side, self.side,
                             rows * self.side_capacity - 2 - refs)


def frame_storage(specs: Sequence[ArraySpec], options: FrameOptions | None, num_rows: int,
                  max_length: int, directory: Any, create: bool
                  ) -> tuple[SharedStorage, SharedFrameRing | None]:
    """A shared buffer's storage of ``num_rows * max_length`` positions for the leaves
    ``specs`` (made or attached in ``directory``), and its frame ring when ``options``
    dedups a stacked leaf (the storage then holds that leaf's references)."""
    if options is None:
        return SharedStorage(specs, num_rows * max_length, directory, create), None
    storage = SharedStorage(options.stored_specs(specs), num_rows * max_length, directory,
                            create)
    return storage, SharedFrameRing(specs[options.leaf], options, num_rows, max_length,
                                    storage, create)
