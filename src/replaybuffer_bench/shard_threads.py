"""Where a shard process's CPU goes, thread by thread (Linux ``/proc``): the thread of
its ``writes`` concurrency group (chunks applied, with their arguments unpickled),
the threads that answer its default group's calls (draws, and the few ``describe``
and ``mass_status`` calls: the answers pickled there too), its main thread (Ray's
task loop, which takes the GIL every 10 ms to check for signals whatever the actor
does) and Ray's own C++ threads (gRPC, the io loop that sends and receives every
call's bytes, timers).

A shard's threads are told apart by asking the actor: ``__ray_call__`` run in the
``writes`` and ``priorities`` groups answers those groups' one thread each; the other
threads named after the actor's process (``ray::ShardActor``) are the default group's.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

PROC = Path("/proc")
ROLES = ("writes", "calls", "main", "ray")
"""The parts of a shard's CPU: the writes thread, the default group's threads (draws
and questions; the ``priorities`` thread is counted here too), the main thread, Ray's
C++ threads."""


def native_thread(_actor: Any) -> int:
    """The id of the thread this runs on (sent to an actor by ``__ray_call__``)."""
    return threading.get_native_id()


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Per thread of process ``pid``: its name (``comm``) and the CPU seconds it has
    run (``schedstat``); empty without ``/proc`` or once the process is gone."""
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return {}
    out = {}
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
            out[int(task.name)] = (name, int((task / "schedstat").read_text().split()[0])
                                   / 1e9)
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out


def role_of(tid: int, name: str, pid: int, writes: int, main_name: str) -> str:
    """The role (one of :data:`ROLES`) of thread ``tid`` named ``name`` in shard
    process ``pid`` whose writes thread is ``writes`` and whose main thread is named
    ``main_name``."""
    if tid == pid:
        return "main"
    if tid == writes:
        return "writes"
    return "calls" if name == main_name else "ray"


class ShardThreadMeter:
    """CPU seconds each role of :data:`ROLES` spends in a set of shard processes between
    :meth:`start` and :meth:`stop`, summed over the shards.

    Args:
        shards: ``(pid, writes thread id)`` per shard (:func:`shard_threads`).
    """

    def __init__(self, shards: list[tuple[int, int]]):
        self.shards = shards
        self._start: dict[tuple[int, int], float] = {}
        self.spent: dict[str, float] | None = None

    def _read(self) -> dict[tuple[int, int], tuple[str, float]]:
        out = {}
        for pid, writes in self.shards:
            threads = thread_cpu(pid)
            main_name = threads.get(pid, ("", 0.0))[0]
            for tid, (name, seconds) in threads.items():
                out[(pid, tid)] = (role_of(tid, name, pid, writes, main_name), seconds)
        return out

    def start(self) -> None:
        self._start = {key: seconds for key, (_, seconds) in self._read().items()}

    def stop(self) -> None:
        """Note each role's CPU since :meth:`start` (threads that started meanwhile count
        from 0; ``None`` without ``/proc``)."""
        now = self._read()
        if not now:
            self.spent = None
            return
        spent = dict.fromkeys(ROLES, 0.0)
        for key, (role, seconds) in now.items():
            spent[role] += seconds - self._start.get(key, 0.0)
        self.spent = spent


def shard_threads(actors: list[Any], pids: list[int]) -> list[tuple[int, int]]:
    """``(pid, writes thread id)`` of each shard actor (``pids``: their processes)."""
    import ray

    refs = [actor.__ray_call__.options(concurrency_group="writes").remote(native_thread)
            for actor in actors]
    return list(zip(pids, ray.get(refs)))
