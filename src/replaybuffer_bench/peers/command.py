"""``python -m replaybuffer_bench.peers`` and ``replaybuffer bench --peers``: run the peer
table and print it (``--json``, ``--markdown`` to files). See :mod:`replaybuffer_bench.peers`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from typing import Any

from replaybuffer_bench.peers.report import format_markdown, format_rows, row_cells
from replaybuffer_bench.peers.running import PEERS, run_peers
from replaybuffer_bench.peers.workloads_spec import WORKLOADS

DESCRIPTION = ("Peer-library benchmarks: the same workloads through cpprb, SB3, TorchRL and "
               "Tianshou.")


def _load() -> str:
    with contextlib.suppress(OSError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "?"


def main(argv: list[str] | None = None) -> int:
    """Run the peer table as the command line asks; print it, write --json and --markdown."""
    parser = argparse.ArgumentParser(prog="python -m replaybuffer_bench.peers",
                                     description=DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="small capacities (smoke run)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--peers", default=None,
                        help=f"comma-separated families ({', '.join(sorted({p.family for p in PEERS}))})")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--retries", type=int, default=0,
                        help="re-run a peer's workload up to N times while other processes "
                             "kept more than --contended cores busy during its timings")
    parser.add_argument("--contended", type=float, default=0.25,
                        help="cores used by other processes that count as contention")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--markdown", help="write a markdown table to this file")
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    peers = None if args.peers is None else [p for p in args.peers.split(",") if p]
    started = time.time()
    print(f"# replaybuffer peer bench ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, python {platform.python_version()}, "
          f"{'quick' if args.quick else 'full'}, torch threads "
          f"{args.torch_threads or 'default'}, load {_load()})", flush=True)

    def progress(r: dict[str, Any]) -> None:
        print("  " + "  ".join(row_cells(r, {})), flush=True)

    rows = run_peers(workloads, args.quick, peers=peers,
                     torch_threads=args.torch_threads or None, retries=args.retries,
                     contended=args.contended, progress=progress)
    print(f"# {time.time() - started:.0f} s, load {_load()}\n")
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(format_markdown(rows) + "\n")
    return 0

