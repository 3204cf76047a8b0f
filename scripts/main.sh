#!/usr/bin/env bash
# Installs what is missing, builds cten and runs the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
cten_deps
[ -d build ] || meson setup build
ninja -C build
./build/examples/cten-info
./build/examples/quickstart
