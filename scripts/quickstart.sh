#!/usr/bin/env bash
# Fresh Debian 12 machine: install dependencies, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
# Until the embedded default model lands, the main job is a forward pass over a committed tiny
# DeepSeek-V4 checkpoint (its logits match transformers' to ~1e-6).
echo '[0, 17, 42, 7, 99, 3, 250, 11]' > /tmp/deepinfer_ids.json
./build/deepinfer logits --model tests/fixtures/v4/tiny_f32/model --ids-file /tmp/deepinfer_ids.json \
  --out /tmp/deepinfer_logits.safetensors
echo "wrote /tmp/deepinfer_logits.safetensors"
