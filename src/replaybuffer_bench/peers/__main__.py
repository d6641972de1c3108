"""``python -m replaybuffer_bench.peers``: see :mod:`replaybuffer_bench.peers.command`."""

import sys

from replaybuffer_bench.peers.command import main

sys.exit(main())
