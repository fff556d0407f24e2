#!/usr/bin/env bash
# Nsight Compute sections of single op-test perf cases (the kernel in isolation, weights cold): for each
# filter in NCU_CASES ('|'-separated test_cuda_ops filters), the first NCU_COUNT launches of kernels
# matching NCU_K. Output: OUT/<i>.txt. Usage (repo root on the GPU machine): bash bench/run_ncu_ops_h200.sh PKG OUT
set -u
PKG=${1:-.gpu}
OUT=${2:-/tmp/ncu_ops}
mkdir -p "$OUT" /tmp/to
[ -x /tmp/to/test_cuda_ops ] || { xz -dc "$PKG/test_cuda_ops.xz" > /tmp/to/test_cuda_ops && chmod +x /tmp/to/test_cuda_ops; }
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
IFS='|' read -ra C <<< "${NCU_CASES:?NCU_CASES}"
i=0
for c in "${C[@]}"; do
  timeout -k 5 ${NCU_TIMEOUT:-60} "$NCU" --clock-control none -k "regex:${NCU_K:-.}" --launch-count ${NCU_COUNT:-1} \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section SourceCounters \
    ${NCU_SRC:+-o "$OUT/$i" --import-source no} \
    --log-file "$OUT/$i.txt" /tmp/to/test_cuda_ops --perf --filter "$c" > "$OUT/$i.log" 2>&1
  echo "case $i '$c' rc=$?"
  # NCU_SRC=1: also the stall reasons (warp cycles per issued instruction, by reason) and the SASS with
  # its per-instruction samples, from the saved report (the text sections above omit both)
  if [ -n "${NCU_SRC:-}" ] && [ -f "$OUT/$i.ncu-rep" ]; then
    "$NCU" -i "$OUT/$i.ncu-rep" > "$OUT/$i.txt" 2>&1
    "$NCU" -i "$OUT/$i.ncu-rep" --page raw 2>&1 | grep -E "issue_stalled|inst_executed.sum |dram__bytes_read.sum " > "$OUT/$i.stalls.txt"
    sort -k3 -g -r "$OUT/$i.stalls.txt" | head -14
    "$NCU" -i "$OUT/$i.ncu-rep" --page source --print-source sass --csv > "$OUT/$i.sass.csv" 2>&1
    echo "sass rows: $(wc -l < "$OUT/$i.sass.csv")"
    rm -f "$OUT/$i.ncu-rep"
  fi
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|highest-utilized" "$OUT/$i.txt" | head -12
  i=$((i + 1))
done
