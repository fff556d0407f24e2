#!/usr/bin/env bash
# Builds and installs the Python package as a user would (pip install . -> scikit-build-core -> the
# same CMake), then runs the Python API tests against the installed copy, outside the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${DEEPINFER_PYTHON:-$PWD/.venv/bin/python3}
# CPU-only package here: CI has nvcc but no GPU, and the CUDA kernels are not linked into it yet.
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation . \
  --config-settings=cmake.define.DEEPINFER_CUDA=OFF \
  --config-settings=build.tool-args=-j"${JOBS:-$(nproc)}"
tests=$PWD/tests/python/test_python_api.py
cd "$(mktemp -d)"
DEEPINFER_EXPECT_INSTALLED=1 "$PY" -m pytest -q -p no:cacheprovider "$tests"
