#!/usr/bin/env bash
# run-faults.sh — one rank of a real job runs out of memory: every
# allocation libkolo makes on that rank fails in turn (KOLO_TEST_FAIL_ALLOC,
# runtime/alloc.c), in a 2-rank job of examples/train_mlp (5 steps) under
# kolorun, from the first allocation of kolo_init to the last of
# kolo_shutdown:
#
#   shm   the default backends of one host (shared memory), rank 1 fails
#         once; then rank 0 fails from the n-th allocation on
#   gloo  KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo, rank 1 fails once
#         (kolo_init's rendezvous, agreement and connection among them)
#   threads  the n-th thread rank 1 starts cannot be started (each n)
#   kolo.torch  a 3-step job of tests/python/faults_torch_main.py
#         (DistributedOptimizer, broadcasts, a metric), rank 1 fails once
#   catch  the same script's "catch" mode (shm, Gloo): rank 1 runs out of
#         memory from halfway on, catches kolo's error and goes on without
#         kolo; rank 0 must fail at once naming rank 1's cause
#
# and other resources, once each: rank 1 may open only 4..8 files (ulimit
# -n; shm and Gloo), rank 1 cannot bind its socket (Gloo), and as root, in
# a mount namespace of its own: /dev/shm too small for the segment, the
# rendezvous directory on a read-only file system (kolorun's, and one
# named by KOLO_RENDEZVOUS for ranks started by hand: both must fail).
#
# A clean run first counts the victim's allocations (KOLO_TEST_COUNT_FILE)
# and gives the reference: the hash of the trained weights. Then for each
# n, every run must end within its bound (`timeout`, 100 s: the limit
# below), the job's own waits (KOLO_TIMEOUT_SECONDS, KOLO_START_TIMEOUT)
# set to three times that, so that a run that ends only when one of them
# fires, because a rank waited for one that was never coming, reaches the
# bound and fails the case as a hang (as rank 0 out of memory from its
# 41st allocation on once did: its kolo_init went on while rank 1 waited
# for a verdict, and the job ended KOLO_TIMEOUT_SECONDS later); with
# either
#   - success: status 0 and the reference's weights on every rank, or
#   - a clean error: status non-zero, "out of memory" (or, for threads,
#     "thread") in the messages of every rank that printed any (the rank
#     that failed, and the others told why), and no message of a timeout
#     ("timed out", "never arrived", "KOLO_START_TIMEOUT").
# Anything else fails the case, with the run's lines.
#
# Each n costs a job's start (about 0.4 s here; every n of the four is
# eight minutes), so make test sweeps every 6th n, and
# KOLO_TEST_JOB_FAULT_STEP=K every K-th (1: every n; CI's sanitizer runs
# 80); but while the victim's kolo_init fails (about 40 allocations, where
# every rank waits for the others: a failure not told is a hang) six
# times more densely (every n by default). KOLO_TEST_FAULT_ONLY=WORD runs only the configurations whose name
# has WORD. (tests/unit/test-faults sweeps every n of the protocol itself,
# ranks as threads.)
# kolorun runs with --no-tag-output: the checks read the ranks' lines as
# they wrote them. Prints one line per configuration with its runs,
# successes and clean errors, then "N passed, N failed".
set -u
. "$(dirname "$0")/../script-lib.sh"
multi_job run-faults examples/train_mlp 100 KOLO_TEST_JOB_FAULT_STEP KOLO_TEST_FAULT_ONLY
case $prog in
*/examples/train_mlp) [ -x "${prog%/*}/.libs/train_mlp" ] && prog=${prog%/*}/.libs/train_mlp ;;
esac
libs=$top/.libs
src=${KOLO_TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
case $libs in /*) ;; *) libs=$PWD/$libs ;; esac
step=${KOLO_TEST_JOB_FAULT_STEP:-6}

pass=0
fail=0

# The job's own waits, far beyond each run's bound (above).
waits=$((limit * 3))

# job VICTIM VAR VALUE ENV...: one 2-rank run; VAR=VALUE only on VICTIM.
# Output in $log; the status is kolorun's (124/137: the bound). The
# others get 2 s to report a failure before kolorun stops them (its
# default 5 s only lengthens the runs where a rank fails before it can tell
# them, or catches the error and sleeps).
job() {
    local victim=$1 var=$2 value=$3
    shift 3
    env "$@" LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        KOLO_START_TIMEOUT=$waits KOLO_TIMEOUT_SECONDS=$waits \
        FAULT_VICTIM="$victim" FAULT_VAR="$var" FAULT_VALUE="$value" \
        timeout -k 5 "$limit" "$kolorun" --no-tag-output --failure-grace 2 -np 2 sh -c \
        'if [ "$KOLO_RANK" = "$FAULT_VICTIM" ]; then export "$FAULT_VAR=$FAULT_VALUE"; fi
         exec "$@"' run-faults "${cmd[@]}" >"$log" 2>&1
}
# What job runs on each rank: train_mlp, or the kolo.torch job.
cmd=("$prog" --steps 5 --min-accuracy 0)

weights() { grep -o 'hash [0-9a-f]*' "$log" | sort | uniq -c | tr -s ' '; }

# named WORD: every rank that reported an error or a warning named the
# cause (WORD) in one of its lines: the rank that failed, and the others
# told why.
named() {
    local r lines
    for r in 0 1; do
        lines=$(grep -E "^(rank $r:|\[kolo rank $r\] (ERROR|WARNING))" "$log")
        [ -z "$lines" ] || echo "$lines" | grep -qi "$1" || return 1
    done
}

# sweep NAME VICTIM KIND SUFFIX ENV...: KIND alloc or thread; SUFFIX "" (the
# n-th fails) or "+" (it and every later one).
sweep() {
    local name=$1 victim=$2 kind=$3 suffix=$4 count ref n rc runs=0 ok=0 errs=0
    local next init=0
    local bad="" word=memory var=KOLO_TEST_FAIL_ALLOC counted=allocations
    shift 4
    case $name in *"${KOLO_TEST_FAULT_ONLY:-}"*) ;; *) return ;; esac
    if [ "$kind" = thread ]; then
        word=thread
        var=KOLO_TEST_FAIL_THREAD
        counted=threads
    fi
    job "$victim" KOLO_TEST_COUNT_FILE "$WORK/count" "$@"
    rc=$?
    ref=$(weights)
    count=$(sed -n "s/.*$counted \([0-9]*\).*/\1/p" "$WORK/count" 2>/dev/null)
    if [ $rc -ne 0 ] || [ -z "$count" ] || [ "$(echo "$ref" | wc -l)" != 1 ]; then
        failed_case "FAIL $name: the clean run (exit $rc, count '${count}')"
        sed 's/^/    | /' "$log" | tail -n 20
        return
    fi
    local every=$step
    [ "$kind" = alloc ] || every=1 # a job starts three threads
    # A Python job takes seconds to start: 7 times more thinly (but every
    # n by hand, with step 1).
    [ "${cmd[0]}" = "$prog" ] || [ "$step" -eq 1 ] || every=$((step * 7))
    local init_every=$(((every + 5) / 6))
    for ((n = 1; n <= count; n += next)); do
        job "$victim" "$var" "$n$suffix" "$@"
        rc=$?
        runs=$((runs + 1))
        # More densely while the victim's kolo_init fails (train_mlp's).
        next=$every
        if [ "${cmd[0]}" = "$prog" ] && grep -q "^rank $victim: kolo_init failed" "$log"; then
            next=$init_every
            init=$((init + 1))
        fi
        if [ $rc -eq 0 ] && [ "$(weights)" = "$ref" ]; then
            ok=$((ok + 1))
        elif [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] &&
            grep -qi "$word" "$log" && named "$word" &&
            ! grep -Eq 'timed out|never arrived|KOLO_START_TIMEOUT' "$log"; then
            errs=$((errs + 1))
        else
            # (the ranks' own lines and kolo's, then the end of the log)
            [ -n "$bad" ] || bad=$(echo "    n=$n: exit $rc"
                grep -E '^(rank [0-9]+:|\[kolo|kolorun:|[A-Za-z_.]*Error)' "$log" |
                    head -n 20 | sed 's/^/    | /'
                echo "    (last lines:)"; sed 's/^/    | /' "$log" | tail -n 8)
            [ $rc -ne 124 ] && [ $rc -ne 137 ] || bad="$bad
    (n=$n reached the ${limit} s bound, the job's own waits set to $waits s: a hang)"
        fi
    done
    verdict "$bad" \
        "PASS $name: $runs runs over $count ${kind}s (every $init_every while kolo_init failed: $init, then every $every): $ok succeeded, $errs clean errors" \
        "FAIL $name: $runs runs over $count ${kind}s (every $init_every while kolo_init failed: $init, then every $every): $ok succeeded, $errs clean errors, $((runs - ok - errs)) neither; the first:" \
        "$bad"
}

# resource NAME WORD ENV... -- COMMAND...: one run of COMMAND (a job, its
# status kolorun's); it must succeed with the reference weights, or fail
# with WORD in the ranks' messages and no timeout.
resource() {
    local name=$1 word=$2 ref rc
    shift 2
    job 0 X 1 >/dev/null # the reference
    ref=$(weights)
    env LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        KOLO_START_TIMEOUT=$waits KOLO_TIMEOUT_SECONDS=$waits \
        timeout -k 5 "$limit" "$@" >"$log" 2>&1
    rc=$?
    if { [ $rc -eq 0 ] && [ "$(weights)" = "$ref" ]; } ||
        { [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] &&
            grep -q "$word" "$log" &&
            ! grep -Eq 'timed out|never arrived|KOLO_START_TIMEOUT' "$log"; }; then
        passed_case "PASS $name: $([ $rc -eq 0 ] && echo "succeeded" || echo "$(grep -m1 "$word" "$log" | cut -c1-160)")"
    else
        failed_case "FAIL $name: exit $rc"
        sed 's/^/    | /' "$log" | tail -n 20
    fi
    smoke_point "$pass" "$fail"
}

# Other resources: rank 1 with only a few descriptors (ulimit -n), and
# /dev/shm too small for the segment (as root, in a mount namespace).
few_fds() { # few_fds N ENV...
    local n=$1
    shift
    # --failure-grace 1: where rank 1 cannot write a file to say why,
    # kolorun stops rank 0 (and its shared memory) sooner than another
    # test's check of /dev/shm (run-failures: 2 s) would notice.
    resource "descriptors: rank 1 may open $n files ($*)" "Too many open files" \
        env "$@" FEW="$n" "$kolorun" --no-tag-output --failure-grace 1 -np 2 sh -c \
        '[ "$KOLO_RANK" = 1 ] && ulimit -n "$FEW"; exec "$0" --steps 5 --min-accuracy 0' "$prog"
}
case ${KOLO_TEST_FAULT_ONLY:-descriptors} in
descriptors)
    for n in 4 5 6 7 8; do
        few_fds $n KOLO_CONTROLLER=shm
        few_fds $n KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo
    done ;;
esac
# A socket that cannot be bound: rank 1's transport address is not this
# host's (TEST-NET-1), over Gloo.
case ${KOLO_TEST_FAULT_ONLY:-socket} in
socket)
    resource "socket: rank 1 cannot bind its address (Gloo)" "cannot bind address" \
        env KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo "$kolorun" --no-tag-output -np 2 sh -c \
        '[ "$KOLO_RANK" = 1 ] && export KOLO_HOSTNAME=192.0.2.7; exec "$0" --steps 5 --min-accuracy 0' "$prog" ;;
esac
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null 2>&1 &&
    unshare -m true 2>/dev/null; then
    case ${KOLO_TEST_FAULT_ONLY:-/dev/shm} in
    /dev/shm)
        resource "/dev/shm of 16 KiB (the segment needs 1 MiB)" "/dev/shm" \
            unshare -m sh -c 'mount -t tmpfs -o size=16k tmpfs /dev/shm &&
                exec "$0" --no-tag-output -np 2 "$1" --steps 5 --min-accuracy 0' "$kolorun" "$prog" ;;
    esac
    # The rendezvous directory on a read-only file system (root writes
    # anywhere else): kolorun's own (TMPDIR), and one named by
    # KOLO_RENDEZVOUS for ranks started by hand.
    case ${KOLO_TEST_FAULT_ONLY:-rendezvous} in
    rendezvous)
        ro=$(mktemp -d)
        resource "rendezvous: kolorun's directory on a read-only file system" \
            "cannot create the rendezvous directory" \
            unshare -m sh -c 'mount -t tmpfs -o ro tmpfs "$2" &&
                TMPDIR=$2 exec "$0" --no-tag-output -np 2 "$1" --steps 5 --min-accuracy 0' \
            "$kolorun" "$prog" "$ro"
        resource "rendezvous: KOLO_RENDEZVOUS=file:DIR read-only, ranks started by hand" \
            "in the rendezvous directory" \
            unshare -m sh -c 'mount -t tmpfs -o ro tmpfs "$1" || exit 2
                export KOLO_RENDEZVOUS=file:$1 KOLO_SIZE=2 KOLO_LOCAL_SIZE=2
                KOLO_RANK=0 KOLO_LOCAL_RANK=0 "$0" --steps 5 --min-accuracy 0 & a=$!
                KOLO_RANK=1 KOLO_LOCAL_RANK=1 "$0" --steps 5 --min-accuracy 0 & b=$!
                wait $a; ra=$?; wait $b; rb=$?
                [ $ra -eq 0 ] && [ $rb -eq 0 ]' "$prog" "$ro"
        rmdir "$ro" ;;
    esac
fi

sweep "threads: rank 1, one thread cannot start" 1 thread ""
sweep "gloo: rank 1, one allocation fails" 1 alloc "" \
    KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo
sweep "shm: rank 1, one allocation fails" 1 alloc ""
sweep "shm: rank 0, every allocation from the n-th on fails" 0 alloc "+"

# The kolo.torch job (tests/python/faults_torch_main.py): a Python job
# starts in seconds, so it is sampled 7 times more thinly (every n by
# hand: KOLO_TEST_JOB_FAULT_STEP=1).
# (last: a sanitizer build needs its runtime preloaded into Python, which
# the jobs above must not have)
python=${KOLO_PYTHON-/usr/bin/python3}
. "$src/tests/python/sanitizer-preload.sh"
if [ -z "$python" ] || [ ! -e "$libs/libkolo.so" ]; then
    echo "NOTE: no Python or no $libs/libkolo.so: no kolo.torch cases"
elif ! kolo_python_preload "$libs/libkolo.so"; then
    echo "NOTE: no kolo.torch cases: $kolo_preload_why"
elif "$python" -c 'import torch' 2>/dev/null; then
    cmd=("$python" "$src/tests/python/faults_torch_main.py" 3)
    sweep "kolo.torch: rank 1, one allocation fails" 1 alloc "" \
        KOLO_LIBRARY="$libs/libkolo.so"
    cmd=("$prog" --steps 5 --min-accuracy 0)
    # A program that catches kolo's error and goes on without kolo: rank 1
    # runs out of memory halfway and sleeps; rank 0 must fail at once,
    # naming rank 1's cause, not after KOLO_TIMEOUT_SECONDS ($waits s here)
    # or rank 1's exit (never: kolorun stops it once rank 0 has failed).
    for backend in shm gloo; do
        case "catch $backend" in *"${KOLO_TEST_FAULT_ONLY:-}"*) ;; *) continue ;; esac
        env KOLO_CONTROLLER=$backend KOLO_CPU_OPERATIONS=$backend \
            KOLO_LIBRARY="$libs/libkolo.so" KOLO_TEST_COUNT_FILE="$WORK/count" \
            LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            "$kolorun" --no-tag-output -np 1 "$python" "$src/tests/python/faults_torch_main.py" catch \
            >"$log" 2>&1
        half=$(($(sed -n 's/.*allocations \([0-9]*\).*/\1/p' "$WORK/count") / 2))
        cmd=("$python" "$src/tests/python/faults_torch_main.py" catch)
        job 1 KOLO_TEST_FAIL_ALLOC "$half+" KOLO_CONTROLLER=$backend \
            KOLO_CPU_OPERATIONS=$backend KOLO_LIBRARY="$libs/libkolo.so"
        rc=$?
        cmd=("$prog" --steps 5 --min-accuracy 0)
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] &&
            grep -q "^rank 1: caught: .*memory" "$log" &&
            grep "^rank 0: caught: " "$log" |
            grep -Eq "rank 1 (had failed|has shut down, which stops the job \(it had failed): .*out of memory" &&
            ! grep -Eq 'KOLO_TIMEOUT_SECONDS|timed out' "$log"; then
            passed_case "PASS catch $backend: rank 1 caught out of memory (from allocation $half on) and went on; rank 0: $(grep -m1 "^rank 0: caught" "$log" | cut -c1-140)"
        else
            failed_case "FAIL catch $backend: exit $rc"
            sed 's/^/    | /' "$log" | tail -n 20
        fi
    done
else
    echo "NOTE: $python cannot import torch: no kolo.torch sweep"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
