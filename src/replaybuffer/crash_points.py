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

A process whose points are armed and re-armed while it runs (a Ray shard reused across
several faults, whose environment is fixed when it starts) sets
``REPLAYBUFFER_CRASH_ARMING=FILE`` instead of ``REPLAYBUFFER_CRASH_AT``: the points
are then read from ``FILE`` at every pass, one ``NAME`` or ``NAME:N`` a line (blank
lines and ``#`` lines aside; no file or no such line: nothing armed). The first line
is armed, its N passes counted from the moment the process first sees the file as it
is now; the process that ends there first takes the line out (of processes racing to
it, one does), so the next line is armed from then on: a sequence of points ends one
process each, in order (a shard's process, then its restart, then the next...).
:func:`arm` writes such a file whole, with a fresh ``#`` line so that arming the same
points again starts their counts afresh; :func:`still_armed` reads what is left.
``REPLAYBUFFER_CRASH_ONCE`` works with it as with the variable (one crash in all).

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


ARMING = os.environ.get("REPLAYBUFFER_CRASH_ARMING") or None
"""The file that names the armed point at each pass (``REPLAYBUFFER_CRASH_ARMING``, see
the module docstring); ``None``: the point is ``REPLAYBUFFER_CRASH_AT``'s, fixed at
import."""

BY_FILE = ("", 0)
""":data:`ARMED` of a process whose point is read from :data:`ARMING` (no point has an
empty name or a count of 0)."""


def armed_at_import(at: str | None, arming: str | None) -> tuple[str, int] | None:
    """:data:`ARMED` from the two variables' values: ``at`` parsed, :data:`BY_FILE`
    where only ``arming`` is set, ``None`` where neither is.

    Raises:
        ValueError: both are set (which one arms the process would be a guess), or
            ``at`` is refused by :func:`parse`.
    """
    if at and arming:
        raise ValueError(f"REPLAYBUFFER_CRASH_AT={at!r} and REPLAYBUFFER_CRASH_ARMING="
                         f"{arming!r} are both set: set one (the variable arms a point "
                         "for the process's life, the file arms one while it runs)")
    if arming:
        return BY_FILE
    return parse(at)


ARMED = armed_at_import(os.environ.get("REPLAYBUFFER_CRASH_AT"), ARMING)
"""The armed point and how many times it is reached before the process ends, from
``REPLAYBUFFER_CRASH_AT`` at import; :data:`BY_FILE` with ``REPLAYBUFFER_CRASH_ARMING``
(the point read from that file at each pass); ``None`` (production): every point is
inert."""

ONCE = os.environ.get("REPLAYBUFFER_CRASH_ONCE") or None
"""The file whose exclusive creation a crash needs (``REPLAYBUFFER_CRASH_ONCE``, see
the module docstring); ``None``: every process that reaches the point ends there."""

_reached: dict[str, int] = {}


class ArmingSeen:
    """What this process last read from :data:`ARMING`: its text and the point it
    names."""

    text: str | None = None
    point: tuple[str, int] | None = None


_seen = ArmingSeen()


def crash_point(name: str) -> None:
    """End the process at once (``os._exit(CRASH_EXIT_CODE)``) when the armed point
    (:data:`ARMED`, or :data:`ARMING`'s now) is ``name`` and this is its N-th time here;
    otherwise return. Callers test ``ARMED is not None`` first so that an unarmed
    process pays no call.

    Raises:
        ValueError: :data:`ARMING` names no crash point (a typo must not pass as a
            point never reached).
    """
    armed = ARMED if ARMED is not BY_FILE else armed_by_file()
    if armed is None or armed[0] != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] >= armed[1] and first_to_crash() and (
            ARMED is not BY_FILE or took_armed_line()):
        os._exit(CRASH_EXIT_CODE)


def armed_by_file() -> tuple[str, int] | None:
    """The point :data:`ARMING` arms now (its first point line, as :func:`parse`
    reads it); when its text changed since the last pass, the passes counted so far
    are forgotten (a new arming counts from here)."""
    assert ARMING is not None
    text = read_arming(ARMING)
    if text != _seen.text:
        lines = point_lines(text)
        _seen.point = parse(lines[0]) if lines else None
        _seen.text = text
        _reached.clear()
    return _seen.point


def read_arming(path: str | os.PathLike[str]) -> str:
    """The text of an arming file (``""`` where there is none)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def point_lines(text: str) -> list[str]:
    """The point lines of an arming file's ``text``, in order (blank and ``#`` lines
    left out)."""
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def took_armed_line() -> bool:
    """Whether this process took :data:`ARMING`'s first point line (the one it saw):
    the file renamed to a name of this process's own (of processes racing, one
    succeeds), then written back without that line. A file armed anew meanwhile is
    put back untouched."""
    assert ARMING is not None
    mine = f"{ARMING}.{os.getpid()}.taken"
    try:
        os.replace(ARMING, mine)
    except FileNotFoundError:
        return False
    text = read_arming(mine)
    if text != _seen.text:
        os.replace(mine, ARMING)
        return False
    arm(ARMING, *point_lines(text)[1:])
    os.unlink(mine)
    return True


def arm(path: str | os.PathLike[str], *points: str) -> None:
    """Arm ``points`` (each ``NAME`` or ``NAME:N``, in order; none: nothing) for the
    processes whose ``REPLAYBUFFER_CRASH_ARMING`` is ``path``: written whole (a
    temporary file renamed over it), with a fresh ``#`` line so that their counts
    start afresh.

    Raises:
        ValueError: a point is refused by :func:`parse`, or is not one line (nothing
            is written).
    """
    for point in points:
        if "\n" in point or parse(point) is None:
            raise ValueError(f"arm: each point must be one NAME or NAME:N, got {point!r}")
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(f"{point}\n" for point in points) + f"# {os.urandom(8).hex()}\n")
    os.replace(tmp, path)


def still_armed(path: str | os.PathLike[str]) -> list[str]:
    """The points of the arming file ``path`` that no process has ended at yet."""
    return point_lines(read_arming(path))


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
