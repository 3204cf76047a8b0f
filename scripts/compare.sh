#!/usr/bin/env bash
# Before/after benchmark of the working tree against an earlier commit, on
# this machine, in one run: builds cten-bench from BASE (a git worktree in
# build-compare/base-src) and from the working tree, then runs the two
# alternately ROUNDS times, so a slowdown of the shared machine hits both,
# and prints bench/compare.py's table (each case's median time before and
# after, the ratio, and the run's own noise: how far the rounds of one build
# spread).
#
# usage: bash scripts/compare.sh BASE [cten-bench options], e.g.
#   bash scripts/compare.sh eb354cf --quick --devices cpu
# BASE is a commit, or a folder holding that commit's sources (git archive
# BASE | tar -x -C folder) for machines where the repository's history is
# not at hand.
# Environment: CT_COMPARE_ROUNDS (default 3), CT_COMPARE_MESON_ARGS (options
# for both meson setups, e.g. -Dcuda=enabled), CT_COMPARE_OUT (JSON and the
# table; default $OUT when set, else build-compare/out).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 BASE [cten-bench options]" >&2; exit 2; }
base=$1
shift
rounds=${CT_COMPARE_ROUNDS:-3}
dir=build-compare
out=${CT_COMPARE_OUT:-${OUT:-$dir/out}}
mkdir -p "$dir" "$out"
read -r -a meson_args <<<"${CT_COMPARE_MESON_ARGS:-}"

if [ -d "$base" ]; then
    base_src=$base
else
    base_src=$dir/base-src
    rm -rf "$base_src"
    git worktree prune
    git worktree add --detach "$base_src" "$base" >/dev/null
fi
build() { # build SRC BUILD
    [ -f "$2/build.ninja" ] || meson setup "$2" "$1" -Dtests=false "${meson_args[@]}" >/dev/null
    ninja -C "$2" bench/cten-bench >/dev/null
}
build "$base_src" "$dir/base"
build . "$dir/head"

for r in $(seq 1 "$rounds"); do
    for side in base head; do
        echo "round $r: $side" >&2
        "$dir/$side/bench/cten-bench" "$@" --json "$out/$side-$r.json" >"$out/$side-$r.txt"
    done
done
[ -d "$base" ] || git worktree remove --force "$base_src"
python3 bench/compare.py --before "$out"/base-*.json --after "$out"/head-*.json \
    | tee "$out/compare.md"
