"""Where a collector's longest adds go while a save runs: each long add beside what the
save was doing then.

    python benchmarks/save_stalls.py [--size-gb 1] [--rounds 3] [--add-rate 2000]
                                     [--chunk-mb MiB]

Builds the buffer of ``replaybuffer bench --checkpoint`` (84x84x4 frames, one row),
adds ``--add-rate`` steps a second from a thread, and saves it ``--rounds`` times. The
save's phases (chunk reads under the buffer's lock, copy-on-write preserves, CRC-32,
fsync, publication, pruning) are timed by wrapping the functions that do them. For
each round this prints the longest adds during the save, the phases each overlapped
(start relative to the add's start and duration, ms), and each phase's total and
longest time.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from typing import Any, Callable

from replaybuffer import persist
from replaybuffer.persist import checksum, durable, series, streams
from replaybuffer_bench import checkpoint
from replaybuffer.storage import frozen

Event = tuple[str, float, float]  # phase, start, end (perf_counter seconds)


def timed(owner: Any, name: str, phase: str, events: list[Event]) -> None:
    """Replace ``owner.name`` by a wrapper that appends each call's span to ``events``."""
    function: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            events.append((phase, start, time.perf_counter()))

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--add-rate", type=float, default=2000.0, help="adds a second")
    parser.add_argument("--show", type=int, default=4, help="long adds shown per round")
    parser.add_argument("--chunk-mb", type=float, help="persist.CHUNK_BYTES, in MiB")
    args = parser.parse_args(argv)
    if args.chunk_mb:
        persist.CHUNK_BYTES = int(args.chunk_mb * (1 << 20))

    events: list[Event] = []
    for owner, name, phase in [(durable, "sync", "fsync"), (series, "publish", "publish"),
                               (series, "prune", "prune"),
                               (streams, "bytes_of", "contiguous copy"),
                               (frozen.FrozenRows, "read", "chunk read (locked)"),
                               (frozen.FrozenRows, "preserve", "preserve")]:
        timed(owner, name, phase, events)
    # persist's checksum module: streams look crc32 up on it at each call
    timed(checksum, "crc32", "crc32", events)

    buffer = checkpoint.build(args.size_gb)
    adds: list[tuple[float, float]] = []  # start, seconds
    stop_collector = checkpoint.start_collector(buffer, args.add_rate, adds)
    time.sleep(1.0)
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            events.clear()
            first, began = len(adds), time.perf_counter()
            buffer.save(f"{scratch}/c", keep=1)
            seconds = time.perf_counter() - began
            during = sorted(adds[first:], key=lambda add: -add[1])
            print(f"round {round_}: save {seconds:.2f} s, {len(during)} adds, longest "
                  + ", ".join(f"{s * 1e3:.1f}" for _, s in during[:6]) + " ms")
            for start, length in during[:args.show]:
                overlapping = [f"{phase} {(a - start) * 1e3:+.1f}/{(b - a) * 1e3:.1f}"
                               for phase, a, b in events if a < start + length and b > start]
                print(f"  add at {start - began:.3f} s, {length * 1e3:.1f} ms: "
                      + "; ".join(overlapping[:8]))
            total: dict[str, float] = collections.defaultdict(float)
            longest: dict[str, float] = collections.defaultdict(float)
            for phase, a, b in events:
                total[phase] += b - a
                longest[phase] = max(longest[phase], b - a)
            print("  phases: " + "; ".join(f"{p} {total[p]:.3f} s (longest "
                                           f"{longest[p] * 1e3:.1f} ms)" for p in total))
    stop_collector()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
