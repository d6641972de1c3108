"""CPU time of the processes a Ray bench runs on: the learner (this process), the
shards, the collectors, and Ray's own (GCS, raylet, idle workers: the processes the
driver's ``ray.init`` started), read from Linux's ``/proc`` (elsewhere every figure is
``None``).

A process's CPU is the sum over its threads of ``/proc/PID/task/TID/schedstat``'s
first field (nanoseconds on a CPU, exact, where ``/proc/PID/stat``'s ticks are 10 ms
coarse).
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds the threads of process ``pid`` have run (``None``: no ``/proc``, or
    the process is gone)."""
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return None
    total = 0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def descendants(pid: int) -> list[int]:
    """The ids of every process below ``pid`` (its children, theirs...): for a driver
    that started its Ray cluster with ``ray.init``, the GCS, the raylet and every
    worker, and none of another job's cluster on the same machine."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in PROC.iterdir() if e.name.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class CpuMeter:
    """CPU seconds processes spend between :meth:`start` and :meth:`stop`.

    Args:
        pids: the processes watched.
    """

    def __init__(self, pids: list[int]):
        self.pids = list(pids)
        self._start: dict[int, float | None] = {}
        self._spent: dict[int, float] = {}

    def start(self) -> None:
        self._start = {pid: cpu_seconds(pid) for pid in self.pids}

    def stop(self) -> None:
        """Note each process's CPU since :meth:`start` (one that ended meanwhile, or
        without ``/proc``: none)."""
        self._spent = {}
        for pid, before in self._start.items():
            after = cpu_seconds(pid)
            if before is not None and after is not None:
                self._spent[pid] = after - before

    def spent(self, pids: list[int] | set[int]) -> float | None:
        """CPU seconds of ``pids`` (those watched) between :meth:`start` and
        :meth:`stop`; ``None`` when none of them could be read."""
        read = [self._spent[pid] for pid in pids if pid in self._spent]
        return sum(read) if read else None
