"""Crash points: named places where a process can be made to end at once, for the
fault-injection tests.

A crash point is a line in a write, claim, priority, journal or checkpoint path where a
``SIGKILL`` would leave the most to recover. Setting ``REPLAYBUFFER_CRASH_AT=NAME`` (or
``NAME:N``, the N-th time the point is reached) in a process's environment makes it end
there with :data:`CRASH_EXIT_CODE`, through ``os._exit``: no ``finally``, no ``atexit``,
no flush, as a kill would. The tests start a child process with the variable set and
then check what survived (``tests/test_crash_points.py`` and the soak).

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

_reached: dict[str, int] = {}


def crash_point(name: str) -> None:
    """End the process at once (``os._exit(CRASH_EXIT_CODE)``) when :data:`ARMED` names
    ``name`` and this is its N-th time here; otherwise return. Callers test ``ARMED is
    not None`` first so that an unarmed process pays no call."""
    if ARMED is None or ARMED[0] != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] >= ARMED[1]:
        os._exit(CRASH_EXIT_CODE)
