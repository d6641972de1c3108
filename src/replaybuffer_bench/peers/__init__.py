"""Peer-library benchmarks: the same workloads through cpprb, SB3, TorchRL and Tianshou.

    python -m replaybuffer_bench.peers [--quick] [--workloads control,frames,prioritized]
                                       [--peers cpprb,sb3,...] [--retries N]
                                       [--json FILE] [--markdown FILE]

The peers are optional and heavy (``benchmarks/setup_peers.sh`` installs them into a
separate virtualenv); each adapter imports its peer lazily, inside the run, and a
missing or broken peer becomes rows with status ``not installed`` or
``failed: <reason>``, never a crash and never a missing row. A workload a peer has no
API for gets ``unsupported: <why>``. See ``benchmarks/PEERS.md`` for the figures.

Workloads (capacities in full mode; ``quick`` shrinks them for a smoke run):

- ``control``: float32 obs[17], action[6], reward, next obs, done; capacity 1M.
  ``add(1)``, ``add(256)`` (a batch of 256 transitions per call) and
  ``sample(256)+next`` (uniform, next observations included).
- ``frames``: uint8 obs[4, 84, 84], int action, reward, next obs, done; capacity 200k.
  ``add(1)``, ``sample(32)+next``, ``sample(256)+next`` and ``bytes/transition``: the
  process's resident-memory growth from constructing the buffer to having filled it,
  divided by capacity (every field, measured the same way for every peer), and where
  the peer's arrays can be inspected, the observation storage alone
  (``obs_bytes_per_transition``). Layouts measured for memory only (next observations
  stored twice) are filled at a small capacity: bytes per transition do not depend on it.
- ``prioritized``: float32 obs[4] (and int action, reward, next obs, done); capacity 1M,
  full, priorities randomised before timing; ``sample(256)+weights`` (alpha 0.6,
  beta 0.4), ``update(256)`` of sampled indices and ``sample+update(256)``.
- ``pearl``: Pearl 0.4.1's own ``ReplayBuffer`` and ``RolloutBuffer`` (a seed system:
  ``replaybuffer.compat.pearl`` reproduces its API) against ours through that module,
  on its tutorial's workload (:mod:`replaybuffer_bench.pearl_seed`). Pearl needs gym
  0.19 and numpy<2, so it runs in its own venv (``benchmarks/setup_pearl.sh``), with
  ours timed beside it in the same process; without that venv the rows say
  ``not installed``.
- ``tf-agents``: TF-Agents 0.19's own ``TFUniformReplayBuffer`` and
  ``PyUniformReplayBuffer`` against ``compat.tf_agents`` on its tutorial's workload, both
  in ``.venv-tfagents`` (``benchmarks/setup_tf_agents.sh``: TensorFlow 2.15, numpy 1.26),
  one process, interleaved; see :mod:`replaybuffer_bench.tf_agents_seed`. Without that
  venv its rows say ``not installed``.

Every buffer is filled completely before anything is timed, so reads touch real pages
and writes overwrite (the steady state). One peer's buffer at a time exists: it is
dropped and garbage-collected before the next is built (200k frames are 5.6 GB a copy).
Timings are :func:`replaybuffer_bench.timing.compare` medians, the ops of one buffer
interleaved. Torch runs with one intra-op thread by default (``torch_threads``), as the
numpy peers do: on a small shared machine torch's OpenMP pool otherwise stalls for
milliseconds whenever another process holds a core. Each timed row records
``others_cores``, the cores other processes kept busy meanwhile; ``--retries N`` runs a
contended peer again once the machine is quiet and keeps the least contended attempt.

The package has one module per concept: ``workloads_spec`` (workloads, sizes, data),
``measuring`` (timings, memory, contention), one module per peer family (``ours``,
``cpprb_peer``, ``sb3_peer``, ``torchrl_peer``, ``tianshou_peer``), ``running`` (the
peer table and :func:`run_peers`), ``report`` (the tables) and ``command`` (the command
line, ``python -m replaybuffer_bench.peers``).
"""

from __future__ import annotations

from replaybuffer_bench.peers.command import main
from replaybuffer_bench.peers.report import format_markdown, format_rows
from replaybuffer_bench.peers.running import PEERS, Peer, run_peers
from replaybuffer_bench.peers.workloads_spec import WORKLOADS, Sizes

__all__ = ["WORKLOADS", "PEERS", "Peer", "Sizes", "run_peers", "format_rows",
           "format_markdown", "main"]
