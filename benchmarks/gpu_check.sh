#!/usr/bin/env bash
# The GPU check: the tests on a CUDA device and `replaybuffer bench --gpu`, in one run on
# a machine with an NVIDIA GPU and a CUDA build of torch (README, "On a GPU"):
#
#   bash benchmarks/gpu_check.sh [WHEELS]
#
# For a machine with no package index, WHEELS (default .whl) holds the wheels it lacks
# (optree, gymnasium, tensordict, torchrl and what they need, for its Python:
# benchmarks/gpu_wheels.sh downloads them); they are installed without dependencies into
# a scratch folder, never over its torch. Then:
#   1. torchrl's extension is rebuilt with its CUDA trees (benchmarks/torchrl_extension.py
#      --cuda), in the background, so that TorchRL's PrioritizedSampler keeps its tree on
#      the GPU as ours does;
#   2. every test parametrized on a CUDA device runs (pytest -k cuda);
#   3. replaybuffer bench --gpu --profile times ours, TorchRL and the copy bandwidth, and
#      counts our kernels, copies, synchronizations and device time per call, ending
#      with the goals table (ours, TorchRL, the ratio, the profile, goal met or not);
#      uniform sample(256)+next twice: eager, and from its CUDA graph (uniform[captured],
#      tests/test_captured_draws.py's *_cuda tests check it against the eager path);
#      prioritized sample and update+sample eager and recorded (prioritized[captured]:
#      the sample and the device-checked update each a CUDA graph;
#      tests/test_captured_prioritized.py's *_cuda tests).
# The whole run is sized for about 6 minutes at most (the tests, 200 s, beside the
# build, 240 s; the bench, 150 s: about 90 s expected).
# Logs, the JUnit report and the bench's table and JSON go to $OUT (default
# build/gpu-check). Each step is bounded in time and a failing step does not stop the
# next; the exit status is 1 if any step failed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WHEELS="${1:-.whl}"
OUT="${OUT:-$ROOT/build/gpu-check}"
PY="${PYTHON:-python3}"
SITE="${GPU_CHECK_SITE:-/tmp/gpu-check-site}"
mkdir -p "$OUT"
status=0
step() { echo "gpu_check: $*"; }
fail() { step "FAILED: $*"; [[ $status -ne 0 ]] || status=1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  || fail "nvidia-smi"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || fail "installing $WHEELS"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'EOF' || fail "imports"
import numpy, optree, torch
import replaybuffer
print(f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}), numpy "
      f"{numpy.__version__}, optree {optree.__version__}; cuda available: "
      f"{torch.cuda.is_available()}, {torch.cuda.get_device_name() if torch.cuda.is_available() else '-'}")
assert torch.cuda.is_available(), "torch sees no CUDA device"
EOF

# 1. torchrl's extension with CUDA, beside the tests (MAX_JOBS: ninja's parallel compiles)
step "rebuilding torchrl's extension with CUDA (log: torchrl_extension.log)"
( MAX_JOBS="$(nproc)" timeout 240 "$PY" benchmarks/torchrl_extension.py --cuda \
    >"$OUT/torchrl_extension.log" 2>&1; echo $? >"$OUT/torchrl_extension.rc" ) &
BUILD=$!

# 2. the tests on the CUDA device
step "tests on the CUDA device (log: tests.log)"
TEST_FILES=(tests/test_uniform_buffer.py tests/test_storage.py tests/test_prioritized.py
            tests/test_bad_input.py tests/test_properties.py tests/test_episodes.py
            tests/test_dataset.py tests/test_samplers.py tests/test_frames.py
            tests/test_transitions.py tests/test_rollout.py tests/test_her.py
            tests/test_threading.py tests/test_persist.py tests/test_resume.py
            tests/test_device_sampling.py tests/test_device_updates.py
            tests/test_device_packing.py tests/test_device_transitions.py
            tests/test_captured_draws.py tests/test_captured_prioritized.py
            tests/test_transition_device_reads.py tests/test_torch_prioritized_draw_checks.py
            tests/test_transition_device_memory.py)
PARALLEL=()
"$PY" -c 'import xdist' 2>/dev/null && PARALLEL=(-n 6)
timeout 200 "$PY" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" -k cuda --timeout 150 \
  --junitxml="$OUT/tests.xml" "${TEST_FILES[@]}" >"$OUT/tests.log" 2>&1 \
  || fail "tests (rc $?)"
tail -n 5 "$OUT/tests.log"

wait "$BUILD"
rc="$(cat "$OUT/torchrl_extension.rc" 2>/dev/null || echo 1)"
tail -n 3 "$OUT/torchrl_extension.log"
if [[ "$rc" == 0 ]] && "$PY" -c 'from torchrl._torchrl import CudaSumSegmentTreeFp32' 2>/dev/null
then
  step "torchrl's CUDA trees load"
  cp "$("$PY" -c 'import torchrl, os; print(os.path.dirname(torchrl.__file__))')"/_torchrl*.so \
    "$OUT/" 2>/dev/null || true
else
  step "torchrl's CUDA trees are unavailable (rc $rc); its prioritized rows will say so"
fi

# 3. the benchmark
step "replaybuffer bench --gpu (log: bench.log)"
# Sized for well under its limit on an H100/H200: short timing loops, and the searches'
# scale up to 2**23 slots (2**26 takes a minute to fill for the same story).
PYTHONUNBUFFERED=1 timeout 150 "$PY" -m replaybuffer_bench.gpu --profile --min-time 0.15 \
  --scale 131072,1048576,8388608 --json "$OUT/gpu.json" >"$OUT/bench.log" 2>&1 \
  || fail "bench --gpu (rc $?)"
sed -n '/^# device/,$p' "$OUT/bench.log"
tail -n 3 "$OUT/bench.log"

# 4. transitions sampled on the device (no host copies) against the host path
step "transition sample(256) on the device and on the host (log: transitions.log)"
for n in 1 3; do
  timeout 60 "$PY" benchmarks/transition_device_sample.py cuda 20 "$n" >>"$OUT/transitions.log" 2>&1 \
    || fail "transition_device_sample n_step=$n (rc $?)"
done
tail -n 12 "$OUT/transitions.log"
exit "$status"
