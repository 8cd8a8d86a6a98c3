#!/usr/bin/env bash
# test-kolorun-flight.sh — kolorun's side of the flight recorder (issue
# 52), with real processes: KOLO_FLIGHT_DIR for every rank (--flight-dir,
# the user's, or kolorun's own directory, removed after a job that
# succeeded, named after one that failed), SIGUSR1 passed on only to the
# ranks that announced a handler (DIR/rank<R>.ready), the ranks' dumps
# before kolorun stops a job, the stragglers' line, and the cause line
# read from the runtime's words for a stall shutdown, a deadlock and a
# mismatch.
#
#   tests/test-kolorun-flight.sh [path/to/kolorun]      (default ./kolorun)
#
# The ranks are shell programs that play the runtime's part: they write
# the files a kolo rank writes (rank<R>.ready with their pid, rank<R>.json
# when SIGUSR1 comes, stragglers.txt) and print the runtime's messages;
# the same shapes from the real runtime are tested with it elsewhere.
# Every case runs kolorun under `timeout` (or a watchdog where the test
# signals it), and checks that nothing is left in TMPDIR, where kolorun
# makes its directories, but what a case names. Prints "ok - ..." or
# "FAIL - ..." per case, then "N passed, M failed".
# The ranks' scripts are single-quoted on purpose: they expand in the ranks.
# shellcheck disable=SC2016
set -u

. "$(dirname "$0")/script-lib.sh"
skip_if_sanitized thread "kolorun has one thread and these ranks are shell commands: nothing for ThreadSanitizer to see (the plain and ASan suites run this)"
kolorun_cases test-kolorun-flight "${1:-}"
unset KOLO_HOSTNAME KOLO_RENDEZVOUS KOLO_FLIGHT_DIR KOLO_FLIGHT_RECORDER

begin() {
    name=$1
    why=
    rm -rf "$D" "${TMPDIR:?}"/*
    mkdir -p "$D"
}

# end [kept]: the case is over; with "kept", the flight directory it
# expected kolorun to keep is removed first.
end() {
    [ "${1-}" != kept ] || rm -rf "${TMPDIR:?}"/kolo-flight-*
    case_end
}

# kr ARGS...: kolorun ARGS (untagged: the cases read what the ranks
# wrote), at most 20 s; $OUT, $ERR, $rc.
kr() {
    timeout -k 5 20 "$KOLORUN" --no-tag-output "$@" >"$OUT" 2>"$ERR" </dev/null
    rc=$?
}

# start_bg ARGS...: kolorun ARGS in the background ($kp); finish waits for
# it ($rc), killing it if it runs past 30 s.
start_bg() {
    "$KOLORUN" --no-tag-output "$@" >"$OUT" 2>"$ERR" </dev/null &
    kp=$!
}
finish() {
    local _
    for _ in $(seq 300); do
        kill -0 "$kp" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$kp" 2>/dev/null
    { wait "$kp"; } 2>/dev/null
    rc=$?
}

# wait_for FILE...: waits (at most 10 s) until every FILE exists.
wait_for() {
    local _ f missing
    for _ in $(seq 100); do
        missing=0
        for f in "$@"; do [ -e "$f" ] || missing=1; done
        [ $missing = 0 ] && return 0
        sleep 0.1
    done
    return 1
}

has() { grep -q -- "$1" "$2"; }
eq() { [ "$1" = "$2" ]; }
last_line() { tail -n 1 "$ERR"; }
flight_dirs() { ls -d "$TMPDIR"/kolo-flight-* 2>/dev/null; }

# ---------------------------------------------------------------------------
# The directory

begin "kolorun's own directory: every rank's KOLO_FLIGHT_DIR, mode 700, removed after success"
kr -np 2 sh -c 'echo "$KOLO_FLIGHT_DIR"; stat -c %a "$KOLO_FLIGHT_DIR" >"$D/mode.$KOLO_RANK"
    echo dump >"$KOLO_FLIGHT_DIR/rank$KOLO_RANK.json"'
dir=$(head -n 1 "$OUT")
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "both ranks, one directory \$TMPDIR/kolo-flight-USER-YYYYmmdd-HHMMSS-PID (got $(sort -u "$OUT"))" \
    eq "$(sort -u "$OUT" | grep -c "^$TMPDIR/kolo-flight-$(id -un)-[0-9]\{8\}-[0-9]\{6\}-[0-9]*\$")" 1
expect "mode 700" eq "$(cat "$D"/mode.* 2>/dev/null | sort -u)" 700
expect "removed after a job that succeeded, dumps and all" test ! -e "$dir"
expect "not named" eval '! has "flight recorder dumps" "$ERR"'
end

begin "a job that failed: the directory is kept and named in the last line"
kr -np 2 --failure-grace 0 sh -c 'echo x >"$KOLO_FLIGHT_DIR/rank$KOLO_RANK.json"
    echo "$KOLO_FLIGHT_DIR"; [ "$KOLO_RANK" = 0 ] || exit 3'
dir=$(head -n 1 "$OUT")
expect "exit status 3 (got $rc)" eq "$rc" 3
expect "kept, with the ranks' files" eq "$(ls "$dir" 2>/dev/null | tr '\n' ' ')" "rank0.json rank1.json "
expect "the last line names it (got: $(last_line))" \
    eq "$(last_line)" "kolorun: flight recorder dumps in $dir; read them with: kolo-timeline why $dir"
rm -rf "$dir"
kr -np 2 --failure-grace 0 sh -c 'echo "$KOLO_FLIGHT_DIR"; exit 3'
expect "nothing written to it: removed, not named" \
    eq "$(flight_dirs)$(grep -c "flight recorder" "$ERR")" 0
end

begin "--flight-dir DIR: every rank's, made absolute, created, kept after success"
mkdir -p "$WORK/cwd"
cd "$WORK/cwd" || exit 2
kr -np 2 --flight-dir rel/fl sh -c 'echo "$KOLO_FLIGHT_DIR"; touch "$KOLO_FLIGHT_DIR/rank$KOLO_RANK.json"'
cd - >/dev/null || exit 2
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "both ranks: the absolute path (got $(sort -u "$OUT"))" eq "$(sort -u "$OUT")" "$WORK/cwd/rel/fl"
expect "created, mode 700, kept with the dumps" \
    eq "$(stat -c %a "$WORK/cwd/rel/fl" 2>/dev/null) $(ls "$WORK/cwd/rel/fl" 2>/dev/null | tr '\n' ' ')" \
    "700 rank0.json rank1.json "
expect "no directory of kolorun's own" eq "$(flight_dirs)" ""
KOLO_FLIGHT_DIR=$WORK/users kr -np 1 sh -c 'echo "$KOLO_FLIGHT_DIR"'
expect "KOLO_FLIGHT_DIR set by the user: that one" eq "$(cat "$OUT")" "$WORK/users"
KOLO_FLIGHT_DIR=$WORK/users kr -np 1 --flight-dir "$WORK/flag" sh -c 'echo "$KOLO_FLIGHT_DIR"'
expect "--flight-dir wins over KOLO_FLIGHT_DIR" eq "$(cat "$OUT")" "$WORK/flag"
KOLO_FLIGHT_RECORDER=0 kr -np 1 sh -c 'echo "${KOLO_FLIGHT_DIR-unset}"'
expect "KOLO_FLIGHT_RECORDER=0: no directory" eq "$(cat "$OUT") $(flight_dirs)" "unset "
kr -np 1 --flight-dir "" true
expect "--flight-dir '': status 2 (got $rc)" eq "$rc" 2
end

begin "ranks on other hosts get KOLO_FLIGHT_DIR on their command line"
kr -H localhost:1,far:1 --redis 127.0.0.1:1 --flight-dir "$WORK/fl" \
    --launch-command 'env -i /bin/sh -c {command}' sh -c 'echo "$KOLO_RANK $KOLO_FLIGHT_DIR"'
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "both ranks (got $(sort "$OUT" | tr '\n' ' '))" eq "$(sort "$OUT")" "0 $WORK/fl
1 $WORK/fl"
end

begin "--mpi: mpirun gets --tag-output unless --no-tag-output, and -x KOLO_FLIGHT_DIR"
printf '#!/bin/sh\nfor a in "$@"; do printf "%%s\\n" "$a"; done\necho "dir=${KOLO_FLIGHT_DIR-unset}"\n' \
    >"$WORK/mpirun"
chmod +x "$WORK/mpirun"
timeout 20 env KOLO_MPIRUN="$WORK/mpirun" "$KOLORUN" --mpi -np 2 true >"$OUT" 2>"$ERR"
rc=$?
expect "default: --tag-output, as horovodrun's mpi_run (status $rc)" has "^--tag-output\$" "$OUT"
expect "default: no flight directory under --mpi" \
    eq "$(grep -c "^KOLO_FLIGHT_DIR\$" "$OUT") $(grep "^dir=" "$OUT") $(flight_dirs)" "0 dir=unset "
timeout 20 env KOLO_MPIRUN="$WORK/mpirun" "$KOLORUN" --mpi -np 2 --no-tag-output \
    --flight-dir "$WORK/fl" true >"$OUT" 2>"$ERR"
expect "--no-tag-output: none" eval '! has "^--tag-output\$" "$OUT"'
expect "--flight-dir: -x KOLO_FLIGHT_DIR with its value (got $(tr '\n' ' ' <"$OUT"))" \
    eq "$(tr '\n' ' ' <"$OUT" | grep -c -- "-x KOLO_FLIGHT_DIR ") $(grep "^dir=" "$OUT")" "1 dir=$WORK/fl"
end

# ---------------------------------------------------------------------------
# SIGUSR1

# A rank that takes SIGUSR1 as kolo's runtime does: it writes
# rank<R>.ready (its pid; empty with EMPTY_READY=R) after its trap is set;
# the trap writes $D/usr1.R and DIR/rank<R>.json. It runs until $D/go.
# NO_READY=R: rank R sets no trap and writes no .ready.
TAKER='dir=$KOLO_FLIGHT_DIR; r=$KOLO_RANK
    if [ "${NO_READY-}" != "$r" ]; then
        trap "echo \$\$ >>$D/usr1.$r; echo dump >$dir/.rank$r.tmp; mv $dir/.rank$r.tmp $dir/rank$r.json" USR1
        if [ "${EMPTY_READY-}" = "$r" ]; then : >"$dir/rank$r.ready"; else echo $$ >"$dir/rank$r.ready"; fi
    fi
    echo $$ >"$D/pid.$r"
    while [ ! -e "$D/go" ]; do sleep 0.05; done'

begin "kill -USR1 kolorun: the ranks that announced a handler get SIGUSR1, the others not; the job goes on"
EMPTY_READY=1 NO_READY=2 start_bg -np 3 bash -c "$TAKER"
expect "ranks started" wait_for "$D/pid.0" "$D/pid.1" "$D/pid.2"
kill -USR1 "$kp"
expect "rank 0 (pid in its .ready) and rank 1 (empty .ready: its own pid) got it" \
    wait_for "$D/usr1.0" "$D/usr1.1"
sleep 0.3
touch "$D/go"
finish
expect "exit status 0: rank 2, without a handler, did not die of it (got $rc)" eq "$rc" 0
expect "rank 2 got nothing" test ! -e "$D/usr1.2"
expect "each once" eq "$(cat "$D/usr1.0" "$D/usr1.1" 2>/dev/null | wc -l)" 2
expect "kolorun says so (got: $(grep USR1 "$ERR"))" \
    has "^kolorun: got SIGUSR1: asked 2 ranks for a flight recorder dump (in $TMPDIR/kolo-flight-.*); the job goes on\$" "$ERR"
end

begin "SIGUSR1 reaches no rank without a .ready, a stale one, or one naming a stranger"
mkdir -p "$WORK/fl"
sleep 60 &
stranger=$!
echo "$stranger" >"$WORK/fl/rank1.ready"
: >"$WORK/fl/rank0.ready"
touch -d '1 hour ago' "$WORK/fl/rank0.ready"
NO_READY=0 start_bg -np 2 --flight-dir "$WORK/fl" bash -c 'NO_READY=$KOLO_RANK; '"$TAKER"
expect "ranks started" wait_for "$D/pid.0" "$D/pid.1"
kill -USR1 "$kp"
sleep 0.5
expect "kolorun says none was sent" has "^kolorun: got SIGUSR1: no rank here has said it takes it" "$ERR"
touch "$D/go"
finish
expect "exit status 0: no rank died of SIGUSR1 (got $rc)" eq "$rc" 0
expect "the stranger named in rank1.ready is alive" kill -0 "$stranger"
kill "$stranger"
wait "$stranger" 2>/dev/null
end

# ---------------------------------------------------------------------------
# Dumps before kolorun stops a job

# events: what happened to rank 0, in order ($D/events).
EVENTS='dir=$KOLO_FLIGHT_DIR
    if [ "$KOLO_RANK" = 0 ]; then
        trap "echo usr1 >>$D/events; sleep ${DUMP_DELAY:-0.5}; [ -n \"${NO_DUMP-}\" ] || { echo x >$dir/.r0; echo dumped >>$D/events; mv $dir/.r0 $dir/rank0.json; }" USR1
        trap "echo term >>$D/events; exit 143" TERM
        echo $$ >"$dir/rank0.ready"
        touch "$D/ready"
        while :; do sleep 0.05; done
    fi'

begin "a rank failed: SIGUSR1 to the others, kolorun waits for their dumps, then SIGTERM"
kr -np 2 --failure-grace 0 bash -c "$EVENTS"'
    while [ ! -e "$D/ready" ]; do sleep 0.05; done; exit 3'
dir=$(flight_dirs)
expect "exit status 3 (got $rc)" eq "$rc" 3
expect "rank 0: SIGUSR1, its dump written, then SIGTERM (got $(tr '\n' ' ' <"$D/events"))" \
    eq "$(tr '\n' ' ' <"$D/events")" "usr1 dumped term "
expect "why kolorun stopped the job, in DIR/kolorun-stop.txt" \
    has "^kolorun stopped the job: rank 1 (pid [0-9]*) exited with status 3\$" "$dir/kolorun-stop.txt"
expect "the cause line, then the directory" \
    eq "$(grep -c '^kolorun: rank 1 (pid [0-9]*) exited with status 3$' "$ERR") $(last_line)" \
    "1 kolorun: flight recorder dumps in $dir; read them with: kolo-timeline why $dir"
end kept

begin "a rank that writes no dump: kolorun waits 2 s, says so, and stops the job"
NO_DUMP=1 DUMP_DELAY=0 kr -np 2 --failure-grace 0 bash -c "$EVENTS"'
    while [ ! -e "$D/ready" ]; do sleep 0.05; done; exit 3'
expect "exit status 3 (got $rc)" eq "$rc" 3
expect "SIGUSR1, then SIGTERM (got $(tr '\n' ' ' <"$D/events"))" eq "$(tr '\n' ' ' <"$D/events")" "usr1 term "
expect "said (got: $(grep dump "$ERR" | head -n 1))" \
    has "^kolorun: no flight recorder dump within 2 s of SIGUSR1 from rank 0 (pid [0-9]*) (stopped, or stuck where signals wait?); stopping the job anyway\$" "$ERR"
end kept

begin "SIGTERM to kolorun: SIGUSR1 and the dumps first, then SIGTERM to the ranks"
start_bg -np 2 bash -c "$EVENTS"'
    while :; do sleep 0.05; done'
expect "rank 0 ready" wait_for "$D/ready"
kill -TERM "$kp"
finish
expect "kolorun ends by SIGTERM (got $rc)" eq "$rc" 143
expect "rank 0: SIGUSR1, its dump, then SIGTERM (got $(tr '\n' ' ' <"$D/events"))" \
    eq "$(tr '\n' ' ' <"$D/events")" "usr1 dumped term "
expect "why, in DIR/kolorun-stop.txt" \
    eq "$(cat "$(flight_dirs)/kolorun-stop.txt" 2>/dev/null)" "kolorun stopped the job: it got SIGTERM"
end kept

# ---------------------------------------------------------------------------
# The end of a job

begin "rank 0's stragglers.txt: one line after the job, whether it succeeded or not"
kr -np 2 sh -c '[ "$KOLO_RANK" = 0 ] &&
    echo "latest rank: 1, last in 93% of 512 rounds over 30.2 s, median 41 ms late" >"$KOLO_FLIGHT_DIR/stragglers.txt"
    exit 0'
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "the last line (got: $(last_line))" \
    eq "$(last_line)" "kolorun: stragglers: latest rank: 1, last in 93% of 512 rounds over 30.2 s, median 41 ms late"
kr -np 2 --failure-grace 0 sh -c 'echo "latest rank: 0" >"$KOLO_FLIGHT_DIR/stragglers.txt"; exit 4'
expect "after a failure too, before the directory's line" \
    eq "$(tail -n 2 "$ERR" | head -n 1)" "kolorun: stragglers: latest rank: 0"
rm -rf "$(flight_dirs)"
kr -np 2 true
expect "nothing without the file" eq "$(grep -c stragglers "$ERR")" 0
end

# ---------------------------------------------------------------------------
# The cause line, from the runtime's words

# stall, deadlock, mismatch: the messages of runtime/negotiate.c, each
# printed by every rank that fails with it.
STALL="kolo: stall: ranks waited more than 60 s (KOLO_STALL_SHUTDOWN_TIME_SECONDS) for tensors other ranks never enqueued: rank 2 is missing 'grad/x' (61 s), 'y' (61 s); rank 2 has been outside kolo for 61.8 s (in its own code); rank 1 is missing 'z' (3 s); rank 1 is waiting inside kolo"
DEADLOCK="RuntimeError: kolo: deadlock: rank 2 skipped 'grad.b' (its 21st) and waits on 'metric.a' (its 22nd); ranks 0, 1 wait on 'grad.b'. Every rank is waiting inside kolo, so none of these can ever be enqueued: a collective that some ranks run and others skip"
DIVERGED="kolo: deadlock: the ranks went different ways: rank 0 waits on 'a. b' (its 3rd); rank 1 waits on 'c' (its 3rd). Every rank is waiting inside kolo"
MISMATCH="kolo: allreduce of tensor 'a.b': ranks disagree on the shape: rank 0 has [2, 3], rank 1 has [4]"

begin "a stall shutdown names the stalled rank, still running, not the first to exit"
MSG=$STALL kr -np 3 --failure-grace 1 sh -c 'echo $$ >"$D/pid.$KOLO_RANK"
    [ "$KOLO_RANK" = 2 ] && exec sleep 30
    echo "$MSG" >&2; exit 1'
expect "exit status 1 (got $rc)" eq "$rc" 1
expect "one cause line (got: $(grep '^kolorun: ' "$ERR" | head -n 2))" \
    eq "$(grep '^kolorun: rank' "$ERR")" \
    "kolorun: rank 2 stalled the job: it never enqueued 'grad/x' (the others waited 61 s) and was outside kolo for 61.8 s (in its own code); rank 2 (pid $(cat "$D/pid.2")) is still running"
end

begin "a deadlock names the rank that skipped the collective, in the message's first sentence"
MSG=$DEADLOCK kr -np 3 --failure-grace 5 sh -c 'echo $$ >"$D/pid.$KOLO_RANK"
    [ "$KOLO_RANK" = 2 ] && sleep 0.5
    echo "$MSG" >&2; exit 1'
expect "exit status 1 (got $rc)" eq "$rc" 1
expect "one cause line (got: $(grep '^kolorun: ' "$ERR" | head -n 2))" \
    eq "$(grep '^kolorun: rank' "$ERR")" \
    "kolorun: rank 2 deadlocked the job: it skipped 'grad.b' (its 21st) and waits on 'metric.a' (its 22nd); ranks 0, 1 wait on 'grad.b'; rank 2 (pid $(cat "$D/pid.2")) exited with status 1"
end

begin "ranks that went different ways: said so, no rank named"
MSG=$DIVERGED kr -np 2 sh -c 'echo "$MSG" >&2; exit 1'
expect "exit status 1 (got $rc)" eq "$rc" 1
expect "the line (got: $(grep '^kolorun: ' "$ERR"))" eq "$(grep '^kolorun: ' "$ERR")" \
    "kolorun: the ranks deadlocked: they went different ways: rank 0 waits on 'a. b' (its 3rd); rank 1 waits on 'c' (its 3rd)"
end

begin "a mismatch is named as the ranks' disagreement, no rank as its cause"
MSG=$MISMATCH kr -np 2 sh -c 'echo "$MSG" >&2
    [ "$KOLO_RANK" = 1 ] && { sleep 0.3; exit 2; }; exit 1'
expect "exit status: the first rank that exited, 1 (got $rc)" eq "$rc" 1
expect "the line (got: $(grep '^kolorun: ' "$ERR"))" eq "$(grep '^kolorun: ' "$ERR")" \
    "kolorun: the ranks disagreed on tensor 'a.b' (the shape: rank 0 has [2, 3], rank 1 has [4])"
MSG="kolo: tensor 'x': ranks disagree on the collective: rank 0 enqueued allreduce, rank 1 enqueued allgather" \
    kr -np 2 sh -c 'echo "$MSG" >&2; exit 1'
expect "on the collective (got: $(grep '^kolorun: ' "$ERR"))" eq "$(grep '^kolorun: ' "$ERR")" \
    "kolorun: the ranks disagreed on tensor 'x' (the collective: rank 0 enqueued allreduce, rank 1 enqueued allgather)"
end

begin "kolo_init's agreed failure names the rank it names, not the first to exit"
kr -np 2 sh -c 'echo $$ >"$D/pid.$KOLO_RANK"
    echo "[kolo rank $KOLO_RANK] ERROR: kolo_init failed: rank 1: out of memory for a response cache of 1024 entries (KOLO_CACHE_CAPACITY)" >&2
    [ "$KOLO_RANK" = 1 ] && sleep 0.5; exit 1'
expect "exit status 1 (got $rc)" eq "$rc" 1
expect "the cause line (got: $(grep '^kolorun: rank' "$ERR"))" \
    eq "$(grep '^kolorun: rank' "$ERR")" \
    "kolorun: rank 1 (pid $(cat "$D/pid.1")) exited with status 1"
kr -np 2 sh -c 'echo $$ >"$D/pid.$KOLO_RANK"
    echo "[kolo rank $KOLO_RANK] ERROR: kolo_init failed: rank 1 of 2 could not join the job (shm, rendezvous file:/x): out of memory" >&2
    [ "$KOLO_RANK" = 1 ] && sleep 0.5; exit 1'
expect "could not join (got: $(grep '^kolorun: rank' "$ERR"))" \
    eq "$(grep '^kolorun: rank' "$ERR")" \
    "kolorun: rank 1 (pid $(cat "$D/pid.1")) exited with status 1"
end

begin "a stall warning (the job goes on) accuses no one"
kr -np 2 sh -c 'echo $$ >"$D/pid.$KOLO_RANK"
    [ "$KOLO_RANK" = 1 ] && { echo "kolo: stall: some ranks have waited more than 60 s (KOLO_STALL_CHECK_TIME_SECONDS) for tensors other ranks have not enqueued: rank 1 is missing '"'x'"' (61 s)" >&2; exit 0; }
    sleep 0.3; exit 3'
expect "exit status 3 (got $rc)" eq "$rc" 3
expect "rank 0 is the cause (got: $(grep '^kolorun: ' "$ERR"))" \
    eq "$(grep '^kolorun: ' "$ERR")" "kolorun: rank 0 (pid $(cat "$D/pid.0")) exited with status 3"
end

cases_summary
