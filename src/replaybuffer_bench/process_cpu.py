"""CPU time of the processes a Ray bench runs on: the learner (this process), the
shards, the collectors, and Ray's own (GCS, raylet, idle workers), read from Linux's
``/proc`` (elsewhere every figure is ``None``).

A process's CPU is the sum over its threads of ``/proc/PID/task/TID/schedstat``'s
first field (nanoseconds on a CPU, exact, where ``/proc/PID/stat``'s ticks are 10 ms
coarse). Ray's processes are found by their command lines (``ray::...`` workers,
``gcs_server``, ``raylet``, Ray's dashboard and log agents).
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


def ray_processes(exclude: set[int]) -> list[int]:
    """The ids of this machine's Ray processes (workers, GCS, raylet, agents), but
    those in ``exclude``."""
    found = []
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        if command.startswith("ray::") or "/ray/" in command or "gcs_server" in command \
                or "raylet" in command:
            found.append(int(entry.name))
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
