#!/bin/sh
# cten-train-lm --cuda-graph trains as the eager loop does: the first step
# runs eagerly, the second is captured, the rest are replays, and the loss of
# every step (two micro-batches each, bf16 autocast) agrees with the eager
# run's. Skipped (77) where no CUDA device is usable.
# usage: test_lm_graph.sh CTEN_INFO CTEN_TRAIN_LM DATA_FILE
set -eu
info=$1
exe=$2
data=$3
"$info" | grep -q "^    cuda:0 " || { echo "no CUDA device: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args="--device cuda --layers 2 --width 64 --heads 4 --kv-heads 2 --context 32 --batch-size 4
  --grad-accum 2 --steps 12 --warmup 2 --log-every 1 --val-every 0 --val-batches 2 --sample 0
  --data $data"
"$exe" $args > "$dir/eager.log"
"$exe" $args --cuda-graph > "$dir/graph.log"
for f in eager graph; do
    grep "^step .* loss" "$dir/$f.log" | grep -v validation | awk '{print $2, $4}' > "$dir/$f.losses"
done
[ "$(wc -l < "$dir/graph.losses")" -eq 12 ] || { cat "$dir/graph.log"; exit 1; }
grep -q "norm -" "$dir/graph.log"
# the same kernels on the same inputs: equal up to the order of cuDNN's and
# cuBLAS's own reductions
paste "$dir/eager.losses" "$dir/graph.losses" | awk '
    { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 > 0 ? $2 : 1); if (r > worst) worst = r }
    END { printf "largest relative difference of the losses %.2e\n", worst; exit(worst > 1e-3) }' ||
    { paste "$dir/eager.losses" "$dir/graph.losses"; exit 1; }
