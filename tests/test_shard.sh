#!/usr/bin/env bash
# CT_TEST_SHARD (tests/test_util.h): the shards i/n of a test program run each
# of its tests exactly once between them, and a malformed value fails the
# program with a message. $1: a test program.
set -u
prog=$1
export CMOCKA_MESSAGE_OUTPUT=stdout
names() { grep -o '^\[ RUN      \] .*' | sed 's/^\[ RUN      \] //' | sort; }
whole=$("$prog" 2>/dev/null | names) || { echo "$prog failed unsharded"; exit 1; }
count=$(echo "$whole" | grep -c .)
[ "$count" -ge 3 ] || { echo "$prog has $count tests; the check needs 3 or more"; exit 1; }
n=$((count - 1)) # one shard runs two tests, the others one each
got=
for ((i = 0; i < n; i++)); do
    out=$(CT_TEST_SHARD="$i/$n" "$prog" 2>/dev/null) || { echo "shard $i/$n failed"; exit 1; }
    got+=$(echo "$out" | names)$'\n'
done
got=$(echo "$got" | grep . | sort)
if [ "$got" != "$whole" ]; then
    echo "the shards ran:"; echo "$got"; echo "the whole program runs:"; echo "$whole"
    exit 1
fi
out=$(CT_TEST_SHARD="$((count + 5))/$((count + 6))" "$prog" 2>&1) || { echo "empty shard failed"; exit 1; }
echo "$out" | grep -q "no tests" || { echo "an empty shard said: $out"; exit 1; }
for bad in "$n/$n" "1/0" "1" "a/b" "1/2x"; do
    if out=$(CT_TEST_SHARD="$bad" "$prog" 2>&1); then
        echo "CT_TEST_SHARD=$bad was accepted"; exit 1
    fi
    echo "$out" | grep -q "CT_TEST_SHARD=$bad: expected i/n with 0 <= i < n" ||
        { echo "CT_TEST_SHARD=$bad said: $out"; exit 1; }
done
echo "$count tests over $n shards, each once; malformed values refused"
