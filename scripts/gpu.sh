#!/usr/bin/env bash
# Builds and checks cten's CUDA backend on a machine with a GPU, in one call:
#   1. cmocka, libzip and the DLPack header from the Debian packages in
#      .debs/ when the machine has none (fetch them once elsewhere with
#       `cd .debs && apt-get download libcmocka0 libcmocka-dev libzip4
#       libzip-dev libdlpack-dev`; .debs/ is git-ignored, so it must be
#      carried to the GPU machine),
#   2. meson setup -Dcuda=enabled and a build,
#   3. the whole test suite,
#   4. the CUDA tests again under compute-sanitizer: memcheck (with the
#      caching allocator off, so every block is a real allocation the tool
#      can check) and racecheck,
#   5. every GPU benchmark (build/bench/bench_cuda_*) and PyTorch's twins
#      (bench/torch_cuda_*.py),
#   6. cten-bench and bench/torch_ref.py on the GPU (JSON into $OUT),
#   7. both Fashion-MNIST models on the GPU beside PyTorch, when the data set
#      is there (Debian's dataset-fashion-mnist, or a copy in .data/),
#   8. the language model's training step (bench_lm_step, GPT-2 and
#      LLaMA-style 124M, B16 T1024 bf16) beside PyTorch eager and
#      torch.compile (bench/torch_lm_step.py), eager and replayed from a
#      CUDA graph, then with --recompute 1.
# Every step runs even when an earlier check fails; a summary table ends the
# output and the exit status is non-zero if any step failed. Logs go to $OUT
# when it is set (gpu.log: every step's output; summary.txt; testlog.txt:
# meson's), else to the build directory's gpu-logs/.
#
# Environment: CT_GPU_BUILD (build directory, default build-gpu),
# CT_GPU_BUILD_TARGETS="tests/test_cuda_x ..." builds those targets alone, with
# the CUDA module and cten-info (with CT_GPU_SANITIZER_TESTS, for a sanitizer
# call on a fresh machine), CT_GPU_SKIP_TESTS=1 to leave out step 3, CT_GPU_SKIP_SANITIZER=1 step 4
# (CT_GPU_SANITIZER_TESTS="test_cuda_x ..." runs it on those programs only,
# CT_GPU_SANITIZER_TIMEOUT=SECONDS bounds each run,
# CT_GPU_SANITIZER_DEADLINE=SECONDS the whole step: a run gets at most what
# is left of it, and one that would start later is recorded as not started,
# so a call with a time limit still ends with its summary; CT_GPU_SANITIZER_JOBS=N
# runs N at once, default the machine's cores up to 16;
# CT_GPU_SANITIZER_SHARDS="N [test_cuda_x=M ...]" splits each program's tests
# over N processes, or M for the programs named, through CT_TEST_SHARD; the
# default, "each", gives every test a process of its own; each run has
# CT_TEST_SANITIZER set to its tool, for the tests that size their inputs
# by it),
# CT_GPU_SKIP_BENCH=1 step 5 (CT_GPU_BENCH_ONLY="name ..." keeps those),
# CT_GPU_BENCH=quick|full|0 for step 6, CT_GPU_FASHION_EPOCHS=N (0: none) for
# step 7, CT_GPU_LM=0 leaves out step 8. Steps 4-8 can run in separate calls
# on the same build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${CT_GPU_BUILD:-build-gpu}
steplogs=$root/$build-logs
out=${OUT:-$steplogs}
mkdir -p "$steplogs" "$out"
all=$out/gpu.log
: >"$all"

names=()
results=()
times=()
failed=0

# step NAME COMMAND...: runs the command with its output in NAME's log and
# in the combined log, and records the result.
step() {
    local name=$1
    shift
    local log=$steplogs/$name.log t0 rc
    printf '\n===== %s: %s\n' "$name" "$*" | tee -a "$all"
    t0=$(date +%s)
    set +e
    "$@" >"$log" 2>&1
    rc=$?
    set -e
    cat "$log" >>"$all"
    tail -n 40 "$log"
    record "$name" "$rc" "$(($(date +%s) - t0))"
}

# record NAME RC SECONDS: a step's line in the summary.
record() {
    names+=("$1")
    times+=("$3")
    if [ "$2" -eq 0 ]; then
        results+=("ok")
    else
        results+=("FAILED (exit $2)")
        failed=1
    fi
    return 0
}

summary() {
    {
        printf '\n===== summary (%s)\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
        printf '%-28s %-18s %8s\n' step result seconds
        for i in "${!names[@]}"; do
            printf '%-28s %-18s %8s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
        done
        if [ -f "$steplogs/tests.log" ]; then
            echo
            grep -E '^(Ok|Fail|Skipped|Timeout|Expected Fail|Unexpected Pass): ' \
                "$steplogs/tests.log" | sed 's/^/test suite  /' || true
        fi
        for t in "${snames[@]}"; do
            [ -f "$steplogs/$t.log" ] &&
                grep -E 'ERROR SUMMARY|PASSED|FAILED|SKIPPED' "$steplogs/$t.log" | grep -v '^\[ *RUN' |
                sed "s/^/$t  /" | tail -n 6 || true
        done
        for f in "$steplogs"/fashion-*.log; do
            [ -f "$f" ] && grep -iE 'best|total|epoch .*acc' "$f" | tail -n 3 | sed "s/^/$(basename "$f" .log)  /"
        done
        for b in "$steplogs"/bench_cuda_*.log "$steplogs"/torch_cuda_*.log "$steplogs"/cten-bench-gpu.log \
            "$steplogs"/lm-*.log; do
            [ -f "$b" ] && sed "s/^/$(basename "$b" .log)  /" "$b"
        done
        # A step left out leaves no log: the group still succeeds (pipefail
        # would otherwise turn the exit status of a clean run into 1).
        true
    } | tee "$out/summary.txt"
    cat "$out/summary.txt" >>"$all"
    [ -f "$build/meson-logs/testlog.txt" ] && cp "$build/meson-logs/testlog.txt" "$out/testlog.txt"
    return 0
}
trap summary EXIT

# sstep NAME COMMAND...: step's run in the background, at most $sjobs at
# once, its exit status and seconds in NAME.rc; the caller waits and records
# the results in the order the runs were started (snames).
snames=()
sstep() {
    local name=$1 left=${CT_GPU_SANITIZER_TIMEOUT:-} rest bound=()
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$sjobs" ]; do wait -n || true; done
    snames+=("$name")
    # A run cut short by either bound fails.
    if [ -n "${CT_GPU_SANITIZER_DEADLINE:-}" ]; then
        rest=$((sanitizer_t0 + CT_GPU_SANITIZER_DEADLINE - $(date +%s)))
        if [ "$rest" -lt 10 ]; then
            echo "not started: the step's deadline (CT_GPU_SANITIZER_DEADLINE) had passed" >"$steplogs/$name.log"
            echo "125 0" >"$steplogs/$name.rc"
            return 0
        fi
        [ -n "$left" ] && [ "$left" -lt "$rest" ] || left=$rest
    fi
    [ -n "$left" ] && bound=(timeout "$left")
    (
        t0=$(date +%s)
        set +e
        "${bound[@]}" "$@" >"$steplogs/$name.log" 2>&1
        echo "$? $(($(date +%s) - t0))" >"$steplogs/$name.rc"
    ) &
}

# shards_of PROGRAM: how many processes CT_GPU_SANITIZER_SHARDS gives its
# tests under compute-sanitizer ("N name=M ...": M for name, N for the rest;
# "each": one a test, the count the program's empty shard reports).
shards_of() {
    local n=each w
    for w in ${CT_GPU_SANITIZER_SHARDS:-each}; do
        case $w in
        "$1"=*) n=${w#*=}; break ;;
        *=*) ;;
        *) n=$w ;;
        esac
    done
    if [ "$n" = each ]; then
        n=$(CT_TEST_SHARD=999999/1000000 "$build/tests/$1" 2>/dev/null |
            sed -n 's/.*(the group has \([0-9]*\)).*/\1/p')
        [ -n "$n" ] || n=1
    fi
    echo "$n"
}

# The CUDA test executables, each also run under compute-sanitizer: every
# tests/test_cuda* program the build made (found after the build), or the
# names in CT_GPU_SANITIZER_TESTS.
cuda_tests=${CT_GPU_SANITIZER_TESTS:-}


# ---- 1. the machine and cmocka ----------------------------------------------------------
machine() {
    uname -a
    command -v nvidia-smi >/dev/null && nvidia-smi || echo "nvidia-smi not found"
    command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version
    gcc --version | head -1
    meson --version
}
step machine machine

# Libraries the build needs that the GPU machine may lack (cmocka, libzip,
# the DLPack header), unpacked from the Debian packages in .debs/ (fetch them
# once elsewhere with `cd .debs && apt-get download libcmocka0 libcmocka-dev
# libzip4 libzip-dev libdlpack-dev`) into $build-cmocka, with their
# pkg-config files pointed there. A library the machine has is left alone.
debs() {
    local pfx=$root/$build-cmocka want=() have
    for have in cmocka:libcmocka libzip:libzip; do
        pkg-config --exists "${have%%:*}" && echo "${have%%:*} $(pkg-config --modversion "${have%%:*}") installed" ||
            want+=("${have##*:}")
    done
    [ -f /usr/include/dlpack/dlpack.h ] && echo "dlpack.h installed" || want+=(libdlpack)
    rm -rf "$pfx"
    mkdir -p "$pfx/pc"
    [ ${#want[@]} -eq 0 ] && return 0
    local w f pc missing=0
    for w in "${want[@]}"; do
        local found=0
        for f in "$root"/.debs/"$w"*.deb; do
            [ -e "$f" ] || continue
            dpkg -x "$f" "$pfx"
            found=1
        done
        [ $found = 1 ] || { echo "no $w on this machine and no .debs/$w*.deb to unpack"; missing=1; }
    done
    # The packaged files name /usr; point them at the unpacked copy.
    for pc in $(find "$pfx/usr" -name '*.pc'); do
        sed -e "s|^prefix=/usr\$|prefix=$pfx/usr|" -e "s|=/usr/|=$pfx/usr/|g" "$pc" >"$pfx/pc/$(basename "$pc")"
    done
    ls "$pfx/pc"
    # Programs run with LD_LIBRARY_PATH cleared (the install test's check of
    # the install rpath) still find the unpacked libraries: as root, the
    # loader's path gets their folder.
    if [ "$(id -u)" -eq 0 ] && [ -d /etc/ld.so.conf.d ]; then
        echo "$pfx/usr/lib/x86_64-linux-gnu" >/etc/ld.so.conf.d/cten-gpu-debs.conf && ldconfig
    fi
    return $missing
}
step debs debs
if [ -d "$root/$build-cmocka/usr" ]; then
    export PKG_CONFIG_PATH=$root/$build-cmocka/pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LD_LIBRARY_PATH=$root/$build-cmocka/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LIBRARY_PATH=$root/$build-cmocka/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    export CPATH=$root/$build-cmocka/usr/include${CPATH:+:$CPATH}
fi

# ---- 2. configure and build ---------------------------------------------------------------
if [ -f "$build/build.ninja" ]; then
    step setup meson setup --reconfigure "$build" -Dcuda=enabled
else
    step setup meson setup "$build" -Dcuda=enabled
fi
# Named targets come with what the script itself runs on any call: the CUDA
# module the test programs load and cten-info.
step build ninja -C "$build" ${CT_GPU_BUILD_TARGETS:+libcten-cuda.so examples/cten-info $CT_GPU_BUILD_TARGETS}
if [ "$failed" -ne 0 ]; then
    echo "setup or build failed: nothing to run"
    exit 1
fi
step cten-info "$build/examples/cten-info"
if [ -z "$cuda_tests" ]; then
    # The programs whose runs under the tools take longest come first, so
    # that the step's end is not one long run started late.
    slow="test_cuda_sort test_cuda_nn test_cuda_attention test_cuda_linear_ce test_cuda_seqops
        test_cuda_parity test_cuda_rope test_cuda_dist"
    for t in $slow; do
        [ -x "$build/tests/$t" ] && cuda_tests="$cuda_tests $t"
    done
    for t in "$build"/tests/test_cuda*; do
        case " $slow " in *" $(basename "$t") "*) continue ;; esac
        [ -f "$t" ] && [ -x "$t" ] && cuda_tests="$cuda_tests $(basename "$t")"
    done
fi

# ---- 3. the test suite --------------------------------------------------------------------
[ "${CT_GPU_SKIP_TESTS:-0}" = 1 ] || step tests meson test -C "$build" --print-errorlogs --no-rebuild

# ---- 4. compute-sanitizer -------------------------------------------------------------------
sanitizer=$(command -v compute-sanitizer || true)
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")"; do
    [ -z "$sanitizer" ] && [ -x "$d/compute-sanitizer" ] && sanitizer=$d/compute-sanitizer
done
if [ "${CT_GPU_SKIP_SANITIZER:-0}" != 1 ]; then
    if [ -z "$sanitizer" ]; then
        step sanitizer-missing sh -c 'echo "compute-sanitizer not found"; exit 1'
    else
        # API errors are not reported: the out-of-memory test provokes failing
        # cudaMalloc calls on purpose, and the tests check every call's status.
        race_filter=()
        race_env=(CT_CUDA_SDPA_CUDNN=0)
        if "$sanitizer" --help 2>/dev/null | grep -q -- '--kernel-name-exclude'; then
            race_filter=(--kernel-name-exclude kns=cudnn)
            race_env=()
            # CUB's device-wide radix sorts (NVIDIA's code, under the sort and
            # top-k of long rows; cten's own block sort is not named so) keep
            # racecheck busy for many minutes a test: left out too where the
            # tool takes a second filter. cudnn's comes last, so a tool that
            # kept only the last filter would still leave cuDNN out.
            if "$sanitizer" --tool racecheck --kernel-name-exclude kns=RadixSort \
                --kernel-name-exclude kns=cudnn /bin/true >/dev/null 2>&1; then
                race_filter=(--kernel-name-exclude kns=RadixSort --kernel-name-exclude kns=cudnn)
            fi
        fi
        # CT_GPU_SANITIZER_JOBS=N runs N of them at once on the one GPU (each
        # process has its own context; the tools slow kernels 10-100x, so
        # the runs are bound by the host and overlap well).
        cores=$(nproc)
        sjobs=${CT_GPU_SANITIZER_JOBS:-$((cores < 16 ? cores : 16))}
        sanitizer_t0=$(date +%s)
        for t in $cuda_tests; do
            n=$(shards_of "$t")
            for ((i = 0; i < n; i++)); do
                shard_env=()
                suffix=
                [ "$n" -gt 1 ] && shard_env=(CT_TEST_SHARD="$i/$n") && suffix=".$((i + 1))of$n"
                # racecheck looks at cten's own kernels: cuDNN's generated kernels
                # (warp-specialized, synchronizing through wgmma and mbarriers,
                # which the tool reports as shared-memory hazards) are left out
                # by name, or where the tool cannot filter, cuDNN's fused
                # attention is turned off (the own flash kernels run instead).
                # It is the slower tool, so its run starts first.
                sstep "sanitizer-racecheck-$t$suffix" env "${shard_env[@]}" \
                    CT_TEST_SANITIZER=racecheck "${race_env[@]}" \
                    "$sanitizer" --tool racecheck "${race_filter[@]}" \
                    --error-exitcode 99 "$build/tests/$t"
                sstep "sanitizer-memcheck-$t$suffix" env "${shard_env[@]}" \
                    CT_TEST_SANITIZER=memcheck CT_CUDA_NO_CACHE=1 \
                    "$sanitizer" --tool memcheck --leak-check full \
                    --report-api-errors no --error-exitcode 99 "$build/tests/$t"
            done
        done
        wait
        for n in "${snames[@]}"; do
            read -r rc secs <"$steplogs/$n.rc"
            printf '\n===== %s\n' "$n" | tee -a "$all"
            cat "$steplogs/$n.log" >>"$all"
            tail -n 12 "$steplogs/$n.log"
            record "$n" "$rc" "$secs"
        done
    fi
fi

# ---- 5. benchmarks ------------------------------------------------------------------------------
# CT_GPU_BENCH_ONLY="rmsnorm attention" keeps the benchmarks (and twins) of
# those names.
bench_wanted() {
    [ -z "${CT_GPU_BENCH_ONLY:-}" ] && return 0
    local w
    for w in $CT_GPU_BENCH_ONLY; do [ "$1" = "$w" ] && return 0; done
    return 1
}
[ "${CT_GPU_SKIP_BENCH:-0}" = 1 ] || for b in "$build"/bench/bench_cuda_*; do
    [ -x "$b" ] && [ -f "$b" ] || continue
    bench_wanted "${b##*/bench_cuda_}" || continue
    step "$(basename "$b")" "$b"
done
# PyTorch on the same GPU, in the same call, for the ratios. Liger Kernel (its
# Triton kernels run on the PyTorch there) is used by the linear_ce twin when its
# source is carried in .debs/liger/src (git-ignored; bench/torch_cuda_linear_ce.py
# says how to get it).
[ -d "$root/.debs/liger/src/liger_kernel" ] &&
    export PYTHONPATH=$root/.debs/liger/src${PYTHONPATH:+:$PYTHONPATH}
[ "${CT_GPU_SKIP_BENCH:-0}" = 1 ] || for p in bench/torch_cuda_*.py; do
    [ -f "$p" ] || continue
    n=${p##*/torch_cuda_}
    bench_wanted "${n%.py}" || continue
    step "$(basename "$p" .py)" python3 "$p"
done

# ---- 6. cten-bench and its PyTorch twin on the GPU (JSON to $out; draw the chart with
# bench/report.py where matplotlib is). CT_GPU_BENCH=quick|full|0 (default quick).
bench_mode=${CT_GPU_BENCH:-quick}
if [ "$bench_mode" != 0 ] && [ -x "$build/bench/cten-bench" ]; then
    bench_flags=()
    [ "$bench_mode" = quick ] && bench_flags+=(--quick)
    step cten-bench-gpu "$build/bench/cten-bench" "${bench_flags[@]}" --devices cuda \
        --json "$out/cten-gpu.json"
    step torch-ref-gpu python3 bench/torch_ref.py "${bench_flags[@]}" --devices cuda \
        --json "$out/torch-gpu.json"
fi

# ---- 7. Fashion-MNIST on the GPU, cten against PyTorch, when the data is here ---------------------
# (the dataset-fashion-mnist package's files, or a copy in .data/fashion-mnist).
# CT_GPU_FASHION_EPOCHS picks the epochs (default 10; 0 leaves the step out).
fashion_epochs=${CT_GPU_FASHION_EPOCHS:-10}
fashion_dir=
for d in /usr/share/datasets/fashion-mnist "$root/.data/fashion-mnist"; do
    [ -f "$d/train-images-idx3-ubyte.gz" ] && fashion_dir=$d && break
done
if [ "$fashion_epochs" -gt 0 ] && [ -n "$fashion_dir" ]; then
    for m in mlp cnn; do
        step "fashion-$m-cten" "$build/examples/cten-fashion-$m" --device cuda \
            --epochs "$fashion_epochs" --data "$fashion_dir"
        step "fashion-$m-torch" python3 "examples/reference/fashion_$m.py" --device cuda \
            --epochs "$fashion_epochs" --data "$fashion_dir"
    done
fi

# ---- 8. the language model's step against PyTorch eager and torch.compile (issue 18's figures),
# one round each in alternation, then cten alone with the MLP's activation recomputed.
if [ "${CT_GPU_LM:-1}" != 0 ] && [ -x "$build/bench/bench_lm_step" ]; then
    for shape in gpt2-124m llama-124m; do
        step "lm-$shape" python3 bench/torch_lm_step.py --shape "$shape" --device cuda \
            --cten "$build/bench/bench_lm_step" --cten-graph --rounds 1
        step "lm-$shape-recompute" "$build/bench/bench_lm_step" --shape "$shape" --device cuda \
            --recompute 1
    done
fi

exit "$failed"
