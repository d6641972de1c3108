"""Throughput of UniformReplayBuffer against the plain numpy limit.

    python benchmarks/uniform.py [--quick] [--storage numpy,torch] [--workloads control,frames]

The same as ``replaybuffer bench``; the workloads live in ``replaybuffer_bench`` so the
installed command can run them too. See benchmarks/README.md for what is measured.
"""

import sys

from replaybuffer.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
