"""Next observations of a transition buffer: the side store and the newest steps' own.

A transition buffer (:class:`~replaybuffer.TransitionReplayBuffer`) stores each
observation once: the next observation of step ``t`` of a row is the observation of
step ``t + 1`` of the same row. Where that is not the ``next_observation`` that was
added (an episode's end, an out-of-sequence add) the true one is kept in a
:class:`~replaybuffer.storage.side_store.SideStore`, owned by the step (``_side_ref``:
int64 per storage position, -1 where the step owns none); the newest step of each row
keeps its own (``_head_next``: one ``[num_envs, *spec.shape]`` array per observation
leaf). :class:`SideObservations` is the part of the buffer that keeps this
bookkeeping on every write (:meth:`SideObservations._write_transition`) and rebuilds
next observations on read (:meth:`SideObservations._next_observations`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.errors import CheckpointError
from replaybuffer.storage.base import to_numpy
from replaybuffer.storage.side_store import SideStore

if TYPE_CHECKING:
    from replaybuffer.specs import ArraySpec

COPY_COMPARE_MAX = 1 << 16
"""Bytes of observations up to which adds compare copies (larger ones in place)."""


class SideObservations(ReplayBuffer):
    """The next-observation bookkeeping of a transition buffer (see the module).

    A part of :class:`~replaybuffer.TransitionReplayBuffer`, which sets the state
    declared here when it is built. Subclasses extend writes through two hooks:
    :meth:`_written` (after every write of a step, by any path) and
    :meth:`_keep_previous_next` (when an add does not follow on from its row's
    previous step).
    """

    # Set by TransitionReplayBuffer.__init__.
    _obs_leaves: list[int]  # storage leaf indices of the observation's leaves
    _obs_specs: list[ArraySpec]
    _side: SideStore  # next observations (or frame references) that are not stored steps
    _side_ref: np.ndarray  # int64 [positions]: a step's slot in _side, -1 for none
    _owns: bytearray  # per step slot: 1 where some row's _side_ref is set
    _head_next: list[np.ndarray]  # the newest step's next observation per leaf [B, ...]
    _head_raw: bytes | None
    _rows: np.ndarray  # int64 [num_envs]
    _no_ends: bytes  # bool [num_envs], all false, as bytes
    _host: bool  # storage arrays are numpy

    # Per class (__init_subclass__): whether it overrides the write hooks.
    _written_hook: ClassVar[bool] = False
    _custom_write: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Calls add's shortcut skips where they would do nothing (_written here), and
        # subclasses whose writes do more than the shortcut knows (_write_transition).
        cls._written_hook = cls._written is not SideObservations._written
        cls._custom_write = cls._write_transition is not SideObservations._write_transition

    @property
    def num_envs(self) -> int:
        """Environments per add: the rows of the ring."""
        return self._ring.batch_size

    def _written(self, start: int, ended: np.ndarray | None) -> None:
        """Called (lock held) after every write of a step, by either path: the step's
        positions are ``start .. start + num_envs``; ``ended`` (bool ``[num_envs]``) marks
        the rows whose episode ended with it, ``None`` when none did."""

    def _write_transition(self, arrays: list[Any], host: list[np.ndarray],
                          next_obs: list[np.ndarray], ended: np.ndarray) -> None:
        """Write one step (the general path; lock held): ``arrays`` the stored leaves
        (backend arrays, ``[num_envs, ...]``), ``host`` the same as numpy, ``next_obs``
        the next observations' leaves, ``ended`` bool ``[num_envs]``; with the
        side-store bookkeeping of the step and of the step it overwrites."""
        # The common case (the observation is the previous next observation, nothing
        # ends, the overwritten step owns no side observation) costs a few whole-add
        # bytes comparisons; only the rare cases look at rows.
        ring = self._ring
        B, L = ring.batch_size, ring.max_length
        if ring.last_id >= 0 and not self._follows_on(host):
            self._keep_previous_next(host)
        step_id = ring.last_id + 1
        slot = step_id % L
        start = slot * B
        if self._owns[slot]:  # overwritten steps release side observations
            self._release(start, slot)
        codec = self._codec
        if codec is not None:  # the stacks become frame references (validated already)
            arrays = list(arrays)
            arrays[self._codec_leaf], frame_writes = codec.encode(step_id,
                                                                  arrays[self._codec_leaf])
        self._storage.write(start, arrays)
        if codec is not None:  # also releases the side frames of the overwritten steps
            codec.commit(frame_writes, step_id, 1)
        ended_rows = None
        if ended.tobytes() != self._no_ends:
            ended_rows = ended
            self._side_ref[start + self._rows[ended]] = self._put_side(
                step_id, ended, [n[ended] for n in next_obs])
            self._owns[slot] = 1
        for head, new in zip(self._head_next, next_obs):
            head[...] = new
        self._head_raw = None
        ring.last_id = step_id
        self._sampler.on_add(ring, step_id, 1)
        self._written(start, ended_rows)

    def _follows_on(self, host: list[np.ndarray]) -> bool:
        """Whether every row's observation is, byte for byte, the next observation of
        the row's previous step (see :func:`rows_differ`), tested for all rows at once.
        False also when a leaf came in another dtype than the spec's (rows then decide)."""
        for i, head in zip(self._obs_leaves, self._head_next):
            new = host[i]
            if new.dtype is not head.dtype:
                return False
            # Two copies and a memcmp beat any numpy reduction on small arrays; large
            # bytes objects cost fresh pages, so images are compared in place.
            if new.nbytes <= COPY_COMPARE_MAX:
                if new.tobytes() != head.tobytes():
                    return False
            elif rows_differ(new, head).any():
                return False
        return True

    def _keep_previous_next(self, host: list[np.ndarray]) -> None:
        """Keep in the side store the next observation of the previous step in every row
        whose new observation does not follow on from it (an out-of-sequence add, or a
        reset), unless the step keeps one already (it ended)."""
        ring, B = self._ring, self._ring.batch_size
        previous = (ring.last_id % ring.max_length) * B
        unkept = self._side_ref[previous:previous + B] < 0
        if not np.count_nonzero(unkept):  # after an episode end in every row, say
            return
        differs = np.zeros(B, bool)
        for i, head in zip(self._obs_leaves, self._head_next):
            differs |= rows_differ(host[i], head)
        moved = differs & unkept
        if moved.any():
            self._side_ref[previous + self._rows[moved]] = self._put_side(
                ring.last_id, moved, [h[moved] for h in self._head_next])
            self._owns[ring.last_id % ring.max_length] = 1

    def _release(self, start: int, slot: int) -> None:
        """Free the side observations of the steps at positions ``start ..
        start + num_envs`` (slot ``slot``), which are being overwritten."""
        owned = self._side_ref[start:start + self._ring.batch_size]  # a view
        self._side.free(owned[owned >= 0])
        owned[...] = -1
        self._owns[slot] = 0

    def _put_side(self, step_id: int, rows: np.ndarray, leaves: list[np.ndarray]
                  ) -> np.ndarray:
        """Keep next observations (leaves ``[n, *spec.shape]``) of step ``step_id`` in the
        rows where ``rows`` (bool ``[num_envs]``) is set; their side-store slots ``[n]``.

        A deduplicated stack is kept as frame references: the frames it shares with the
        step's own observation are referenced, the rest become side frames owned by the
        step (``step_id`` must be written already)."""
        if self._codec is not None:
            j = self._obs_leaves.index(self._codec_leaf)
            which = np.flatnonzero(rows)
            refs, extras = self._codec.encode_side(np.full(len(which), step_id), which,
                                                   leaves[j])
            self._codec.commit_side(extras)
            leaves = list(leaves)
            leaves[j] = refs
        return self._side.put(leaves)

    def _next_observations(self, positions: np.ndarray, ids: np.ndarray) -> list[Any]:
        """Next observations of the steps at ``positions`` (int64, ids ``ids`` of the same
        shape): the following step's observation, the side store's, or the newest step's
        own. Deduplicated stacks are rebuilt from whichever frame references apply."""
        ring = self._ring
        B = ring.batch_size
        following = (positions + B) % ring.capacity
        out = self._storage.gather(following, self._obs_leaves)
        side = self._side_ref[positions]
        from_side = side >= 0
        newest = ids == ring.last_id
        # Most reads patch nothing, or only a few side observations: count_nonzero costs
        # a fraction of .any() on small arrays, and every masked step is skipped when
        # nothing needs it.
        any_side, any_newest = np.count_nonzero(from_side), np.count_nonzero(newest)
        codec = self._codec
        if codec is None and not (any_side or any_newest):
            return out
        newest &= ~from_side
        patched = []
        for i, leaf, side_leaf, head in zip(self._obs_leaves, out,
                                            self._side.take(side[from_side]),
                                            self._head_next):
            leaf = to_numpy(leaf).copy()
            if any_side:
                leaf[from_side] = side_leaf
            if codec is not None and i == self._codec_leaf:
                # The slot after the newest step holds no successor (an old step, or
                # nothing since a clear): read zero frames there instead of its refs.
                leaf[newest] = -1
                leaf = codec.decode(leaf, positions % B)
            if any_newest:
                leaf[newest] = head[positions[newest] % B]
            patched.append(self._storage.from_numpy(leaf))
        return patched

    def _side_state(self) -> dict[str, Any]:
        """The side observations' checkpoint state, about as large as what is held:
        ``side`` (the side store's), ``side_ref`` int64 ``[n]``: the references up to the
        last one set (the rest are -1; until the ring wraps, the positions written so
        far at most), and ``head_next`` (one ``[num_envs, *spec.shape]`` per leaf).
        ``_owns`` follows from ``side_ref`` and is not written."""
        refs = self._side_ref
        is_set = refs[::-1] >= 0  # the last set entry is the first one from the end
        live = len(refs) - int(is_set.argmax()) if is_set.any() else 0
        return {"side": self._side.state_dict(), "side_ref": refs[:live].copy(),
                "head_next": [h.copy() for h in self._head_next]}

    def _check_side_state(self, state: dict[str, Any]) -> np.ndarray:
        """``state["side_ref"]`` as int64 ``[n]``, checked with the side store's state
        before a restore changes anything.

        Raises:
            CheckpointError: ``side_ref`` is not a vector of at most this buffer's
                positions, or the side store's state is inconsistent.
        """
        refs = np.asarray(state["side_ref"])
        positions = len(self._side_ref)
        if refs.ndim != 1 or len(refs) > positions or \
                (refs.dtype.kind not in "iu" and len(refs)):  # ([] reads as float64)
            raise CheckpointError(f"state side_ref: expected integers [n <= {positions}] "
                                  f"(the buffer's positions), got {refs.dtype} "
                                  f"{list(refs.shape)}")
        try:
            self._side.check_state(state["side"])
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        return refs.astype(np.int64, copy=False)

    def _restore_side(self, state: dict[str, Any], refs: np.ndarray) -> None:
        """Restore :meth:`_side_state` (the lock held; ``refs`` from
        :meth:`_check_side_state`). Positions past ``refs`` (all of them in older saves,
        which wrote every position) own no side observation."""
        self._side.load_state_dict(state["side"])
        self._side_ref[:len(refs)] = refs
        self._side_ref[len(refs):] = -1
        self._owns[:] = (self._side_ref.reshape(len(self._owns), -1) >= 0).any(1).tobytes()
        for head, saved in zip(self._head_next, state["head_next"]):
            head[...] = saved
        self._head_raw = None

    def _clear_state(self) -> None:
        self._side.clear()
        self._side_ref[:] = -1
        self._owns[:] = bytes(len(self._owns))


def rows_differ(new: np.ndarray, head: np.ndarray) -> np.ndarray:
    """bool ``[num_envs]``: rows of ``new`` whose bytes differ from ``head``'s (both
    ``[num_envs, *spec.shape]``). Bytes, not values: -0.0 is not 0.0, and a NaN is
    itself, so a next observation read from the following step is the one added."""
    new = np.ascontiguousarray(new, head.dtype)
    rows = len(head)
    differ: np.ndarray = (new.view(np.uint8).reshape(rows, -1)
                          != head.view(np.uint8).reshape(rows, -1)).any(1)
    return differ
