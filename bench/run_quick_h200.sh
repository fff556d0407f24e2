#!/usr/bin/env bash
# A short device call for one new kernel: its op-test correctness cases (OPS_FILTER) beside the model
# checks (MODEL=1), then op perf filters (PERF, '|'-separated substrings, one process), a 6-layer decode
# bench with --profile (L6_ARGS, L6=0 skips), a 31-layer decode (L31_ARGS, L31=0 skips) and ablations
# (ABLATE, '|'-separated OFF values, ABL_ARGS), then more bench runs (BENCHES), then a kernel timeline (TRACE=1,
# TRACE_ARGS); OFF / ON are DEEPINFER_CUDA_OFF /
# DEEPINFER_CUDA_ON for the benches. Everything under OUT.
# Usage (repo root on the GPU machine): bash bench/run_quick_h200.sh PKG OUT
set -u
PKG=${1:-.gpu}
OUT=${2:-/tmp/quick_out}
mkdir -p "$OUT" /tmp/to
t0=$(date +%s)
xz -dc "$PKG/test_cuda_ops.xz" > /tmp/to/test_cuda_ops && chmod +x /tmp/to/test_cuda_ops
if [ -n "${OPS_FILTER:-}" ]; then
  (timeout ${OPS_TIMEOUT:-200} /tmp/to/test_cuda_ops --filter "$OPS_FILTER" > "$OUT/ops.txt" 2>&1
   echo "ops rc=$? $(tail -1 "$OUT/ops.txt")") &
fi
if [ "${MODEL:-1}" = 1 ]; then
  OPS_TIMEOUT=1 TM_TIMEOUT=${TM_TIMEOUT:-250} bash tests/cuda/run_model_h200.sh "$PKG" "$OUT/model" > "$OUT/model_run.log" 2>&1
  grep -E "rc |PASS|FAIL|passed|failed|flip|generate" "$OUT/model_run.log" | head -30
fi
wait
[ -n "${OPS_FILTER:-}" ] && { echo "op cases: $(grep -c '^\[PASS\]' "$OUT/ops.txt") passed, $(grep -c '^\[FAIL\]' "$OUT/ops.txt") failed"; grep '^\[FAIL\]' "$OUT/ops.txt" | cut -c1-300 | head -20; }
echo "== perf at $(( $(date +%s) - t0 )) s"
if [ -n "${PERF:-}" ]; then
  timeout ${PERF_TIMEOUT:-200} /tmp/to/test_cuda_ops --perf --filter "$PERF" > "$OUT/perf.txt" 2>&1
  echo "perf rc=$?"
  # (perf: back-to-back stream launches; graph: per call from a CUDA graph with programmatic edges, the model's
  # setting — compare kernels on the graph line; the floor cases print their graph time as perf:)
  grep -E "^\[(PASS|FAIL)\]|perf:|graph:" "$OUT/perf.txt" | cut -c1-190 | head -200
fi
echo "== bench l6 at $(( $(date +%s) - t0 )) s"
export DEEPINFER_CUDA_ON=${ON:-}
[ "${L6:-1}" = 1 ] && SKIP_MODEL=1 HF_TIMEOUT=0 DI_TIMEOUT=${L6_TIMEOUT:-100} OFF=${OFF:-} \
  BENCH_ARGS="${L6_ARGS:---layers 6 --chunk 4096 --steps 8 --case-seconds 3 --profile 2 --batch 1,8,128 --prefill 0}" \
  bash bench/run_session_h200.sh "$PKG" "$OUT/l6" 2>&1 | grep -vE "^  [a-z_0-9]+ " | head -20
[ "${L6:-1}" = 1 ] && grep -E "^profile|^  [a-z_0-9]+ " "$OUT/l6/bench/bench.log" | head -60
echo "== bench l31 at $(( $(date +%s) - t0 )) s"
[ "${L31:-1}" = 1 ] && SKIP_MODEL=1 HF_TIMEOUT=0 DI_TIMEOUT=${L31_TIMEOUT:-90} OFF=${OFF:-} \
  BENCH_ARGS="${L31_ARGS:---layers 31 --steps 8 --case-seconds 3 --batch 1,8,128 --prefill 0}" \
  bash bench/run_session_h200.sh "$PKG" "$OUT/l31" 2>&1 | grep -E "^\|" | head -10
# ABLATE / ABLATE_ON: '|'-separated DEEPINFER_CUDA_OFF / DEEPINFER_CUDA_ON values (ON: opt-in paths), each a
# short decode (ABL_ARGS) beside the default. ablate KIND VALUES, KIND off or on.
ablate() {
  local kind=$1 a A
  IFS='|' read -ra A <<< "$2"
  for a in "${A[@]}"; do
    if [ "$kind" = off ]; then echo "== ablation OFF=$a at $(( $(date +%s) - t0 )) s"; else echo "== opt-in ON=$a at $(( $(date +%s) - t0 )) s"; fi
    ( if [ "$kind" = off ]; then export OFF="$a"; else export DEEPINFER_CUDA_ON="$a" OFF="${OFF:-}"; fi
      SKIP_MODEL=1 HF_TIMEOUT=0 DI_TIMEOUT=${ABL_TIMEOUT:-60} \
        BENCH_ARGS="${ABL_ARGS:---layers 31 --steps 8 --case-seconds 2 --batch 1,8 --prefill 0}" \
        bash bench/run_session_h200.sh "$PKG" "$OUT/${kind}_${a//,/_}" 2>&1 | grep -E "^\| decode|^\| prefill" | head -6 )
  done
}
[ -n "${ABLATE:-}" ] && ablate off "$ABLATE"
# BENCHES: '|'-separated bench argument strings, each one more bench run under the default settings (the same
# case with a bench flag changed, e.g. --feed 0 beside --feed 1).
if [ -n "${BENCHES:-}" ]; then
  IFS='|' read -ra BB <<< "$BENCHES"
  i=0
  for b in "${BB[@]}"; do
    i=$((i + 1))
    echo "== bench $i ($b) at $(( $(date +%s) - t0 )) s"
    SKIP_MODEL=1 HF_TIMEOUT=0 DI_TIMEOUT=${ABL_TIMEOUT:-60} OFF=${OFF:-} BENCH_ARGS="$b" \
      bash bench/run_session_h200.sh "$PKG" "$OUT/b$i" 2>&1 | grep -E "^\| decode|^\| prefill" | head -8
    grep -E "^profile|idle" "$OUT/b$i/bench/bench.log" | head -6
  done
fi
[ -n "${ABLATE_ON:-}" ] && ablate on "$ABLATE_ON"
# TRACE=1: a kernel timeline of decode steps (bench --kernel-trace through CUPTI; TRACE_ARGS, 31 layers b1 and b8 by
# default): every kernel's share of a step, graph replays as they run. CUPTI is found under /usr/local/cuda, in
# PyTorch's wheels, or anywhere (DEEPINFER_CUPTI names it).
if [ -n "${TRACE:-}" ]; then
  echo "== kernel trace at $(( $(date +%s) - t0 )) s"
  if [ -z "${DEEPINFER_CUPTI:-}" ]; then
    DEEPINFER_CUPTI=$(ls /usr/local/cuda/lib64/libcupti.so* /usr/local/cuda/extras/CUPTI/lib64/libcupti.so* 2>/dev/null | head -1)
    [ -z "$DEEPINFER_CUPTI" ] && DEEPINFER_CUPTI=$(find / -xdev -name 'libcupti.so*' 2>/dev/null | sort | head -1)
    export DEEPINFER_CUPTI
  fi
  echo "CUPTI: ${DEEPINFER_CUPTI:-none found}"
  SKIP_MODEL=1 HF_TIMEOUT=0 DI_TIMEOUT=${TRACE_TIMEOUT:-120} OFF=${OFF:-} \
    BENCH_ARGS="${TRACE_ARGS:---layers 31 --steps 8 --case-seconds 3 --batch 1,8 --prefill 0 --kernel-trace 4}" \
    bash bench/run_session_h200.sh "$PKG" "$OUT/trace" 2>&1 | grep -E "^\| decode|kernel-trace" | head -6
  grep -A33 "^kernel trace" "$OUT/trace/bench/bench.log" | head -72
  # the first kernels of the window in order (start, duration, gap / early start, marginal) and a PNG a case
  python3 bench/plot_kernel_trace.py "$OUT/trace/bench/bench.json" "$OUT/trace" --rows ${TRACE_ROWS:-60} 2>&1 | head -150
fi
echo "== done at $(( $(date +%s) - t0 )) s"
