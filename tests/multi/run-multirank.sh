#!/usr/bin/env bash
# shellcheck disable=SC2086
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
nps=${KOLO_TEST_NP:-2 3 4}
wrap=${KOLO_TEST_WRAP:-} # a command that starts each rank (fake-hosts.sh)
. "$(dirname "$0")/../run-lib.sh"

for np in $nps; do
    run "np=$np random, fusion 64 KiB" \
        env KOLO_FUSION_THRESHOLD=65536 "$kolorun" -np "$np" $wrap "$prog" random 4
    run "np=$np random, default fusion" \
        "$kolorun" -np "$np" $wrap "$prog" random 3
    run "np=$np many small tensors fused" "$kolorun" -np "$np" $wrap "$prog" many
    run "np=$np random, no fusion" \
        env KOLO_FUSION_THRESHOLD=0 "$kolorun" -np "$np" $wrap "$prog" random 3
    run "np=$np random, cache of 4 (evictions)" \
        env KOLO_CACHE_CAPACITY=4 KOLO_FUSION_THRESHOLD=65536 \
        "$kolorun" -np "$np" $wrap "$prog" random 4
    run "np=$np random, no cache" \
        env KOLO_CACHE_CAPACITY=0 "$kolorun" -np "$np" $wrap "$prog" random 3
    run "np=$np random, autotune (1-round windows) settles, values right" \
        bash -c 'log=$(mktemp) && trap "rm -f $log" EXIT &&
            env KOLO_AUTOTUNE=1 KOLO_AUTOTUNE_WINDOW=1 KOLO_AUTOTUNE_LOG=$log \
                "$@" random 60 &&
            head -n 1 "$log" | grep -q "^window,parameter,fusion_threshold," &&
            grep -q ",fusion_threshold,.*,sample$" "$log" &&
            tail -n 1 "$log" | grep -q ",settled,.*,settled$"' \
        autotune "$kolorun" -np "$np" $wrap "$prog"
    run "np=$np mismatch" "$kolorun" -np "$np" $wrap "$prog" mismatch
    run "np=$np accumulate" "$kolorun" -np "$np" $wrap "$prog" accumulate
    run "np=$np shutdown with pending work" "$kolorun" -np "$np" $wrap "$prog" shutdown
done
[ -z "$wrap" ] && run "np=2 soak ($soak steps), heap flat" "$kolorun" -np 2 $wrap "$prog" soak "$soak"
# KOLO_CHUNK_BYTES=auto: the data backend's piece size, as the autotune log's
# first window shows it (16 MiB over Gloo, 4 MiB over shared memory).
chunk_default() {
    local ops=$1 want=$2 log
    log=$(mktemp) || return 1
    env KOLO_CPU_OPERATIONS="$ops" KOLO_AUTOTUNE=1 KOLO_AUTOTUNE_WINDOW=1 \
        KOLO_AUTOTUNE_LOG="$log" "$kolorun" -np 2 "$prog" random 3 || { rm -f "$log"; return 1; }
    got=$(awk -F, 'NR == 2 {print $4}' "$log")
    rm -f "$log"
    [ "$got" = "$want" ] || { echo "KOLO_CPU_OPERATIONS=$ops: chunk_bytes $got, want $want"; return 1; }
}
if [ -z "$wrap" ] && [ -z "${KOLO_TEST_LAUNCHER:-}" ]; then
    export -f chunk_default
    export kolorun prog
    grep -q "define KOLO_HAVE_GLOO 1" "$top/config.h" &&
        run "np=2 KOLO_CHUNK_BYTES=auto over Gloo: 16 MiB pieces" \
            bash -c 'chunk_default gloo 16777216'
    run "np=2 KOLO_CHUNK_BYTES=auto over shm: 4 MiB pieces" \
        bash -c 'chunk_default shm 4194304'
fi
[ -z "$wrap" ] && run "np=2 idle job does not spin" "$kolorun" -np 2 $wrap "$prog" idle 3
run "np=4 idle job does not spin" "$kolorun" -np 4 $wrap "$prog" idle 3

finish
