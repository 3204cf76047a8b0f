#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (in build-fuzz, or
# $CTEN_FUZZ_BUILD) and runs each for SECONDS (default 300), one after the
# other, from the seeds the library writes, the kept regression inputs and
# the corpus grown by earlier runs (build-fuzz/corpus/<target>). An input
# that crashes, leaks, trips a sanitizer or a target's check, or takes more
# than 10 s is saved under build-fuzz/findings/<target>/; once fixed, copy it
# to fuzz/regressions/<target>/ so the test suite replays it.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]    (docs/FUZZING.md)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-300}
[ $# -gt 0 ] && shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz/fuzz_*.c; do
        t=${f#fuzz/fuzz_}
        targets+=("${t%.c}")
    done
    targets+=(op_program)
fi
build=${CTEN_FUZZ_BUILD:-build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
    # native: the fuzzers run where they are built, so the portable build's
    # other CPU kernel levels would be compiled for nothing
    CC=${CC:-clang} meson setup "$build" -Dfuzz=true -Dtests=false -Dcuda=disabled \
        -Dnative=true -Dbuildtype=debugoptimized
fi
ninja -C "$build" fuzz/fuzz_make_seeds "${targets[@]/#/fuzz/fuzz_}"
rm -rf "$build/seeds"
"$build/fuzz/fuzz_make_seeds" "$build/seeds"

failed=()
summary=""
for t in "${targets[@]}"; do
    corpus="$build/corpus/$t" findings="$build/findings/$t" log="$build/fuzz-$t.log"
    mkdir -p "$corpus" "$findings" "$build/seeds/$t"
    echo "== fuzz_$t: $secs s"
    dict=()
    [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
    # An op program's bytes are instructions: longer inputs only repeat them.
    [ "$t" = op_program ] && dict+=(-max_len=512)
    rc=0
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "$build/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -print_final_stats=1 "${dict[@]}" \
        -artifact_prefix="$findings/" "$corpus" "$build/seeds/$t" "fuzz/regressions/$t" \
        >"$log" 2>&1 || rc=$?
    last=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' || true)
    line="fuzz_$t: ${runs:-?} executions; ${last:-no progress line}"
    if [ $rc -ne 0 ]; then
        failed+=("$t")
        line="$line; FAILED (exit $rc), see $log and $findings/"
        grep -E 'ERROR|SUMMARY|check failed|Test unit written' "$log" | head -n 8 || true
    fi
    echo "$line"
    summary+="$line"$'\n'
done
printf '\n%s' "$summary"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzzing found problems in: ${failed[*]}" >&2
    exit 1
fi
