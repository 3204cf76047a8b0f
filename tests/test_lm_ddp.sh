#!/bin/sh
# cten-train-lm --ddp on 2 ranks takes the steps one process takes with
# twice the batch: the same windows split between the ranks, the gradients
# averaged. After 6 steps (2 micro-batches each) the parameters and AdamW's
# states of both checkpoints agree within float32 rounding, and so do the
# printed losses. Skipped (77) without NumPy for the comparison.
# usage: test_lm_ddp.sh MPIRUN_SH MPIRUN CTEN_TRAIN_LM DATA_FILE PYTHON3
set -eu
mpirun_sh=$1
mpirun=$2
exe=$3
data=$4
python=$5
"$python" -c 'import numpy' 2>/dev/null || { echo "no NumPy: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args="--layers 2 --width 32 --heads 4 --kv-heads 2 --context 32 --grad-accum 2
  --steps 6 --warmup 2 --log-every 1 --val-every 0 --val-batches 2 --sample 0 --data $data"
"$mpirun_sh" "$mpirun" 2 "$exe" --ddp $args --batch-size 2 --checkpoint "$dir/ddp.safetensors" \
    > "$dir/ddp.log"
"$exe" $args --batch-size 4 --checkpoint "$dir/one.safetensors" > "$dir/one.log"
grep -q "data-parallel over 2 processes" "$dir/ddp.log"
for f in ddp one; do
    grep "^step .* loss" "$dir/$f.log" | grep -v validation | sed 's/  lr .*//' > "$dir/$f.losses"
done
if ! cmp "$dir/ddp.losses" "$dir/one.losses"; then
    paste "$dir/ddp.losses" "$dir/one.losses"
    exit 1
fi
"$python" - "$dir/ddp.safetensors" "$dir/one.safetensors" <<'PY'
import json, struct, sys
import numpy as np

def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        dt = {"F32": np.float32, "F64": np.float64, "I64": np.int64}[v["dtype"]]
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt).reshape(v["shape"])
    return out

a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), "the checkpoints hold different tensors"
worst, where = 0.0, None
for k in a:
    x, y = a[k].astype(np.float64), b[k].astype(np.float64)
    # float32 rounding of sums taken in another order (two halves and an
    # all-reduce against one batch), relative to the tensor's size. AdamW
    # divides by the root of the second moment, so in an element whose
    # gradient is near 0 that rounding moves a whole step's share of lr:
    # 1.2e-5 on some machines after 6 steps. A wrong average or a rank's
    # missing gradient moves every element by steps of lr (1e-2 and more).
    err = np.abs(x - y).max() / (np.abs(y).max() + 1e-30) if y.size else 0.0
    if err > worst:
        worst, where = err, k
print(f"{len(a)} tensors, largest difference {worst:.2e} of the tensor's magnitude ({where})")
sys.exit(0 if worst <= 5e-5 else 1)
PY
