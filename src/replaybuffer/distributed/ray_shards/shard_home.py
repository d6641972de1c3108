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
  start, so a writer that never calls again still has its loss in the client's
  ``losses``, and not again when the writer reports them.
- The mark and a writer's record move together (:meth:`ShardHome.record_applied`):
  the chunk's number and the mark it brings are stored first as the writer's
  *pending* record, then the mark, then the writer's record. A process killed between
  any two of these stores leaves a chunk either counted by the mark and known applied
  (its pending mark is at most the mark), or in neither (the writer's report counts
  it): never counted twice, never missed.
- ``undelivered``: the steps lost that the client has not yet acknowledged holding
  (a process's count lives in its memory and reaches the client in answers, which
  may die with it; the client acknowledges what it recorded, see
  :meth:`~.shard.ShardActor.acknowledge`), carried by the next process if this one
  dies first.
- A start is one redo record (:meth:`ShardHome.begin_start`): it counts its loss
  (``undelivered`` + the mark past its checkpoint + the held steps), stores that count
  and the ``last_id`` it restored in a record of its own, then the record's valid flag;
  only then does it store ``undelivered``, forget the held records, settle the pending
  ones and move the mark, and last clears the flag. Each of those stores is
  idempotent given the record (it stores a value the record fixes, or clears
  something), so a start that finds the flag set first makes them all again from the
  record (:meth:`ShardHome.finish_start`) and only then counts: a kill before the flag
  leaves the files as they were (the next start counts from scratch, once); a kill at
  or after it leaves a record the next start completes, so the killed start's count
  is carried, never counted again. A kill inside the record, before its flag, tears
  nothing either: the flag is stored last.
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
import sys
from pathlib import Path
from typing import Any

import numpy as np

from replaybuffer.crash_points import ARMED, crash_point

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
_PENDING_WORDS = 1 + 2 * WRITER_SLOTS
"""int64 words after those: the steps lost no client was shown (``undelivered``), then
per slot the writer's pending record: ``1 +`` the chunk's number (0: none) and the
mark its application brings. Files of an earlier layout grow with zeros: nothing
pending, nothing undelivered."""
_COPY_WORDS = 4 * WRITER_SLOTS
"""int64 words after those: per slot a second copy of the held record (3 words), then
per slot which copy holds the record (0: the first). A new record is written whole
into the copy not in use, then one store switches to it, so a kill never leaves a
torn record. Files of an earlier layout grow with zeros: the first copy."""
_START_WORDS = 3
"""int64 words after those: the record of a start in progress (its redo record): the
``undelivered`` it counted, the ``last_id`` it restored, then ``1`` while it is valid
(stored last, cleared once the start's stores are all made). Files of an earlier
layout grow with zeros: no start in progress."""
_PENDING_AT = _MARK_WORDS + _HELD_WORDS + 1
_COPY_AT = _MARK_WORDS + _HELD_WORDS + _PENDING_WORDS
_CHOICE_AT = _COPY_AT + 3 * WRITER_SLOTS
_START_AT = _COPY_AT + _COPY_WORDS
_WORDS = _START_AT + _START_WORDS
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
        size = 8 * _WORDS
        with open(path, "a+b") as fh:
            if fresh or os.path.getsize(path) < size:
                fh.truncate(size)  # zeros past a shorter file: no writer recorded
                fh.flush()
            self._map = mmap.mmap(fh.fileno(), size)
        self._words = words = np.frombuffer(self._map, np.int64, _WORDS)
        self._mark = words[:1]
        self._round_robin = words[1:2]
        self._writers = words[2:_MARK_WORDS].reshape(WRITER_SLOTS, 2)
        self._held = words[_MARK_WORDS:_MARK_WORDS + _HELD_WORDS].reshape(WRITER_SLOTS, 3)
        self._pending = words[_PENDING_AT:_COPY_AT].reshape(WRITER_SLOTS, 2)
        self._choice = words[_CHOICE_AT:]
        self._slots: dict[int, int] = {}
        if fresh:
            self._mark[0] = -1

    def store(self, index: int, value: int) -> None:
        """Store ``value`` into int64 word ``index`` of the file: the unit a kill
        cannot tear. Every store that orders the mark and the records goes through
        here, so a test can model a process killed after any one of them."""
        self._words[index] = value

    @property
    def undelivered(self) -> int:
        """Steps lost the client has not acknowledged yet (see the module docstring)."""
        return int(self._words[_MARK_WORDS + _HELD_WORDS])

    @undelivered.setter
    def undelivered(self, steps: int) -> None:
        self.store(_MARK_WORDS + _HELD_WORDS, steps)

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
        self.store(0, last_id)

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
        writes any process of this shard applied and counted in the mark (writers not
        recorded are absent): a pending record whose mark is at most the mark counts
        (the process died after storing the mark, before the writer's record)."""
        mark = self.mark
        out = {}
        for slot in np.flatnonzero(self._writers[:, 0]):
            key, seq = (int(v) for v in self._writers[slot])
            pending, at = (int(v) for v in self._pending[slot])
            if pending and at <= mark:
                seq = max(seq, pending)
            if seq:
                out[key] = seq - 1
        return out

    def settle_pending(self) -> None:
        """Fold each writer's pending record into its record where the mark counts it,
        and forget the rest: before a start moves the mark (down to its checkpoint),
        which would leave a counted pending record looking uncounted. Each slot is
        made whole before its pending record goes, so a kill here changes nothing."""
        mark = self.mark
        for slot in np.flatnonzero(self._pending[:, 0]):
            pending, at = (int(v) for v in self._pending[slot])
            if at <= mark and pending > int(self._writers[slot, 1]):
                self.store(2 + 2 * slot + 1, pending)
            if ARMED is not None:
                crash_point("ray.start.settle")
            self.store(_PENDING_AT + 2 * slot, 0)

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

    def record_applied(self, writer: int | None, seq: int, mark: int) -> None:
        """Record that the chunks of ``writer`` (a :func:`writer_key`; ``None``: the
        writes of no writer) up to ``seq`` are applied, and the ``mark`` (``last_id``)
        they bring: the writer's pending record (the mark, then the number), the mark,
        then the writer's record, four memory stores (no file sync; a slot is found
        once per writer). See the module docstring for why this order is exact."""
        slot = None if writer is None else self._slot(writer)
        if slot is None:  # no room: this writer's lost chunks are counted in full
            self.store(0, mark)
            return
        pending = _PENDING_AT + 2 * slot
        self.store(pending + 1, mark)
        self.store(pending, seq + 1)
        if ARMED is not None:
            crash_point("ray.applied.pending")
        self.store(0, mark)
        if ARMED is not None:
            crash_point("ray.applied.mark")
        if seq + 1 > int(self._writers[slot, 1]):
            self.store(2 + 2 * slot + 1, seq + 1)

    def record_held(self, writer: int, held: dict[int, int]) -> None:
        """Record the chunks of ``writer`` this process holds: ``held`` maps each
        one's number to its steps (empty: none). Those more than :data:`HELD_SPAN`
        past the first are not recorded (the writer reports them)."""
        slot = self._slot(writer) if held else self._slots.get(writer)
        if slot is None:
            return
        if not held:
            at = self._held_at(slot)
            if self._words[at + 1]:
                self.store(at + 1, 0)  # no mask: nothing held (one store)
            return
        origin = min(held)
        mask = steps = 0
        for seq, count in held.items():
            if seq - origin < HELD_SPAN:
                mask |= 1 << (seq - origin)
                steps += count
        choice = 1 - int(self._choice[slot])
        at = (_MARK_WORDS if choice == 0 else _COPY_AT) + 3 * slot
        self.store(at, origin)
        self.store(at + 1, mask)
        self.store(at + 2, steps)
        if ARMED is not None:
            crash_point("ray.held.copy")
        self.store(_CHOICE_AT + slot, choice)

    def _held_at(self, slot: int) -> int:
        """The first word of ``slot``'s held record in use."""
        return (_COPY_AT if self._choice[slot] else _MARK_WORDS) + 3 * slot

    def held(self) -> dict[int, tuple[set[int], int]]:
        """Per writer key, the chunks an earlier process held: their numbers and
        steps."""
        out: dict[int, tuple[set[int], int]] = {}
        for slot in np.flatnonzero(self._writers[:, 0]):
            at = self._held_at(int(slot))
            origin, mask, steps = (int(v) for v in self._words[at:at + 3])
            if mask:
                seqs = {origin + j for j in range(HELD_SPAN) if mask >> j & 1}
                out[int(self._writers[slot, 0])] = (seqs, steps)
        return out

    @property
    def start_record(self) -> tuple[int, int] | None:
        """``(undelivered, last_id)`` of a start killed before it cleared its record
        (``None``: none is in progress)."""
        if not self._words[_START_AT + 2]:
            return None
        return int(self._words[_START_AT]), int(self._words[_START_AT + 1])

    def begin_start(self, undelivered: int, last_id: int) -> None:
        """Store a start's outcome (the loss it counted, the ``last_id`` it restored)
        as its redo record, the valid flag last, then make the start's stores
        (:meth:`finish_start`). See the module docstring."""
        self.store(_START_AT, undelivered)
        self.store(_START_AT + 1, last_id)
        if ARMED is not None:
            crash_point("ray.start.record")
        self.store(_START_AT + 2, 1)
        self.finish_start()

    def finish_start(self) -> None:
        """Make the stores of the start whose record is valid, each idempotent given
        it: ``undelivered``, the held records forgotten, the pending ones settled, the
        mark moved to the restored ``last_id``; then clear the record (nothing if none
        is valid). A start that finds a record calls it before it counts."""
        record = self.start_record
        if record is None:
            return
        undelivered, last_id = record
        self.undelivered = undelivered
        self.forget_held()
        self.settle_pending()
        self.mark = last_id
        if ARMED is not None:
            crash_point("ray.start.mark")
        self.store(_START_AT + 2, 0)

    def forget_held(self) -> None:
        """Forget every held record (one store each: its mask). A start calls it once
        its record holds the loss it counted from them (:meth:`finish_start`)."""
        if ARMED is not None:
            crash_point("ray.start.forget_held")
        for slot in np.flatnonzero(self._writers[:, 0]):
            at = self._held_at(int(slot))
            if self._words[at + 1]:
                self.store(at + 1, 0)

    def take_held(self) -> dict[int, tuple[set[int], int]]:
        """:meth:`held`, then :meth:`forget_held`: the caller counts them once."""
        out = self.held()
        self.forget_held()
        return out

    def forget_applied(self) -> None:
        """Forget every writer's record (a clear starts the shard afresh)."""
        self._writers[:] = 0
        self._held[:] = 0
        self._pending[:] = 0
        self._words[_COPY_AT:] = 0
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

    def forget_limiters(self) -> None:
        """Delete every saved limiter counter file: a clear starts the checkpoint series'
        ids again from -1, and the old files' higher ids would otherwise outrank (and
        prune) the counters saved with the cleared buffer's checkpoints."""
        for path in (self.home / "limiter").glob("*.json"):
            path.unlink(missing_ok=True)

    def limiter_state(self, last_id: int) -> dict[str, Any] | None:
        """The counters saved with the checkpoint of ``last_id`` (``None``: none)."""
        path = self.home / "limiter" / f"{last_id}.json"
        if not path.exists():
            return None
        state: dict[str, Any] = json.loads(path.read_text())
        return state

    def remove(self) -> None:
        """Delete the directory if it is a temporary one (no checkpoint directory).
        Removes all it can; what it could not is an ``OSError`` naming the first path
        and cause and how many failed (the buffer's ``close`` warns with it). Gone
        already is fine: a second call does nothing."""
        if not self.temporary:
            return
        failed: list[tuple[str, BaseException]] = []

        def note(_function: Any, path: str, info: Any) -> None:
            # Gone already is fine; a path rmtree fails on twice (its listing, then
            # its removal) is counted once.
            if not isinstance(info[1], FileNotFoundError) and \
                    all(path != seen for seen, _ in failed):
                failed.append((path, info[1]))
        if sys.version_info >= (3, 12):  # onerror is deprecated there (a warning a call)
            shutil.rmtree(self.home, onexc=lambda f, p, e: note(f, p, (type(e), e, None)))
        else:
            shutil.rmtree(self.home, onerror=note)
        if failed:
            path, cause = failed[0]
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            raise OSError(f"could not remove {path}{more}: {type(cause).__name__}: "
                          f"{cause}")


def writer_key(writer: str) -> int:
    """A writer's name (16 hex digits) as the int64 the mark file stores (never 0)."""
    key = int(np.array(int(writer, 16) & (2**64 - 1), np.uint64).view(np.int64))
    return key or 1
