# Installs the Debian packages cten needs, when missing. Sourced by the
# other scripts. g++ is nvcc's host compiler and provides the libstdc++ the
# CUDA backend links; without it a machine with the CUDA toolkit would build
# cten without that backend.
#
# Another apt-get or dpkg may hold the package locks (an unattended upgrade,
# a second set-up): these wait for them, up to CTEN_APT_LOCK_WAIT seconds
# (600 by default), instead of failing at once. apt waits for the dpkg lock
# itself (DPkg::Lock::Timeout); apt-get update's lock on the package lists
# it does not wait for on every version, so that is retried here.
cten_apt_lock_wait=${CTEN_APT_LOCK_WAIT:-600}

# Runs apt-get update, retrying while another process holds the lists lock.
cten_apt_update() {
    local deadline=$((SECONDS + cten_apt_lock_wait)) out
    while :; do
        if out=$($sudo apt-get -o DPkg::Lock::Timeout="$cten_apt_lock_wait" update -qq 2>&1); then
            [ -n "$out" ] && echo "$out"
            return 0
        fi
        if ! echo "$out" | grep -q "Could not get lock" || [ $SECONDS -ge $deadline ]; then
            echo "$out" >&2
            return 1
        fi
        echo "cten: another package manager holds the lists lock; waiting" >&2
        sleep 5
    done
}

# Installs the packages named that are missing (apt-get, waiting for the locks).
cten_install_missing() {
    local missing=""
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "cten: installing$missing"
    cten_apt_update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout="$cten_apt_lock_wait" \
        install -y -qq --no-install-recommends $missing
}

# What building and running cten and its examples needs.
cten_deps() {
    cten_install_missing gcc g++ libc6-dev meson ninja-build pkg-config libcmocka-dev \
        libopenblas-dev zlib1g-dev libzip-dev libdlpack-dev python3-numpy dataset-fashion-mnist \
        fortunes libopenmpi-dev openmpi-bin
}

# What the test suite needs besides: PyTorch (Debian's, CPU), the reference the
# language model's twin test (tests/test_lm_twin.py) trains against.
cten_test_deps() {
    cten_install_missing python3-torch
}

# True when this machine has an NVIDIA GPU the driver can see.
cten_have_gpu() {
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        return 0
    fi
    [ -e /dev/nvidia0 ]
}

# Configures build/ (creating it when missing) with -Dcuda=$1, changing an
# existing build's setting only when it differs, so a build already set up
# as asked is not reconfigured.
cten_configure() {
    local cuda=$1
    if [ ! -d build ]; then
        meson setup build -Dcuda="$cuda"
        return
    fi
    local now
    now=$(meson introspect build --buildoptions |
        python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "cuda"))')
    [ "$now" = "$cuda" ] || meson configure build -Dcuda="$cuda"
}

# Configures and builds build/ for this machine, for the scripts that run an
# example: with the CUDA backend (where its toolkit is found) when a GPU is
# here, else without it, whose kernels take minutes to compile and would be of
# no use (scripts/test.sh builds them wherever it can: CI must). Sets
# cten_gpu_build=1 when the build holds the CUDA backend and a GPU is here.
cten_build_for_this_machine() {
    cten_gpu_build=0
    if cten_have_gpu; then
        cten_configure auto
    else
        echo "cten: no GPU here, building without the CUDA backend"
        cten_configure disabled
    fi
    ninja -C build
    if cten_have_gpu && [ -e build/libcten-cuda.so ]; then cten_gpu_build=1; fi
}
