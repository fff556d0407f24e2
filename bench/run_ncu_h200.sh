#!/usr/bin/env bash
# Hardware counters of the V4-Flash slice's kernels on the H200 (Nsight Compute; the Firecracker
# machines allow it, see the device notes): one decode step at each batch in NCU_BATCHES (every kernel:
# time, DRAM bytes, grid, registers, occupancy), the full sections of the kernels matching NCU_DETAIL,
# and the prefill's heaviest kernels. Output: OUT/*.csv, OUT/*.txt. Builds nothing.
# Usage (repo root on the GPU machine): bash bench/run_ncu_h200.sh PKG OUT
set -u
PKG=${1:-.gpu}
OUT=${2:-/tmp/ncu_out}
mkdir -p "$OUT" /tmp/tb/lib
[ -x /tmp/tb/deepinfer ] || { xz -dc "$PKG/deepinfer.xz" > /tmp/tb/deepinfer && chmod +x /tmp/tb/deepinfer; }
for l in "$PKG"/lib/*; do
  n=$(basename "$l" .xz); ldconfig -p | grep -q "$n " && continue
  case "$l" in *.xz) xz -dc "$l" > /tmp/tb/lib/$n ;; *) cp "$l" /tmp/tb/lib/$n ;; esac
done
export LD_LIBRARY_PATH=/tmp/tb/lib:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
export DEEPINFER_PROFILER_RANGE=1 DEEPINFER_CUDA_OFF=${OFF:-graphs}
LAYERS=${NCU_LAYERS:-2}
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__shared_mem_per_block_dynamic
for B in ${NCU_BATCHES:-1 128}; do
  timeout -k 5 ${NCU_TIMEOUT:-150} "$NCU" --clock-control none --profile-from-start off --metrics "$M" --csv \
    --log-file "$OUT/decode_b$B.csv" /tmp/tb/deepinfer bench --backend cuda --config flash --layers $LAYERS \
    --batch $B --prefill 0 --steps 1 --warmup 1 --profile 1 > "$OUT/decode_b$B.log" 2>&1
  echo "decode b$B rc=$? rows=$(wc -l < "$OUT/decode_b$B.csv")"
done
if [ -n "${NCU_DETAIL:-gemv|moe}" ]; then
  timeout -k 5 ${NCU_TIMEOUT:-150} "$NCU" --clock-control none --profile-from-start off -k "regex:${NCU_DETAIL:-gemv|moe}" \
    --launch-count ${NCU_DETAIL_COUNT:-12} --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    --log-file "$OUT/detail_b1.txt" /tmp/tb/deepinfer bench --backend cuda --config flash --layers $LAYERS \
    --batch 1 --prefill 0 --steps 1 --warmup 1 --profile 1 > "$OUT/detail_b1.log" 2>&1
  echo "detail b1 rc=$?"
fi
if [ "${NCU_PREFILL:-1}" = 1 ]; then
  timeout -k 5 ${NCU_TIMEOUT:-150} "$NCU" --clock-control none --profile-from-start off -k "regex:${NCU_PREFILL_K:-moe_expert|attention_mma|gemm|hc_pre}" \
    --launch-count ${NCU_PREFILL_COUNT:-14} --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --log-file "$OUT/prefill.txt" /tmp/tb/deepinfer bench --backend cuda --config flash --layers 1 --batch '' \
    --prefill 4096 --chunk 4096 --profile 1 > "$OUT/prefill.log" 2>&1
  echo "prefill rc=$?"
fi
