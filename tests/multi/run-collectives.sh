#!/usr/bin/env bash
# run-collectives.sh — runs test-collectives (every collective beyond the
# plain allreduce: options and dtypes, compression, broadcast, allgather,
# alltoall, reducescatter, grouped, barrier, join, process sets, mismatches)
# as real processes under kolorun, every mode at 2, 3 and 4 ranks, each run
# bounded in time so that a hang fails instead of hanging CI. Prints one line
# per run and a summary "N passed, N failed".
#
# Usage: tests/multi/run-collectives.sh [mode...]   (from the build
# directory; `make check` runs it with KOLO_TOP_BUILDDIR set). With modes
# given, runs only those. KOLO_TEST_COLLECTIVES names another test binary,
# KOLO_TEST_NP other rank counts ("2 3 4").
set -u
top=${KOLO_TOP_BUILDDIR:-.}
kolorun=$top/kolorun
prog=${KOLO_TEST_COLLECTIVES:-$top/tests/multi/test-collectives}
limit=${KOLO_TEST_TIMEOUT:-120}
nps=${KOLO_TEST_NP:-2 3 4}
pass=0
fail=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

modes="allreduce-matrix compression broadcast allgather alltoall
reducescatter grouped barrier join process-sets mismatch"
[ $# -gt 0 ] && modes="$*"

run() {
    local desc=$1 start end
    shift
    start=$(date +%s.%N)
    if timeout -k 10 "$limit" "$@" >"$log" 2>&1; then
        pass=$((pass + 1))
        end=$(date +%s.%N)
        printf 'PASS %-50s %ss\n' "$desc" "$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')"
    else
        local rc=$?
        fail=$((fail + 1))
        [ $rc -eq 124 ] && desc="$desc (timed out after ${limit}s)"
        printf 'FAIL %s (exit %d)\n' "$desc" "$rc"
        tail -n 30 "$log" | sed 's/^/    /'
    fi
}

for np in $nps; do
    for mode in $modes; do
        run "np=$np $mode" "$kolorun" -np "$np" "$prog" "$mode"
        if [ "$mode" = allreduce-matrix ]; then
            run "np=$np $mode, no fusion" \
                env KOLO_FUSION_THRESHOLD=0 "$kolorun" -np "$np" "$prog" "$mode"
        fi
    done
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
