#!/usr/bin/env bash
# Runs the CPU-vs-GPU benchmark suite and its report (docs/BENCH.md):
#   1. python3-matplotlib from Debian when no Python has matplotlib (apt-get as
#      root or through sudo; a machine that cannot reach the archive gets the
#      markdown report only, and the chart can be drawn elsewhere from the JSON),
#   2. cten-bench built (meson setup first when the build directory is new),
#   3. cten-bench on every device present     -> cten.json, cten.txt
#   4. bench/torch_ref.py when torch imports  -> torch.json, torch.txt
#   5. bench/report.py                        -> bench.md, bench.png
#
# usage: bash scripts/bench.sh [quick|full] [options for cten-bench and torch_ref.py]
#   e.g. bash scripts/bench.sh quick --devices cpu
#
# Environment:
#   CT_BENCH_BUILD       build directory (default: build)
#   CT_BENCH_MESON_ARGS  options for meson setup of a new build directory (e.g. -Dcuda=enabled)
#   CT_BENCH_OUT         where results go (default: $OUT when set, else bench-results)
#   CT_BENCH_PYTHON      the Python for torch_ref.py (default: the first python3 that imports torch)
#   CT_BENCH_NO_APT=1    never call apt-get (machines without access to the archive)
# The exit status is non-zero when a step failed; the others still run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

mode=quick
if [ $# -gt 0 ] && { [ "$1" = quick ] || [ "$1" = full ]; }; then
    mode=$1
    shift
fi
build=${CT_BENCH_BUILD:-build}
out=${CT_BENCH_OUT:-${OUT:-bench-results}}
mkdir -p "$out"
flags=()
[ "$mode" = quick ] && flags+=(--quick)
failed=0

# The first of the candidate interpreters that can import module $1.
python_with() {
    local p
    for p in ${CT_BENCH_PYTHON:-} python3 /usr/bin/python3; do
        command -v "$p" >/dev/null 2>&1 && "$p" -c "import $1" >/dev/null 2>&1 && {
            echo "$p"
            return 0
        }
    done
    return 1
}

# ---- 1. matplotlib for the chart --------------------------------------------------------------
apt_install() {
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    # bounded: a machine that cannot reach the archive must not hang here
    timeout 300 $sudo apt-get install -y -qq --no-install-recommends "$@" ||
        { timeout 300 $sudo apt-get update -qq &&
          timeout 300 $sudo apt-get install -y -qq --no-install-recommends "$@"; }
}
if [ "${CT_BENCH_NO_APT:-0}" != 1 ] && ! python_with matplotlib >/dev/null; then
    echo "bench: installing python3-matplotlib"
    if ! apt_install python3-matplotlib >"$out/apt.log" 2>&1; then
        echo "bench: python3-matplotlib could not be installed (see $out/apt.log);" \
             "the report will have no chart"
    fi
fi

# ---- 2. the build --------------------------------------------------------------------------------
if [ ! -f "$build/build.ninja" ]; then
    if [ "${CT_BENCH_NO_APT:-0}" != 1 ]; then
        # shellcheck source=scripts/deps.sh
        . scripts/deps.sh
        cten_deps || echo "bench: could not install the build dependencies; trying anyway"
    fi
    # shellcheck disable=SC2086
    meson setup "$build" ${CT_BENCH_MESON_ARGS:-} || exit 1
fi
ninja -C "$build" bench/cten-bench || exit 1

# ---- 3. cten -------------------------------------------------------------------------------------
echo "bench: $build/bench/cten-bench ${flags[*]} $*"
"$build/bench/cten-bench" "${flags[@]}" --json "$out/cten.json" "$@" | tee "$out/cten.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
jsons=("$out/cten.json")

# ---- 4. PyTorch ----------------------------------------------------------------------------------
if torch_py=$(python_with torch); then
    echo "bench: $torch_py bench/torch_ref.py ${flags[*]} $*"
    "$torch_py" bench/torch_ref.py "${flags[@]}" --json "$out/torch.json" "$@" |
        tee "$out/torch.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    [ -f "$out/torch.json" ] && jsons+=("$out/torch.json")
else
    echo "bench: no Python here imports torch; PyTorch columns left empty"
fi

# ---- 5. the report -------------------------------------------------------------------------------
report_py=$(python_with matplotlib || python_with json)
"$report_py" bench/report.py "${jsons[@]}" --png "$out/bench.png" --md "$out/bench.md" || failed=1
echo "bench: results in $out/ (cten.json, torch.json, bench.md, bench.png)"
exit "$failed"
