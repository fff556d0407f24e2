#!/usr/bin/env bash
# One device run of test_model_cuda (the model on the CUDA backend against the CPU oracle: op checks,
# the V4 reference fixtures, nano greedy parity for 256 tokens and decode timing).
# Usage (from the repo root on the GPU machine): tests/cuda/run_model_h200.sh PKG [OUTDIR]
# PKG holds test_model_cuda.xz (built on the dev machine for sm_90a) and lib/libopenblas.so.0 (the
# stub from openblas_stub.c, used only where the machine has no OpenBLAS).
set -u
PKG=${1:-.gpu}
OUT=${2:-${OUT:-/tmp/model_out}}
mkdir -p "$OUT" /tmp/tm
xz -dc "$PKG/test_model_cuda.xz" > /tmp/tm/test_model_cuda && chmod +x /tmp/tm/test_model_cuda
ldconfig -p | grep -q 'libopenblas.so.0' || export LD_LIBRARY_PATH=$PWD/$PKG/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used,memory.total \
  --format=csv | tee "$OUT/nvidia-smi.txt"
ldd /tmp/tm/test_model_cuda | grep -i "not found"
set -o pipefail
timeout ${TM_TIMEOUT:-420} /tmp/tm/test_model_cuda --root . --tokens ${TM_TOKENS:-256} --threads $(nproc) \
  --out "$OUT/summary.json" 2>&1 | tee "$OUT/test_model.txt"
echo "rc test_model=$?"
