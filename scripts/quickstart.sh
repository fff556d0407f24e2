#!/usr/bin/env bash
# Fresh Debian 12 machine: install dependencies, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
./build/deepinfer generate --prompt "In the beginning" --max-tokens 64
