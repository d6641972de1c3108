"""``replaybuffer bench``: throughput of the buffers against the plain numpy limit.

See :mod:`replaybuffer_bench.workloads` for what is measured. Speed is measured
here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict

from replaybuffer_bench.workloads import Result, run

__all__ = ["Result", "run", "run_and_report", "format_table"]


def format_table(results: list[Result]) -> str:
    header = ("workload", "storage", "op", "us/call", "items/s", "numpy us", "x numpy",
              "records us", "x records")
    rows = [header]
    for r in results:
        rows.append((r.workload, r.storage, r.op, f"{r.seconds * 1e6:.2f}",
                     f"{r.items_per_second:,.0f}",
                     "" if r.limit_seconds is None else f"{r.limit_seconds * 1e6:.2f}",
                     "" if r.ratio is None else f"{r.ratio:.2f}",
                     "" if r.record_limit_seconds is None
                     else f"{r.record_limit_seconds * 1e6:.2f}",
                     "" if r.record_ratio is None else f"{r.record_ratio:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_and_report(args: argparse.Namespace) -> int:
    storages = [s for s in args.storage.split(",") if s]
    workloads = [w for w in args.workloads.split(",") if w]
    results = []
    print(f"# replaybuffer bench ({platform.processor() or platform.machine()}, "
          f"{'quick' if args.quick else 'full'}); x numpy = our time / numpy limit (one "
          "array per leaf); x records = our time / the same reads from interleaved records")
    for result in run(workloads, storages, args.quick):
        results.append(result)
        print(f"  {result.workload:<20} {result.storage:<6} {result.op:<26} "
              f"{result.seconds * 1e6:9.2f} us  x{result.ratio:.2f}", flush=True)
    print()
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(r) for r in results], fh, indent=1)
    return 0
