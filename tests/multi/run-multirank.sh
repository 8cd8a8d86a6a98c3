#!/usr/bin/env bash
# run-multirank.sh — runs the multi-rank tests as real processes under
# kolorun, at 2, 3 and 4 ranks, each run bounded in time so that a hang
# fails instead of hanging CI. Prints one line per run and a summary
# "N passed, N failed".
#
# Usage: tests/multi/run-multirank.sh   (from the build directory; `make
# check` runs it with KOLO_TOP_BUILDDIR set)
set -u
top=${KOLO_TOP_BUILDDIR:-.}
kolorun=${KOLO_TEST_LAUNCHER:-$top/kolorun} # run-mpi.sh: mpirun
prog=$top/tests/multi/test-allreduce
soak=${KOLO_SOAK_STEPS:-2000}
. "$(dirname "$0")/../run-lib.sh"

for np in 2 3 4; do
    run "np=$np random, fusion 64 KiB" \
        env KOLO_FUSION_THRESHOLD=65536 "$kolorun" -np "$np" "$prog" random 4
    run "np=$np random, default fusion" \
        "$kolorun" -np "$np" "$prog" random 3
    run "np=$np random, no fusion" \
        env KOLO_FUSION_THRESHOLD=0 "$kolorun" -np "$np" "$prog" random 3
    run "np=$np random, cache of 4 (evictions)" \
        env KOLO_CACHE_CAPACITY=4 KOLO_FUSION_THRESHOLD=65536 \
        "$kolorun" -np "$np" "$prog" random 4
    run "np=$np random, no cache" \
        env KOLO_CACHE_CAPACITY=0 "$kolorun" -np "$np" "$prog" random 3
    run "np=$np mismatch" "$kolorun" -np "$np" "$prog" mismatch
    run "np=$np accumulate" "$kolorun" -np "$np" "$prog" accumulate
    run "np=$np shutdown with pending work" "$kolorun" -np "$np" "$prog" shutdown
done
run "np=2 soak ($soak steps), heap flat" "$kolorun" -np 2 "$prog" soak "$soak"
run "np=2 idle job does not spin" "$kolorun" -np 2 "$prog" idle 3
run "np=4 idle job does not spin" "$kolorun" -np 4 "$prog" idle 3

finish
