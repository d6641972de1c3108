#!/usr/bin/env bash
# One round on a lent GPU machine (16 cores, an NVIDIA GPU, no package index), as one
# call: the shared buffer's writer scaling on the quiet cores first, then the GPU check.
#
#   bash benchmarks/device_round.sh [WHEELS]     (WHEELS: benchmarks/gpu_wheels.sh's)
#
# Results under $OUT (default build/device-round): processes.log/.json (writers 1..12),
# processes_prioritized.log, lscpu.log, false_sharing.log, and gpu_check.sh's tests.log,
# bench.log, gpu.json.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WHEELS="${1:-.whl}"
R="${OUT:-$ROOT/build/device-round}"
mkdir -p "$R"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
SITE=/tmp/device-round-site
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHEELS"/*.whl || echo "device_round: installing $WHEELS failed"
echo "device_round: $(nproc) cores"
PYTHONPATH="$ROOT/src:$SITE" timeout 170 "$PY" -m replaybuffer_bench.processes \
  --workloads control,frames --writers 1,2,4,8,12 --seconds 2 --no-reverb \
  --json "$R/processes.json" >"$R/processes.log" 2>&1
echo "device_round: processes rc $?"; cat "$R/processes.log"
PYTHONPATH="$ROOT/src:$SITE" timeout 60 "$PY" -m replaybuffer_bench.processes \
  --workloads control --writers 1,8 --seconds 2 --no-reverb --prioritized \
  >"$R/processes_prioritized.log" 2>&1
echo "device_round: prioritized processes rc $?"; cat "$R/processes_prioritized.log"
# Issue 24's learner beside writers: false against true sharing with pinned processes,
# and whether the cores are hardware threads of fewer physical cores.
lscpu | grep -iE "^(CPU\(s\)|Thread|Core|Socket|Model name)" >"$R/lscpu.log" 2>&1
PYTHONPATH="$ROOT/src:$SITE" timeout 45 "$PY" benchmarks/false_sharing.py \
  --cases 8x1,8x8,1x1+s,8x1+s,0+s --num-rows 64 --seconds 1 --repeats 1 \
  >"$R/false_sharing.log" 2>&1
echo "device_round: false_sharing rc $?"; cat "$R/lscpu.log" "$R/false_sharing.log"
OUT=/tmp/gpu-check timeout 420 bash benchmarks/gpu_check.sh "$WHEELS" >"$R/gpu_check.log" 2>&1
echo "device_round: gpu_check rc $?"
cp /tmp/gpu-check/tests.log /tmp/gpu-check/bench.log /tmp/gpu-check/gpu.json "$R/" 2>/dev/null
tail -n 80 "$R/gpu_check.log"
