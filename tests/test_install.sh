#!/usr/bin/env bash
# Installs the built library into a scratch root and uses it as a user
# would, with pkg-config alone:
#  - builds the quickstart example shared and static, and train_mlp.c with
#    the README's line (it calls libm itself), and runs them;
#  - runs the installed cten-info without LD_LIBRARY_PATH (install rpath);
#  - checks that libcten.so links no CUDA library and, when the build has
#    the CUDA module, that it is installed where the library looks, that a
#    program runs on a machine without a GPU, and that cten-info says why
#    the module did not load or that it found no device.
# Arguments: the build directory, the source directory, "cuda" or "cpu".
set -euo pipefail
build=$1
src=$2
backends=${3:-cpu}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
fail() {
    echo "install test: $*" >&2
    exit 1
}
meson install -C "$build" --destdir "$root" --no-rebuild --quiet
pcfile=$(find "$root" -name cten.pc | head -1)
[ -n "$pcfile" ] || fail "cten.pc not installed"
# The installed file names the real prefix; point a copy at the scratch root.
mkdir -p "$root/pc"
sed "s|^prefix=|prefix=$root|" "$pcfile" >"$root/pc/cten.pc"
export PKG_CONFIG_PATH=$root/pc
libdir=$(pkg-config --variable=libdir cten)
bindir=$(dirname "$(find "$root" -name cten-info -type f | head -1)")
[ -x "$bindir/cten-info" ] || fail "cten-info not installed"

# A sanitized library needs the sanitizer runtime in the program too.
san=$(meson introspect "$build" --buildoptions |
    python3 -c 'import json,sys
v = next(o["value"] for o in json.load(sys.stdin) if o["name"] == "b_sanitize")
# Older meson gives "address,undefined", newer a list.
v = ",".join(v) if isinstance(v, list) else v
print(v or "none")')
sanflag=""
[ "$san" != "none" ] && sanflag="-fsanitize=$san"

# ---- link lines. The public Libs carry -lm (programs like the examples call
# libm next to cten); the static library needs Libs.private too.
pkg-config --libs cten | grep -qw -- -lm || fail "pkg-config --libs cten lacks -lm"
for l in -lopenblas -lzip -lz -lpthread; do
    pkg-config --static --libs cten | grep -qw -- "$l" || fail "pkg-config --static --libs cten lacks $l"
done
# The README's lines, with nothing added but the sanitizer.
cc -std=c11 -o "$root/app" "$src/examples/quickstart.c" $(pkg-config --cflags --libs cten) $sanflag
cc -std=c11 -o "$root/train_mlp" "$src/examples/train_mlp.c" \
    $(pkg-config --cflags --libs cten) $sanflag
# A program linked to a library outside the loader's path finds it through
# LD_LIBRARY_PATH (or its own rpath), as with any library.
LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$root/app" --quiet
LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$root/train_mlp" >/dev/null
# Static: the archive by name, since -lcten picks the shared library when
# both are installed; the rest is pkg-config --static's. The installed
# headers alone must compile (no private include paths).
cc -std=c11 -o "$root/app_static" "$src/examples/quickstart.c" $(pkg-config --cflags cten) \
    $(pkg-config --static --libs cten | sed 's/-lcten\b/-l:libcten.a/') $sanflag
ldd "$root/app_static" | grep -q libcten && fail "the static program loads libcten.so"
"$root/app_static" --quiet
echo "installed-library build: shared and static OK"

# ---- installed programs find libcten.so through their rpath.
info=$(env -u LD_LIBRARY_PATH "$bindir/cten-info") || fail "installed cten-info does not run"
echo "$info"
echo "$info" | grep -q "^  cpu: " || fail "cten-info names no CPU backend"

# ---- libcten.so serves machines without CUDA libraries: it links none.
so=$(readlink -f "$libdir/libcten.so")
if ldd "$so" | grep -Ei 'cudart|cublas|cudnn|libcuda\.'; then
    fail "libcten.so links CUDA libraries"
fi

if [ "$backends" = cuda ]; then
    module=$(pkg-config --variable=moduledir cten)/libcten-cuda.so
    [ -f "$module" ] || fail "the CUDA module is not installed at $module"
    line=$(echo "$info" | grep "^  cuda: ") || fail "cten-info has no cuda line"
    # The library found the installed module: whatever happened next, it is
    # not a missing file.
    echo "$line" | grep -q "no module file" && fail "cten-info did not find the module: $line"
    if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && [ ! -e /dev/nvidia0 ]; then
        # No GPU: the module did not load (no driver) or loaded and found no
        # device; either way cten-info says why, and programs run on the CPU.
        echo "$info" | grep -Eq "^  cuda: (not loaded: .+|no device usable: .+)" ||
            fail "cten-info gives no reason for the CUDA module: $line"
    else
        echo "$info" | grep -q "^  cuda: loaded from $(readlink -f "$module")" ||
            fail "cten-info did not load the installed module on a GPU machine: $line"
    fi
    # With the toolkit's stub driver in front, the installed module loads from
    # libcten.so's own cten/ directory, as the staged root has no other copy.
    stub=$build/tests/libcuda.so.1
    if [ -e "$stub" ]; then
        stubbed=$(env LD_LIBRARY_PATH="$(dirname "$stub")" "$bindir/cten-info")
        echo "$stubbed" | grep -q "^  cuda: loaded from $(readlink -f "$module")$" ||
            fail "the installed module did not load beside libcten.so: $stubbed"
    fi
    echo "installed CUDA module: found where the library looks, and it says what it did"
fi
