#!/usr/bin/env bash
# run-timeline.sh — the timeline, the stall inspector and kolo-timeline,
# tested on real jobs under kolorun at 2 and 3 ranks. Every run is bounded
# in time (timeout -k 10), so that a hang fails instead of hanging CI.
# Prints one line per check and a summary "N passed, N failed".
#
#   timeline files    tests/timeline/test-timeline runs a known sequence of
#                     collectives (3 steps of 4 allreduces, an allgather and
#                     a broadcast) with the timeline started by the C API,
#                     by KOLO_TIMELINE (kolorun --timeline-filename), and by
#                     KOLO_TIMELINE_ALL_RANKS=1 (one file per rank);
#                     check-timeline.py reads every file with json.load and
#                     checks the events: names, nesting, args, ready instants
#   a killed job      rank 0 is SIGKILLed while it writes a timeline in a
#                     loop of allreduces: the file must still load
#   stragglers        rank 1 enqueues 30 ms late: its ready instants come
#                     last, and kolo-timeline names it
#   kolo-timeline     summary numbers (counts, bytes per tensor) checked
#                     against the workload; plot output parsed as XML; bad
#                     input gives the documented errors and exit codes
#   odd names         tensor names that are not valid UTF-8: the file is
#                     still UTF-8 JSON, each name on a lane of its own
#   a full disk       the timeline written to a 64 KiB tmpfs (mounted here;
#                     skipped unless root): the file loads, the failed write
#                     is said once, and kolo_stop_timeline reports it
#   device spans      tests/unit/test-device's timeline test on the
#                     simulated device: kolo-timeline summary's per-step
#                     device time, the device's wait for the program's
#                     inputs and the program's stream's wait for kolo
#   stall inspector   one rank withholds a tensor: rank 0 warns naming the
#                     rank and the tensor (KOLO_STALL_CHECK_TIME_SECONDS=1),
#                     and that the rank is outside kolo, in its own code;
#                     KOLO_STALL_SHUTDOWN_TIME_SECONDS=2 (the deadlock check
#                     off: tests/flight has it) fails every rank's handle
#                     with that message and ends the job
#
# Usage: tests/timeline/run-timeline.sh   (from the build directory; `make
# check` runs it with KOLO_TOP_BUILDDIR and KOLO_TOP_SRCDIR set)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../script-lib.sh"
top=${KOLO_TOP_BUILDDIR:-.}
src=${KOLO_TOP_SRCDIR:-$here/../..}
kolorun=$top/kolorun
prog=$top/tests/timeline/test-timeline
tool=$src/tools/kolo-timeline
check=$src/tests/timeline/check-timeline.py
py=/usr/bin/python3
limit=${KOLO_TEST_TIMEOUT:-30}
pass=0
fail=0
work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-timeline-test.XXXXXX")
log=$work/log
mounted=
trap '[ -n "$mounted" ] && umount "$mounted"; rm -rf "$work"' EXIT

for f in "$kolorun" "$prog"; do
    if [ ! -x "$f" ]; then
        echo "run-timeline.sh: $f is missing: build it first (make check)" >&2
        exit 1
    fi
done

ok() { pass=$((pass + 1)); printf 'PASS %s\n' "$1"; }
bad() {
    fail=$((fail + 1))
    printf 'FAIL %s\n' "$1"
    grep -v '^ok: ' "$log" | tail -n 30 | sed 's/^/    /'
}

# run DESC COMMAND...: one check, bounded in time, passes on exit 0.
run() {
    local desc=$1 start end rc
    shift
    smoke_point "$pass" "$fail"
    start=$(date +%s.%N)
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    if [ $rc -eq 0 ]; then
        ok "$(printf '%-62s %ss' "$desc" "$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')")"
    else
        [ $rc -eq 124 ] && desc="$desc (timed out after ${limit}s)"
        bad "$desc (exit $rc)"
    fi
    return $rc
}

# grep_log DESC PATTERN: the last run's output has a line matching PATTERN.
grep_log() {
    if grep -E -q -- "$2" "$log"; then
        ok "$1"
    else
        bad "$1: no line matches /$2/"
    fi
}

# The timeline's structure is the same on every backend; these checks run
# on Gloo (its fusion-buffer phases included), and one case below on shared
# memory, the default on one host.
export KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo
steps=3
d=$work/shm
mkdir -p "$d"
if run "np=2 shared memory: timeline by KOLO_TIMELINE" \
    env KOLO_CONTROLLER=auto KOLO_CPU_OPERATIONS=auto \
    "$kolorun" -np 2 --timeline-filename "$d/env.json" "$prog" steps; then
    run "np=2   env.json: events, nesting, SHM_ALLREDUCE phases" \
        env KOLO_TEST_PHASE=SHM $py "$check" structure "$d/env.json" --size 2 \
        --steps $steps
fi
for np in 2 3; do
    d=$work/np$np
    mkdir -p "$d"

    # The C API: kolo_start_timeline/kolo_stop_timeline on rank 0.
    if run "np=$np timeline by kolo_start_timeline" \
        "$kolorun" -np "$np" "$prog" api "$d/api.json"; then
        run "np=$np   api.json: events, nesting, ready instants" \
            $py "$check" structure "$d/api.json" --size "$np" --steps $steps \
            --absent pre.start --absent post.stop
        run "np=$np   restarted file: one step, cycles marked" \
            $py "$check" structure "$d/api.json.again.json" --size "$np" --steps 1 \
            --cycles --ready own --absent pre.start --absent post.stop
    fi

    # KOLO_TIMELINE (through kolorun --timeline-filename), cycles marked.
    if run "np=$np timeline by KOLO_TIMELINE" \
        env KOLO_TIMELINE_MARK_CYCLES=1 \
        "$kolorun" -np "$np" --timeline-filename "$d/env.json" "$prog" steps; then
        run "np=$np   env.json: events, nesting, ready instants" \
            $py "$check" structure "$d/env.json" --size "$np" --steps $steps --cycles \
            --carried
        run "np=$np   kolo-timeline summary: counts and bytes per tensor" \
            $py "$check" summary "$tool" --size "$np" --steps $steps "$d/env.json"
    fi

    # One file per rank.
    if run "np=$np timeline of every rank (KOLO_TIMELINE_ALL_RANKS=1)" \
        env KOLO_TIMELINE="$d/all.json" KOLO_TIMELINE_ALL_RANKS=1 \
        "$kolorun" -np "$np" "$prog" steps; then
        for ((r = 0; r < np; r++)); do
            run "np=$np   all.$r.json: events, nesting, own ready instants" \
                $py "$check" structure "$d/all.$r.json" --size "$np" --rank $r \
                --steps $steps
        done
        files=()
        for ((r = 0; r < np; r++)); do files+=("$d/all.$r.json"); done
        run "np=$np   per-rank files: one epoch, clocks aligned" \
            $py "$check" aligned "${files[@]}"
        run "np=$np   kolo-timeline summary of the per-rank files" \
            $py "$check" summary "$tool" --size "$np" --steps $steps --complete \
            "${files[@]}"
    fi

    # Rank 1 is late for everything. Without the response cache, rank 0's
    # file holds every rank's ready instant of every round.
    if run "np=$np straggler rank 1, rank 0's file (no cache)" \
        env KOLO_CACHE_CAPACITY=0 KOLO_TIMELINE="$d/strag.json" \
        "$kolorun" -np "$np" "$prog" straggler 30; then
        run "np=$np   strag.json: rank 1's ready instants come last" \
            $py "$check" structure "$d/strag.json" --size "$np" --steps $steps \
            --ready every --straggler 1
        run "np=$np   kolo-timeline names rank 1 the usual straggler" \
            $py "$check" summary "$tool" --size "$np" --steps $steps --complete \
            --straggler 1 "$d/strag.json"
    fi
    # With the cache, only the ranks' own files know when each was ready.
    if run "np=$np straggler rank 1, per-rank files (cache on)" \
        env KOLO_TIMELINE="$d/sall.json" KOLO_TIMELINE_ALL_RANKS=1 \
        "$kolorun" -np "$np" "$prog" straggler 30; then
        files=()
        for ((r = 0; r < np; r++)); do files+=("$d/sall.$r.json"); done
        run "np=$np   kolo-timeline combines them: rank 1 usually last" \
            $py "$check" summary "$tool" --size "$np" --steps $steps --complete \
            --straggler 1 "${files[@]}"
        run "np=$np   kolo-timeline plot: SVG and HTML" \
            $py "$check" plot "$tool" "$d" "${files[@]}"
    fi
    # Rank 0 late: the others' requests reach the coordinator first; the
    # negotiation span must still run from the first request to the last.
    # The coordinator stamps the others' readiness when their requests
    # arrive, a round at a time: rank 0 is late by far more than a round
    # takes on a loaded machine.
    if run "np=$np straggler rank 0 (no cache)" \
        env KOLO_CACHE_CAPACITY=0 KOLO_TIMELINE="$d/late0.json" TL_LATE_RANK=0 \
        "$kolorun" -np "$np" "$prog" straggler 200; then
        run "np=$np   late0.json: NEGOTIATE covers every ready instant" \
            $py "$check" structure "$d/late0.json" --size "$np" --steps $steps \
            --ready every --straggler 0
    fi

    # Started, stopped and started again while operations are in flight.
    if run "np=$np timeline restarted with operations in flight" \
        "$kolorun" -np "$np" "$prog" restart "$d/rs"; then
        run "np=$np   every restarted file balanced (no end without begin)" \
            $py "$check" balanced "$tool" "$d"/rs.*.json
    fi

    # SIGKILL of rank 0 while it writes its timeline: once the file holds
    # "loop.mark" (160 allreduces ended before it) and KB KiB of events
    # (the size without the spaces the writer keeps in reserve).
    for kb in 32 256; do
        k=$d/kill$kb
        mkdir -p "$k"
        (
            TL_DIR=$k KOLO_TIMELINE=$k/tl.json KOLO_TIMELINE_MARK_CYCLES=1 \
                timeout -k 10 "$limit" "$kolorun" -np "$np" "$prog" loop \
                >"$k/out" 2>&1
            echo $? >"$k/rc"
        ) &
        job=$!
        killed=0
        t0=$SECONDS
        while [ $((SECONDS - t0)) -lt $((limit - 5)) ]; do
            if [ -s "$k/pid.0" ] && [ -f "$k/tl.json" ] &&
                grep -q 'loop\.mark' "$k/tl.json" &&
                [ "$(tr -d ' ' <"$k/tl.json" | wc -c)" -gt $((kb * 1024)) ]; then
                kill -KILL "$(cat "$k/pid.0")" && killed=1
                break
            fi
            [ -f "$k/rc" ] && break
            sleep 0.05
        done
        wait $job
        if [ $killed -eq 1 ] && [ "$(cat "$k/rc")" != 124 ]; then
            ok "np=$np SIGKILL of rank 0 after ${kb} KiB of timeline: job ended"
            run "np=$np   the killed job's file loads" \
                $py "$check" killed "$k/tl.json"
        else
            cp "$k/out" "$log"
            bad "np=$np SIGKILL of rank 0 after ${kb} KiB (killed=$killed, kolorun exit $(cat "$k/rc" 2>/dev/null))"
        fi
    done

    # The stall inspector: the last rank withholds grad.withheld.
    if run "np=$np stall warning (KOLO_STALL_CHECK_TIME_SECONDS=1)" \
        env KOLO_STALL_CHECK_TIME_SECONDS=1 TL_WITHHOLD_S=2.5 \
        "$kolorun" --tag-output -np "$np" "$prog" stall-warn; then
        grep_log "np=$np   rank 0 warns: rank $((np - 1)) is missing 'grad.withheld'" \
            "^\[0\]<stderr>:\[kolo rank 0\] WARNING: stall: .*rank $((np - 1)) is missing 'grad\.withheld'"
        grep_log "np=$np   and that rank $((np - 1)) is outside kolo, in its own code" \
            "^\[0\]<stderr>:\[kolo rank 0\] WARNING: stall: .*rank $((np - 1)) has been outside kolo for [0-9.]+ s \(in its own code\)"
        grep_log "np=$np   and how to see where (the dumps, kolo-timeline why)" \
            "^\[0\]<stderr>:\[kolo rank 0\] WARNING: stall: a rank outside kolo .*stuck in its own code.*kolo-timeline why DIR"
    fi
    if run "np=$np stall shutdown (KOLO_STALL_SHUTDOWN_TIME_SECONDS=2)" \
        env KOLO_STALL_SHUTDOWN_TIME_SECONDS=2 TL_STALL_BOUND_S=8 \
        KOLO_DEADLOCK_CHECK_SECONDS=0 \
        KOLO_TIMELINE="$d/stall.json" \
        "$kolorun" --tag-output -np "$np" "$prog" stall-shutdown; then
        for ((r = 0; r < np; r++)); do
            grep_log "np=$np   rank $r's handle fails naming rank $((np - 1)) and the tensor" \
                "^\[$r\]<stderr>:rank $r: grad\.(withheld|next) failed after [0-9.]+ s: .*rank $((np - 1)) is missing 'grad\.withheld'"
        done
        run "np=$np   the stopped job's timeline is valid and closed" \
            $py "$check" stalled "$tool" "$d/stall.json" --size "$np"
    fi
done

# Tensor names that are not valid UTF-8.
d=$work/names
mkdir -p "$d"
if run "np=2 tensor names that are not valid UTF-8" \
    "$kolorun" -np 2 "$prog" names "$d/names.json"; then
    run "np=2   names.json: UTF-8 JSON, one lane per name, kolo-timeline reads it" \
        $py "$check" names "$tool" "$d" "$d/names.json"
fi

# A disk that fills up while rank 0 writes its timeline: a 64 KiB tmpfs.
d=$work/full
mkdir -p "$d/fs"
if [ "$(id -u)" != 0 ]; then
    echo "SKIP a disk that fills up: mounting a tmpfs needs root"
elif ! mount -t tmpfs -o size=64k kolo-timeline-test "$d/fs" >"$log" 2>&1; then
    echo "SKIP a disk that fills up: cannot mount a tmpfs: $(head -n 1 "$log")"
else
    mounted=$d/fs
    if run "np=2 timeline on a 64 KiB disk that fills up" \
        "$kolorun" -np 2 "$prog" fill "$d/fs/tl.json" "$d/next.json"; then
        n=$(grep -c "WARNING: timeline $d/fs/tl.json: cannot write: No space left on device; events are dropped" "$log")
        if [ "$n" -eq 1 ]; then
            ok "np=2   the failed write is said once, naming the file and the error"
        else
            bad "np=2   the failed write is said $n times, want once (a WARNING naming $d/fs/tl.json and 'No space left on device')"
        fi
        run "np=2   the full disk's file loads" $py "$check" full "$d/fs/tl.json"
        run "np=2   the next timeline, on another disk, is whole" \
            $py "$check" structure "$d/next.json" --size 2 --steps 1
    fi
    umount "$mounted" && mounted=
fi

# kolo-timeline on bad input, and on a file written the way Horovod does.
d=$work/np2
if [ -f "$d/env.json" ]; then
    mkdir -p "$d/bad"
    run "kolo-timeline: bad input, truncated files, usage errors" \
        $py "$check" bad-input "$tool" "$d/bad" "$d/env.json" --steps $steps
    run "kolo-timeline: a Horovod-style timeline" \
        $py "$check" horovod "$tool" "$d/bad" "$d/env.json" --steps $steps --size 2
fi

# The device side, on the unit tests' simulated device (a real job needs a
# GPU): tests/unit/test-device's timeline test leaves its files here, 3
# steps in which the program's stream works 30 ms before kolo may read an
# input, and kolo's stream is held 40 ms while the program's stream waits.
dev=$top/tests/unit/test-device
if [ -x "$dev" ]; then
    d=$work/device
    mkdir -p "$d"
    if run "device spans on the simulated device (test-device)" \
        env KOLO_TEST_TIMELINE_DIR="$d" "$dev"; then
        run "kolo-timeline summary: per step, the device's time and the stream's wait" \
            $py - "$tool" "$d/rank0.json" <<'PY'
import json, subprocess, sys
out = subprocess.run([sys.executable, sys.argv[1], "summary", "--json", sys.argv[2]],
                     capture_output=True, text=True, check=True).stdout
dev = json.loads(out)["device"]
assert len(dev) == 1, dev
d = dev[0]
assert d["step_tensor"] == "grad.a", d["step_tensor"]
steps = d["steps"]
assert len(steps) == 3, steps
for k, st in enumerate(steps):
    assert st["batches"] == 2, (k, st)          # grad.a and grad.b
    assert st["stream_waits"] >= 1, (k, st)     # grad.b's, maybe grad.a's
    assert st["stream_wait_us"] >= 10000, (k, st)  # grad.b's, held 40 ms
    assert st["data_wait_us"] >= 40000, (k, st)   # grad.b's, held 40 ms
assert d["stream_wait_per_step"]["count"] == 3, d
text = subprocess.run([sys.executable, sys.argv[1], "summary", sys.argv[2]],
                      capture_output=True, text=True, check=True).stdout
assert "stream waited for kolo ms" in text and "per step of 'grad.a'" in text, text
print("steps:", [(round(s["device_us"]), round(s["data_wait_us"]),
                  round(s["stream_wait_us"])) for s in steps])
PY
    fi
else
    echo "SKIP device spans: tests/unit/test-device is not built (Check is needed)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
