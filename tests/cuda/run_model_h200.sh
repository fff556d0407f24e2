#!/usr/bin/env bash
# One device run of the model on the CUDA backend: test_model_cuda (op checks, the V4 reference
# fixtures, nano greedy parity for 256 tokens and timing, the engine with its cache in device memory)
# and the `deepinfer generate --backend cuda|cpu` command line.
# Usage (from the repo root on the GPU machine): tests/cuda/run_model_h200.sh PKG [OUTDIR]
# PKG (made by tests/cuda/package_gpu.sh) holds test_model_cuda.xz, deepinfer.xz and test_cuda_ops.xz
# (built on the dev machine for sm_90a) and lib/: loader
# stand-ins for libraries the GPU machine lacks (openblas_stub.c, make_icu_stub.sh, libpcre2-8.xz).
set -u
PKG=${1:-.gpu}
OUT=${2:-${OUT:-/tmp/model_out}}
mkdir -p "$OUT" /tmp/tm/lib
for b in test_model_cuda deepinfer test_cuda_ops; do
  [ -f "$PKG/$b.xz" ] && xz -dc "$PKG/$b.xz" > /tmp/tm/$b && chmod +x /tmp/tm/$b
done
for l in "$PKG"/lib/*; do
  n=$(basename "$l" .xz)
  ldconfig -p | grep -q "$n " && continue  # the machine has it
  case "$l" in *.xz) xz -dc "$l" > /tmp/tm/lib/$n ;; *) cp "$l" /tmp/tm/lib/$n ;; esac
done
export LD_LIBRARY_PATH=/tmp/tm/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used,memory.total \
  --format=csv | tee "$OUT/nvidia-smi.txt"
ls /tmp/tm/lib; ldd /tmp/tm/test_model_cuda /tmp/tm/deepinfer | grep -i "not found"
set -o pipefail
timeout ${TM_TIMEOUT:-360} /tmp/tm/test_model_cuda --root . --tokens ${TM_TOKENS:-256} --threads $(nproc) \
  --out "$OUT/summary.json" 2>&1 | tee "$OUT/test_model.txt"
echo "rc test_model=$?"
if [ -x /tmp/tm/test_cuda_ops ]; then  # the table-driven op test (97 cases vs the CPU twins)
  timeout ${OPS_TIMEOUT:-240} /tmp/tm/test_cuda_ops > "$OUT/cuda_ops.txt" 2>&1
  echo "rc test_cuda_ops=$? $(tail -1 "$OUT/cuda_ops.txt")"
fi
if [ -x /tmp/tm/deepinfer ]; then
  for be in cuda cpu; do
    /usr/bin/time -f "$be: %e s wall" /tmp/tm/deepinfer generate --model models/nano-v4 --backend $be --prompt "In the beginning" \
      --max-tokens 200 --ignore-eos --quiet > "$OUT/generate_$be.txt" 2> "$OUT/generate_$be.err"
    echo "generate --backend $be rc=$? $(tail -1 "$OUT/generate_$be.err")"
  done
  cmp "$OUT/generate_cuda.txt" "$OUT/generate_cpu.txt" && echo "generate: cuda and cpu print the same text"
  head -c 400 "$OUT/generate_cuda.txt"; echo
  cat "$OUT"/generate_*.err > "$OUT/generate.err"; rm -f "$OUT"/generate_*.err
fi
# Where the decode time goes: host time per kind of backend call over a single-sequence decode, then
# Nsight Systems over the same, if the machine has it.
DEEPINFER_CUDA_HOST_TIMES=1 /tmp/tm/test_model_cuda --root . --decode-only 256 2>&1 | tee "$OUT/host_times.txt"
# Where the decode time goes: Nsight Systems over a single-sequence decode, if the machine has it.
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ] && [ -x /tmp/tm/test_model_cuda ]; then
  timeout 120 "$NSYS" profile -o /tmp/tm/decode --force-overwrite true /tmp/tm/test_model_cuda --root . \
    --decode-only 128 > /tmp/tm/nsys.log 2>&1
  timeout 120 "$NSYS" stats --report cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum --format csv \
    /tmp/tm/decode.nsys-rep > "$OUT/nsys_stats.csv" 2>&1
  tail -3 /tmp/tm/nsys.log; head -c 3000 "$OUT/nsys_stats.csv"
else
  echo "no nsys on this machine"
fi
