"""The device's copy of a transition buffer's next-observation bookkeeping.

A transition buffer finds a step's next observation by host bookkeeping
(:mod:`~replaybuffer.buffers.side_observations`): ``side_ref`` (int64 per storage
position: the step's slot in the side store, -1 for none), the side store's rows and
the newest step's own next observation per row (``head_next``). A sample drawn on the
device reads them there, from :class:`DeviceSideMirror`, so that no draw goes back to
the host (which would wait for the device's whole queue).

The mirror is brought up to date at sample time, not by the add path (which stays as
fast as without it): what an add can change is known from the step ids, so a sync
copies only that, host to device, never the other way:

- the ``side_ref`` entries of the steps added since the last sync and of the step
  before them (an add that does not follow on from its row's previous step keeps that
  step's next observation, setting its entry); an add only ever changes those;
- the side store's rows those entries name (a slot's row never changes while a
  position names it; a freed slot handed out again is named by a newer step);
- the ``num_envs`` rows of ``head_next``.

So that a read finds every next observation that is not the following step's with one
lookup, the newest step's entries that name no side slot name its rows of
``head_next`` in the mirror instead (an entry the host never has; an ``n``-step window
that breaks at the newest step breaks where it ends anyway). The next sync copies that
step's entries again from the host.

A ``clear()`` or a restore (the buffer's ``generation`` changes, or :meth:`invalidate`)
and a side store that grew copy everything again. On CUDA every copy is staged in
page-locked memory and issued asynchronously on the current stream, which orders it
before the reads of the same sample and after those of earlier ones on that stream;
reads issued on other streams are waited for on the device (:meth:`after_read`), as
the torch storage orders its writes after its gathers.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

from replaybuffer.storage.memory import InsufficientMemoryError, check_memory
from replaybuffer.storage.stream_reads import PendingReads
from replaybuffer.storage.torch_storage import torch_dtype

if TYPE_CHECKING:
    from replaybuffer.sampling import Ring
    from replaybuffer.storage.side_store import SideStore


class DeviceSideMirror:
    """``side_ref``, the side store's rows and ``head_next`` of a transition buffer, on
    ``device`` (see the module).

    Attributes:
        refs: int64 ``[positions]``: per storage position, the row of :attr:`rows` that
            holds the step's next observation, -1 where it is the following step's
            observation: ``side_ref``, with the newest step's -1 entries naming its
            ``head_next`` rows.
        rows: per observation leaf, ``[side slots + num_envs, *spec.shape]`` in the
            leaf's dtype: the side store's rows (row ``s`` is slot ``s``), then the
            newest step's next observation of each env (row ``side_slots + env``).
        side_slots: the side store's capacity the rows were made for.

    Args:
        ring: the buffer's ring (``last_id``, ``batch_size``, ``max_length`` read at
            every sync).
        side_ref, side, head_next: the buffer's host bookkeeping, read (never written)
            at every sync: ``side_ref`` and ``head_next`` are updated in place by the
            buffer, ``side.arrays`` may be replaced (the store grows).
        device: the torch storage's device.
    """

    def __init__(self, ring: Ring, side_ref: np.ndarray, side: SideStore,
                 head_next: list[np.ndarray], device: torch.device):
        self._ring = ring
        self._side_ref = side_ref
        self._side = side
        self._head_next = head_next
        self.device = device
        self._cuda = device.type == "cuda"
        self.refs = torch.full((len(side_ref),), -1, dtype=torch.int64, device=device)
        self._dtypes = [torch_dtype(h.dtype) for h in head_next]
        self.rows: list[torch.Tensor] = []
        self.side_slots = -1  # no rows yet: the first sync makes them
        self._generation: int | None = None  # None: copy everything at the next sync
        self._synced_id = -1
        # The side slots the newest step named at the last sync (their rows are on the
        # device already: the next sync copies only the slots named since).
        self._synced_slots = np.zeros(0, np.int64)
        # CUDA: the reads since the last copy (a copy waits for them: it may overwrite
        # rows they read).
        self._reads = PendingReads(self.device) if self._cuda else None

    @property
    def nbytes(self) -> int:
        """Bytes the mirror takes on :attr:`device`: :attr:`refs` (8 per position) and
        :attr:`rows` as the next :meth:`sync` makes them (the side store's slots as they
        are now, plus ``num_envs``), whether or not a sync has made them yet."""
        return mirror_nbytes(len(self._side_ref), [h[0] for h in self._head_next],
                             len(self._side.arrays[0]), self._ring.batch_size)

    def invalidate(self) -> None:
        """Copy everything at the next :meth:`sync` (the host state was replaced)."""
        self._generation = None

    def after_read(self) -> None:
        """Mark the reads issued so far on the current CUDA stream: the next copy into
        the mirror waits for them on the device. Nothing on the CPU."""
        if self._reads is not None:
            self._reads.mark()

    def sync(self, generation: int) -> None:
        """Bring the mirror up to date with the host bookkeeping (the buffer's lock
        held); ``generation`` is the buffer's count of clears and restores."""
        last = self._ring.last_id
        slots = len(self._side.arrays[0])
        if generation == self._generation and last == self._synced_id and \
                slots == self.side_slots:
            return
        if self._reads is not None:  # reads on other streams may still use the rows
            self._reads.wait()
        if generation != self._generation:
            self._copy_refs(0, len(self._side_ref), last, slots)
            self._copy_side_rows(slots, None)
        else:
            changed = self._copy_changed_refs(self._synced_id, last, slots)
            if slots != self.side_slots:
                self._copy_side_rows(slots, None)
            elif len(changed):
                self._copy_side_rows(slots, changed)
        self._copy_head()
        self._generation, self._synced_id = generation, last
        start = (last % self._ring.max_length) * self._ring.batch_size
        newest = self._side_ref[start:start + self._ring.batch_size]
        self._synced_slots = newest[newest >= 0]  # a copy (boolean indexing)

    # ------------------------------------------------------------------ copies
    def _copy_changed_refs(self, synced: int, last: int, slots: int) -> np.ndarray:
        """Copy the ``side_ref`` entries of steps ``synced .. last`` (the step synced
        last may have had its entry set since, and was the newest: see the module) for
        a side store of ``slots`` slots; the side slots they name (int64 ``[k]``)."""
        ring = self._ring
        B, L, capacity = ring.batch_size, ring.max_length, ring.capacity
        first = max(synced, 0)
        if last - first + 1 >= L:
            spans = [(0, capacity)]
        else:
            a, b = (first % L) * B, (last % L + 1) * B
            spans = [(a, b)] if a < b else [(a, capacity), (0, b)]
        named = []
        for a, b in spans:
            self._copy_refs(a, b, last, slots)
            refs = self._side_ref[a:b]
            named.append(refs[refs >= 0])
        changed = np.concatenate(named) if len(named) > 1 else named[0]
        # The synced step's slots (still its own unless the ring came round to it,
        # when every span is copied) have their rows on the device already.
        if len(self._synced_slots) and last - first + 1 < L:
            changed = changed[~np.isin(changed, self._synced_slots)]
        return changed

    def _copy_refs(self, a: int, b: int, last: int, slots: int) -> None:
        """Copy the entries of positions ``a .. b``, those of step ``last`` (the newest)
        that name no side slot naming its ``head_next`` rows (after ``slots``)."""
        values = self._side_ref[a:b]
        B = self._ring.batch_size
        newest = (last % self._ring.max_length) * B
        if last >= 0 and a <= newest < b:
            values = values.copy()
            own = values[newest - a:newest - a + B]  # a view
            free = own < 0
            own[free] = slots + np.flatnonzero(free)
        self._upload(self.refs[a:b], values)

    def _copy_side_rows(self, slots: int, which: np.ndarray | None) -> None:
        """Copy the side store's rows at slots ``which`` (int64 ``[k]``), or all of them
        (``None``), into rows made for ``slots`` slots (made anew if it grew)."""
        arrays = self._side.arrays
        if slots != self.side_slots:
            B = self._ring.batch_size
            self.rows = [torch.empty((slots + B,) + a.shape[1:], dtype=dtype,
                                     device=self.device)
                         for a, dtype in zip(arrays, self._dtypes)]
            self.side_slots = slots
        for rows, array in zip(self.rows, arrays):
            if which is None:
                self._upload(rows[:slots], array)
            else:
                index = self._to_device(which)
                rows.index_copy_(0, index, self._to_device(array[which]))

    def _copy_head(self) -> None:
        for rows, head in zip(self.rows, self._head_next):
            self._upload(rows[self.side_slots:], head)

    def _upload(self, target: torch.Tensor, array: np.ndarray) -> None:
        """Copy ``array`` into ``target`` (a contiguous slice of a mirror tensor) without
        waiting for the device (staged in page-locked memory on CUDA)."""
        if len(array):
            target.copy_(self._staged(array), non_blocking=self._cuda)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return self._staged(array).to(self.device, non_blocking=self._cuda)

    def _staged(self, array: np.ndarray) -> torch.Tensor:
        """``array`` as a CPU tensor the copy may read after the caller's array changed:
        on CUDA a page-locked copy (torch's host allocator keeps it until the
        asynchronous copy ran), on the CPU the array itself (the copy runs at once)."""
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor.pin_memory() if self._cuda else tensor


def mirror_nbytes(positions: int, observation: list[np.ndarray], side_slots: int,
                  num_envs: int) -> int:
    """Bytes of a :class:`DeviceSideMirror` of ``positions`` storage positions, a side
    store of ``side_slots`` slots and ``num_envs`` rows, for observations whose leaves
    are like ``observation`` (one observation's arrays, ``[*spec.shape]`` each)."""
    return 8 * positions + (side_slots + num_envs) * sum(a.nbytes for a in observation)


def check_device_memory(nbytes: int, what: str, device: torch.device, strict: bool) -> None:
    """Warn (or, when ``strict``, raise) if ``nbytes`` more on ``device`` exceed what it
    has free: host memory for the CPU (:func:`~replaybuffer.storage.memory.check_memory`),
    the device's free memory for CUDA (``torch.cuda.mem_get_info``); unchecked on other
    devices.

    Raises:
        InsufficientMemoryError: ``strict`` and they do not fit.
    """
    if device.type == "cpu":
        check_memory(nbytes, what, strict)
        return
    if device.type != "cuda":
        return
    free = torch.cuda.mem_get_info(device)[0]
    if nbytes <= free:
        return
    message = (f"{what} needs {nbytes / 2**30:.2f} GiB on {device} but only "
               f"{free / 2**30:.2f} GiB of its memory is free")
    if strict:
        raise InsufficientMemoryError(message)
    warnings.warn(message, ResourceWarning, stacklevel=3)
