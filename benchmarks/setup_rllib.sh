#!/usr/bin/env bash
# The RLlib peer environment (benchmarks/rllib_ray.py):
#
#   bash benchmarks/setup_rllib.sh [VENV]
#   VENV/bin/python benchmarks/rllib_ray.py [--shards 1,2,4,8] [--seconds 5]
#
# RLlib (ray[rllib] 2.60.0) pins gymnasium 1.2.2, while .venv-bench holds gymnasium 1.4
# for SB3 and Tianshou, so RLlib gets a venv of its own. VENV defaults to .venv-rllib in
# this checkout (ignored by git); VENV_RLLIB does the same as the argument. Never the
# project's .venv nor .venv-bench.
#
# Installs, in this order:
#   1. the pinned CPU torch, alone, so that no resolver ever picks another build (a CUDA
#      one drags several GB of nvidia packages); RLlib imports torch when it is there;
#   2. ray[rllib]==2.60.0 and numpy under a constraints file holding torch at the
#      installed build, after a dry run that fails if anything would still pull torch,
#      triton or nvidia/cuda packages. Whatever gymnasium RLlib asks for comes with it.
# benchmarks/rllib_ray.py is standalone (no replaybuffer import), so this project is not
# installed here. Then it checks that RLlib's replay buffers add and sample a SampleBatch
# and prints the versions. Idempotent: a second run installs nothing. Any failure stops
# it with a message (set -euo pipefail).
#
# Environment: VENV_RLLIB (default: see above), PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VENV_RLLIB:-$ROOT/.venv-rllib}}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
RLLIB_PIN="ray[rllib]==2.60.0"

TOOL=setup_rllib
# shellcheck source=benchmarks/venv_setup.sh
source "$ROOT/benchmarks/venv_setup.sh"   # log, die, quiet_pip, installed, make_venv
refuse_venvs "$ROOT/.venv" "$ROOT/.venv-bench"

# --- 0. the virtualenv ---------------------------------------------------------------
make_venv
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
  || die "$PY is older than Python 3.10"

# --- 1. torch, first and alone -------------------------------------------------------
if [[ "$(installed torch || true)" == 2.13.0* ]]; then
  log "torch $(installed torch) is installed already"
else
  log "installing $TORCH_PIN (CPU build)"
  quiet_pip install -q "$TORCH_PIN"
fi
TORCH_VERSION="$(installed torch)"
"$PY" -W ignore - <<'EOF' || die "torch in $VENV is not the 2.13.0 CPU build"
import torch
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
assert torch.version.cuda is None, f"CUDA build {torch.version.cuda}"
EOF
CONSTRAINTS="$VENV/rllib-constraints.txt"
echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"

# --- 2. ray[rllib] and numpy, after a dry run ----------------------------------------
REPORT="$(mktemp)"
trap 'rm -f "$REPORT"' EXIT
INSTALL_ARGS=(-c "$CONSTRAINTS" "$RLLIB_PIN" numpy)
quiet_pip install -q --dry-run --report "$REPORT" "${INSTALL_ARGS[@]}"
WOULD="$("$PY" - "$REPORT" <<'EOF'
import json, sys
names = sorted(item["metadata"]["name"].lower().replace("_", "-")
               for item in json.load(open(sys.argv[1])).get("install", []))
bad = [n for n in names if n in ("torch", "triton") or n.startswith(("nvidia-", "cuda-"))]
print(" ".join(names))
if bad:
    sys.exit(f"setup_rllib: ERROR: the dry run would install {bad}")
EOF
)" || die "the RLlib install would change torch or pull CUDA packages"
if [[ -z "$WOULD" ]]; then
  log "ray[rllib] and numpy are installed already"
else
  log "installing $RLLIB_PIN and numpy: $WOULD"
  quiet_pip install -q "${INSTALL_ARGS[@]}"
fi
[[ "$(installed torch)" == "$TORCH_VERSION" ]] || die "torch changed during the RLlib install"
quiet_pip check || die "pip check found broken requirements"

# --- 3. checks -----------------------------------------------------------------------
log "checking RLlib's replay buffers"
"$PY" -W ignore - <<'EOF' || die "RLlib's replay buffers do not import or run"
import logging
from importlib.metadata import version

import numpy as np

logging.disable(logging.WARNING)
from ray.rllib.policy.sample_batch import SampleBatch
from ray.rllib.utils.replay_buffers import PrioritizedReplayBuffer, ReplayBuffer, StorageUnit

for dist in ("ray", "torch", "numpy", "gymnasium"):
    print(f"setup_rllib:   {dist} {version(dist)}")

batch = SampleBatch({"obs": np.arange(32, dtype=np.float32)[:, None]})
for cls, kwargs in ((ReplayBuffer, {}), (PrioritizedReplayBuffer, {"beta": 0.4})):
    buffer = cls(capacity=100, storage_unit=StorageUnit.TIMESTEPS)
    buffer.add(batch)
    out = buffer.sample(8, **kwargs)
    assert len(buffer) == 32 and out.count == 8, (len(buffer), out.count)
    assert set(out["obs"][:, 0].tolist()) <= set(range(32))
print("setup_rllib:   ReplayBuffer and PrioritizedReplayBuffer add and sample ok")
EOF
log "done: $VENV"
