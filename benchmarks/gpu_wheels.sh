#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh installs on a GPU machine that has a CUDA torch but
# no package index (the lent machines: Python 3.12, x86-64), downloaded here into
# WHEELS (default .whl, which .git/info/exclude should ignore):
#
#   bash benchmarks/gpu_wheels.sh [WHEELS]
#
# The project's own needs beyond numpy and torch (optree; gymnasium for the tests), and
# TorchRL with what it needs beyond the machine's packages, for bench --gpu's TorchRL
# rows. No dependencies are resolved (--no-deps): the list is complete for such a
# machine, and torch is never among it.
set -euo pipefail

WHEELS="${1:-.whl}"
PYTHON="${PYTHON:-python3}"
PINS=(
  "optree==0.20.0"
  "gymnasium==1.4.0"
  "farama-notifications==0.0.6"
  "tensordict==0.14.3"
  "torchrl==0.14.1"
  "orjson==3.13.0"
  "pyvers==0.2.3"
  "hoptorch==0.1.4"
  "importlib-metadata==10.2.0"
  "lazy-importer==0.1.0"
)
mkdir -p "$WHEELS"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" "${PINS[@]}"
ls "$WHEELS"
