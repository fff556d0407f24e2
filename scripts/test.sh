#!/usr/bin/env bash
# Builds (if needed) and runs every test: the C++ unit and reference tests through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 900
