#!/usr/bin/env bash
# The TF-Agents seed environment (src/replaybuffer_bench/tf_agents_seed.py):
#
#   bash benchmarks/setup_tf_agents.sh
#   TF_USE_LEGACY_KERAS=1 .venv-tfagents/bin/python -m replaybuffer_bench.tf_agents_seed
#   replaybuffer bench --peers --peer-workloads tf-agents    # the same, from any venv
#
# Creates (or reuses) .venv-tfagents, never the project's test environment .venv,
# .venv-bench nor .venv-reverb, and installs TF-Agents 0.19.0 (its newest release) with
# what it is built for: tensorflow-probability 0.23.0 and TensorFlow 2.15 (the CPU-only
# wheel tensorflow-cpu 2.15.1, falling back to tensorflow 2.15.1 if the CPU wheel cannot
# be had), tf-keras 2.15.x (TF-Agents 0.19 runs on Keras 2, selected at run time with
# TF_USE_LEGACY_KERAS=1) and numpy 1.26 (TF 2.15 is built against the numpy 1.x ABI).
# TF-Agents pins typing-extensions 4.5.0, gym<=0.23 and pygame 2.1.3; pip resolves them.
# Then this project goes in editable without dependencies (-e <repo> --no-deps), with an
# optree and a gymnasium that take numpy 1.26 and typing-extensions 4.5.0, so that both
# replay buffers run side by side in one process on the same TensorFlow. No torch here
# (nothing in the set wants it; the script stops if one appears).
# Then it checks that TF-Agents' TFUniformReplayBuffer and PyUniformReplayBuffer add
# and sample, and that replaybuffer's TFUniformReplayBuffer does too. Idempotent: a
# second run installs nothing. Any failure stops it with a message (set -euo pipefail).
#
# Environment: VENV_TFAGENTS (default <repo>/.venv-tfagents), PYTHON (default python3;
# a Python 3.9-3.11, the versions TensorFlow 2.15 ships wheels for).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV_TFAGENTS:-$ROOT/.venv-tfagents}"
PYTHON="${PYTHON:-python3}"
TFA_PIN="tf-agents==0.19.0"
TFP_PIN="tensorflow-probability==0.23.0"
TF_CPU_PIN="tensorflow-cpu==2.15.1"
TF_PIN="tensorflow==2.15.1"
KERAS_PIN="tf-keras==2.15.*"
NUMPY_PIN="numpy==1.26.*"
# Ours, resolved under the numpy and typing-extensions that step 1 installed (TF-Agents
# pins typing-extensions 4.5.0, which newer optree releases refuse).
OURS_PINS=("optree>=0.11" "gymnasium>=1.0")

TOOL=setup_tf_agents
# shellcheck source=benchmarks/venv_setup.sh
source "$ROOT/benchmarks/venv_setup.sh"   # log, die, quiet_pip, installed, make_venv
refuse_venvs "$ROOT/.venv" "$ROOT/.venv-bench" "$ROOT/.venv-reverb"

# --- 0. the virtualenv ---------------------------------------------------------------
make_venv
"$PY" -c 'import sys; assert (3, 9) <= sys.version_info[:2] <= (3, 11), sys.version' \
  || die "$PY is not Python 3.9-3.11 (TensorFlow 2.15 ships wheels up to cp311)"

# --- 1. TensorFlow 2.15 (CPU), numpy 1.26, tf-keras, TFP and TF-Agents ---------------
TF_DIST=""
for dist in tensorflow-cpu tensorflow; do
  v="$(installed "$dist" || true)"
  if [[ "$v" == 2.15.* ]]; then TF_DIST="$dist"; break; fi
done
TFA="$(installed tf-agents || true)"
TFP="$(installed tensorflow-probability || true)"
TFK="$(installed tf-keras || true)"
NP="$(installed numpy || true)"
if [[ -n "$TF_DIST" && "$TFA" == "0.19.0" && "$TFP" == "0.23.0" && "$TFK" == 2.15.* \
      && "$NP" == 1.26.* ]]; then
  log "$TF_DIST $(installed "$TF_DIST"), tf-agents $TFA, tensorflow-probability $TFP," \
      "tf-keras $TFK and numpy $NP are installed already"
else
  log "installing $TF_CPU_PIN, $NUMPY_PIN, $KERAS_PIN, $TFP_PIN and $TFA_PIN" \
      "(TensorFlow is ~250 MB)"
  if ! quiet_pip install -q "$TF_CPU_PIN" "$NUMPY_PIN" "$KERAS_PIN" "$TFP_PIN" "$TFA_PIN"; then
    log "tensorflow-cpu 2.15.1 did not install; trying $TF_PIN"
    quiet_pip install -q "$TF_PIN" "$NUMPY_PIN" "$KERAS_PIN" "$TFP_PIN" "$TFA_PIN"
  fi
fi

# --- 2. this project, without its dependencies, and the two it needs here -----------
OPTREE="$(installed optree || true)"
GYM="$(installed gymnasium || true)"
OURS="$("$PY" -c 'import replaybuffer, sys; sys.stdout.write(replaybuffer.__file__)' \
        2>/dev/null || true)"
if [[ "$OURS" == "$ROOT/src/replaybuffer/__init__.py" && -n "$OPTREE" && "$GYM" == 1.* ]]; then
  log "replaybuffer (editable, $ROOT), optree $OPTREE and gymnasium $GYM are installed already"
else
  log "installing replaybuffer (editable, no dependencies), ${OURS_PINS[*]}"
  # The constraints keep what step 1 resolved: numpy 1.26 and TF-Agents' typing-extensions.
  constraints="$(mktemp)"
  "$PY" -m pip --disable-pip-version-check freeze --exclude-editable \
    | grep -iE '^(numpy|typing[-_]extensions|tensorflow[-_a-z]*|cloudpickle)==' \
    > "$constraints"
  quiet_pip install -q -c "$constraints" "${OURS_PINS[@]}"
  quiet_pip install -q --no-deps -e "$ROOT"
  rm -f "$constraints"
fi
if "$PY" -c 'import torch' 2>/dev/null; then
  die "torch is importable in $VENV; this environment must not hold it"
fi
quiet_pip check || die "pip check found broken requirements"

# --- 3. checks -----------------------------------------------------------------------
log "checking TF-Agents and replaybuffer"
TF_USE_LEGACY_KERAS=1 "$PY" - <<'EOF' 2> >(grep -v -e 'cuda' -e 'TF-TRT' -e 'oneDNN' \
    -e 'cpu_feature_guard' -e 'rebuild TensorFlow' -e 'UserWarning' -e 'warnings.warn' \
    -e 'pkg_resources' -e 'Gym has been unmaintained' -e 'upgrade to Gymnasium' \
    -e 'migration_guide' >&2) || die "TF-Agents or replaybuffer does not import or run"
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from importlib.metadata import version

import numpy as np
import tensorflow as tf

tf.get_logger().setLevel("ERROR")  # TF-Agents' deprecation notes for get_next, gather_all
from tf_agents.replay_buffers import py_uniform_replay_buffer, tf_uniform_replay_buffer
from tf_agents.specs import array_spec

import replaybuffer
from replaybuffer.compat import tf_agents as ours

for dist in ("tf-agents", "tensorflow-probability", "tensorflow-cpu", "tensorflow",
             "tf-keras", "numpy", "optree", "gymnasium", "typing-extensions"):
    try:
        print(f"setup_tf_agents:   {dist} {version(dist)}")
    except Exception:
        pass
print(f"setup_tf_agents:   tf.__version__ {tf.__version__}; replaybuffer "
      f"{replaybuffer.__version__} from {os.path.dirname(replaybuffer.__file__)}")

spec = (tf.TensorSpec([3], tf.float32, "obs"), tf.TensorSpec([], tf.int64, "act"))
items = (tf.ones([2, 3]), tf.constant([1, 2], tf.int64))
theirs = tf_uniform_replay_buffer.TFUniformReplayBuffer(spec, batch_size=2, max_length=10)
mine = ours.TFUniformReplayBuffer(spec, batch_size=2, max_length=10, seed=0)
for buf in (theirs, mine):
    buf.add_batch(items)
    buf.add_batch(items)
    sample = buf.get_next(sample_batch_size=4, num_steps=2)[0]
    assert sample[0].shape == (4, 2, 3), sample[0].shape
    element = next(iter(buf.as_dataset(sample_batch_size=4, num_steps=2)))[0]
    assert element[0].shape == (4, 2, 3), element[0].shape
    assert buf.gather_all()[0].shape == (2, 2, 3)
print("setup_tf_agents:   TFUniformReplayBuffer (TF-Agents' and ours) ok")

py_spec = array_spec.ArraySpec([3], np.float32, "obs")
py_theirs = py_uniform_replay_buffer.PyUniformReplayBuffer(py_spec, capacity=10)
py_theirs.add_batch(np.ones([1, 3], np.float32))
assert py_theirs.get_next(sample_batch_size=4).shape == (4, 3)
py_mine = ours.PyUniformReplayBuffer(py_spec, capacity=10, seed=0)
py_mine.add_batch(np.ones([1, 3], np.float32))
assert py_mine.get_next(sample_batch_size=4)[0].shape == (4, 3)
print("setup_tf_agents:   PyUniformReplayBuffer (TF-Agents' and ours) ok")
EOF
log "done: $VENV"
