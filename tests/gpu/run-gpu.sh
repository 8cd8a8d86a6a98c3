#!/usr/bin/env bash
# run-gpu.sh — CUDA tensors through kolo (tests/gpu/test-gpu.c) under
# kolorun. Without a GPU it checks that a CUDA tensor is refused with a
# message naming it, then exits 77 (automake's SKIP) and says why: the GPU
# runs below need one.
#
# With G GPUs visible: every collective with 1 rank (a single-rank NCCL
# communicator), and with 2..min(G, 4) ranks (NCCL refuses two ranks on one
# GPU); each rank of 2 and 3 in a process set of its own; host against CUDA
# at 2 ranks (negotiation refuses it before NCCL runs); hierarchical
# allreduce (KOLO_HIERARCHICAL_ALLREDUCE=1) with 2 "hosts" of one rank each
# (tests/multi/fake-hosts.sh): NCCL within each host, Gloo between them,
# which one GPU can carry; with 4 GPUs, 2 hosts of 2 ranks. On that same
# hierarchical job, rank 1 SIGKILLs itself in the middle of a 256 MiB
# allreduce: kolorun fails the job, rank 0's handle fails in bounded time
# naming the tensor and rank 1, its stream completes (test-gpu lost).
set -u
top=${KOLO_TOP_BUILDDIR:-.}
here=$(cd "$(dirname "$0")" && pwd)
kolorun=$top/kolorun
prog=$top/tests/gpu/test-gpu
fake=$here/../multi/fake-hosts.sh
. "$here/../run-lib.sh"

gpus=$("$prog" count 2>/dev/null || echo 0)
if [ "${gpus:-0}" -eq 0 ]; then
    run "np=1 no-device: a CUDA tensor is refused" "$kolorun" -np 1 "$prog" no-device
    run "np=2 no-device: a CUDA tensor is refused" "$kolorun" -np 2 "$prog" no-device
    finish || exit 1
    echo "SKIP: no CUDA device is visible (test-gpu count: ${gpus:-0}): the NCCL runs need a GPU"
    exit 77
fi

echo "$gpus CUDA device(s) visible"
run "np=1 all (single-rank NCCL)" "$kolorun" -np 1 "$prog" all
max=$gpus
[ "$max" -gt 4 ] && max=4
for np in $(seq 2 "$max"); do
    run "np=$np all" "$kolorun" -np "$np" "$prog" all
done
for np in 2 3; do
    run "np=$np sets (a set per rank)" "$kolorun" -np "$np" "$prog" sets
done
run "np=2 mismatch (host against CUDA)" "$kolorun" -np 2 "$prog" mismatch
run "np=2 hierarchical, 2 hosts x 1 rank" env KOLO_HIERARCHICAL_ALLREDUCE=1 \
    KOLO_TEST_HOSTS=2 "$kolorun" -np 2 "$fake" "$prog" allreduce
# shellcheck disable=SC2016 # expanded by the inner shell
run "np=2 hierarchical, rank 1 killed in a 256 MiB allreduce" \
    env KOLO_HIERARCHICAL_ALLREDUCE=1 KOLO_TEST_HOSTS=2 KOLO_TIMEOUT_SECONDS=20 \
    bash -c 'out=$("$0" --no-tag-output -np 2 "$1" "$2" lost 2>&1); rc=$?; echo "$out"
        echo "kolorun exited $rc (a rank was killed: must not be 0)"
        [ "$rc" -ne 0 ] &&
            echo "$out" | grep -q "^rank 0: lost: [0-9]* passed, 0 failed$"' \
    "$kolorun" "$fake" "$prog"
grep -E '^rank 0: lost:|killed|lost' "$run_log" | head -8 | sed 's/^/    /'
if [ "$gpus" -ge 4 ]; then
    run "np=4 hierarchical, 2 hosts x 2 ranks" env KOLO_HIERARCHICAL_ALLREDUCE=1 \
        KOLO_TEST_HOSTS=2 "$kolorun" -np 4 "$fake" "$prog" allreduce
fi
finish
