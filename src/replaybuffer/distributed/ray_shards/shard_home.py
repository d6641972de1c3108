"""A shard's directory: what must outlive the shard's process so that its next start
can say what it lost and resume where it stood.

- ``incarnation``: a counter, one more per start (ids carry it, so ids from before a
  restart are recognised as stale).
- ``mark``: the ``last_id`` of the last applied write, an int64 in a memory-mapped
  file. A store into a shared file mapping survives the process being killed (the
  page belongs to the kernel's page cache), so a restarted shard knows how many steps
  its checkpoint lacks, whoever wrote them; it costs one memory store per write.
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
        with open(path, "a+b") as fh:
            if fresh or os.path.getsize(path) < 8:
                fh.truncate(8)
                fh.flush()
            self._map = mmap.mmap(fh.fileno(), 8)
        self._mark = np.frombuffer(self._map, np.int64, 1)
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
