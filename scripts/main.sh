#!/usr/bin/env bash
# Installs what is missing, builds cten and runs the main example: the
# language model of examples/llm trained on the text of Debian's fortunes,
# then sampled. On a GPU: the example's default model (llama-style, 6 layers,
# width 384, context 256, 9.5M parameters), 2000 steps in bf16 autocast, the
# step replayed from a CUDA graph. On a CPU: 4 layers of width 128, context
# 128 (0.82M parameters), 800 steps in float32, about a minute and a half on
# two cores. Arguments go to the example and win over these (bash
# scripts/main.sh --steps 2000; --help lists them). Ctrl-C saves a checkpoint
# in build/; --resume continues from it. scripts/fashion.sh trains the
# Fashion-MNIST CNN instead.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
cten_deps
cten_build_for_this_machine
./build/examples/cten-info
run=(./build/examples/cten-train-lm --checkpoint build/lm.safetensors)
if [ "$cten_gpu_build" = 1 ]; then
    run+=(--device cuda --cuda-graph)
else
    run+=(--layers 4 --width 128 --heads 4 --kv-heads 2 --context 128 --steps 800 --warmup 50
          --lr 2e-3 --log-every 50 --val-every 200 --val-batches 10)
fi
"${run[@]}" "$@"
