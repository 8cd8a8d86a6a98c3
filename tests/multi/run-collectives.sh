#!/usr/bin/env bash
# run-collectives.sh — runs test-collectives (every collective beyond the
# plain allreduce: options and dtypes, sizes around 64 KiB, compression, broadcast, allgather,
# alltoall, reducescatter, grouped, barrier, join, process sets, mismatches)
# as real processes under kolorun, every mode at 2, 3 and 4 ranks, each run
# bounded in time so that a hang fails instead of hanging CI. Prints one line
# per run and a summary "N passed, N failed".
#
# Usage: tests/multi/run-collectives.sh [mode...]   (from the build
# directory; `make check` runs it with KOLO_TOP_BUILDDIR set). With modes
# given, runs only those. KOLO_TEST_COLLECTIVES names another test binary,
# KOLO_TEST_NP other rank counts ("2 3 4"), KOLO_TEST_WRAP a command that
# starts each rank (tests/multi/fake-hosts.sh), KOLO_TEST_MODES the modes.
set -u
top=${KOLO_TOP_BUILDDIR:-.}
kolorun=${KOLO_TEST_LAUNCHER:-$top/kolorun} # run-mpi.sh: mpirun
prog=${KOLO_TEST_COLLECTIVES:-$top/tests/multi/test-collectives}
nps=${KOLO_TEST_NP:-2 3 4}
wrap=${KOLO_TEST_WRAP:-}
. "$(dirname "$0")/../run-lib.sh"
modes="allreduce-matrix allreduce-sizes compression broadcast allgather alltoall
reducescatter into grouped barrier join process-sets mismatch"
modes=${KOLO_TEST_MODES:-$modes}
[ $# -gt 0 ] && modes="$*"


for np in $nps; do
    for mode in $modes; do
        # shellcheck disable=SC2086
        run "np=$np $mode" "$kolorun" -np "$np" $wrap "$prog" "$mode"
        if [ "$mode" = allreduce-matrix ]; then
            # shellcheck disable=SC2086
            run "np=$np $mode, no fusion" env KOLO_FUSION_THRESHOLD=0 \
                "$kolorun" -np "$np" $wrap "$prog" "$mode"
        fi
    done
done

finish
