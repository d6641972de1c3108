"""Sample cost against capacity (``replaybuffer bench --scale [--plot]``).

For capacities 10k to 10M control-size steps (float32 observation[17] and the control
scalars, :func:`~replaybuffer_bench.workloads.control_spec`), one full buffer at a
time: the median time of ``get_next(sample_batch_size=256)`` for

* ``uniform``: :class:`~replaybuffer.UniformReplayBuffer`;
* ``prioritized``: :class:`~replaybuffer.PrioritizedReplayBuffer` with log-normal
  priorities (sigma 1) on every step;
* ``episodes``: uniform with ``within_episodes=True`` over episodes of 20 to 400 steps;
* ``prioritized-episodes``: prioritized (as above) with ``within_episodes=True`` over
  the same episodes, drawing windows of ``num_steps=2`` (a step and its successor: with
  one step every stored step would be a valid start, and nothing would be left to
  exclude), so it gathers twice the rows the limit does;

beside the plain numpy limit at the same capacity: ``take`` of 256 random positions
from one contiguous array per leaf holding the same bytes. That limit grows with
capacity too (random reads leave the caches, then the TLB's reach), so "flat" means the
ratio to it stays flat: nothing the buffer adds grows with the number of steps held.
"""

from __future__ import annotations

import argparse
import gc
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from replaybuffer import nest
from replaybuffer_bench.timing import compare
from replaybuffer_bench.workloads import control_spec, random_items
from replaybuffer.buffers import PrioritizedReplayBuffer, ReplayBuffer, UniformReplayBuffer
from replaybuffer.collect.trajectory import StepType

CAPACITIES = (10_000, 100_000, 1_000_000, 10_000_000)
KINDS = ("uniform", "prioritized", "episodes", "prioritized-episodes")
BATCH = 256
CHUNK = 50_000


@dataclass
class ScalePoint:
    kind: str
    capacity: int
    seconds: float
    """Median seconds per ``get_next(256)``."""
    limit_seconds: float
    """The numpy limit's median seconds per batch at this capacity."""

    @property
    def ratio(self) -> float:
        return self.seconds / self.limit_seconds


def episode_step_types(length: int, rng: np.random.Generator) -> np.ndarray:
    """int32 ``[length]`` step types of back-to-back episodes of 20-400 steps."""
    types = np.full(length, StepType.MID, np.int32)
    start = 0
    while start < length:
        end = min(start + int(rng.integers(20, 401)), length)
        types[start] = StepType.FIRST
        types[end - 1] = StepType.LAST
        start = end
    return types


def filled(kind: str, capacity: int, rng: np.random.Generator) -> ReplayBuffer:
    """A buffer of ``kind`` with every one of its ``capacity`` slots written."""
    spec = control_spec()
    if kind.startswith("prioritized"):
        buffer: ReplayBuffer = PrioritizedReplayBuffer(
            spec, 1, capacity, seed=0, track_episodes=kind == "prioritized-episodes")
    else:
        buffer = UniformReplayBuffer(spec, 1, capacity, seed=0,
                                     track_episodes=kind == "episodes")
    chunk = min(CHUNK, capacity)
    data = random_items(spec, (1, chunk), rng)
    for start in range(0, capacity, chunk):
        n = min(chunk, capacity - start)
        part = nest.map_structure(lambda a, n=n: a[:, :n], data)
        part["step_type"] = episode_step_types(n, rng)[None]
        buffer.extend(part)
    if isinstance(buffer, PrioritizedReplayBuffer):
        # With one row an item's id is its step id: 0 .. capacity - 1 after one lap.
        for start in range(0, capacity, CHUNK):
            ids = np.arange(start, min(start + CHUNK, capacity))
            buffer.update_priorities(ids, rng.lognormal(0.0, 1.0, len(ids)))
    return buffer


def limit(capacity: int, rng: np.random.Generator
          ) -> tuple[Callable[[], None], list[np.ndarray]]:
    """The numpy limit: ``take`` per leaf of a fresh set of 256 random positions."""
    arrays = [np.ones((capacity,) + s.shape, s.dtype) for s in control_spec().values()]
    out = [np.empty((BATCH,) + a.shape[1:], a.dtype) for a in arrays]
    draws = rng.integers(0, capacity, (64, BATCH))
    state = {"i": 0}

    def gather() -> None:
        positions = draws[state["i"] & 63]
        state["i"] += 1
        for array, dest in zip(arrays, out):
            array.take(positions, 0, out=dest, mode="clip")
    return gather, arrays


def measure(capacities: tuple[int, ...], kinds: tuple[str, ...], min_time: float,
            echo: Callable[[str], None] = print) -> list[ScalePoint]:
    rng = np.random.default_rng(0)
    points = []
    for capacity in capacities:
        gather, arrays = limit(capacity, rng)
        for kind in kinds:
            buffer = filled(kind, capacity, rng)
            within = kind in ("episodes", "prioritized-episodes")
            steps = 2 if kind == "prioritized-episodes" else None

            def ours(b: ReplayBuffer = buffer, w: bool = within, t: int | None = steps
                     ) -> None:
                b.get_next(BATCH, t, within_episodes=w)
            timed = compare({"ours": ours, "limit": gather}, min_time=min_time, repeats=5)
            point = ScalePoint(kind, capacity, timed["ours"], timed["limit"])
            points.append(point)
            echo(f"  {kind:<20} {capacity:>12,}  {point.seconds * 1e6:9.1f} us  "
                 f"numpy {point.limit_seconds * 1e6:7.1f} us  x{point.ratio:.2f}")
            del buffer
            gc.collect()
        del gather, arrays
        gc.collect()
    return points


def format_table(points: list[ScalePoint]) -> str:
    capacities = sorted({p.capacity for p in points})
    kinds = [k for k in KINDS if any(p.kind == k for p in points)]
    by = {(p.kind, p.capacity): p for p in points}
    header = ["get_next(256), us (x numpy)"] + [f"{c:,}" for c in capacities]
    rows = [header]
    for kind in kinds:
        rows.append([kind] + [f"{by[kind, c].seconds * 1e6:.1f} (x{by[kind, c].ratio:.2f})"
                              if (kind, c) in by else "" for c in capacities])
    limits = {c: next(p.limit_seconds for p in points if p.capacity == c) for c in capacities}
    rows.append(["numpy limit"] + [f"{limits[c] * 1e6:.1f}" for c in capacities])
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(header))
    return "\n".join(lines)


def plot(points: list[ScalePoint], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for kind in KINDS:
        mine = sorted((p for p in points if p.kind == kind), key=lambda p: p.capacity)
        if mine:
            caps = [p.capacity for p in mine]
            left.plot(caps, [p.seconds * 1e6 for p in mine], "o-", label=kind)
            right.plot(caps, [p.ratio for p in mine], "o-", label=kind)
    limits = sorted({(p.capacity, p.limit_seconds) for p in points if p.kind == points[0].kind})
    left.plot([c for c, _ in limits], [s * 1e6 for _, s in limits], "k--",
              label="numpy limit")
    left.set(xscale="log", yscale="log", xlabel="capacity (steps)",
             ylabel="us per get_next(256)", title="sample cost")
    right.set(xscale="log", xlabel="capacity (steps)", ylabel="our time / numpy limit",
              title="ratio to the numpy limit")
    right.set_ylim(bottom=0)
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replaybuffer bench --scale")
    parser.add_argument("--capacities", default=",".join(map(str, CAPACITIES)))
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--plot", metavar="PNG", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    capacities = tuple(int(c) for c in args.capacities.split(",") if c)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"--kinds: unknown {sorted(unknown)}; choose from {list(KINDS)}")
    print(f"# sample cost against capacity: get_next({BATCH}) of control-size steps")
    points = measure(capacities, kinds, args.min_time)
    print()
    print(format_table(points))
    if args.plot:
        plot(points, Path(args.plot))
        print(f"wrote {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(p) for p in points], indent=1))
    return 0
