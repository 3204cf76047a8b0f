#!/bin/sh
# cten-train-lm stopped and resumed continues exactly: 6 steps in one run
# and 3 + 3 steps (--stop-after 3, then --resume) write the same final
# checkpoint, byte for byte (parameters, AdamW's state, the data position
# and the step). Runs on DATA_FILE, a small text. --recompute (the MLP's
# activation made again in the backward) and --activation-checkpointing
# (each block made again) write that checkpoint too, for both families.
# usage: test_lm_resume.sh CTEN_TRAIN_LM DATA_FILE
set -eu
exe=$1
data=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args="--layers 2 --width 32 --heads 4 --kv-heads 2 --context 32 --batch-size 4 --grad-accum 2
  --steps 6 --warmup 2 --log-every 1 --val-every 0 --val-batches 2 --sample 0 --data $data"
"$exe" $args --checkpoint "$dir/whole.safetensors" > "$dir/whole.log"
"$exe" $args --checkpoint "$dir/split.safetensors" --stop-after 3 > "$dir/first.log"
grep -q "saved at step 3" "$dir/first.log"
"$exe" $args --checkpoint "$dir/split.safetensors" --resume > "$dir/second.log"
grep -q "resumed from .* at step 3" "$dir/second.log"
if ! cmp "$dir/whole.safetensors" "$dir/split.safetensors"; then
    echo "the resumed run's checkpoint differs from the uninterrupted run's"
    cat "$dir/whole.log" "$dir/first.log" "$dir/second.log"
    exit 1
fi
# The same losses at the steps both printed (step 6).
grep "^step     6/6  loss" "$dir/whole.log" > "$dir/a"
grep "^step     6/6  loss" "$dir/second.log" > "$dir/b"
sed -i 's/ *[0-9]* tok\/s.*//' "$dir/a" "$dir/b"
cmp "$dir/a" "$dir/b"
echo "resumed run matches: $(cat "$dir/a")"
# Recomputation changes no bit of the training.
"$exe" $args --checkpoint "$dir/recompute.safetensors" --recompute > "$dir/recompute.log"
cmp "$dir/whole.safetensors" "$dir/recompute.safetensors"
"$exe" $args --model gpt2 --kv-heads 4 --checkpoint "$dir/gpt2.safetensors" > "$dir/gpt2.log"
"$exe" $args --model gpt2 --kv-heads 4 --checkpoint "$dir/gpt2r.safetensors" --recompute \
    > "$dir/gpt2r.log"
cmp "$dir/gpt2.safetensors" "$dir/gpt2r.safetensors"
"$exe" $args --checkpoint "$dir/ckpt.safetensors" --activation-checkpointing > "$dir/ckpt.log"
cmp "$dir/whole.safetensors" "$dir/ckpt.safetensors"
"$exe" $args --model gpt2 --kv-heads 4 --checkpoint "$dir/gpt2c.safetensors" \
    --activation-checkpointing > "$dir/gpt2c.log"
cmp "$dir/gpt2.safetensors" "$dir/gpt2c.safetensors"
echo "recomputing and checkpointing runs match (llama and gpt2)"
