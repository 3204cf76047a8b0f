#!/usr/bin/env bash
# Installs what is missing, builds cten (CUDA included when the toolkit is
# here) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
cten_deps
cten_test_deps
# Everything, the CUDA backend included wherever its toolkit is found, GPU
# or not: CI compiles and links it, and its GPU tests are skipped.
cten_configure auto
ninja -C build
meson test -C build --print-errorlogs "$@"
