#!/usr/bin/env bash
# Configures and builds DeepInfer into ./build (Release). Extra arguments go to cmake's configure step,
# e.g. scripts/build.sh -DDEEPINFER_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$JOBS"
