#!/usr/bin/env bash
# One device run of the CUDA op tests: correctness pass, then --perf, then the kernels' resource usage.
# Usage (from the repo root, on the GPU machine): tests/cuda/run_h200.sh [OUTDIR]
# Expects build-cuda/tests/cuda/test_cuda_ops built on the dev machine (sm_90a); falls back to building
# the test directly with nvcc when that binary cannot start there.
set -u
OUT=${1:-${OUT:-/tmp/cuda_out}}
mkdir -p "$OUT"
BIN=build-cuda/tests/cuda/test_cuda_ops
RT=$PWD/build-cuda/rt
if [ -f build-cuda/pkg/test_cuda_ops.xz ]; then  # the compressed carry (keeps the call under 64 MiB)
  mkdir -p /tmp/tb && xz -dc build-cuda/pkg/test_cuda_ops.xz > /tmp/tb/test_cuda_ops && chmod +x /tmp/tb/test_cuda_ops
  BIN=/tmp/tb/test_cuda_ops
  RT=$PWD/build-cuda/pkg
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia-smi.txt"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# libopenblas only satisfies the loader (CpuBackend's own GEMM is the reference); a stub where absent
ldconfig -p | grep -q 'libopenblas.so.0' || export LD_LIBRARY_PATH=$RT:$LD_LIBRARY_PATH
if ! "$BIN" --list > /dev/null 2> "$OUT/start_err.txt"; then
  echo "prebuilt binary does not start:"; cat "$OUT/start_err.txt"; ldd "$BIN" | grep -i "not found"
  echo "building on the device with nvcc"
  mkdir -p /tmp/tb && nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
    src/ops/cuda/*.cu tests/cuda/test_cuda_ops.cu src/ops/cpu/*.cc src/util/*.cc -o /tmp/tb/test_cuda_ops \
    -lcublasLt -L "$RT" -lopenblas -lpthread 2>&1 | tail -20
  BIN=/tmp/tb/test_cuda_ops
  export LD_LIBRARY_PATH=$RT:$LD_LIBRARY_PATH
fi
set -o pipefail
timeout 200 "$BIN" 2>&1 | tee "$OUT/test.txt"; rc1=$?
timeout 270 "$BIN" --perf 2>&1 | tee "$OUT/perf.txt"; rc2=$?
cuobjdump --dump-resource-usage "$BIN" 2>/dev/null | grep -E "Function|REG" > "$OUT/resources.txt"
cuobjdump --dump-sass "$BIN" 2>/dev/null | grep -c -E "HGMMA|QGMMA" > "$OUT/gmma_count.txt"
cuobjdump --dump-sass "$BIN" 2>/dev/null | grep -c -E "HMMA" > "$OUT/hmma_count.txt"
echo "rc test=$rc1 perf=$rc2"
