#!/usr/bin/env bash
# run-fuzz.sh — runs the message decoder's fuzz target (libFuzzer, with
# AddressSanitizer and UndefinedBehaviorSanitizer) for KOLO_FUZZ_SECONDS
# (default 30) over the corpus in tests/fuzz/corpus/message. A crash, a
# sanitizer report or a message that does not re-encode to its own bytes
# fails the run; the input that did it is saved as crash-* in the work dir.
# A smoke run (KOLO_TEST_SMOKE: the tarball's make check in CI) fuzzes 3 s.
set -u
. "$(dirname "$0")/../script-lib.sh"
skip_if_sanitized "the fuzz target is built with its own sanitizers in every build: the same program the plain suite runs"
top=${KOLO_TOP_BUILDDIR:-.}
src=${KOLO_TOP_SRCDIR:-.}
seconds=${KOLO_FUZZ_SECONDS:-30}
[ -z "${KOLO_TEST_SMOKE:-}" ] || seconds=3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if "$top/tests/fuzz/fuzz-message" -max_total_time="$seconds" -print_final_stats=1 \
        -artifact_prefix="$top/tests/fuzz/" "$work" "$src/tests/fuzz/corpus/message" \
        >"$work/log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^Done" "$work/log"
    echo "1 passed, 0 failed"
else
    tail -n 40 "$work/log"
    echo "0 passed, 1 failed"
    exit 1
fi
