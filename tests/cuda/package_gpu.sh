#!/usr/bin/env bash
# Packs what a device run needs into PKG (default .gpu, ignored by git: add `/.gpu/` to
# .git/info/exclude) from a CUDA build made HERE (nvcc for sm_90a; binaries run there unchanged):
# the xz-compressed deepinfer, test_model_cuda and test_cuda_ops, the run script, and lib/ with
# loader stand-ins or copies of the Debian libraries the GPU machine lacks (OpenBLAS stub, ICU stub,
# PCRE2, cpp-httplib, brotli). Then, with the device tool:
#   run(command="bash .gpu/run_model_h200.sh .gpu $OUT", carry=[".gpu"])
#   run(command="bash bench/run_bench_h200.sh .gpu $OUT", carry=[".gpu"])   # the V4-Flash slice benchmark
# The tool sends at most 64 MiB (tracked files + carry); main tracks more, so move tests/data/ (unused
# on the GPU) out of the tree for the call and back after it: `mv tests/data /tmp/ && ... && mv /tmp/data tests/`.
# Usage: tests/cuda/package_gpu.sh [BUILD_DIR] [PKG]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
PKG=${2:-.gpu}
mkdir -p "$PKG/lib"
[ -x "$B/deepinfer" ] || { echo "missing $B/deepinfer: build with CUDA first (scripts/build.sh)"; exit 1; }
for f in "$B/deepinfer" "$B/tests/cuda/test_model_cuda" "$B/tests/cuda/test_cuda_ops"; do
  # the test binaries are optional: `deepinfer bench` (bench/run_bench_h200.sh) needs deepinfer only
  [ -x "$f" ] || { echo "note: no $f (not packed)"; continue; }
  # (host symbols stripped: ~170 KB less each once compressed, which keeps a full run's tree under the tool's
  # 64 MiB; the kernels' names live in the fatbin, so Nsight Compute still names them)
  strip -o "$PKG/.strip.tmp" "$f"
  xz -9 -T2 -c "$PKG/.strip.tmp" > "$PKG/$(basename "$f").xz"
  rm -f "$PKG/.strip.tmp"
done
cp tests/cuda/run_model_h200.sh "$PKG/"
# Optional: a transformers wheel for bench/hf_slice_bench.py, used there only when the machine's
# transformers lacks deepseek_v4 (its 5.17 has it): HF_WHEEL=path/to/transformers-X-py3-none-any.whl
if [ -n "${HF_WHEEL:-}" ]; then mkdir -p "$PKG/wheels" && cp "$HF_WHEEL" "$PKG/wheels/"; fi
cc -shared -fPIC -O2 -o "$PKG/lib/libopenblas.so.0" tests/cuda/openblas_stub.c
bash tests/cuda/make_icu_stub.sh "$B/deepinfer" "$PKG/lib"
# Real copies of small Debian libraries that Ubuntu 24.04's image does not have in these versions.
for l in libpcre2-8.so.0 libcpp-httplib.so.0.11 libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1; do
  src=$(ldd "$B/deepinfer" | awk -v n="$l" '$1 == n {print $3}')
  [ -n "$src" ] || continue
  xz -9 -c "$(readlink -f "$src")" > "$PKG/lib/$l.xz"  # (the run scripts unpack lib/*.xz)
done
du -sh "$PKG"
