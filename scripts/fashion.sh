#!/usr/bin/env bash
# Installs what is missing, builds cten and trains the Fashion-MNIST CNN
# (examples/fashion_cnn.c) on the GPU when one can be used, else on the CPU,
# printing its progress and test accuracy. Arguments go to the example
# (bash scripts/fashion.sh --epochs 2; --help lists them). Ctrl-C saves a
# checkpoint in build/; --resume continues from it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
cten_deps
cten_build_for_this_machine
./build/examples/cten-info
./build/examples/cten-fashion-cnn --device auto --checkpoint build/fashion_cnn.safetensors "$@"
