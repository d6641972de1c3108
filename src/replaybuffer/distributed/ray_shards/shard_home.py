"""A shard's directory: what must outlive the shard's process so that its next start
can say what it lost and resume where it stood.

- ``incarnation``: a counter, one more per start (ids carry it, so ids from before a
  restart are recognised as stale).
- ``mark``: the ``last_id`` of the last applied write, an int64 in a memory-mapped
  file. A store into a shared file mapping survives the process being killed (the
  page belongs to the kernel's page cache), so a restarted shard knows how many steps
  its checkpoint lacks, whoever wrote them; it costs one memory store per write. The
  same file holds, per writer (up to :data:`WRITER_SLOTS`), the number of the newest
  chunk of its writes applied: a writer whose chunk was lost on its way back (the
  process died after applying it, before answering) reports it lost, and the next
  process counts it only if no process before it applied it (the mark counts it
  otherwise); whether round-robin writes came since the last clear (windows over
  them are refused); and, per writer, the chunks the process holds (come ahead of an
  earlier one, see :mod:`.ordering`): the next process counts their steps lost at its
  start (:meth:`ShardHome.take_held`), so a writer that never calls again still has
  its loss in the client's ``losses``, and not again when the writer reports them.
- ``limiter/<last_id>.json``: the rate limiter's counters saved with each checkpoint
  (checkpoints save the buffer, not its limiter), restored with it.

The directory is ``checkpoint_dir/shard-NNN`` with a checkpoint directory, else one
under the system's temporary directory named by the buffer (removed at close).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

INCARNATIONS = 0x7FFF
"""Incarnations wrap after this many starts (ids carry them in 15 bits)."""

WRITER_SLOTS = 256
"""Writers whose applied chunks the mark file records; chunks of further writers
reported lost are counted whether or not they were applied."""

_MARK_WORDS = 2 + 2 * WRITER_SLOTS
"""int64 words of the mark file: the mark, whether round-robin writes came (1) since
the shard was last cleared, then per slot the writer's key (0: a free slot) and ``1 +``
its newest applied chunk's number (0: none)."""
_HELD_WORDS = 3 * WRITER_SLOTS
"""int64 words after those: per slot, the chunks the process holds for the writer:
``origin``, a mask (bit ``j``: chunk ``origin + j`` is held) and their steps. Files of
an earlier layout grow with zeros: nothing held."""
HELD_SPAN = 63
"""Held chunks recorded per writer: those within this many numbers of its first held
one (a writer's chunks in flight are far fewer); one further out is left to the
writer's own report."""


class ShardHome:
    """The files of one shard under ``home`` (created if missing).

    Args:
        home: the shard's directory.
        temporary: whether :meth:`remove` may delete it (no checkpoint directory).
    """

    def __init__(self, home: Path, temporary: bool):
        self.home = home
        self.temporary = temporary
        home.mkdir(parents=True, exist_ok=True)
        path = home / "mark"
        fresh = not path.exists()
        size = 8 * (_MARK_WORDS + _HELD_WORDS)
        with open(path, "a+b") as fh:
            if fresh or os.path.getsize(path) < size:
                fh.truncate(size)  # zeros past a shorter file: no writer recorded
                fh.flush()
            self._map = mmap.mmap(fh.fileno(), size)
        words = np.frombuffer(self._map, np.int64, _MARK_WORDS + _HELD_WORDS)
        self._mark = words[:1]
        self._round_robin = words[1:2]
        self._writers = words[2:_MARK_WORDS].reshape(WRITER_SLOTS, 2)
        self._held = words[_MARK_WORDS:].reshape(WRITER_SLOTS, 3)
        self._slots: dict[int, int] = {}
        if fresh:
            self._mark[0] = -1

    def next_incarnation(self) -> int:
        """1, 2, 3, ... per call (a counter file, replaced atomically); after
        :data:`INCARNATIONS` it wraps to 1."""
        counter = self.home / "incarnation"
        value = int(counter.read_text()) + 1 if counter.exists() else 1
        tmp = counter.with_suffix(".tmp")
        tmp.write_text(str(value))
        os.replace(tmp, counter)
        return (value - 1) % INCARNATIONS + 1

    @property
    def mark(self) -> int:
        """The ``last_id`` the shard had applied when it last wrote (-1: none)."""
        return int(self._mark[0])

    @mark.setter
    def mark(self, last_id: int) -> None:
        self._mark[0] = last_id

    @property
    def round_robin(self) -> bool:
        """Whether the shard holds steps of round-robin writes (whose rows' consecutive
        steps went to other shards too) since it was last cleared."""
        return bool(self._round_robin[0])

    @round_robin.setter
    def round_robin(self, value: bool) -> None:
        self._round_robin[0] = int(value)

    def applied(self) -> dict[int, int]:
        """Per writer key (:func:`writer_key`), the number of the newest chunk of its
        writes any process of this shard applied (writers not recorded are absent)."""
        return {int(key): int(seq) - 1 for key, seq in self._writers if seq}

    def _slot(self, writer: int) -> int | None:
        """``writer``'s slot, taken if it has none (``None``: every slot is taken)."""
        slot = self._slots.get(writer)
        if slot is None:
            keys = self._writers[:, 0]
            found = np.flatnonzero(keys == writer)
            free = np.flatnonzero(keys == 0)
            if len(found):
                slot = int(found[0])
            elif len(free):
                slot = int(free[0])
                self._writers[slot, 0] = writer
            else:
                return None
            self._slots[writer] = slot
        return slot

    def record_applied(self, writer: int, seq: int) -> None:
        """Record that the chunks of ``writer`` (a :func:`writer_key`) up to ``seq``
        are applied: one memory store (a slot is found once per writer)."""
        slot = self._slot(writer)
        if slot is None:
            return  # no room: this writer's lost chunks are counted in full
        self._writers[slot, 1] = max(int(self._writers[slot, 1]), seq + 1)

    def record_held(self, writer: int, held: dict[int, int]) -> None:
        """Record the chunks of ``writer`` this process holds: ``held`` maps each
        one's number to its steps (empty: none). Those more than :data:`HELD_SPAN`
        past the first are not recorded (the writer reports them)."""
        slot = self._slot(writer) if held else self._slots.get(writer)
        if slot is None:
            return
        row = self._held[slot]
        if not held:
            if row[1]:
                row[:] = 0
            return
        origin = min(held)
        mask = steps = 0
        for seq, count in held.items():
            if seq - origin < HELD_SPAN:
                mask |= 1 << (seq - origin)
                steps += count
        row[0], row[1], row[2] = origin, mask, steps

    def take_held(self) -> dict[int, tuple[set[int], int]]:
        """Per writer key, the chunks an earlier process held (their numbers and
        steps), forgotten here: the caller counts them once."""
        out: dict[int, tuple[set[int], int]] = {}
        for slot in np.flatnonzero(self._held[:, 1]):
            origin, mask, steps = (int(v) for v in self._held[slot])
            seqs = {origin + j for j in range(HELD_SPAN) if mask >> j & 1}
            out[int(self._writers[slot, 0])] = (seqs, steps)
            self._held[slot] = 0
        return out

    def forget_applied(self) -> None:
        """Forget every writer's record (a clear starts the shard afresh)."""
        self._writers[:] = 0
        self._held[:] = 0
        self._slots.clear()

    def save_limiter(self, last_id: int, state: dict[str, Any], keep: int) -> None:
        """Save a limiter's counters for the checkpoint of ``last_id``; keep the
        newest ``keep`` files (as checkpoints are kept)."""
        folder = self.home / "limiter"
        folder.mkdir(exist_ok=True)
        tmp = folder / f"{last_id}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, folder / f"{last_id}.json")
        saved = sorted(int(p.stem) for p in folder.glob("*.json"))
        for old in saved[:-keep]:
            (folder / f"{old}.json").unlink(missing_ok=True)

    def limiter_state(self, last_id: int) -> dict[str, Any] | None:
        """The counters saved with the checkpoint of ``last_id`` (``None``: none)."""
        path = self.home / "limiter" / f"{last_id}.json"
        if not path.exists():
            return None
        state: dict[str, Any] = json.loads(path.read_text())
        return state

    def remove(self) -> None:
        """Delete the directory if it is a temporary one (no checkpoint directory)."""
        if self.temporary:
            shutil.rmtree(self.home, ignore_errors=True)


def writer_key(writer: str) -> int:
    """A writer's name (16 hex digits) as the int64 the mark file stores (never 0)."""
    key = int(np.array(int(writer, 16) & (2**64 - 1), np.uint64).view(np.int64))
    return key or 1
