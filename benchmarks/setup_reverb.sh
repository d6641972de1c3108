#!/usr/bin/env bash
# The DeepMind Reverb peer environment (benchmarks/reverb_processes.py):
#
#   bash benchmarks/setup_reverb.sh
#   .venv-reverb/bin/python benchmarks/reverb_processes.py [--writers 1,2,4] [--seconds 5]
#
# Creates (or reuses) .venv-reverb, never the project's test environment .venv nor
# .venv-bench, and installs dm-reverb 0.14.0 (its newest release; a cp311 manylinux
# wheel) with the TensorFlow it is built against: its `tensorflow` extra pins
# tensorflow~=2.15.0, and its C++ ops link libtensorflow_framework.so.2 from that
# TensorFlow. We install the CPU-only wheel tensorflow-cpu 2.15.x (it ships the same
# `tensorflow` package, without the GPU kernels), falling back to tensorflow 2.15.x if
# the CPU wheel cannot be had, plus numpy<2 (TF 2.15 and Reverb are built against the
# numpy 1.x ABI). dm-reverb itself is installed without its extra, so that pip does not
# add the full `tensorflow` distribution beside tensorflow-cpu. No torch here.
# Then it checks that `import reverb` works and that a one-table server round-trips an
# item. Idempotent: a second run installs nothing. Any failure stops it with a message
# (set -euo pipefail).
#
# Environment: VENV_REVERB (default <repo>/.venv-reverb), PYTHON (default python3; a
# Python 3.11, since the newest dm-reverb wheels are cp38..cp311).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV_REVERB:-$ROOT/.venv-reverb}"
PYTHON="${PYTHON:-python3}"
REVERB_PIN="dm-reverb==0.14.0"
TF_CPU_PIN="tensorflow-cpu==2.15.*"
TF_PIN="tensorflow==2.15.*"
NUMPY_PIN="numpy<2"

TOOL=setup_reverb
# shellcheck source=benchmarks/venv_setup.sh
source "$ROOT/benchmarks/venv_setup.sh"   # log, die, quiet_pip, installed, make_venv
refuse_venvs "$ROOT/.venv" "$ROOT/.venv-bench"

# --- 0. the virtualenv ---------------------------------------------------------------
make_venv
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || die "$PY is not Python 3.11 (dm-reverb 0.14.0 ships wheels up to cp311)"

# --- 1. TensorFlow 2.15 (CPU), numpy<2 and dm-reverb ---------------------------------
TF_DIST=""
for dist in tensorflow-cpu tensorflow; do
  v="$(installed "$dist" || true)"
  if [[ "$v" == 2.15.* ]]; then TF_DIST="$dist"; break; fi
done
RV="$(installed dm-reverb || true)"
NP="$(installed numpy || true)"
if [[ -n "$TF_DIST" && "$RV" == "0.14.0" && -n "$NP" && "$NP" == 1.* ]]; then
  log "$TF_DIST $(installed "$TF_DIST"), dm-reverb $RV and numpy $NP are installed already"
else
  log "installing $TF_CPU_PIN, $NUMPY_PIN and $REVERB_PIN (TensorFlow is ~250 MB)"
  if ! quiet_pip install -q "$TF_CPU_PIN" "$NUMPY_PIN" "$REVERB_PIN"; then
    log "tensorflow-cpu 2.15 did not install; trying $TF_PIN"
    quiet_pip install -q "$TF_PIN" "$NUMPY_PIN" "$REVERB_PIN"
  fi
fi
if "$PY" -c 'import torch' 2>/dev/null; then
  die "torch is importable in $VENV; this environment must not hold it"
fi
quiet_pip check || die "pip check found broken requirements"

# --- 2. checks -----------------------------------------------------------------------
log "checking reverb"
"$PY" - <<'EOF' 2> >(grep -v -e 'cuda' -e 'TF-TRT' -e 'oneDNN' -e 'cpu_feature_guard' \
                      -e 'rebuild TensorFlow' >&2) || die "reverb does not import or run"
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from importlib.metadata import version

import numpy as np
import reverb
import tensorflow as tf

for dist in ("dm-reverb", "tensorflow-cpu", "tensorflow", "numpy", "dm-tree"):
    try:
        print(f"setup_reverb:   {dist} {version(dist)}")
    except Exception:
        pass
print(f"setup_reverb:   tf.__version__ {tf.__version__}")

server = reverb.Server(tables=[reverb.Table(
    name="t", sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
    max_size=10, rate_limiter=reverb.rate_limiters.MinSize(1))])
try:
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=1) as w:
        w.append({"x": np.arange(3, dtype=np.float32)})
        w.create_item("t", priority=1.0, trajectory={"x": w.history["x"][-1]})
        w.flush()
    # A single-step reference is squeezed: the item holds x itself, not [1, 3]; with the
    # default emit_timesteps=True the client would split it along its first axis.
    s = next(iter(client.sample("t", num_samples=1, emit_timesteps=False)))
    got = s.data[0]
    assert np.array_equal(got, np.arange(3, dtype=np.float32)), got
    print("setup_reverb:   server round trip ok")
finally:
    server.stop()
EOF
log "done: $VENV"
