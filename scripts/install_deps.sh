#!/usr/bin/env bash
# Installs what DeepInfer builds against, from Debian 12's packages. Idempotent; needs root (or sudo).
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
PKGS=(build-essential cmake pkg-config git
      libopenblas-dev nlohmann-json3-dev libpcre2-dev libicu-dev zlib1g-dev
      libgtest-dev libgmock-dev libcpp-httplib-dev libssl-dev libbrotli-dev python3 python3-venv python3-dev)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# The tests' Python packages (requirements-test.txt, pinned) in a venv beside the sources: .venv.
# As the invoking user, not root, so that a developer's checkout stays theirs.
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python3 ]; then python3 -m venv .venv; fi
.venv/bin/python3 -m pip install -q --disable-pip-version-check -r requirements-test.txt
