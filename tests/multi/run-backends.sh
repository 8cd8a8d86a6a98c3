#!/usr/bin/env bash
# run-backends.sh — the multi-rank suites again, on the backends the plain
# runs do not choose. A job on one host runs on shared memory by default
# (ops/shm), so run-multirank.sh, run-collectives.sh and run-failures.sh
# test that path; here they run with
#   - Gloo carrying everything (KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo),
#   - Gloo negotiating and shared memory moving tensors,
#   - shared memory with 4 KiB slots, so every collective takes many steps
#     and every piece boundary is crossed;
#   - two and three "hosts" of two ranks, and two of three
#     (tests/multi/fake-hosts.sh sets the placement), where allreduce is
#     hierarchical (ops/hier): shared memory within a host, Gloo across;
#     and the same with it switched off.
# (At 6 ranks the int8 product matrix overflows the test's own reference,
# so the 6-rank runs leave allreduce-matrix out.)
# Prints each suite's lines, then the total "N passed, N failed".
set -u
here=$(dirname "$0")
. "$here/../script-lib.sh"
top=${KOLO_TOP_BUILDDIR:-.}
total_pass=0
total_fail=0

suite() { # suite LABEL SCRIPT VAR=VALUE...
    local label=$1 script=$2 out line
    smoke_point "$total_pass" "$total_fail"
    shift 2
    echo "==== $label: $script $*"
    out=$(env "$@" bash "$here/$script" 2>&1)
    echo "$out" | sed -E 's/^([0-9]+) passed, ([0-9]+) failed$/(\1 passed, \2 failed)/'
    line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL $label: $script printed no summary"
        total_fail=$((total_fail + 1))
        return
    fi
    total_pass=$((total_pass + ${line%% passed*}))
    line=${line#* passed, }
    total_fail=$((total_fail + ${line%% failed}))
}

gloo="KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo"
if ! grep -q '^#define KOLO_HAVE_SHM 1' "$top/config.h" 2>/dev/null; then
    echo "SKIP shared memory is not built: the plain suites ran on Gloo"
    echo "0 passed, 0 failed"
    exit 0
fi
# shellcheck disable=SC2086
suite "gloo" run-multirank.sh $gloo
# shellcheck disable=SC2086
suite "gloo" run-collectives.sh $gloo
# shellcheck disable=SC2086
suite "gloo" run-failures.sh $gloo
suite "gloo negotiates, shm moves" run-collectives.sh \
    KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=shm
suite "shm, 4 KiB slots" run-collectives.sh KOLO_SHM_SLOT_BYTES=4096
suite "shm, 4 KiB slots" run-multirank.sh KOLO_SHM_SLOT_BYTES=4096 \
    KOLO_SOAK_STEPS=200
fake="KOLO_TEST_WRAP=$here/fake-hosts.sh"
suite "2 hosts x 2 ranks, hierarchical" run-collectives.sh KOLO_TEST_NP=4 "$fake"
suite "2 hosts x 2 ranks, hierarchical" run-multirank.sh KOLO_TEST_NP=4 "$fake"
suite "2 hosts x 2 ranks, flat" run-collectives.sh KOLO_TEST_NP=4 "$fake" \
    KOLO_HIERARCHICAL_ALLREDUCE=0 KOLO_TEST_MODES="allreduce-matrix grouped"
# Three ranks a host: a share reduced from its own rank's input where it
# lies and two peers' slots, in rank order (ops/shm).
suite "2 hosts x 3 ranks, hierarchical" run-collectives.sh KOLO_TEST_NP=6 \
    "$fake" KOLO_TEST_HOSTS=2 KOLO_TEST_MODES="allreduce-sizes compression
grouped reducescatter"
suite "3 hosts x 2 ranks, hierarchical" run-collectives.sh KOLO_TEST_NP=6 \
    "$fake" KOLO_TEST_HOSTS=3 KOLO_TEST_MODES="compression broadcast
allgather alltoall reducescatter grouped join process-sets"
# KOLO_RING_SEND_BUFFER reaches kolo's ring sockets (seen from outside, in
# ss's skmem: the kernel doubles the value for its bookkeeping), and 0
# leaves them to the kernel.
ring_buffers() { # ring_buffers VALUE: sockets of a 2-rank Gloo job with tb=2*VALUE
    local want=$1 log n=0
    log=$(mktemp)
    # shellcheck disable=SC2086
    env $gloo KOLO_RING_SEND_BUFFER="$2" "$top/kolorun" -np 2 \
        "$top/tests/multi/test-allreduce" idle 3 >"$log" 2>&1 &
    local job=$!
    for _ in $(seq 50); do
        n=$(ss -tmpn 2>/dev/null | grep -A1 '"test-allreduce"' |
            grep -c "tb$want,") || true
        [ "$n" -ge 4 ] && break
        sleep 0.1
    done
    wait "$job" || { cat "$log"; rm -f "$log"; echo 0; return; }
    rm -f "$log"
    echo "$n"
}
if command -v ss >/dev/null 2>&1; then
    n96=$(ring_buffers 196608 96K)
    n0=$(ring_buffers 196608 0)
    if [ "$n96" -ge 4 ] && [ "$n0" -eq 0 ]; then
        echo "PASS KOLO_RING_SEND_BUFFER=96K: $n96 ring sockets hold 192K; =0: none"
        total_pass=$((total_pass + 1))
    else
        echo "FAIL KOLO_RING_SEND_BUFFER: 96K gave $n96 sockets of 192K (want 4: two per rank), 0 gave $n0 (want 0)"
        total_fail=$((total_fail + 1))
    fi
else
    echo "SKIP KOLO_RING_SEND_BUFFER: no ss here (iproute2)"
fi
# Every segment is unlinked once its members attached: nothing older than
# a start-up may stay in /dev/shm (run-failures.sh checks each kill too).
left=$(find /dev/shm -maxdepth 1 -name 'kolo-*' ! -newermt '-20 seconds' 2>/dev/null)
if [ -n "$left" ]; then
    echo "FAIL shared memory left in /dev/shm: $left"
    total_fail=$((total_fail + 1))
else
    echo "PASS /dev/shm holds no kolo segment older than 20 s"
    total_pass=$((total_pass + 1))
fi
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
