#!/usr/bin/env bash
# The op test's correctness cases in parallel processes (its CPU references set the pace: one process
# took ~400 s), then perf filters one at a time. Usage (repo root on the GPU machine):
#   bash tests/cuda/run_ops_split.sh PKG OUT ["perf filter|perf filter|..."]
set -u
PKG=${1:-.gpu}
OUT=${2:-/tmp/ops_out}
mkdir -p "$OUT" /tmp/to
xz -dc "$PKG/test_cuda_ops.xz" > /tmp/to/test_cuda_ops && chmod +x /tmp/to/test_cuda_ops
GROUPS_=("gemv_q" "sink_attention|indexer|topk" "moe_" "norm_rope|fusecomp|hc_" "!gemv_q|sink_attention|indexer|topk|moe_|norm_rope|fusecomp|hc_")
i=0
for f in "${GROUPS_[@]}"; do
  (timeout ${OPS_TIMEOUT:-300} /tmp/to/test_cuda_ops --filter "$f" > "$OUT/ops_$i.txt" 2>&1; echo "ops '$f' rc=$? $(tail -1 "$OUT/ops_$i.txt")") &
  i=$((i + 1))
done
wait
cat "$OUT"/ops_*.txt > "$OUT/cuda_ops.txt"
echo "op cases: $(grep -c '^\[PASS\]' "$OUT/cuda_ops.txt") passed, $(grep -c '^\[FAIL\]' "$OUT/cuda_ops.txt") failed"
grep '^\[FAIL\]' "$OUT/cuda_ops.txt" | cut -c1-300 | head -30
if [ -n "${3:-}" ]; then
  IFS='|' read -ra F <<< "$3"
  for f in "${F[@]}"; do
    timeout ${PERF_TIMEOUT:-45} /tmp/to/test_cuda_ops --perf --filter "$f" >> "$OUT/ops_perf.txt" 2>&1
    echo "perf '$f' rc=$?"
  done
fi
