#!/usr/bin/env bash
# Installs the built library into a scratch root and builds the quickstart
# example against it through pkg-config, shared and static, then runs both.
set -euo pipefail
build=$1
src=$2
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
meson install -C "$build" --destdir "$root" --no-rebuild --quiet
pcfile=$(find "$root" -name cten.pc | head -1)
[ -n "$pcfile" ] || { echo "cten.pc not installed"; exit 1; }
# The installed file names the real prefix; point a copy at the scratch root.
mkdir -p "$root/pc"
sed "s|^prefix=|prefix=$root|" "$pcfile" >"$root/pc/cten.pc"
export PKG_CONFIG_PATH=$root/pc
flags=$(pkg-config --cflags --libs cten)
# A sanitized library needs the sanitizer runtime in the program too.
san=$(meson introspect "$build" --buildoptions |
    python3 -c 'import json,sys
v = next(o["value"] for o in json.load(sys.stdin) if o["name"] == "b_sanitize")
# Older meson gives "address,undefined", newer a list.
v = ",".join(v) if isinstance(v, list) else v
print(v or "none")')
[ "$san" != "none" ] && flags="$flags -fsanitize=$san"
libdir=$(pkg-config --variable=libdir cten)
cc -std=c11 -o "$root/app" "$src/examples/quickstart.c" $flags -lm
LD_LIBRARY_PATH=$libdir "$root/app" --quiet
# The installed headers alone must compile (no private include paths).
cc -std=c11 -o "$root/app_static" "$src/examples/quickstart.c" \
    $(pkg-config --cflags cten) "$libdir/libcten.a" $(pkg-config --static --libs cten | sed "s/-lcten//") \
    $([ "$san" != "none" ] && echo "-fsanitize=$san")
"$root/app_static" --quiet
echo "installed-library build: shared and static OK"
