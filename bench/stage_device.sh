#!/usr/bin/env bash
# Stages the checkout for a call of the device tool (its working-tree copy is capped at 64 MiB) and restores it
# afterwards. `stage`: packages the build into .gpu (tests/cuda/package_gpu.sh; .gpu is excluded from git) and moves
# the tracked files a device run does not read (sources, docs, test data; with LEAN=1 also the unit and python
# tests and the CUDA test sources; LEAN=2 also the model fixtures, for runs without the model checks) to STASH. `restore`: moves them back. Always restore right after the device call: edits to moved files
# fail while they are away. Usage (repo root): bash bench/stage_device.sh stage|restore [BUILD_DIR]
set -euo pipefail
cmd=${1:?stage or restore}
BUILD=${2:-build}
STASH=${STASH:-/tmp/deepinfer_device_stash}
paths=(tests/data docs data/nano tests/fixtures/v4/tiny_f32/debug.safetensors src)
[ "${LEAN:-0}" -ge 1 ] && paths+=(tests/unit tests/python tests/cuda/test_cuda_ops.cu tests/cuda/test_model_cuda.cc scripts python)
[ "${LEAN:-0}" -ge 2 ] && paths=("${paths[@]/tests\/fixtures\/v4\/tiny_f32\/debug.safetensors/tests/fixtures}")
case "$cmd" in
  stage)
    grep -q '^/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    rm -rf .gpu
    bash tests/cuda/package_gpu.sh "$BUILD" .gpu > /dev/null
    for p in "${paths[@]}"; do
      [ -e "$p" ] || continue
      [ -e "$STASH/$p" ] && { echo "$STASH/$p exists: restore first" >&2; exit 1; }
      mkdir -p "$STASH/$(dirname "$p")"
      mv "$p" "$STASH/$p"
    done
    echo "tracked files left: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes; .gpu: $(du -sb .gpu | cut -f1) bytes (limit 67108864 together)"
    ;;
  restore)
    for p in tests/fixtures tests/unit tests/python tests/cuda/test_cuda_ops.cu tests/cuda/test_model_cuda.cc scripts python "${paths[@]}"; do
      # (directories before files inside them)
      [ -e "$STASH/$p" ] || continue
      # (a stashed directory whose place exists holds only the parents of stashed files: they come back below)
      [ -d "$STASH/$p" ] && [ -e "$p" ] && continue
      mkdir -p "$(dirname "$p")"
      mv "$STASH/$p" "$p"
    done
    [ -d "$STASH" ] && find "$STASH" -depth -type d -empty -delete  # (the parents of moved files)
    git status --short | head
    ;;
  *) echo "usage: $0 stage|restore [BUILD_DIR]" >&2; exit 2 ;;
esac
