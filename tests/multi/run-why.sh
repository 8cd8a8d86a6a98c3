#!/usr/bin/env bash
# run-why.sh — jobs that hang, stall, die or lag, each under kolorun (3
# ranks, shared memory; the deadlock on Gloo and at 4 ranks as well), and
# what they say
# about themselves: the ranks' messages, kolorun's last lines, and
# `kolo-timeline why DIR` over the flight recorder's dumps. Each verdict
# comes from the job that causes it (tests/multi/why_job.py):
#
#   skip      rank 2 skips 'grad.b' and waits on 'metric.loss': a proven
#             deadlock, every rank fails at once naming both sides (why
#             also reads the ranks' timelines, written beside the dumps)
#   sleep     rank 1 sleeps in load_batch(): the stall warning says it is
#             outside kolo, the stall shutdown stops the job, kolorun and
#             why name rank 1, why shows load_batch in its stack
#   sigstop   rank 1 is SIGSTOPped: the others time out naming it, and it
#             left no fresh dump ("killed or frozen")
#   sigkill   rank 1 is SIGKILLed: the others name it at once, and it left
#             no dump
#   busy      rank 2 computes 60 ms longer every step: the straggler
#             warning names it, and kolorun's last line; a balanced job
#             gets no warning
#   usr1      kill -USR1 to kolorun in a healthy job: every rank dumps,
#             the job goes on and ends with every result right
#   mismatch  rank 1 sends 'grad.a' with 5 elements: a disagreement, named
#             as one by the ranks, kolorun and why
#
# Usage: tests/multi/run-why.sh (from the build directory; `make check`
# sets KOLO_TOP_BUILDDIR and KOLO_TOP_SRCDIR). Prints "N passed, N failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../script-lib.sh"
python_test 120 numpy " (python3-numpy)"
kolorun=$(cd "$top" && pwd)/kolorun
tool=$src/tools/kolo-timeline
job_py=$src/tests/multi/why_job.py
make_work kolo-why
export TMPDIR=$WORK/tmp
mkdir -p "$TMPDIR"
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "PASS $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    [ -z "${2:-}" ] || sed -n '1,40p' "$2" | sed 's/^/    /'
}

# has DESC FILE PATTERN: a line of FILE matches the extended PATTERN.
has() {
    if grep -E -q -- "$3" "$2"; then ok "$1"; else bad "$1: no line matches /$3/" "$2"; fi
}
# hasnt DESC FILE PATTERN: no line does.
hasnt() {
    if grep -E -q -- "$3" "$2"; then bad "$1: a line matches /$3/" "$2"; else ok "$1"; fi
}

# job NAME MODE [ENV...]: kolorun -np ${NP:-3} of why_job.py MODE with
# its dumps in $WORK/NAME; output in $WORK/NAME.out, kolorun's status in
# rc; runs in the background when BG is set (its pid in jobpid).
job() {
    local name=$1 mode=$2
    shift 2
    mkdir -p "$WORK/$name.pids"
    set -- env "$@" FLIGHT_PIDS="$WORK/$name.pids" timeout -k 10 "$limit" \
        "$kolorun" -np "${NP:-3}" --flight-dir "$WORK/$name" \
        "$python" "$job_py" "$mode"
    if [ -n "${BG:-}" ]; then
        "$@" >"$WORK/$name.out" 2>&1 &
        jobpid=$!
        return 0
    fi
    "$@" >"$WORK/$name.out" 2>&1
    rc=$?
}

# why NAME: kolo-timeline why over the job's dumps, into $WORK/NAME.why.
why() {
    "$python" "$tool" why "$WORK/$1" >"$WORK/$1.why" 2>&1 ||
        bad "kolo-timeline why $1 exits $?" "$WORK/$1.why"
}

# first_line DESC NAME PATTERN: why's first line matches PATTERN.
first_line() {
    if head -1 "$WORK/$2.why" | grep -E -q -- "$3"; then
        ok "$1"
    else
        bad "$1: why's first line does not match /$3/" "$WORK/$2.why"
    fi
}

# wait_pids NAME N: the job's N ranks have written their pids (10 s).
wait_pids() {
    for _ in $(seq 100); do
        [ "$(ls "$WORK/$1.pids" 2>/dev/null | wc -l)" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}

# case_skip BACKEND NP [ENV...]: the last rank skips 'grad.b'.
case_skip() {
    local backend=$1 np=$2 name=skip-$1-$2 last=$(($2 - 1)) others
    shift 2
    others=$(seq -s ', ' 0 $((last - 1)))
    NP=$np job "$name" skip "$@"
    has "$backend np=$np skip: every rank fails naming the deadlock's both sides" \
        "$WORK/$name.out" "^\[$last\]<stderr>:.*deadlock: rank $last skipped 'allreduce\.grad\.b' \(the [0-9]+th collective of rank 0\) and waits on 'allreduce\.metric\.loss'.*; ranks $others wait on 'allreduce\.grad\.b'"
    has "$backend np=$np skip:   kolorun's last line names rank $last" "$WORK/$name.out" \
        "^kolorun: .*rank $last.*(skipped|deadlock)"
    why "$name"
    first_line "$backend np=$np skip:   why: rank $last skipped 'grad.b', a deadlock" "$name" \
        "^rank $last skipped 'allreduce\.grad\.b'.*deadlock"
}

case_sleep() {
    job sleep sleep KOLO_STALL_CHECK_TIME_SECONDS=2 \
        KOLO_STALL_SHUTDOWN_TIME_SECONDS=5 FLIGHT_SLEEP_S=600
    has "sleep: the stall warning says rank 1 is outside kolo" "$WORK/sleep.out" \
        "^\[0\]<stderr>:\[kolo rank 0\] WARNING: stall: .*rank 1 is missing 'allreduce\.grad\.a' \([0-9]+ s\); rank 1 has been outside kolo for [0-9.]+ s \(in its own code\)"
    has "sleep:   the stall shutdown stops every rank" "$WORK/sleep.out" \
        "^\[2\]<stderr>:.*KoloError: .*KOLO_STALL_SHUTDOWN_TIME_SECONDS.*rank 1 is missing"
    has "sleep:   kolorun's last lines name rank 1 as the stuck rank" \
        "$WORK/sleep.out" "^kolorun: rank 1 stalled the job"
    why sleep
    first_line "sleep:   why: rank 1 never enqueued 'grad.a', stuck in its own code" sleep \
        "^rank 1 never enqueued 'allreduce\.grad\.a'.*outside kolo.*stuck in your code"
    has "sleep:   why shows where: load_batch in rank 1's stack" \
        "$WORK/sleep.why" "line [0-9]+ in load_batch"
}

# signal_case NAME SIGNAL: rank 1 of a job without end gets SIGNAL.
signal_case() {
    local name=$1 sig=$2
    BG=1 job "$name" long KOLO_TIMEOUT_SECONDS=5 KOLO_STALL_CHECK_TIME_SECONDS=2
    if ! wait_pids "$name" 3; then
        bad "$name: the ranks did not start" "$WORK/$name.out"
        kill "$jobpid" 2>/dev/null
        wait "$jobpid"
        return
    fi
    sleep 1
    kill -"$sig" "$(cat "$WORK/$name.pids/rank1.pid")"
    wait "$jobpid"
    rc=$?
    if [ "$sig" = STOP ]; then
        kill -CONT "$(cat "$WORK/$name.pids/rank1.pid")" 2>/dev/null
    fi
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ok "$name: the job ended, failed (status $rc)" ||
        bad "$name: kolorun's status $rc" "$WORK/$name.out"
    why "$name"
}

case_sigstop() {
    signal_case sigstop STOP
    has "sigstop:   the others name rank 1, stopped" "$WORK/sigstop.out" \
        "^\[0\]<stderr>:.*rank 1 .*made no progress for [0-9.]+ s.*is it stopped"
    first_line "sigstop:   why: rank 1 left no dump, killed or frozen" sigstop \
        "^rank 1 left no (fresh )?dump.*(killed or frozen|frozen)"
}

case_sigkill() {
    signal_case sigkill KILL
    has "sigkill:   the others name rank 1, lost" "$WORK/sigkill.out" \
        "^\[0\]<stderr>:.*rank 1 \(pid [0-9]+\) has exited or was killed"
    has "sigkill:   kolorun names rank 1, killed" "$WORK/sigkill.out" \
        "^kolorun: rank 1 \(pid [0-9]+\) .*signal 9"
    first_line "sigkill:   why: rank 1 left no dump" sigkill \
        "^rank 1 left no (fresh )?dump"
}

case_busy() {
    job busy busy FLIGHT_STEPS=120 FLIGHT_BUSY_MS=60
    has "busy: the straggler warning names rank 2" "$WORK/busy.out" \
        "^\[0\]<stderr>:\[kolo rank 0\] WARNING: straggler: rank 2 kept the others waiting"
    has "busy:   the job ends right" "$WORK/busy.out" "^\[2\]<stdout>:rank 2: 120 steps, every result right"
    has "busy:   kolorun's last line names rank 2" "$WORK/busy.out" \
        "^kolorun: stragglers: latest rank: 2,"
    if "$python" - "$WORK/busy/rank0.json" >"$WORK/busy.ready" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
first = d["records"][0]
t = first["members_ready"]
assert first["name"] == "allreduce.grad.a" and len(t) == 3, first
assert t[2] > max(t[0], t[1]), t  # rank 2 computed 60 ms longer
PY
    then ok "busy:   rank 0's first record: rank 2 ready last (members_ready)"
    else bad "busy: members_ready of rank 0's first record" "$WORK/busy.ready"
    fi
    job balanced healthy FLIGHT_STEPS=120 FLIGHT_STEP_S=0.02
    hasnt "balanced: no straggler warning" "$WORK/balanced.out" "straggler:"
    has "balanced:   the job ends right" "$WORK/balanced.out" "^\[1\]<stdout>:rank 1: 120 steps, every result right"
}

# dumps_of NAME: the reasons of the job's dumps there are, "rank: reason".
dumps_of() {
    "$python" - "$WORK/$1" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "rank*.json"))):
    try:
        d = json.load(open(f))
        print("%s: %s" % (d["rank"], d["reason"]))
    except (OSError, ValueError, KeyError):
        pass
PY
}

case_usr1() {
    local n
    BG=1 job usr1 healthy FLIGHT_STEPS=100 FLIGHT_STEP_S=0.05
    if wait_pids usr1 3; then
        sleep 1
        # kolorun runs under timeout (which SIGUSR1 would end): its one
        # child. (Read from /proc: pkill, with a sanitizer's runtime
        # preloaded as the sanitized suite does, can hang at its start.)
        kill -USR1 $(cat "/proc/$jobpid/task/$jobpid/children")
        for _ in $(seq 50); do
            dumps_of usr1 >"$WORK/usr1.dumps"
            n=$(grep -c -v ": shutdown" "$WORK/usr1.dumps")
            [ "$n" -ge 3 ] && break
            sleep 0.1
        done
    fi
    wait "$jobpid"
    rc=$?
    # (every rank got the signal: a rank's SIGUSR1 dump may be followed,
    # and replaced, by the one another rank's signal asks for)
    has "usr1: kill -USR1 kolorun: rank 0 dumps, on request" "$WORK/usr1.dumps" "^0: (SIGUSR1|asked by rank [12])"
    has "usr1:   ranks 1 and 2 too, while the job runs" "$WORK/usr1.dumps" "^2: (SIGUSR1|asked by rank)"
    [ "$rc" -eq 0 ] && ok "usr1:   the job ends well" ||
        bad "usr1: kolorun's status $rc" "$WORK/usr1.out"
    has "usr1:   every result right" "$WORK/usr1.out" "^\[2\]<stdout>:rank 2: 100 steps, every result right"
}

case_mismatch() {
    job mismatch mismatch
    has "mismatch: the ranks say they disagree on 'grad.a'" "$WORK/mismatch.out" \
        "^\[0\]<stderr>:.*'allreduce\.grad\.a'.*ranks disagree on the number of elements"
    has "mismatch:   kolorun names a disagreement, not a failed rank" \
        "$WORK/mismatch.out" "^kolorun: .*disagree"
    why mismatch
    first_line "mismatch:   why: the ranks disagreed" mismatch "disagree"
}

case_skip shm 3 KOLO_TIMELINE="$WORK/skip-shm-3/tl.json" KOLO_TIMELINE_ALL_RANKS=1
has "shm np=3 skip:   why reads the timelines beside the dumps" \
    "$WORK/skip-shm-3.why" "timelines: 'allreduce\.grad\.b' failed or was left unfinished \(seen by ranks 0, 1\)"
case_skip gloo 3 KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo
case_skip shm 4
smoke_point "$pass" "$fail"
case_sleep
case_sigstop
case_sigkill
case_busy
case_usr1
case_mismatch
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
