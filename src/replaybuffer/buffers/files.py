"""The file life cycle of a buffer whose storage lives on files (``storage="mmap"``).

A new buffer writes its state at once (:meth:`FileLifeCycle._files_ready`), so that a
process killed before any flush can still be reopened; :meth:`FileLifeCycle.flush`
``msync`` s the data files and writes the state beside them; :meth:`FileLifeCycle.close`
gives the files up; after a reopen, :meth:`FileLifeCycle.catch_up` takes in the steps the
files committed since the last flush. Other storages keep nothing on disk, and each of
these does nothing for them. The files themselves are
:mod:`replaybuffer.storage.mmap_storage`'s; the state file is :mod:`replaybuffer.persist`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from replaybuffer.buffers.wiring import BufferParts
from replaybuffer.persist import save_state

if TYPE_CHECKING:
    from typing_extensions import Self

    from replaybuffer.buffers.base import ReplayBuffer
    from replaybuffer.storage.mmap_storage import MmapStorage


class FileLifeCycle(BufferParts):
    """``flush``, ``close`` (and the buffer as a context manager that closes it),
    :meth:`_files_ready` at the end of constructors, and :meth:`catch_up` after a
    reopen (which records episode starts read back from the files)."""

    def flush(self) -> None:
        """With ``storage="mmap"``: ``msync`` the data files, then write the buffer's state
        (ids, sampler generator, priorities, cursors, episode index) to ``path/state``,
        atomically, so :func:`replaybuffer.reopen` resumes from here even after a power
        loss. Other storages keep nothing on disk: nothing to do.
        """
        if self._storage.kind == "mmap":
            save_state(cast("ReplayBuffer", self))  # (a part of a ReplayBuffer)

    def close(self) -> None:
        """With ``storage="mmap"``: :meth:`flush`, then give the files up (they stay
        mapped for reads until the buffer is garbage collected; writes are refused).
        Other storages: nothing to do."""
        self.flush()
        if self._storage.kind == "mmap":
            with self._lock:
                cast("MmapStorage", self._storage).release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _files_ready(self) -> None:
        """The end of a constructor that takes ``path``: a new mmap buffer writes its
        state at once, so that even a process killed before any flush can be reopened."""
        if self._storage.kind == "mmap" and not cast("MmapStorage", self._storage).reopening:
            self.flush()

    def catch_up(self, last_id: int, stale: bool) -> None:
        """After a reopen restored the state of the last flush: take in the steps the
        files committed since (``last_id`` is the files'), as adds would have. ``stale``:
        the buffer was cleared after that flush, so its state describes other data."""
        ring = self._ring
        with self._lock:
            first = ring.last_id + 1
            if stale or last_id < ring.last_id:
                self._sampler.on_clear(ring)
                if self._episodes is not None:
                    self._episodes.clear()
                ring.last_id, first = -1, 0
            if last_id < first:
                return
            ring.last_id = last_id
            self._sampler.on_add(ring, first, last_id - first + 1)
            if self._episodes is not None:  # episode starts, read back from the step types
                self._record_stored_episodes(first, last_id)

