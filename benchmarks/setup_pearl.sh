#!/usr/bin/env bash
# The Pearl seed environment (replaybuffer_bench.pearl_seed; the "pearl" workload of
# `replaybuffer bench --peers`):
#
#   bash benchmarks/setup_pearl.sh
#   .venv-pearl/bin/python -m replaybuffer_bench.pearl_seed [--calls 500] [--json FILE]
#
# Creates (or reuses) .venv-pearl, never the project's test environment .venv nor the
# other peers' .venv-bench / .venv-reverb, and installs, in this order:
#   1. the pinned CPU torch, alone (torch==2.13.0, the project's build), so that no
#      resolver ever picks another build; every later install runs under a constraints
#      file holding torch, numpy<2 and gym at their pins;
#   2. gym 0.19.0, which Pearl 0.4.1 is written against (its setup.py predates PEP 517
#      metadata rules: it only builds, without build isolation, under setuptools 65.5.0
#      and wheel 0.38.4), and numpy<2 (Pearl indexes with the numpy 1.x API);
#   3. pearll 0.4.1 itself with --no-deps --ignore-requires-python: it declares
#      Python <3.10 and torch <2.0, yet its buffers run unchanged on Python 3.11 and this
#      torch. Of its requirements the buffers import only numpy, torch, gym and psutil
#      (pearll/buffers/*.py and pearll/common/{enumerations,type_aliases,utils}.py,
#      pearll/settings.py); matplotlib, scikit-learn and tensorboard are for its agents
#      and logging and are left out;
#   4. this project (editable, --no-deps) with optree and gymnasium, at versions that
#      run on numpy<2, so that one process times both buffers interleaved.
# Then it checks that Pearl's ReplayBuffer and RolloutBuffer fill and sample, and that
# replaybuffer.compat.pearl does the same beside them. Idempotent: a second run installs
# nothing. Any failure stops it with a message (set -euo pipefail).
#
# Environment: VENV_PEARL (default <repo>/.venv-pearl), PYTHON (default python3; 3.10+).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV_PEARL:-$ROOT/.venv-pearl}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
PEARL_PIN="pearll==0.4.1"
GYM_PIN="gym==0.19.0"
NUMPY_PIN="numpy<2"
BUILD_PINS=("setuptools==65.5.0" "wheel==0.38.4")   # what gym 0.19.0's setup.py builds with
# What the buffers import beside numpy, torch and gym (gym 0.19 itself needs cloudpickle).
PEARL_DEPS=("psutil>=5.8,<6" "cloudpickle>=1.2")
# This project and what it needs, on numpy 1.x (optree and gymnasium 1.x both allow it).
OURS_DEPS=("optree>=0.11" "gymnasium==1.4.0")

TOOL=setup_pearl
# shellcheck source=benchmarks/venv_setup.sh
source "$ROOT/benchmarks/venv_setup.sh"   # log, die, quiet_pip, installed, make_venv
refuse_venvs "$ROOT/.venv" "$ROOT/.venv-bench" "$ROOT/.venv-reverb"

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
CONSTRAINTS="$VENV/pearl-constraints.txt"
printf '%s\n' "torch==$TORCH_VERSION" "$NUMPY_PIN" "$GYM_PIN" >"$CONSTRAINTS"
log "torch $TORCH_VERSION; constraints in $CONSTRAINTS"

# --- 2. numpy<2, the build tools and gym 0.19.0 --------------------------------------
NP="$(installed numpy || true)"
if [[ -n "$NP" && "$NP" == 1.* && "$(installed gym || true)" == "0.19.0" ]]; then
  log "numpy $NP and gym 0.19.0 are installed already"
else
  log "installing $NUMPY_PIN, ${PEARL_DEPS[*]} and ${BUILD_PINS[*]}"
  quiet_pip install -q -c "$CONSTRAINTS" "$NUMPY_PIN" "${PEARL_DEPS[@]}" "${BUILD_PINS[@]}"
  log "building $GYM_PIN (no build isolation)"
  quiet_pip install -q -c "$CONSTRAINTS" --no-build-isolation --no-deps "$GYM_PIN"
fi

# --- 3. Pearl ------------------------------------------------------------------------
if [[ "$(installed pearll || true)" == "0.4.1" ]]; then
  log "pearll 0.4.1 is installed already"
else
  log "installing $PEARL_PIN (--no-deps --ignore-requires-python)"
  quiet_pip install -q --no-deps --ignore-requires-python "$PEARL_PIN"
fi

# --- 4. this project -----------------------------------------------------------------
HERE="$("$PY" -c 'import os, replaybuffer; print(os.path.realpath(replaybuffer.__file__))' \
        2>/dev/null || true)"
if [[ "$HERE" == "$(realpath "$ROOT")/src/replaybuffer/"* ]] \
    && "$PY" -c 'import optree, gymnasium' 2>/dev/null; then
  log "the project is installed already ($HERE)"
else
  log "installing the project (editable) with ${OURS_DEPS[*]}"
  quiet_pip install -q -c "$CONSTRAINTS" "${OURS_DEPS[@]}"
  # (built in isolation: the project needs a newer setuptools than gym 0.19.0 does)
  quiet_pip install -q -c "$CONSTRAINTS" --no-deps -e "$ROOT"
fi
[[ "$(installed torch)" == "$TORCH_VERSION" ]] || die "torch changed during the installs"
[[ "$(installed numpy)" == 1.* ]] || die "numpy is not 1.x: $(installed numpy)"

# --- 5. checks -----------------------------------------------------------------------
log "checking Pearl and replaybuffer.compat.pearl"
"$PY" -W ignore - <<'EOF' || die "Pearl's buffers or ours do not import or run"
from importlib.metadata import version

import gym
import numpy as np
import torch
from pearll.buffers import ReplayBuffer, RolloutBuffer

import replaybuffer
from replaybuffer.compat import pearl as ours

for dist in ("torch", "numpy", "gym", "gymnasium", "optree", "psutil", "pearll",
             "replaybuffer"):
    print(f"setup_pearl:   {dist} {version(dist)}")

class Env(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (17,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)

rng = np.random.default_rng(0)
for name, cls in (("ReplayBuffer", ReplayBuffer), ("RolloutBuffer", RolloutBuffer)):
    buf = cls(Env(), 100)
    obs = rng.random(17, dtype=np.float32)
    for t in range(150):
        nxt = rng.random(17, dtype=np.float32)
        buf.add_trajectory(obs, rng.random(6, dtype=np.float32), 1.0, nxt, t % 40 == 39)
        obs = nxt
    s = buf.sample(32, dtype="torch")
    assert isinstance(s.observations, torch.Tensor) and s.observations.shape == (32, 17), s
    assert s.rewards.shape == (32, 1) and s.dones.shape == (32, 1), s
    s = buf.sample(32, dtype="numpy")
    assert s.actions.shape == (32, 6) and s.actions.dtype == np.float32, s
    print(f"setup_pearl:   pearll {name} ok")

import gymnasium

box = gymnasium.spaces.Box
mine = ours.ReplayBuffer(observation_space=box(-1.0, 1.0, (17,), np.float32),
                         action_space=box(-1.0, 1.0, (6,), np.float32), buffer_size=100,
                         device="cpu")
for t in range(150):
    mine.add_trajectory(np.zeros(17, np.float32), np.zeros(6, np.float32), 1.0,
                        np.ones(17, np.float32), True)
assert mine.sample(32).observations.shape == (32, 17)
print(f"setup_pearl:   replaybuffer {replaybuffer.__version__} compat.pearl ok")
EOF
log "done: $VENV"
