#!/usr/bin/env bash
# The peer-library benchmark environment (see benchmarks/PEERS.md):
#
#   bash benchmarks/setup_peers.sh
#   .venv-bench/bin/python -m replaybuffer_bench.peers [--quick]
#
# Creates (or reuses) .venv-bench, never the project's test environment .venv, and
# installs, in this order:
#   1. the pinned CPU torch, alone, so that no resolver ever picks another build (a CUDA
#      one drags several GB of nvidia packages);
#   2. this project (editable) and the peers at versions that install beside it, under a
#      constraints file holding torch at the installed build, after a dry run that fails
#      if anything would still pull torch, triton or nvidia/cuda packages;
#   3. torchrl's C++ extension, rebuilt from the sources its wheel ships when the
#      registry's binary does not load against this torch (it is built for another
#      torch: undefined symbol), since its PrioritizedSampler needs it.
# Then it checks that every peer imports and that torchrl's PrioritizedSampler samples by
# priority. Idempotent: a second run installs nothing and rebuilds nothing. Any failure
# stops it with a message (set -euo pipefail).
#
# Environment: VENV_BENCH (default <repo>/.venv-bench), PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV_BENCH:-$ROOT/.venv-bench}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
# Resolved together with torch 2.13.0 on Python 3.11 (torchrl 0.14.1 wants tensordict
# 0.14.x; tianshou 2.0.1 and stable-baselines3 2.9.2 both take gymnasium 1.x).
PEERS=(
  "cpprb==11.0.0"
  "stable-baselines3==2.9.2"
  "torchrl==0.14.1"
  "tensordict==0.14.3"
  "tianshou==2.0.1"
  "gymnasium==1.4.0"
  "ray==2.60.0"        # benchmarks/torchrl_ray.py: TorchRL's Ray-backed buffer
)

TOOL=setup_peers
# shellcheck source=benchmarks/venv_setup.sh
source "$ROOT/benchmarks/venv_setup.sh"   # log, die, quiet_pip, installed, make_venv
refuse_venvs "$ROOT/.venv"   # the project's test environment

# --- 0. the virtualenv ---------------------------------------------------------------
make_venv
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
  || die "$PY is older than Python 3.10"

# --- 1. torch, first and alone -------------------------------------------------------
log "installing $TORCH_PIN (CPU build)"
quiet_pip install -q "$TORCH_PIN"
TORCH_VERSION="$("$PY" -W ignore -c 'import torch; print(torch.__version__)')"
"$PY" -W ignore - <<'EOF' || die "torch in $VENV is not the 2.13.0 CPU build"
import torch
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
assert torch.version.cuda is None, f"CUDA build {torch.version.cuda}"
EOF
CONSTRAINTS="$VENV/peers-constraints.txt"
{
  echo "torch==$TORCH_VERSION"
  printf '%s\n' "${PEERS[@]}"
} >"$CONSTRAINTS"
log "torch $TORCH_VERSION; constraints in $CONSTRAINTS"

# --- 2. the project and the peers, after a dry run -----------------------------------
REPORT="$(mktemp)"
trap 'rm -f "$REPORT"' EXIT
INSTALL_ARGS=(-c "$CONSTRAINTS" -e "$ROOT" "${PEERS[@]}" setuptools)
quiet_pip install -q --dry-run --report "$REPORT" "${INSTALL_ARGS[@]}"
WOULD="$("$PY" - "$REPORT" <<'EOF'
import json, sys
names = sorted(item["metadata"]["name"].lower().replace("_", "-")
               for item in json.load(open(sys.argv[1])).get("install", []))
bad = [n for n in names if n in ("torch", "triton") or n.startswith(("nvidia-", "cuda-"))]
print(" ".join(names))
if bad:
    sys.exit(f"setup_peers: ERROR: the dry run would install {bad}")
EOF
)" || die "the peer install would change torch or pull CUDA packages"
log "dry run would install: ${WOULD:-nothing}"
# An editable project always shows up in a dry run: skip the reinstall when it is the
# only entry and this venv already imports this checkout.
HERE="$("$PY" -c 'import os, replaybuffer; print(os.path.realpath(replaybuffer.__file__))' \
        2>/dev/null || true)"
if [[ "$WOULD" == "replaybuffer" && "$HERE" == "$(realpath "$ROOT")/src/replaybuffer/"* ]]; then
  log "the project and the peers are installed already"
else
  log "installing the project and the peers"
  quiet_pip install -q "${INSTALL_ARGS[@]}"
fi
[[ "$("$PY" -c 'import torch; print(torch.__version__)')" == "$TORCH_VERSION" ]] \
  || die "torch changed during the peer install"
quiet_pip check || die "pip check found broken requirements"

# --- 3. torchrl's C++ extension ------------------------------------------------------
if "$PY" -c 'import torchrl._torchrl' 2>/dev/null; then
  log "torchrl._torchrl loads against torch $TORCH_VERSION"
else
  log "torchrl._torchrl does not load:"
  "$PY" -c 'import torchrl._torchrl' 2>&1 | tail -n 1 | cut -c1-240 >&2 || true
  command -v g++ >/dev/null || die "g++ is needed to rebuild torchrl's extension (apt-get install g++)"
  "$PY" - <<'EOF' || die "python headers missing (apt-get install python3-dev)"
import os, sysconfig
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
EOF
  log "rebuilding it from the sources in its wheel (about 2-3 minutes on 2 cores)"
  "$PY" "$ROOT/benchmarks/torchrl_extension.py"
  "$PY" -c 'import torchrl._torchrl' || die "torchrl._torchrl still does not load after the rebuild"
fi

# --- 4. checks -----------------------------------------------------------------------
log "checking the peers"
RL_WARNINGS=0 "$PY" - <<'EOF'
import logging
from importlib.metadata import version

import numpy as np
import torch

logging.disable(logging.INFO)
import cpprb, gymnasium, stable_baselines3, tensordict, tianshou, torchrl  # noqa: E401,F401
import replaybuffer_bench.peers  # noqa: F401
from torchrl._torchrl import MinSegmentTreeFp32, SumSegmentTreeFp32  # noqa: F401
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

for dist in ("torch", "numpy", "gymnasium", "cpprb", "stable-baselines3", "torchrl",
             "tensordict", "tianshou", "replaybuffer"):
    print(f"setup_peers:   {dist} {version(dist)}")

# torchrl's PrioritizedSampler must sample by priority through the rebuilt trees.
n = 1000
rb = ReplayBuffer(storage=LazyTensorStorage(n),
                  sampler=PrioritizedSampler(n, alpha=0.6, beta=0.4))
rb.extend(torch.arange(n, dtype=torch.float32))
low, high = 1e-3, 1e3
rb.update_priority(torch.arange(n), torch.full((n,), low))
rb.update_priority(torch.tensor([7]), torch.tensor([high]))
data, info = rb.sample(4096, return_info=True)
share = (data == 7).float().mean().item()
expected = high**0.6 / (high**0.6 + (n - 1) * low**0.6)  # 80%; uniform would be 0.1%
assert abs(share - expected) < 0.05, f"item 7 drawn {share:.1%}, expected {expected:.1%}"
w = info["priority_weight"]
assert w.shape == (4096,) and float(w.max()) <= 1.0 + 1e-6, w
print(f"setup_peers:   torchrl PrioritizedSampler ok (high-priority item drawn {share:.1%},"
      f" expected {expected:.1%})")

# cpprb and tianshou prioritized buffers, briefly.
per = cpprb.PrioritizedReplayBuffer(64, {"obs": {"shape": 4}}, alpha=0.6)
per.add(obs=np.ones((64, 4), np.float32))
s = per.sample(8, beta=0.4)
per.update_priorities(s["indexes"], np.ones(8))
from tianshou.data import Batch, PrioritizedReplayBuffer
tb = PrioritizedReplayBuffer(64, alpha=0.6, beta=0.4)
tb.add(Batch(obs=np.ones(4), act=0, rew=1.0, terminated=False, truncated=False,
             obs_next=np.ones(4)))
batch, idx = tb.sample(8)
tb.update_weight(idx, np.ones(8))
print("setup_peers:   cpprb and tianshou prioritized buffers ok")
EOF
log "done: $VENV"
