#!/usr/bin/env bash
# One device call that builds nothing and does everything a session needs (each step time-boxed, every
# output under OUT, tarred by the caller): the V4-Flash slice bench with --profile, the model checks (run_model_h200.sh), and the op
# test's perf cases for FILTERS. Knobs: BENCH_ARGS, HF_TIMEOUT (0: no transformers), PERF_FILTERS
# ("a|b|c"), OFF (DEEPINFER_CUDA_OFF for the bench), SKIP_MODEL=1.
# Usage (repo root on the GPU machine): bash bench/run_session_h200.sh PKG OUT
set -u
PKG=${1:-.gpu}
OUT=${2:-/tmp/session_out}
mkdir -p "$OUT"
export DEEPINFER_CUDA_OFF=${OFF:-}
t0=$(date +%s)
echo "== bench ($(date +%T))"
DI_TIMEOUT=${DI_TIMEOUT:-180} HF_TIMEOUT=${HF_TIMEOUT:-3} \
  BENCH_ARGS="${BENCH_ARGS:---layers 6 --chunk 4096 --steps 8 --case-seconds 10 --profile 2}" \
  bash bench/run_bench_h200.sh "$PKG" "$OUT/bench" > "$OUT/bench_run.log" 2>&1
grep -E "^\| |^profile|^  [a-z_]+ " "$OUT/bench/bench.log" | head -120
if [ "${SKIP_MODEL:-0}" != 1 ]; then
  echo "== model checks ($(date +%T))"
  TM_TIMEOUT=${TM_TIMEOUT:-240} bash tests/cuda/run_model_h200.sh "$PKG" "$OUT/model" > "$OUT/model_run.log" 2>&1
  grep -E "rc |PASS|FAIL|passed|failed|NOT explained|flip|generate" "$OUT/model_run.log" | head -60
  grep -E "FAIL" "$OUT/model/cuda_ops.txt" | head -40
  echo "op cases: $(grep -c '^\[PASS\]' "$OUT/model/cuda_ops.txt") passed, $(grep -c '^\[FAIL\]' "$OUT/model/cuda_ops.txt") failed; last: $(tail -1 "$OUT/model/cuda_ops.txt" | cut -c1-120)"
fi
if [ -n "${PERF_FILTERS:-}" ]; then
  echo "== op perf ($(date +%T))"
  IFS='|' read -ra F <<< "$PERF_FILTERS"
  for f in "${F[@]}"; do
    timeout 90 /tmp/tm/test_cuda_ops --perf --filter "$f" >> "$OUT/ops_perf.txt" 2>&1
    echo "perf '$f' rc=$?"
  done
  grep -iE "perf|GB/s|TFLOP" "$OUT/ops_perf.txt" | head -150
fi
echo "== done in $(( $(date +%s) - t0 )) s"
