#!/usr/bin/env bash
# Builds (if needed) and runs every test: the C++ unit and reference tests and the pytest suites
# through ctest, then the Python package as pip installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
# Tests keep their scratch files apart (per-process names), so ctest may run them side by side.
ctest --test-dir build --output-on-failure --timeout 900 -j"${JOBS:-$(nproc)}"
bash scripts/test_python_package.sh
