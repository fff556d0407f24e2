#!/usr/bin/env bash
# One device call for a session checkpoint (each step time-boxed; everything under OUT, then OUT.tgz):
# op-test correctness in four processes beside the model checks, op perf filters (PERF, '|'-separated),
# the 6-layer slice bench with --profile, and a 31-layer decode. Knobs: PERF, L6_ARGS, L31_ARGS, OFF,
# L6=0 / L31=0 (skip a bench), ABLATE ('|'-separated OFF values: a short 6-layer decode each, ABL_ARGS),
# NCU_CASES (then bench/run_ncu_ops_h200.sh at the end, NCU_K its kernel regex).
# Usage (repo root on the GPU machine): bash bench/run_full_h200.sh PKG OUT
set -u
PKG=${1:-.gpu}
OUT=${2:-/tmp/full_out}
mkdir -p "$OUT"
t0=$(date +%s)
OPS_TIMEOUT=${OPS_TIMEOUT:-260} bash tests/cuda/run_ops_split.sh "$PKG" "$OUT/ops" > "$OUT/ops_run.log" 2>&1 &
P=$!
OPS_TIMEOUT=1 TM_TIMEOUT=${TM_TIMEOUT:-250} bash tests/cuda/run_model_h200.sh "$PKG" "$OUT/model" > "$OUT/model_run.log" 2>&1
wait $P
echo "== ops + model done at $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/ops_run.log"; grep '^\[FAIL\]' "$OUT/ops/cuda_ops.txt" | cut -c1-250 | head -20
grep -E "rc |PASS|FAIL|passed|failed|flip|generate" "$OUT/model_run.log" | head -30
if [ -n "${PERF:-}" ]; then
  IFS='|' read -ra F <<< "$PERF"
  for f in "${F[@]}"; do
    timeout ${PERF_TIMEOUT:-25} /tmp/to/test_cuda_ops --perf --filter "$f" >> "$OUT/perf.txt" 2>&1
    echo "perf '$f' rc=$?"
  done
  grep -E "^\[(PASS|FAIL)\]|perf:" "$OUT/perf.txt" | cut -c1-200 | head -120
fi
echo "== bench l6 at $(( $(date +%s) - t0 )) s"
[ "${L6:-1}" = 1 ] && SKIP_MODEL=1 HF_TIMEOUT=0 DI_TIMEOUT=${L6_TIMEOUT:-110} OFF=${OFF:-} \
  BENCH_ARGS="${L6_ARGS:---layers 6 --chunk 4096 --steps 8 --case-seconds 4 --profile 2 --batch 1,8,32,128 --prefill 4096}" \
  bash bench/run_session_h200.sh "$PKG" "$OUT/l6" 2>&1 | grep -vE "^  [a-z_0-9]+ " | head -40
[ "${L6:-1}" = 1 ] && grep -E "^profile|^  [a-z_0-9]+ " "$OUT/l6/bench/bench.log" | head -80
echo "== bench l31 at $(( $(date +%s) - t0 )) s"
if [ "${L31:-1}" = 1 ]; then
  SKIP_MODEL=1 HF_TIMEOUT=0 DI_TIMEOUT=${L31_TIMEOUT:-90} OFF=${OFF:-} \
    BENCH_ARGS="${L31_ARGS:---layers 31 --steps 8 --case-seconds 4 --batch 1 --prefill 0}" \
    bash bench/run_session_h200.sh "$PKG" "$OUT/l31" 2>&1 | grep -E "^\|" | head -10
fi
# ABLATE: '|'-separated DEEPINFER_CUDA_OFF values, each a short 6-layer decode (ABL_ARGS) for the table
if [ -n "${ABLATE:-}" ]; then
  IFS='|' read -ra A <<< "$ABLATE"
  for a in "${A[@]}"; do
    echo "== ablation OFF=$a at $(( $(date +%s) - t0 )) s"
    SKIP_MODEL=1 HF_TIMEOUT=0 DI_TIMEOUT=${ABL_TIMEOUT:-45} OFF="$a" \
      BENCH_ARGS="${ABL_ARGS:---layers 6 --steps 16 --case-seconds 2 --batch 1,128 --prefill 0}" \
      bash bench/run_session_h200.sh "$PKG" "$OUT/off_${a//,/_}" 2>&1 | grep -E "^\| decode|^\| prefill" | head -6
  done
fi
if [ -n "${NCU_CASES:-}" ]; then
  echo "== ncu ops at $(( $(date +%s) - t0 )) s"
  bash bench/run_ncu_ops_h200.sh "$PKG" "$OUT/ncu_ops" 2>&1 | head -60
fi
echo "== done at $(( $(date +%s) - t0 )) s"
