#!/usr/bin/env bash
# GPU all-reduce bus bandwidth of cten (bench_allreduce) beside its anchor
# in the same run: NCCL's all_reduce_perf when it is on the PATH (or
# $NCCL_TESTS), else PyTorch's dist.all_reduce (bench/torch_allreduce.py).
#   bash bench/allreduce.sh [NRANKS] [SIZES]      e.g.  bash bench/allreduce.sh 2 1M,64M,1G
# Needs a build with MPI and NCCL in build/ (or $CT_BENCH_BUILD) and one GPU
# per rank. Prints both tables and the ratio of cten's busbw to the
# anchor's at each size.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2}
sizes=${2:-1M,16M,256M,1G}
build=${CT_BENCH_BUILD:-build}
mpirun=(mpirun -np "$n")
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"${mpirun[@]}" "$build/bench/bench_allreduce" --device cuda --sizes "$sizes" | tee "$out/cten.txt"
perf=${NCCL_TESTS:-$(command -v all_reduce_perf || true)}
if [ -n "$perf" ]; then
    # One process per GPU, float32 sums, the sizes above, in place
    # (all_reduce_perf's "in-place" busbw column is what cten's call does).
    lo=${sizes%%,*}
    hi=${sizes##*,}
    "${mpirun[@]}" "$perf" -b "$lo" -e "$hi" -f 2 -g 1 -d float -o sum -n 20 -w 5 | tee "$out/anchor.txt"
    anchor=nccl
else
    "${mpirun[@]}" python3 bench/torch_allreduce.py --sizes "$sizes" | tee "$out/anchor.txt"
    anchor=torch
fi
python3 - "$out/cten.txt" "$out/anchor.txt" "$anchor" <<'PY'
import sys
def rows(path, kind):
    r = {}
    for line in open(path):
        f = line.split()
        if not f or not f[0].isdigit():
            continue
        if kind == "nccl":   # size count type redop root time algbw busbw #wrong (out-of-place), then in-place
            if len(f) >= 12:
                r[int(f[0])] = float(f[11])
        else:
            r[int(float(f[0]))] = float(f[3])
    return r
cten, anchor = rows(sys.argv[1], "cten"), rows(sys.argv[2], sys.argv[3])
print("%12s %12s %12s %8s" % ("bytes", "cten busbw", sys.argv[3] + " busbw", "ratio"))
for b in sorted(cten):
    if b in anchor and anchor[b] > 0:
        print("%12d %12.3f %12.3f %8.3f" % (b, cten[b], anchor[b], cten[b] / anchor[b]))
PY
