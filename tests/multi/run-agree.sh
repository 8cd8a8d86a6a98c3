#!/usr/bin/env bash
# run-agree.sh — settings and process-set membership that the ranks must
# agree on (runtime/agree.c): runs tests/multi/test-agree under kolorun.
#
#   - a setting that changes what goes on the wire or how work is cut,
#     different on one rank (the last), at 2, 3 and 4 ranks, over shared
#     memory and over Gloo: kolo_init fails on every rank, naming the
#     variable and both values (before: wrong sums with status OK, an abort
#     inside Gloo, or a hang until the start timeout);
#   - the same value written two ways (16M and 16777216): the job runs and
#     its sums are right;
#   - a misspelled KOLO_ variable: a warning naming the closest one;
#   - ranks asking for different members of a process set: the add fails
#     on every rank, naming each set asked for; the same set everywhere
#     works;
#   - a set whose shared memory cannot be reserved (/dev/shm full, in a
#     private mount namespace: needs root and unshare, else skipped): the
#     add fails on every rank at once, with the member's reason; the same
#     at kolo_init, where ranks used to be said "never arrived";
#   - a rank frozen by SIGSTOP for a few seconds: the others warn while it
#     lasts, every KOLO_STALL_CHECK_TIME_SECONDS, naming it, and the job
#     goes on once it is back (before: not a word).
#
# kolorun runs with --no-tag-output: the checks read the ranks' lines as
# they wrote them. Every run is bounded by `timeout`; prints one line per
# case and "N passed, N failed".
set -u
. "$(dirname "$0")/../script-lib.sh"
multi_job run-agree tests/multi/test-agree 60

pass=0
fail=0
ok() { passed_case "ok - $1"; }
bad() {
    failed_case "FAIL - $1: $2"
    sed 's/^/    | /' "$log" | tail -n 20
}

# passes NP: every rank printed PASS.
passes() {
    local n
    n=$(grep -c '^rank [0-9]*: PASS$' "$log")
    [ "$n" -eq "$1" ]
}

# verdict NAME RC NP LATE WRONG: the case passes unless kolorun (exit RC)
# ran out of time ("timed out after ... sLATE") or fewer than NP ranks
# printed PASS (WRONG).
verdict() {
    if [ "$2" -eq 124 ] || [ "$2" -eq 137 ]; then
        bad "$1" "timed out after $limit s$4"
    elif ! passes "$3"; then
        bad "$1" "$5"
    else
        ok "$1"
    fi
}

# on_last NP VAR=VALUE CMD...: runs CMD under kolorun, the last rank with
# VAR=VALUE in its environment.
on_last() {
    local np=$1 assign=$2
    shift 2
    timeout -k 5 "$limit" "$kolorun" --no-tag-output -np "$np" sh -c \
        'if [ "$KOLO_RANK" = "$1" ]; then export "$2"; fi; shift 2; exec "$@"' \
        sh "$((np - 1))" "$assign" "$@" >"$log" 2>&1 </dev/null
}

# mismatch NP VAR OURS THEIRS [ENV...]: VAR=OURS on every rank but the
# last, which has THEIRS; every rank must fail, naming VAR and both values.
mismatch() {
    local np=$1 var=$2 ours=$3 theirs=$4 name
    shift 4
    name="np=$np $var=$ours but $theirs on the last rank${*:+ ($*)}"
    (
        [ $# -gt 0 ] && export "$@"
        export "$var=$ours"
        on_last "$np" "$var=$theirs" "$prog" settings fail "$var" "$ours" "$theirs"
    )
    local rc=$?
    verdict "$name" $rc "$np" "" \
        "not every rank failed kolo_init with the message"
}

# Numbers are compared as parsed; "auto" and strings as written.
for np in 2 3 4; do
    mismatch "$np" KOLO_FUSION_THRESHOLD 1024 2048
done
mismatch 2 KOLO_FUSION_THRESHOLD 1024 20480 \
    KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo
mismatch 3 KOLO_CACHE_CAPACITY 1024 1
mismatch 2 KOLO_CACHE_CAPACITY 1024 1 KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo
mismatch 2 KOLO_AUTOTUNE 0 1
mismatch 2 KOLO_CHUNK_BYTES auto 1048576
mismatch 2 KOLO_CONTROLLER shm gloo
mismatch 3 KOLO_CPU_OPERATIONS shm gloo
mismatch 2 KOLO_SHM_SLOT_BYTES 65536 131072
mismatch 2 KOLO_HIERARCHICAL_ALLREDUCE auto 0

name="np=3 KOLO_FUSION_THRESHOLD=16M on two ranks, 16777216 on the last: same value, sums right"
KOLO_FUSION_THRESHOLD=16M on_last 3 KOLO_FUSION_THRESHOLD=16777216 \
    "$prog" settings ok
rc=$?
if [ $rc -ne 0 ] || ! passes 3; then
    bad "$name" "exit $rc"
else
    ok "$name"
fi

name="np=2 KOLO_FUSION_TRESHOLD (a typo): warned, naming KOLO_FUSION_THRESHOLD"
KOLO_FUSION_TRESHOLD=1 timeout -k 5 "$limit" "$kolorun" --no-tag-output -np 2 "$prog" settings ok \
    >"$log" 2>&1 </dev/null
rc=$?
if [ $rc -ne 0 ] || ! passes 2; then
    bad "$name" "exit $rc"
elif ! grep -q 'KOLO_FUSION_TRESHOLD is not a variable kolo knows.*did you mean KOLO_FUSION_THRESHOLD' "$log"; then
    bad "$name" "no warning naming the closest variable"
else
    ok "$name"
fi

# sets NP EXPECT SET_OF_RANK0 SET_OF_OTHERS [ENV...]
sets() {
    local np=$1 expect=$2 first=$3 others=$4 name rc
    shift 4
    name="np=$np sets: rank 0 adds {$first}, the others {$others}${*:+ ($*)}"
    timeout -k 5 "$limit" env "$@" AGREE_EXPECT="$expect" "$kolorun" --no-tag-output -np "$np" \
        sh -c 'if [ "$KOLO_RANK" = 0 ]; then AGREE_SET=$1; else AGREE_SET=$2; fi
               export AGREE_SET; shift 2; exec "$@"' \
        sh "$first" "$others" "$prog" sets >"$log" 2>&1 </dev/null
    rc=$?
    if [ $rc -ne 0 ] || ! passes "$np"; then
        bad "$name" "exit $rc"
    else
        ok "$name"
    fi
}
sets 2 ok "0,1" "0,1"
sets 3 ok "1,2" "1,2"
sets 3 fail "0,1" "1,2"
sets 3 fail "0,1" "1,2" KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo
sets 4 fail "0,1,2,3" "0,1,2"

# small_shm NAME SIZE NP ARGS...: runs the job with a private /dev/shm of
# SIZE (a mount namespace: needs root and unshare, else the case is
# skipped) and a start timeout far beyond the case's bound, so that a rank
# waiting it out fails the case; every rank must print PASS.
small_shm() {
    local name=$1 size=$2 np=$3 rc
    shift 3
    if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null ||
        ! unshare -m true 2>/dev/null; then
        echo "ok - $name # SKIP needs root and unshare -m"
        pass=$((pass + 1))
        return
    fi
    KOLO_START_TIMEOUT=600 timeout -k 5 "$limit" unshare -m sh -c \
        'mount -t tmpfs -o size="$0" tmpfs /dev/shm && exec "$@"' "$size" \
        "$kolorun" --no-tag-output -np "$np" "$prog" "$@" >"$log" 2>&1 </dev/null
    rc=$?
    verdict "$name" $rc "$np" ": a rank waited for the failed one" "exit $rc"
}
# 8 MiB: enough for the global set, not for another.
small_shm "np=2 setfull: /dev/shm full when a set is added: every rank fails at once" 8m 2 setfull
small_shm "np=3 setfull: /dev/shm full when a set is added: every rank fails at once" 8m 3 setfull
# 64 KiB: too small for the job itself: every rank fails kolo_init with the
# reason, and none is said never to have arrived.
small_shm "np=4 /dev/shm full at kolo_init: every rank fails with the reason" 64k 4 initfail /dev/shm

# freeze NP SECONDS [ENV...]: the last rank stops itself for SECONDS; the
# others must warn, naming it, every KOLO_STALL_CHECK_TIME_SECONDS (1 s).
freeze() {
    local np=$1 secs=$2 last=$(($1 - 1)) name rc
    shift 2
    name="np=$np freeze: rank $last stopped for $secs s is named by the others${*:+ ($*)}"
    timeout -k 5 "$limit" env "$@" KOLO_STALL_CHECK_TIME_SECONDS=1 \
        "$kolorun" --no-tag-output -np "$np" "$prog" freeze "$secs" >"$log" 2>&1 </dev/null
    rc=$?
    if [ $rc -ne 0 ] || ! passes "$np"; then
        bad "$name" "exit $rc"
    elif ! grep -q "WARNING: stall: rank 0 has waited [0-9.]* s in .*rank $last\b.*is stopped" "$log"; then
        bad "$name" "rank 0 did not warn, naming rank $last as stopped"
    else
        ok "$name"
    fi
}
freeze 2 3
freeze 3 3
freeze 2 3 KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
