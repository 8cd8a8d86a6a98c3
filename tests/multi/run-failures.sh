#!/usr/bin/env bash
# run-failures.sh — one rank fails, the others must say so: runs
# tests/multi/test-failures under kolorun at 2, 3 and 4 ranks (or the
# counts in KOLO_TEST_NP), the victim being the last rank (and, at 3 ranks,
# rank 0, the coordinator), in every mode:
#
#   midcoll   SIGKILL in the middle of a 16M-float allreduce: early (a
#             tenth of the time one takes) and late (half of it), when the
#             others are sending to the victim
#   between   SIGKILL between two steps
#   init      SIGKILL before kolo_init (kolorun --start-timeout 3)
#   exit      exit(0) without kolo_shutdown (the others: "rank K has shut
#             down"; the job ends with status 0)
#   stop      SIGSTOP (hung, not dead; KOLO_TIMEOUT_SECONDS=3): once the
#             others have exited, the driver SIGCONTs it, and it must find
#             out by itself that its job is gone and exit 1
#   cycles    20 kolo_init/kolo_shutdown cycles at 2 ranks: descriptors and
#             threads must not grow
#
# For each run it checks: kolorun's exit status (non-zero, except exit and
# cycles), that kolorun names the victim and how it died, that every
# survivor printed its PASS line (the program checks the error codes,
# messages and delays itself), that the run ended within its limit (no
# hang; a run slower than usual is said), that no rank is left running, and that neither the rendezvous
# directory (TMPDIR is ours; a flight recorder directory only where
# kolorun names it) nor /dev/shm/kolo* leaks. kolorun runs with
# --no-tag-output: the checks read the ranks' lines as they wrote them.
# Every run is bounded by `timeout -k 10`. Prints one line per run and
# "N passed, N failed".
#
# Usage: tests/multi/run-failures.sh   (from the build directory; `make
# check` runs it with KOLO_TOP_BUILDDIR set)
set -u
. "$(dirname "$0")/../script-lib.sh"
nps=${KOLO_TEST_NP:-2 3 4}
# The ranks see only what this script gives them (and the backends
# run-backends.sh chooses); kolorun's rendezvous directories go in TMPDIR.
multi_job run-failures tests/multi/test-failures 60 \
    KOLO_CONTROLLER KOLO_CPU_OPERATIONS KOLO_SHM_SLOT_BYTES
export FT_DIR=$WORK/d # pid files of the ranks

pass=0
fail=0
why=

note() { why="$why
    - $*"; }

shm_list() {
    local f
    for f in /dev/shm/kolo*; do
        [ -e "$f" ] && echo "${f#/dev/shm/}"
    done | sort
}

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

# stop_case NP VICTIM ENV...: runs the stop mode, which needs the driver:
# the victim stops itself; once the survivors are gone (or after a bound),
# it gets SIGCONT, and SIGKILL if it is still there 10 s later.
stop_case() {
    local np=$1 victim=$2 kpid t0 vpid="" gone r alive
    shift 2
    timeout -k 10 "$limit" env "$@" "$kolorun" --no-tag-output --verbose --failure-grace 10 \
        -np "$np" "$prog" stop "$victim" >"$log" 2>&1 </dev/null &
    kpid=$!
    t0=$(date +%s)
    gone=0
    # Survivors fail within KOLO_TIMEOUT_SECONDS (3) and exit.
    while [ $(($(date +%s) - t0)) -lt 20 ]; do
        [ -z "$vpid" ] && [ -s "$FT_DIR/victim.pid" ] &&
            vpid=$(cat "$FT_DIR/victim.pid")
        gone=1
        for r in $(seq 0 $((np - 1))); do
            [ "$r" = "$victim" ] && continue
            if [ ! -s "$FT_DIR/pid.$r" ] ||
                kill -0 "$(cat "$FT_DIR/pid.$r")" 2>/dev/null; then
                gone=0
            fi
        done
        [ -n "$vpid" ] && [ $gone = 1 ] && break
        kill -0 "$kpid" 2>/dev/null || break
        sleep 0.1
    done
    [ $gone = 1 ] || note "survivors still running $(($(date +%s) - t0)) s after the victim stopped"
    if [ -n "$vpid" ]; then
        kill -CONT "$vpid" 2>/dev/null
        t0=$(date +%s)
        alive=1
        while [ $(($(date +%s) - t0)) -lt 10 ]; do
            kill -0 "$vpid" 2>/dev/null || { alive=0; break; }
            sleep 0.1
        done
        if [ $alive = 1 ]; then
            note "the victim (rank $victim) still runs 10 s after SIGCONT: SIGKILL"
            kill -KILL "$vpid" 2>/dev/null
        fi
    else
        note "the victim never wrote its pid"
    fi
    wait "$kpid"
}

# run DESC EXPECT BOUND NP VICTIM MODE [kolorun options --] [ENV...]
#   EXPECT: killed (the victim is killed by SIGKILL), exit0 (every rank
#   exits 0), stopped (the stop mode), cycles (no victim)
#   BOUND: seconds the whole run usually takes at most (said, not failed:
#   the hang bound is `limit`)
run() {
    local desc=$1 expect=$2 bound=$3 np=$4 victim=$5 mode=$6 start rc t slow
    local opts=() shm_before shm_after left r f pid line
    shift 6
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        opts+=("$1")
        shift
    done
    [ $# -gt 0 ] && shift # --
    smoke_point "$pass" "$fail"
    why=
    rm -rf "$FT_DIR" "${TMPDIR:?}"/*
    mkdir -p "$FT_DIR"
    shm_before=$(shm_list)
    start=$(date +%s.%N)
    if [ "$expect" = stopped ]; then
        stop_case "$np" "$victim" "$@"
        rc=$?
    else
        timeout -k 10 "$limit" env "$@" "$kolorun" --no-tag-output --verbose \
            --failure-grace 10 "${opts[@]}" -np "$np" "$prog" "$mode" \
            "$victim" >"$log" 2>&1 </dev/null
        rc=$?
    fi
    t=$(elapsed "$start")

    if [ "$rc" -eq 124 ] || awk -v t="$t" -v l="$limit" 'BEGIN{exit !(t >= l)}'; then
        note "timed out after ${limit}s (exit $rc)"
    fi
    # Slow is not wrong (a sanitizer build on a loaded machine takes
    # several times longer): a hang is the limit above, a survivor that
    # waits for a timeout instead of seeing the loss fails its own check
    # (test-failures.c: bound_s) and prints no PASS line.
    slow=
    awk -v t="$t" -v b="$bound" 'BEGIN{exit !(t > b)}' &&
        slow=" (slower than the ${bound}s it usually takes)"

    # kolorun's status and what it says about the first failure (with
    # --verbose it also says how every other rank ended).
    line=$(grep '^kolorun: rank [0-9]* (pid [0-9]*) ' "$log" |
        grep -v 'exited with status 0$' | grep -v '(stopped by kolorun)$' |
        head -n 1)
    case $expect in
    killed)
        [ "$rc" -ne 0 ] || note "kolorun exited 0 although rank $victim was killed"
        echo "$line" | grep -Eq "^kolorun: rank $victim \(pid [0-9]+\) was killed by signal 9 \(Killed\)" ||
            note "kolorun does not name rank $victim killed by signal 9 first: '${line:-nothing}'"
        ;;
    stopped)
        [ "$rc" -ne 0 ] || note "kolorun exited 0 although rank $victim hung"
        echo "$line" | grep -Eq "^kolorun: rank $victim \(pid [0-9]+\) " ||
            note "kolorun does not name rank $victim first: '${line:-nothing}'"
        grep -q "^rank $victim: resumed victim: its step failed" "$log" ||
            note "the resumed victim did not report that its step failed"
        ;;
    exit0 | cycles)
        [ "$rc" -eq 0 ] || note "kolorun exited $rc, expected 0"
        [ -z "$line" ] || note "kolorun reports a failure: '$line'"
        ;;
    esac

    # Every survivor (every rank, in cycles) printed its PASS line.
    for r in $(seq 0 $((np - 1))); do
        if [ "$expect" = cycles ]; then
            grep -q "^rank $r of $np: PASS cycles" "$log" ||
                note "rank $r did not pass"
        elif [ "$r" != "$victim" ]; then
            grep -q "^rank $r of $np: PASS $mode victim=$victim\$" "$log" ||
                note "survivor rank $r did not pass ($(grep -m1 "^kolorun: rank $r (pid" "$log" | sed 's/^kolorun: //'))"
        fi
    done

    # Nothing left running, nothing left behind.
    for f in "$FT_DIR"/pid.*; do
        [ -s "$f" ] || continue
        pid=$(cat "$f")
        if kill -0 "$pid" 2>/dev/null; then
            note "${f##*/} (pid $pid) still running after kolorun ended"
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    # A job that failed keeps its flight recorder directory where a rank
    # wrote to it, naming it in kolorun's last lines: that one is meant.
    for d in "$TMPDIR"/kolo-flight-*; do
        [ -d "$d" ] || continue
        grep -qF "kolorun: flight recorder dumps in $d;" "$log" ||
            note "${d##*/} left behind in TMPDIR, not named by kolorun"
        rm -rf "$d"
    done
    left=$(ls -A "$TMPDIR")
    [ -z "$left" ] || note "left behind in TMPDIR: $left"
    # Another test script may run beside this one (make -j2): a segment of
    # its jobs lives only while their ranks start, so a name that is still
    # there two seconds later is one this case left.
    shm_after=$(shm_list)
    left=$(comm -13 <(echo "$shm_before") <(echo "$shm_after"))
    if [ -n "$left" ]; then
        sleep 2
        left=$(comm -12 <(echo "$left") <(shm_list))
    fi
    [ -z "$left" ] || note "left behind in /dev/shm: $left"

    if [ -z "$why" ]; then
        pass=$((pass + 1))
        printf 'PASS %-58s %ss%s\n' "$desc" "$t" "$slow"
    else
        fail=$((fail + 1))
        printf 'FAIL %s (exit %d, %ss)%s\n' "$desc" "$rc" "$t" "$why"
        grep -v '^\[kolo rank' "$log" |
            grep -v '^kolorun: \(rank [0-9]*: pid\|rendezvous\|ranks\|removed\|flight recorder directory\)' |
            head -n 40 | cut -c1-400 | sed 's/^/    | /'
    fi
}

for np in $nps; do
    last=$((np - 1))
    run "np=$np midcoll: rank $last killed inside a 16M allreduce" killed 20 \
        "$np" "$last" midcoll -- KOLO_TIMEOUT_SECONDS=5
    run "np=$np midcoll: rank $last killed late in a 16M allreduce" killed 20 \
        "$np" "$last" midcoll -- KOLO_TIMEOUT_SECONDS=5 FT_KILL_FRACTION=0.5
    run "np=$np between: rank $last killed between steps" killed 10 \
        "$np" "$last" between -- KOLO_TIMEOUT_SECONDS=5
    run "np=$np init: rank $last killed before kolo_init" killed 10 \
        "$np" "$last" init --start-timeout 3 --
    run "np=$np exit: rank $last exits without kolo_shutdown" exit0 10 \
        "$np" "$last" exit -- KOLO_TIMEOUT_SECONDS=5
    run "np=$np stop: rank $last SIGSTOPped" stopped 20 \
        "$np" "$last" stop -- KOLO_TIMEOUT_SECONDS=3
done
# The coordinator as the victim.
run "np=3 midcoll: rank 0 killed inside a 16M allreduce" killed 20 \
    3 0 midcoll -- KOLO_TIMEOUT_SECONDS=5
run "np=3 between: rank 0 killed between steps" killed 10 \
    3 0 between -- KOLO_TIMEOUT_SECONDS=5
run "np=3 init: rank 0 killed before kolo_init" killed 10 \
    3 0 init --start-timeout 3 --
run "np=3 exit: rank 0 exits without kolo_shutdown" exit0 10 \
    3 0 exit -- KOLO_TIMEOUT_SECONDS=5
run "np=3 stop: rank 0 SIGSTOPped" stopped 20 \
    3 0 stop -- KOLO_TIMEOUT_SECONDS=3
# Resources: 20 init/shutdown cycles in a 2-rank job.
run "np=2 cycles: 20 init/shutdown, fds and threads flat" cycles 30 \
    2 20 cycles

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
