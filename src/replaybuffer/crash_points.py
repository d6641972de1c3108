"""Crash points: named places where a process can be made to end at once, for the
fault-injection tests.

A crash point is a line in a write, claim, priority, journal or checkpoint path where a
``SIGKILL`` would leave the most to recover. Setting ``REPLAYBUFFER_CRASH_AT=NAME`` (or
``NAME:N``, the N-th time the point is reached) in a process's environment makes it end
there with :data:`CRASH_EXIT_CODE`, through ``os._exit``: no ``finally``, no ``atexit``,
no flush, as a kill would. The tests start a child process with the variable set and
then check what survived (``tests/test_crash_points.py`` and the soak).

A process that is started again with the same environment (a Ray shard actor, which
Ray restarts with its ``runtime_env``) would end at the same point every time. With
``REPLAYBUFFER_CRASH_ONCE=FILE`` set too, a process ends at the point only if it is
the first to create ``FILE`` (created as it ends, exclusively); while ``FILE`` exists,
the point is passed. So one crash happens among all the processes sharing the
variables, and a test can hold a point off (create ``FILE``) and arm it later
(remove ``FILE``): for points of a restart, which only a restarted process passes.

Off, a point costs one ``is None`` test: callers write ``if ARMED is not None:
crash_point("...")`` with ``ARMED`` imported from this module (read once, at import),
never a call per step. Every point is listed in :data:`POINTS` with what a crash there
interrupts; an unknown name in the variable is refused at import, so a typo cannot make
a fault-injection test pass by never crashing.
"""

from __future__ import annotations

import os

CRASH_EXIT_CODE = 86
"""The exit status of a process ended at a crash point."""

POINTS: dict[str, str] = {
    "mmap.journal.recreate": "an mmap journal file just emptied, before its header is "
                             "written",
    "shared.claim": "a shared buffer's rows just marked as this process's, under the "
                    "lock, before the claim returns",
    "shared.write.uncount": "a full row's oldest step counted out of a shared buffer's "
                            "held count, before its odd version marks it being "
                            "overwritten",
    "shared.write.data": "a shared buffer's step written (data copied, versions odd), "
                         "before it is published",
    "shared.write.frames": "a frame-dedup shared buffer's step's newest frames written "
                           "to its rows' frame ring (versions odd), before their frame "
                           "ids and side frames",
    "shared.write.publish": "a shared buffer's step versions published (even), before "
                            "its row heads and held counts move",
    "shared.priorities.update": "a shared sum tree's leaves set (a step hidden or "
                                "published, or update_priorities), before their "
                                "ancestors are recomputed",
    "shared.clear.floors": "a SharedReplayBuffer.clear() with the rows' floors moved "
                           "and priorities zeroed, before held counts are zeroed",
    "shared.save.publish": "a SharedReplayBuffer.save() with every file of the new "
                           "checkpoint written, before it is renamed into the series",
    "checkpoint.write.manifest": "a checkpoint's data and state files written and synced "
                                 "under its temporary name, before its manifest",
    "checkpoint.publish.before_rename": "a complete checkpoint, before its temporary "
                                        "directory is renamed to the next ckpt-N",
    "checkpoint.prune.renamed": "an old checkpoint renamed aside for pruning, before it "
                                "is removed",
    "ray.applied.pending": "a Ray shard's pending record of a writer's applied chunk "
                           "stored (its number and the mark it brings), before the "
                           "mark",
    "ray.applied.mark": "a Ray shard's mark (last_id) stored for a writer's applied "
                        "chunk, before the writer's record of it",
    "ray.held.copy": "a Ray shard's new record of the chunks it holds for a writer "
                     "written into the spare copy, before the selector switches to it",
    "ray.start.record": "a restarting Ray shard's redo record (its loss count and "
                        "restored last_id) stored, before its valid flag",
    "ray.start.forget_held": "a restarting Ray shard's loss count stored (undelivered), "
                             "before the held records it counted are forgotten",
    "ray.start.settle": "a restarting Ray shard's pending record folded into its "
                        "writer's record, before the pending record is cleared",
    "ray.start.mark": "a restarting Ray shard's mark moved to its restored last_id, "
                      "before its redo record is cleared",
}
"""Every crash point, by name, with the moment it interrupts."""


def parse(value: str | None) -> tuple[str, int] | None:
    """``NAME`` or ``NAME:N`` as ``(NAME, N)`` (N >= 1; 1 when absent); ``None`` for an
    empty or missing value.

    Raises:
        ValueError: NAME is not in :data:`POINTS`, or N is not a positive integer.
    """
    if not value:
        return None
    name, sep, count = value.partition(":")
    if name not in POINTS:
        raise ValueError(f"REPLAYBUFFER_CRASH_AT names {name!r}, which is not a crash "
                         f"point; known: {', '.join(sorted(POINTS))}")
    if sep and not (count.isdigit() and int(count) > 0):
        raise ValueError(f"REPLAYBUFFER_CRASH_AT={value!r}: the count after ':' must be "
                         f"a positive integer, got {count!r}")
    return name, int(count) if sep else 1


ARMED = parse(os.environ.get("REPLAYBUFFER_CRASH_AT"))
"""The armed point and how many times it is reached before the process ends, from
``REPLAYBUFFER_CRASH_AT`` at import; ``None`` (production): every point is inert."""

ONCE = os.environ.get("REPLAYBUFFER_CRASH_ONCE") or None
"""The file whose exclusive creation a crash needs (``REPLAYBUFFER_CRASH_ONCE``, see
the module docstring); ``None``: every process that reaches the point ends there."""

_reached: dict[str, int] = {}


def crash_point(name: str) -> None:
    """End the process at once (``os._exit(CRASH_EXIT_CODE)``) when :data:`ARMED` names
    ``name`` and this is its N-th time here; otherwise return. Callers test ``ARMED is
    not None`` first so that an unarmed process pays no call."""
    if ARMED is None or ARMED[0] != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] >= ARMED[1] and first_to_crash():
        os._exit(CRASH_EXIT_CODE)


def first_to_crash() -> bool:
    """Whether this process may end: no :data:`ONCE` file, or this process created it
    (exclusively: of processes racing to it, one ends)."""
    if ONCE is None:
        return True
    try:
        os.close(os.open(ONCE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True
