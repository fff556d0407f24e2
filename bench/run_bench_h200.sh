#!/usr/bin/env bash
# One device run of the V4-Flash slice benchmark (issue #6 item 5), ending within ~8 minutes:
#   1. deepinfer bench --backend cuda --config flash (layers: as many as fit)  -> OUT/bench.json
#   2. transformers' DeepseekV4ForCausalLM on the same slice (bench/hf_slice_bench.py) -> OUT/hf.json
#   3. the plot and the side-by-side table (bench/plot_bench.py)         -> OUT/bench.png, OUT/bench.md
# Every step has a timeout and a log in OUT; each tool writes its JSON after every case, so a step
# cut short still leaves what it measured.
# Usage (repo root on the GPU machine): bash bench/run_bench_h200.sh PKG [OUT]
#   PKG: made by tests/cuda/package_gpu.sh (deepinfer.xz + lib/; optional wheels/transformers-*.whl,
#   used only when the machine's transformers has no deepseek_v4).
# Knobs (environment): DI_TIMEOUT (270 s), HF_TIMEOUT (170 s), BENCH_ARGS (extra deepinfer bench flags,
# e.g. "--layers 2 --steps 8"), HF_ARGS (extra hf_slice_bench.py flags).
set -u
PKG=${1:-.gpu}
OUT=${2:-${OUT:-/tmp/bench_out}}
mkdir -p "$OUT" /tmp/tb/lib
[ -f "$PKG/deepinfer.xz" ] && xz -dc "$PKG/deepinfer.xz" > /tmp/tb/deepinfer && chmod +x /tmp/tb/deepinfer
for l in "$PKG"/lib/*; do
  [ -e "$l" ] || continue
  n=$(basename "$l" .xz)
  ldconfig -p | grep -q "$n " && continue  # the machine has it
  case "$l" in *.xz) xz -dc "$l" > /tmp/tb/lib/$n ;; *) cp "$l" /tmp/tb/lib/$n ;; esac
done
export LD_LIBRARY_PATH=/tmp/tb/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used,memory.total \
  --format=csv | tee "$OUT/nvidia-smi.txt"
ldd /tmp/tb/deepinfer | grep -i "not found"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

echo "== deepinfer bench"
timeout -k 10 ${DI_TIMEOUT:-270} /tmp/tb/deepinfer bench --backend cuda --config flash --case-seconds 20 \
  --device-name "${GPU:-cuda device}" --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
echo "rc deepinfer bench=${PIPESTATUS[0]}"

echo "== transformers"
WHEEL=()
if ! python3 -c "import transformers.models.deepseek_v4" 2>/dev/null; then
  w=$(ls "$PKG"/wheels/transformers-*.whl 2>/dev/null | head -1)
  [ -n "$w" ] && WHEEL=(--transformers-wheel "$w") || echo "this transformers has no deepseek_v4 and PKG/wheels has none"
fi
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
HF_T=${HF_TIMEOUT:-170}
if [ -f "$OUT/bench.json" ]; then
  timeout -k 10 "$HF_T" python3 bench/hf_slice_bench.py --deepinfer-json "$OUT/bench.json" --json "$OUT/hf.json" \
    --case-seconds 15 --budget-seconds $((HF_T - 40)) "${WHEEL[@]}" ${HF_ARGS:-} 2>&1 | tee "$OUT/hf.log"
  echo "rc hf_slice_bench=${PIPESTATUS[0]}"
fi

echo "== plot"
timeout 60 python3 bench/plot_bench.py --deepinfer "$OUT/bench.json" --hf "$OUT/hf.json" --png "$OUT/bench.png" \
  --md "$OUT/bench.md" 2>&1 | tee "$OUT/plot.log"
ls -la "$OUT"
