#!/usr/bin/env bash
# Builds the op-program fuzz target (fuzz/op_program.c) with clang's
# libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer:
#
#   fuzz/build_op_program.sh [build-dir]          (default: build-fuzz-ops)
#
# The library is configured by meson in build-dir with the sanitizers and
# libFuzzer's coverage instrumentation (-fsanitize=fuzzer-no-link) and only its
# static archive is built; the target is then linked against it with
# -fsanitize=fuzzer. The binary is build-dir/op_program. To fuzz:
#
#   mkdir -p corpus/op_program
#   build-fuzz-ops/op_program -max_total_time=900 -timeout=30 \
#       corpus/op_program fuzz/regressions/op_program
#
# Every input that found a bug is kept in fuzz/regressions/op_program, which
# the normal test suite replays (test "fuzz_op_program").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz-ops}
cc=${CC_FUZZ:-clang}
if [ ! -f "$build/build.ninja" ]; then
    CC=$cc meson setup "$build" -Dcuda=disabled -Dtests=false -Dnative=false \
        -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false \
        -Dc_args='-mavx2 -mfma -fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined'
fi
ninja -C "$build" libcten.a
$cc -std=c11 -D_GNU_SOURCE -g -O1 -mavx2 -mfma \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Iinclude -I"$build/include" -Isrc \
    fuzz/op_program.c "$build/libcten.a" -lopenblas -lz -lm -lpthread -ldl \
    -o "$build/op_program"
echo "built $build/op_program"
