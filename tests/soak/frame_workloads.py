"""The frame-dedup variant of the soak's shared workload: a shared buffer whose ``obs``
leaf is a stack of ``K`` frames, each frame stored once (``frame_stack="obs"``), written
as :func:`workloads.shared_everything` writes (attach, claim, add, sample and
reprioritize, close, once a unit), with an ``extend`` of two steps now and then.

Run as ``python frame_workloads.py NAME JSON`` (as :mod:`workloads`; the scenarios and
``tests/test_shared_frames.py`` do). A step of row ``r`` and step ``t`` holds the
:mod:`workloads` leaves and ``obs = stack(r, t)``, so a torn stack (frames of two
writes, or a frame a killed writer left) shows.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

try:
    from soak import workloads
except ImportError:  # run as a script: its folder, tests/soak, is first on sys.path
    import workloads  # type: ignore[no-redef]

K = 3
"""Frames a stack."""

EPISODE = 7
"""Steps an episode: its first stack is padded by repeating its first frame."""

ODD = 11
"""Every ``ODD``-th step (from step 5) has a stack whose two older frames are its own:
it takes two side frames, and the next step matches its frames one by one."""


def frames_spec() -> dict[str, Any]:
    """:func:`workloads.shared_spec` with ``obs``, int64 ``[K, 2]`` (a frame: row, t)."""
    from replaybuffer.specs import ArraySpec
    spec = workloads.shared_spec()
    spec["obs"] = ArraySpec((K, 2), np.int64)
    return spec


def stack(row: int, step: int) -> np.ndarray:
    """The stack int64 ``[K, 2]`` of ``row``'s ``step``: frame ``(row, t)`` for the
    ``K`` steps up to ``step`` within its episode, the first repeated before it."""
    if step % ODD == 5:
        return np.array([[row, 1000 + step], [row, 2000 + step], [row, step]], np.int64)
    start = step - step % EPISODE
    return np.array([[row, max(t, start)] for t in range(step - K + 1, step + 1)], np.int64)


def frame_items(rows: np.ndarray, steps: np.ndarray) -> dict[str, np.ndarray]:
    """Items ``[len(rows)]`` for ``rows`` at ``steps``, ``obs`` included."""
    items = workloads.shared_items(rows, steps)
    items["obs"] = np.stack([stack(int(r), int(s)) for r, s in zip(rows, steps)])
    return items


def add_or_extend(buffer: Any, rows: np.ndarray, step: int,
                  rng: np.random.Generator) -> int:
    """One step of :func:`frame_items` to ``rows`` at ``step`` (or, one time in three,
    an ``extend`` by two); the last step written."""
    count = len(rows)
    if rng.random() < 1 / 3:
        steps = [frame_items(rows, np.full(count, step + t)) for t in range(2)]
        buffer.extend({k: np.stack([s[k] for s in steps], 1) for k in steps[0]})
        return step + 1
    buffer.add_batch(frame_items(rows, np.full(count, step)))
    return step


def shared_frames(args: dict[str, Any]) -> None:
    """:func:`workloads.shared_everything` on a frame-dedup buffer, writing by
    :func:`add_or_extend`."""
    workloads.shared_everything(args, add_or_extend)


if __name__ == "__main__":
    {"shared_frames": shared_frames}[sys.argv[1]](json.loads(sys.argv[2]))
    workloads.say("done")
