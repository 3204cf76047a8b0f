#!/usr/bin/env bash
# Generates the seed corpora and runs each through its target's entry point:
# every file the library writes must go through the checks of its target.
# Usage: check_seeds.sh MAKE_SEEDS TARGET REPLAY [TARGET REPLAY]...
set -euo pipefail
make_seeds=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$make_seeds" "$dir"
while [ $# -ge 2 ]; do
    n=$(find "$dir/$1" -type f | wc -l)
    [ "$n" -gt 0 ] || { echo "no seeds for $1" >&2; exit 1; }
    "$2" "$dir/$1"
    shift 2
done
