# Installs the Debian packages cten needs, when missing. Sourced by the
# other scripts. g++ is nvcc's host compiler and provides the libstdc++ the
# CUDA backend links; without it a machine with the CUDA toolkit would build
# cten without that backend.
cten_deps() {
    local pkgs="gcc g++ libc6-dev meson ninja-build pkg-config libcmocka-dev libopenblas-dev zlib1g-dev dataset-fashion-mnist"
    local missing=""
    for p in $pkgs; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "cten: installing$missing"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
}
