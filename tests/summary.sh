#!/usr/bin/env bash
# summary.sh — after `make check`, adds up the test cases of every test log
# (Check's "Checks: N, Failures: F, Errors: E" lines and our scripts'
# "N passed, N failed" lines), prints the tail of every failed log, and ends
# with one line "N passed, N failed".
#
# Usage: tests/summary.sh [BUILDDIR [MAKE_CHECK_STATUS]]
# A non-zero MAKE_CHECK_STATUS with no failed test log means the tests
# could not be built or run: that counts as a failure too.
set -u
dir=${1:-.}
check_status=${2:-0}
passed=0
failed=0
while IFS= read -r trs; do
    log=${trs%.trs}.log
    [ -f "$log" ] || continue
    line=$(grep -E '^[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        c=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
        f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
        e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
        passed=$((passed + c - f - e))
        failed=$((failed + f + e))
    fi
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        passed=$((passed + $(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')))
        failed=$((failed + $(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
    fi
    if grep -q '^:test-result: FAIL\|^:test-result: ERROR' "$trs"; then
        echo "---- failed: $log (last 40 lines)"
        tail -n 40 "$log"
        # A test binary that died without a summary still counts as failed.
        [ -z "$line" ] && ! grep -qE 'Checks: ' "$log" && failed=$((failed + 1))
    fi
done < <(find "$dir" -name '*.trs' | sort)
if [ "$check_status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo "---- make check failed (exit $check_status) before any test failed: the tests did not build or run"
    failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
