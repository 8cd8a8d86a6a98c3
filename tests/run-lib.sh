# run-lib.sh — sourced by the multi-rank test drivers: run one bounded test
# command and count it, then print the summary line.
#
#   . "$(dirname "$0")/../run-lib.sh"
#   run "description" command args...   # PASS/FAIL line, the log on failure
#   finish                                # "N passed, N failed"; the status
#
# KOLO_TEST_TIMEOUT (120 s by default) bounds every command, so that a hang
# fails instead of hanging CI. With KOLO_TEST_SMOKE set, the second run
# ends the script (script-lib.sh's smoke_point) unless it sets smoke_auto=0.
. "$(dirname "${BASH_SOURCE[0]}")/script-lib.sh"
smoke_auto=${smoke_auto:-1}
limit=${KOLO_TEST_TIMEOUT:-120}
pass=0
fail=0
run_log=$(mktemp)
trap 'rm -f "$run_log"' EXIT

run() {
    local desc=$1 start end rc
    shift
    [ "$smoke_auto" = 0 ] || smoke_point "$pass" "$fail"
    start=$(date +%s.%N)
    if timeout -k 10 "$limit" "$@" >"$run_log" 2>&1; then
        pass=$((pass + 1))
        end=$(date +%s.%N)
        printf 'PASS %-50s %ss\n' "$desc" \
            "$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')"
    else
        rc=$?
        fail=$((fail + 1))
        [ $rc -eq 124 ] && desc="$desc (timed out after ${limit}s)"
        printf 'FAIL %s (exit %d)\n' "$desc" "$rc"
        tail -n 30 "$run_log" | sed 's/^/    /'
    fi
}

finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
