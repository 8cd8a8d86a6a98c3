#!/usr/bin/env bash
# test-kolorun.sh — tests of the launcher, kolorun, with real processes.
#
#   tests/test-kolorun.sh [path/to/kolorun]      (default ./kolorun)
#
# Each case runs kolorun under `timeout` (or, where the test itself must send
# kolorun a signal, under a watchdog that kills it), so that a hang fails the
# case instead of the suite. Every case also checks that kolorun left no
# rendezvous directory behind: TMPDIR points at a directory of our own, where
# kolorun makes them, and it must be empty after each case.
# Prints "ok - ..." or "FAIL - ..." per case, then "N passed, M failed";
# exits 0 only if nothing failed.
# The ranks' scripts are single-quoted on purpose: they expand in the ranks.
# shellcheck disable=SC2016
set -u

KOLORUN=${1:-./kolorun}
case $KOLORUN in /*) ;; *) KOLORUN=$PWD/$KOLORUN ;; esac
if [ ! -x "$KOLORUN" ]; then
    echo "test-kolorun: '$KOLORUN' is not an executable file" >&2
    exit 2
fi

# The ranks must see only what kolorun gives them.
unset KOLO_HOSTNAME KOLO_TIMELINE KOLO_START_TIMEOUT KOLO_RENDEZVOUS

WORK=$(mktemp -d "${TMPDIR:-/tmp}/test-kolorun.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
export TMPDIR=$WORK/tmp # kolorun's rendezvous directories go here
mkdir "$TMPDIR"
D=$WORK/d # what the ranks of a case leave for the checks: pid files, ...
export D
OUT=$WORK/out
ERR=$WORK/err

passed=0
failed=0
name=
why=

# begin NAME: starts a case.
begin() {
    name=$1
    why=
    rm -rf "$D" "${TMPDIR:?}"/*
    mkdir -p "$D"
}

# expect DESCRIPTION COMMAND...: notes DESCRIPTION as a failure unless
# COMMAND succeeds.
expect() {
    local what=$1
    shift
    "$@" || why="$why
    - $what"
}

# end: checks that no rendezvous directory is left, reports the case.
end() {
    local left
    left=$(ls -A "$TMPDIR")
    [ -z "$left" ] || why="$why
    - left behind in TMPDIR: $left"
    if [ -z "$why" ]; then
        passed=$((passed + 1))
        echo "ok - $name"
    else
        failed=$((failed + 1))
        echo "FAIL - $name$why"
        echo "    kolorun exit status: ${rc-?}; stderr (first lines):"
        head -n 8 "$ERR" 2>/dev/null | cut -c1-200 | sed 's/^/      | /'
    fi
}

# kr ARGS...: runs kolorun with ARGS, at most KR_LIMIT (20) seconds; stdout
# in $OUT, stderr in $ERR, exit status in $rc, run time in $ms.
kr() {
    local t0
    t0=$(date +%s%N)
    timeout -k 5 "${KR_LIMIT:-20}" "$KOLORUN" "$@" >"$OUT" 2>"$ERR" </dev/null
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
}

# wait_files N: waits (at most 10 s) until $D holds N files.
wait_files() {
    local _
    for _ in $(seq 100); do
        [ "$(ls "$D" | wc -l)" -ge "$1" ] && return 0
        sleep 0.1
    done
    return 1
}

# all_gone FILE...: the processes whose pids the files hold are all gone
# (waits up to 3 s: a killed process is briefly a zombie of its new parent).
all_gone() {
    local _ f alive
    for _ in $(seq 30); do
        alive=0
        for f in "$@"; do
            [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1
        done
        [ $alive = 0 ] && return 0
        sleep 0.1
    done
    return 1
}

# start_bg ARGS...: starts kolorun in the background ($kp), with a watchdog
# that kills it after 30 s; disarm stops the watchdog.
start_bg() {
    "$KOLORUN" "$@" >"$OUT" 2>"$ERR" </dev/null &
    kp=$!
    rm -f "$WORK/wd"
    (
        sleep 30 &
        echo $! >"$WORK/wd"
        wait $! && kill -KILL "$kp"
    ) >/dev/null 2>&1 &
    wd_shell=$!
}
disarm() {
    local _
    for _ in $(seq 50); do
        [ -s "$WORK/wd" ] && break
        sleep 0.1
    done
    kill "$(cat "$WORK/wd" 2>/dev/null)" 2>/dev/null
    wait "$wd_shell" 2>/dev/null
}

has() { grep -q -- "$1" "$2"; }
eq() { [ "$1" = "$2" ]; }

# ---------------------------------------------------------------------------
# Environment

for np in 1 2 3 4; do
    begin "every rank's KOLO_* variables, -np $np"
    kr -np "$np" sh -c 'echo "$KOLO_RANK $KOLO_SIZE $KOLO_LOCAL_RANK $KOLO_LOCAL_SIZE $KOLO_CROSS_RANK $KOLO_CROSS_SIZE $KOLO_HOSTNAME"; echo "$KOLO_RENDEZVOUS" >&2'
    expected=$(for ((r = 0; r < np; r++)); do echo "$r $np $r $np 0 1 127.0.0.1"; done)
    expect "exit status 0 (got $rc)" eq "$rc" 0
    expect "one line per rank with its values" eq "$(sort "$OUT")" "$expected"
    expect "the same KOLO_RENDEZVOUS=file:$TMPDIR/kolo-rdv-* for every rank" \
        eq "$(sort -u "$ERR" | grep -c "^file:$TMPDIR/kolo-rdv-......\$")" 1
    expect "$np lines on stderr" eq "$(wc -l <"$ERR")" "$np"
    end
done

begin "-n 2 and --np=2 name the number of ranks too"
kr -n 2 sh -c 'echo $KOLO_SIZE'
a=$(cat "$OUT")
kr --np=2 -- sh -c 'echo $KOLO_SIZE'
expect "-n 2 gives two ranks of size 2" eq "$a" "2
2"
expect "--np=2 gives two ranks of size 2" eq "$(cat "$OUT")" "2
2"
end

begin "--timeline-filename and --start-timeout are exported, KOLO_HOSTNAME kept"
KOLO_HOSTNAME=10.1.2.3 kr -np 2 --timeline-filename /x/t.json --start-timeout 45 \
    sh -c 'echo "$KOLO_TIMELINE $KOLO_START_TIMEOUT $KOLO_HOSTNAME"'
expect "exit status 0" eq "$rc" 0
expect "both ranks see them" eq "$(cat "$OUT")" "/x/t.json 45 10.1.2.3
/x/t.json 45 10.1.2.3"
kr -np 1 sh -c 'echo "${KOLO_TIMELINE-unset} ${KOLO_START_TIMEOUT-unset}"'
expect "absent when not asked for" eq "$(cat "$OUT")" "unset unset"
end

begin "rendezvous directory: private while ranks run, removed after"
# The ranks leave what a runtime might: files, a read-only file, a nested
# directory, a read-only directory, and a symbolic link out of it, which
# removal must not follow.
echo precious >"$WORK/outside"
kr -np 2 sh -c '
    dir=${KOLO_RENDEZVOUS#file:}
    test -d "$dir" || { echo "no directory $dir"; exit 1; }
    echo "$dir" >"$D/dir.$KOLO_RANK"
    stat -c %a "$dir" >"$D/mode.$KOLO_RANK"
    mkdir -p "$dir/sub.$KOLO_RANK/deeper" &&
    echo x >"$dir/sub.$KOLO_RANK/deeper/f" &&
    echo y >"$dir/ro.$KOLO_RANK" && chmod 0400 "$dir/ro.$KOLO_RANK" &&
    mkdir "$dir/rodir.$KOLO_RANK" && echo z >"$dir/rodir.$KOLO_RANK/f" &&
    chmod 0500 "$dir/rodir.$KOLO_RANK" &&
    ln -s "$WORK/outside" "$dir/link.$KOLO_RANK"'
dir=$(cat "$D/dir.0" 2>/dev/null)
expect "exit status 0 (got $rc)" eq "$rc" 0
expect "the ranks found the directory" eq "$(cat "$D/dir.1" 2>/dev/null)" "$dir"
expect "mode 700" eq "$(cat "$D"/mode.* 2>/dev/null | sort -u)" 700
expect "it is gone after the run" test ! -e "$dir"
expect "the file a link pointed at is still there" eq "$(cat "$WORK/outside")" precious
end

# ---------------------------------------------------------------------------
# Output

begin "output passes unchanged, stdout to stdout and stderr to stderr"
kr -np 2 sh -c 'echo "out $KOLO_RANK"; echo "err $KOLO_RANK" >&2'
expect "exit status 0" eq "$rc" 0
expect "stdout" eq "$(sort "$OUT")" "out 0
out 1"
expect "stderr" eq "$(sort "$ERR")" "err 0
err 1"
end

begin "--tag-output prefixes [rank]<stdout>: and [rank]<stderr>:"
kr -np 2 --tag-output sh -c 'echo "out $KOLO_RANK"; echo "err $KOLO_RANK" >&2; printf "no newline $KOLO_RANK"'
expect "exit status 0" eq "$rc" 0
expect "stdout lines tagged, the last line ended" eq "$(sort "$OUT")" "[0]<stdout>:no newline 0
[0]<stdout>:out 0
[1]<stdout>:no newline 1
[1]<stdout>:out 1"
expect "stderr lines tagged" eq "$(sort "$ERR")" "[0]<stderr>:err 0
[1]<stderr>:err 1"
end

# check_lines FILE NP N LEN: FILE holds exactly N intact lines
# "rank R line I <LEN x> end" of each of NP ranks, each rank's in order.
check_lines() {
    awk -v np="$2" -v n="$3" -v len="$4" -v prefix="${5-}" '
        {
            line = $0
            if (prefix != "") {
                if (index(line, "[") != 1) { bad++; next }
                line = substr(line, index(line, ":") + 1)
            }
            k = split(line, f, " ")
            if (k != 6 || f[1] != "rank" || f[3] != "line" || f[6] != "end" ||
                length(f[5]) != len || f[5] !~ /^x+$/) { bad++; next }
            if (prefix != "" && index($0, "[" f[2] "]" prefix) != 1) { bad++; next }
            if (f[4] != seen[f[2]] + 0) order++
            seen[f[2]] = f[4] + 1
        }
        END {
            for (r = 0; r < np; r++) if (seen[r] != n) short++
            if (bad || order || short) {
                printf "%d broken lines, %d out of order, %d ranks short\n", bad, order, short
                exit 1
            }
        }' "$1"
}
LONG='BEGIN { s = sprintf("%5000s", ""); gsub(/ /, "x", s)
              for (i = 0; i < 2000; i++) printf "rank %d line %d %s end\n", ENVIRON["KOLO_RANK"], i, s > OUTFILE }'

begin "lines are never mixed: 4 ranks x 2000 lines of 5 KB"
kr -np 4 awk -v OUTFILE=/dev/stdout "$LONG"
expect "exit status 0" eq "$rc" 0
expect "every line intact: $(check_lines "$OUT" 4 2000 5000)" check_lines "$OUT" 4 2000 5000
end

begin "lines are never mixed with --tag-output, on stderr"
kr -np 4 --tag-output awk -v OUTFILE=/dev/stderr "$LONG"
expect "exit status 0" eq "$rc" 0
expect "every line intact and tagged: $(check_lines "$ERR" 4 2000 5000 '<stderr>:')" \
    check_lines "$ERR" 4 2000 5000 '<stderr>:'
end

begin "a 300 KB line without --tag-output comes out byte for byte"
LINES='head -c 300000 /dev/zero | tr "\0" y; printf "\nshort\n"; head -c 300000 /dev/zero | tr "\0" z'
kr -np 1 sh -c "$LINES"
sh -c "$LINES" >"$WORK/expected"
expect "exit status 0" eq "$rc" 0
expect "identical output" cmp -s "$OUT" "$WORK/expected"
end

begin "ranks read /dev/null, not kolorun's stdin"
echo "not for the ranks" | timeout 20 "$KOLORUN" -np 2 cat >"$OUT" 2>"$ERR"
rc=$?
expect "exit status 0" eq "$rc" 0
expect "nothing read" test ! -s "$OUT"
end

begin "kolorun's stdout closed (| head): ranks see the broken pipe, the job ends"
timeout 20 "$KOLORUN" -np 2 yes 2>"$ERR" </dev/null | head -n 3 >"$OUT"
rc=${PIPESTATUS[0]}
expect "head got its lines" eq "$(cat "$OUT")" "y
y
y"
expect "kolorun ended by itself, non-zero (got $rc)" eval '[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ]'
expect "a rank is named as the cause" has "^kolorun: rank [01] (pid [0-9]*) " "$ERR"
end

# ---------------------------------------------------------------------------
# Failures

# Ranks other than the failing one write their pid and their child's pid,
# then sleep 60 s; the failing one waits for their files first, so that the
# test knows every process it must find dead afterwards.
SLEEPERS='echo $$ >"$D/pid.$KOLO_RANK"
    if [ "$KOLO_RANK" != "$FAILING" ]; then
        sleep 60 & echo $! >"$D/child.$KOLO_RANK"; wait; exit 0
    fi
    n=$((2 * KOLO_SIZE - 1))
    while [ "$(ls "$D" | wc -l)" -lt $n ]; do sleep 0.05; done'

begin "a rank exits with status 3: named, others stopped at once, status 3"
FAILING=1 kr -np 3 sh -c "$SLEEPERS"'
    echo "rank 1 says goodbye" >&2; exit 3'
expect "exit status 3 (got $rc)" eq "$rc" 3
expect "one line names rank 1, its pid and status 3" \
    eq "$(grep '^kolorun: ' "$ERR")" "kolorun: rank 1 (pid $(cat "$D/pid.1" 2>/dev/null)) exited with status 3"
words=$(grep -n "^rank 1 says goodbye\$" "$ERR" | cut -d: -f1)
named=$(grep -n "^kolorun: rank 1 " "$ERR" | cut -d: -f1)
expect "the rank's last words come before that line" test "${words:-99}" -lt "${named:-0}"
expect "done in seconds, not the 60 s sleep (took $ms ms)" test "$ms" -lt 10000
expect "no rank or child of a rank survives" all_gone "$D"/pid.* "$D"/child.*
end

begin "a rank killed by SIGKILL: the message names the signal, status 137"
FAILING=0 kr -np 2 sh -c "$SLEEPERS"'
    kill -KILL $$'
expect "exit status 137 (got $rc)" eq "$rc" 137
expect "one line names rank 0 and signal 9" \
    eq "$(grep '^kolorun: ' "$ERR")" "kolorun: rank 0 (pid $(cat "$D/pid.0" 2>/dev/null)) was killed by signal 9 (Killed)"
expect "done in seconds (took $ms ms)" test "$ms" -lt 10000
expect "no rank or child of a rank survives" all_gone "$D"/pid.* "$D"/child.*
end

begin "ranks that ignore SIGTERM are killed after the grace period"
FAILING=2 kr -np 3 sh -c 'trap "" TERM; '"$SLEEPERS"'
    exit 5'
expect "exit status 5 (got $rc)" eq "$rc" 5
expect "only the failing rank is named" eq "$(grep -c '^kolorun: rank' "$ERR")" 1
expect "after about 3 s, not 60 (took $ms ms)" eval '[ "$ms" -ge 2500 ] && [ "$ms" -lt 10000 ]'
expect "no rank or child of a rank survives" all_gone "$D"/pid.* "$D"/child.*
end

begin "command not found: status 127 and a message"
kr -np 2 /nonexistent/kolo-cmd --flag
expect "exit status 127 (got $rc)" eq "$rc" 127
expect "the child says why" has "^kolorun: cannot run '/nonexistent/kolo-cmd': No such file or directory\$" "$ERR"
expect "a rank is named, with status 127" has "^kolorun: rank [01] (pid [0-9]*) exited with status 127\$" "$ERR"
expect "only one rank is named" eq "$(grep -c '^kolorun: rank' "$ERR")" 1
end

begin "--verbose shows the rendezvous directory, the pids and the environment"
kr -np 2 --verbose sh -c 'echo $$ >"$D/pid.$KOLO_RANK"'
expect "exit status 0" eq "$rc" 0
expect "the directory" has "^kolorun: rendezvous directory $TMPDIR/kolo-rdv-" "$ERR"
for r in 0 1; do
    expect "rank $r's pid and environment" \
        has "^kolorun: rank $r: pid $(cat "$D/pid.$r" 2>/dev/null), environment: KOLO_RANK=$r KOLO_SIZE=2 " "$ERR"
done
end

# ---------------------------------------------------------------------------
# Signals to kolorun

# RANKS_BG: each rank writes its pid and its child's pid and the rendezvous
# directory, then waits for its child, a 60 s sleep.
RANKS_BG='echo $$ >"$D/pid.$KOLO_RANK"; echo "${KOLO_RENDEZVOUS#file:}" >"$D/dir.$KOLO_RANK"
    sleep 60 & echo $! >"$D/child.$KOLO_RANK"; wait'

begin "SIGTERM to kolorun stops every rank, then kolorun ends by SIGTERM"
start_bg -np 3 sh -c "$RANKS_BG"
expect "ranks started" wait_files 9
t0=$(date +%s%N)
kill -TERM "$kp"
{ wait "$kp"; } 2>/dev/null
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
disarm
expect "exit status 143 (got $rc)" eq "$rc" 143
expect "done in seconds (took $ms ms)" test "$ms" -lt 10000
expect "no rank or child of a rank survives" all_gone "$D"/pid.* "$D"/child.*
expect "it says why it stops" has "^kolorun: got SIGTERM: stopping 3 ranks\$" "$ERR"
expect "no rank is blamed" eq "$(grep -c '^kolorun: rank' "$ERR")" 0
expect "rendezvous directory gone" test ! -e "$(cat "$D/dir.0")"
end

begin "SIGINT to kolorun (job control on) stops every rank, kolorun ends by SIGINT"
set -m
start_bg -np 2 sh -c "$RANKS_BG"
set +m
expect "ranks started" wait_files 6
kill -INT "$kp"
{ wait "$kp"; } 2>/dev/null
rc=$?
disarm
expect "exit status 130 (got $rc)" eq "$rc" 130
expect "no rank or child of a rank survives" all_gone "$D"/pid.* "$D"/child.*
end

begin "Ctrl-Z (SIGTSTP) stops kolorun and the ranks, SIGCONT resumes them"
set -m
start_bg -np 2 sh -c 'echo $$ >"$D/pid.$KOLO_RANK"; i=0
    while [ $i -lt 20 ]; do i=$((i + 1)); echo "$KOLO_RANK $i"; sleep 0.05; done'
set +m
expect "ranks started" wait_files 2
kill -TSTP "$kp"
sleep 0.5
state() { awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null; }
expect "kolorun is stopped (state $(state "$kp"))" eq "$(state "$kp")" T
for r in 0 1; do
    p=$(cat "$D/pid.$r")
    expect "rank $r is stopped (state $(state "$p"))" eq "$(state "$p")" T
done
kill -CONT "$kp"
{ wait "$kp"; } 2>/dev/null
rc=$?
disarm
expect "exit status 0 after SIGCONT (got $rc)" eq "$rc" 0
expect "all 40 lines printed" eq "$(wc -l <"$OUT")" 40
end

begin "SIGHUP to kolorun stops every rank"
start_bg -np 2 sh -c "$RANKS_BG"
expect "ranks started" wait_files 6
{ kill -HUP "$kp"; wait "$kp"; } 2>/dev/null # quiet: no "Hangup" from bash
rc=$?
disarm
expect "exit status 129 (got $rc)" eq "$rc" 129
expect "no rank or child of a rank survives" all_gone "$D"/pid.* "$D"/child.*
end

begin "SIGINT ignored by the caller (cmd & in a script) stays ignored"
start_bg -np 2 sh -c "$RANKS_BG"
expect "ranks started" wait_files 6
kill -INT "$kp"
sleep 0.5
expect "kolorun still runs after SIGINT" kill -0 "$kp"
kill -TERM "$kp"
{ wait "$kp"; } 2>/dev/null
rc=$?
disarm
expect "SIGTERM ends it (got $rc)" eq "$rc" 143
expect "no rank survives" all_gone "$D"/pid.* "$D"/child.*
end

begin "kolorun killed with SIGKILL: the ranks die with it (no orphans)"
start_bg -np 2 sh -c 'echo $$ >"$D/pid.$KOLO_RANK"; exec sleep 60'
expect "ranks started" wait_files 2
{ kill -KILL "$kp"; wait "$kp"; } 2>/dev/null # quiet: no "Killed" from bash
disarm
expect "no rank survives" all_gone "$D"/pid.*
rm -rf "${TMPDIR:?}"/kolo-rdv-* # left behind: SIGKILL gives kolorun no chance
end

begin "ranks that exit at once: status 0, without delay"
kr -np 4 sh -c 'exit 0'
expect "exit status 0" eq "$rc" 0
expect "quick (took $ms ms)" test "$ms" -lt 5000
end

# ---------------------------------------------------------------------------
# Command line

begin "command line errors exit 2 with a message"
kr sh -c true
expect "no -np: status 2 (got $rc)" eq "$rc" 2
expect "no -np: says so" has "-np N" "$ERR"
kr -np 0 true
expect "-np 0: status 2" eq "$rc" 2
kr -np two true
expect "-np two: status 2" eq "$rc" 2
kr -np 2
expect "no command: status 2" eq "$rc" 2
kr -np 2 --frobnicate true
expect "unknown option: status 2" eq "$rc" 2
expect "unknown option: named" has "'--frobnicate'" "$ERR"
for opt in "-H localhost:2" "--hostfile hosts"; do
    # shellcheck disable=SC2086
    kr -np 2 $opt true
    expect "$opt: status 2 (got $rc)" eq "$rc" 2
    expect "$opt: not supported yet" has "not supported yet" "$ERR"
done
# --mpi runs the job through mpirun (tests/multi/run-mpi.sh); options that
# mean nothing there are refused before mpirun starts.
kr -np 2 --mpi --gloo true
expect "--mpi --gloo: status 2 (got $rc)" eq "$rc" 2
expect "--mpi --gloo: named" has "choose different launchers" "$ERR"
kr -np 2 --mpi --failure-grace 2 true
expect "--mpi --failure-grace: status 2 (got $rc)" eq "$rc" 2
expect "--mpi --failure-grace: named" has "no effect with --mpi" "$ERR"
end

begin "--help prints the usage on stdout and exits 0"
kr --help
expect "status 0" eq "$rc" 0
expect "usage line" has "^usage: kolorun -np N" "$OUT"
expect "documents the tag format" has "\[1\]<stdout>:text" "$OUT"
kr -h
expect "-h too" eq "$rc" 0
end

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
