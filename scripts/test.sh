#!/usr/bin/env bash
# Installs what is missing, builds cten and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
cten_deps
[ -d build ] || meson setup build
ninja -C build
meson test -C build --print-errorlogs "$@"
