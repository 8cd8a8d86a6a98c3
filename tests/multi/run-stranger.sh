#!/usr/bin/env bash
# run-stranger.sh — a stranger's TCP connection must not break a Gloo job
# while it starts. At 2 and 3 ranks, a job over Gloo
# (KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo) runs tests/multi/
# test-allreduce while tests/multi/stranger.py hits the ports on which its
# ranks listen for each other:
#
#   scan      connect and close (a port scanner)
#   garbage   connect, send 3 bytes, hold the connection
#   impostor  connect, send 64 bytes shaped like kolo's old hello with
#             another identity, hold
#   hello     connect, send a well-formed hello (the right magic and ranks,
#             a fresh nonce), read the reply, answer with a made-up proof
#   flood     20 silent connections to every port, held
#   replay    send each rank the handshakes the last rank sent it in an
#             earlier job with the same secret, captured on the wire
#   redis     (kolorun --start-redis) PING, KEYS, GET, SET, CONFIG and a
#             made-up AUTH to the job's Redis server: every one refused
#   rdv       (torchrun, KOLO_SECRET set) the same to the rendezvous rank
#             0 serves, then a well-formed KOLO.HELLO for a job it guesses:
#             refused, dropped with a warning
#
# Run as root, the stranger strikes as the user nobody, and as that user
# also looks for the job's secret (which it read, as root, in rank 0's
# environment: kolorun gave it) in every command line and environment it
# can read, and tries to list the rendezvous directory; it fails the run
# on any byte the job sends back beyond a handshake's reply.
#
# Before the replay, tests/multi/wire.py captures a 3-rank job's traffic
# on loopback (root only; skipped otherwise) and checks every pair's and
# ring's handshake: whole, no bytes repeated across connections, neither
# the secret nor the key derived from it anywhere on the wire.
#
# To give the stranger a listening socket to find, the last rank waits in
# kolo_init, after the ranks have agreed on their settings and before it
# connects, until the stranger has struck (KOLO_TEST_HOLD_CONNECT names a
# FIFO it reads a line from); the other ranks meanwhile listen for it. Each run must end with
# kolorun's status 0, every rank's PASS line (the program checks the
# reduced values), the stranger's report that it struck every early rank
# (and that the job closed every connection it held), and kolo's warnings
# that it dropped a connection, from Gloo's pairs and from kolo's ring.
# kolorun runs with --no-tag-output: the checks read the ranks' lines as
# they wrote them. Every run is bounded by `timeout -k 10`.
# Prints one line per run and "N passed, N failed"; exits 77 (skipped)
# without Gloo or Python.
#
# Usage: tests/multi/run-stranger.sh   (from the build directory; `make
# check` runs it with KOLO_TOP_BUILDDIR set)
set -u
here=$(dirname "$0")
top=${KOLO_TOP_BUILDDIR:-.}
kolorun=$top/kolorun
prog=$top/tests/multi/test-allreduce
stranger=${KOLO_TOP_SRCDIR:-$here/../..}/tests/multi/stranger.py
wire=${KOLO_TOP_SRCDIR:-$here/../..}/tests/multi/wire.py
limit=${KOLO_TEST_TIMEOUT:-120}

if ! grep -q '^#define KOLO_HAVE_GLOO 1' "$top/config.h" 2>/dev/null; then
    echo "SKIP kolo is built without Gloo"
    exit 77
fi
# Under ThreadSanitizer everything runs 5-15 times slower, and whether a
# struck connection is seen and warned about before the pairs connect
# becomes a race of the test, not of kolo (the job still completed there);
# the plain and AddressSanitizer suites run it.
if nm -D --undefined-only "$top/.libs/libkolo.so" 2>/dev/null | grep -q __tsan_; then
    echo "SKIP libkolo is built with ThreadSanitizer: the stranger's timing is not kolo's"
    exit 77
fi
python=/usr/bin/python3
[ -x "$python" ] || python=${KOLO_PYTHON:-}
[ -n "$python" ] || python=$(command -v python3) || {
    echo "SKIP no python3 for the stranger"
    exit 77
}
. "$here/../script-lib.sh"
require_executables run-stranger "$kolorun" "$prog"
clear_kolo_env
make_work run-stranger
log=$WORK/log
pass=0
fail=0

# A port that is free now, and the next one too (torchrun's store and rank
# 0's rendezvous), from the kernel rather than a guess.
free_port_pair() {
    "$python" -c '
import socket
while True:
    a = socket.socket()
    a.bind(("127.0.0.1", 0))
    p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1))
    except OSError:
        continue
    print(p)
    break'
}

# run NP MODE
run() {
    local np=$1 mode=$2 d=$WORK/job rc src why='' desc
    desc="np=$np $mode: the job completes"
    rm -rf "$d"
    mkdir -p "$d"
    chmod 755 "$d" "$WORK" # the stranger, as nobody, reads its replays
    mkfifo "$d/go"
    [ "$mode" = replay ] && cp "$WORK/replay" "$d/replay"
    STRANGER_REPLAY=$d/replay timeout -k 10 "$limit" "$python" "$stranger" \
        "$mode" "$d" "$np" >"$d/stranger" 2>&1 </dev/null &
    src=$!
    # Rank NP-1 waits for the stranger's go before it starts. The launcher:
    # kolorun (--start-redis in mode redis), or torchrun (mode rdv: rank 0
    # serves the rendezvous).
    local launch=("$kolorun" --no-tag-output --start-timeout 60 -np "$np")
    [ "$mode" = redis ] && launch+=(--start-redis)
    [ "$mode" = overwrite ] && launch+=(--redis "127.0.0.1:$redis_port")
    [ "$mode" = rdv ] && launch=(torchrun --nnodes 1 --nproc_per_node "$np"
        --master_addr 127.0.0.1 --master_port "$(free_port_pair)"
        --redirects 1 --tee 1 --no_python)
    # (In a file: torchrun would read $$ on a command line as its own.)
    # shellcheck disable=SC2016 # the ranks expand these
    echo 'r=${KOLO_RANK:-$RANK}; echo $$ >"$STRANGER_DIR/pid.$r"
        [ "$r" = "$STRANGER_LAST" ] &&
            export KOLO_TEST_HOLD_CONNECT=$STRANGER_DIR/go
        exec "$@"' >"$d/rank.sh"
    timeout -k 10 "$limit" env KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo \
        KOLO_TIMEOUT_SECONDS=20 STRANGER_DIR="$d" STRANGER_LAST=$((np - 1)) \
        "${launch[@]}" \
        bash "$d/rank.sh" "$prog" random 3 >"$log" 2>&1 </dev/null
    rc=$?
    wait "$src"
    src=$?

    [ "$rc" -eq 0 ] || why="$why
    - kolorun exited $rc$([ "$rc" -eq 124 ] && echo " (timed out after ${limit}s)")"
    for r in $(seq 0 $((np - 1))); do
        grep -q "^\(\[default[0-9]*\]:\)\?rank $r of $np: PASS random\$" "$log" || why="$why
    - rank $r did not pass"
    done
    [ "$src" -eq 0 ] || why="$why
    - the stranger failed (exit $src): $(cat "$d/stranger")"
    if [ "$mode" = overwrite ]; then
        # The job must fail, saying why, rather than meet the stranger.
        why=
        [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || why="$why
    - kolorun exited $rc, not a failure of the job's own"
        grep -q "without the job's MAC: something without the job's secret wrote it" "$log" ||
            why="$why
    - no rank said that an entry lacks the job's MAC"
        [ "$src" -eq 0 ] || why="$why
    - the stranger failed (exit $src): $(cat "$d/stranger")"
        desc="np=$np overwrite: entries rewritten by a holder of the Redis password fail the job, named"
    fi
    case $mode in
    redis|overwrite) ;; # the stranger's report says what Redis answered
    rdv)
        grep -q "WARNING: rendezvous: dropped a connection from .* to rank 0's rendezvous server: " "$log" ||
            why="$why
    - rank 0 did not warn that its rendezvous server dropped the stranger" ;;
    *)
        grep -q '^\[kolo rank [0-9]*\] WARNING: Gloo: dropped a connection from ' "$log" ||
            why="$why
    - no rank warned that it dropped the stranger's connection"
        # kolo's ring (ops/gloo/ring.c) listens while the ranks meet, too.
        grep -q "^\[kolo rank [0-9]*\] WARNING: Gloo: dropped a connection from .* to rank [0-9]*'s ring socket: " "$log" ||
            why="$why
    - no rank warned that its ring socket dropped the stranger's connection" ;;
    esac
    case $mode in
    hello|replay)
        grep -q "^\[kolo rank [0-9]*\] WARNING: Gloo: dropped a connection from .*: it did not prove the job's secret" "$log" ||
            why="$why
    - no rank said that the $mode stranger did not prove the job's secret" ;;
    esac

    if [ -z "$why" ]; then
        pass=$((pass + 1))
        echo "PASS $desc ($(cat "$d/stranger"))"
    else
        fail=$((fail + 1))
        echo "FAIL $desc$why"
        head -n 40 "$log" | cut -c1-400 | sed 's/^/    | /'
    fi
}

for np in 2 3; do
    for mode in scan garbage impostor hello flood; do
        run "$np" "$mode"
    done
done
# The rendezvous: the Redis server kolorun starts, rank 0's under torchrun.
if command -v redis-server >/dev/null; then
    run 2 redis
else
    echo "SKIP redis: no redis-server"
fi
# check_run DESCRIPTION RC WANT_RC PATTERN FILE: one verdict on a job's end
check_run() {
    local desc=$1 got=$2 want=$3 pattern=$4 file=$5
    if { [ "$want" = 0 ] && [ "$got" -eq 0 ]; } || { [ "$want" != 0 ] && [ "$got" -ne 0 ] && [ "$got" -ne 124 ]; } &&
        grep -q -e "$pattern" "$file"; then
        pass=$((pass + 1))
        echo "PASS $desc"
    else
        fail=$((fail + 1))
        echo "FAIL $desc (exit $got, wanted ${want/1/non-zero}, and /$pattern/ in:)"
        head -n 20 "$file" | cut -c1-400 | sed 's/^/    | /'
    fi
}

# A Redis server of the user's, with a password the stranger has too.
if command -v redis-server >/dev/null; then
    redis_port=$(free_port_pair)
    printf 'requirepass the-users-redis-password\nuser kolo on >kolos-own-pw ~* &* +@all\n' |
        redis-server - --port "$redis_port" --bind 127.0.0.1 --save '' \
            --appendonly no --daemonize no >"$WORK/redis.log" 2>&1 &
    redis_pid=$!
    sleep 0.5
    KOLO_REDIS_PASSWORD=the-users-redis-password \
        STRANGER_REDIS_PASSWORD=the-users-redis-password run 3 overwrite
    # The server's password and an ACL user, as a URL; a wrong password.
    o=$WORK/url.log
    timeout -k 10 "$limit" "$kolorun" --no-tag-output -np 2 \
        --redis "redis://kolo:kolos-own-pw@127.0.0.1:$redis_port/0" \
        "$prog" random 3 >"$o" 2>&1 </dev/null
    check_run "--redis redis://USER:PASSWORD@HOST:PORT (an ACL user): runs" $? 0 "^rank 1 of 2: PASS random" "$o"
    timeout -k 10 "$limit" "$kolorun" --no-tag-output -np 2 --redis "127.0.0.1:$redis_port" \
        --redis-password not-the-password "$prog" random 3 >"$o" 2>&1 </dev/null
    check_run "a wrong --redis-password: refused, named" $? 1 "refused KOLO_REDIS_PASSWORD" "$o"
    timeout -k 10 "$limit" "$kolorun" --no-tag-output -np 2 --redis "127.0.0.1:$redis_port" \
        "$prog" random 3 >"$o" 2>&1 </dev/null
    check_run "no password for a server that wants one: refused, saying what to give" $? 1 \
        "wants a password and refused the one derived from the job's secret" "$o"
    kill "$redis_pid" 2>/dev/null
    wait "$redis_pid" 2>/dev/null
fi
if command -v torchrun >/dev/null; then
    KOLO_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n') run 2 rdv
else
    echo "SKIP rdv: no torchrun"
fi

# The wire of a 3-rank job with a secret of the test's, then a job with the
# same secret and the captured handshakes replayed to it.
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export KOLO_SECRET=$secret
w=$WORK/wire
mkdir -p "$w"
WIRE_SECRET=$secret timeout -k 10 "$limit" "$python" "$wire" "$w" \
    >"$w/out" 2>&1 </dev/null &
wpid=$!
for _ in $(seq 100); do
    [ -e "$w/capturing" ] || ! kill -0 "$wpid" 2>/dev/null && break
    sleep 0.1
done
timeout -k 10 "$limit" env KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo \
    "$kolorun" --no-tag-output -np 3 "$prog" random 3 >"$w/log" 2>&1 </dev/null
jrc=$?
touch "$w/stop"
wait "$wpid"
wrc=$?
if [ "$wrc" -eq 77 ]; then
    echo "SKIP wire: $(cat "$w/out")"
elif [ "$jrc" -eq 0 ] && [ "$wrc" -eq 0 ]; then
    pass=$((pass + 1))
    echo "PASS np=3 on the wire: every handshake whole, none repeats, no secret ($(cat "$w/out"))"
    cp "$w/replay" "$WORK/replay"
    run 3 replay
else
    fail=$((fail + 1))
    echo "FAIL np=3 on the wire: the job exited $jrc, the capture $wrc: $(cat "$w/out")"
    head -n 20 "$w/log" | sed 's/^/    | /'
fi
unset KOLO_SECRET

# Datagrams to the shared-memory wake sockets of a job on one host, from
# another user (nobody, when root runs this): the job's sums stay right,
# and a rank says it dropped one.
o=$WORK/datagrams.log
as_nobody=()
[ "$(id -u)" = 0 ] && command -v setpriv >/dev/null &&
    as_nobody=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
# A copy the user nobody can read (the tree may be in a private directory).
chmod 755 "$WORK"
cp "${KOLO_TOP_SRCDIR:-$here/../..}/tests/multi/datagrams.py" "$WORK/datagrams.py"
chmod 644 "$WORK/datagrams.py"
mkdir -p "$WORK/open" && chmod 1777 "$WORK/open" # where nobody may write
"${as_nobody[@]}" "$python" "$WORK/datagrams.py" 60 "$WORK/open/datagrams.ready" \
    >"$WORK/datagrams.out" 2>&1 </dev/null &
dpid=$!
# The job starts once the stranger looks, and lasts a few seconds.
for _ in $(seq 200); do
    [ -e "$WORK/open/datagrams.ready" ] && break
    sleep 0.05
done
timeout -k 10 "$limit" "$kolorun" --no-tag-output -np 3 "$prog" soak 60000 >"$o" 2>&1 </dev/null
jrc=$?
wait "$dpid"
if [ "$jrc" -eq 0 ] && [ "$(grep -c ' PASS soak$' "$o")" = 3 ] &&
    grep -q "WARNING: shared memory: dropped a datagram to rank [0-9]*'s wake socket from pid" "$o"; then
    pass=$((pass + 1))
    echo "PASS np=3 on shared memory, a stranger's datagrams to the wake sockets: right sums, dropped ($(cat "$WORK/datagrams.out"))"
else
    fail=$((fail + 1))
    echo "FAIL np=3 on shared memory with a stranger's datagrams (exit $jrc): $(cat "$WORK/datagrams.out")"
    head -n 20 "$o" | cut -c1-300 | sed 's/^/    | /'
fi


# A rank started with another secret: its peers refuse it, and the whole
# job fails at once (not after the start timeout) saying why.
o=$WORK/odd.log
# shellcheck disable=SC2016 # the ranks expand these
timeout -k 10 "$limit" env KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo \
    "$kolorun" --no-tag-output -np 3 bash -c '[ "$KOLO_RANK" = 1 ] &&
        export KOLO_SECRET=another-secret-of-the-wrong-kind; exec "$@"' \
    rank "$prog" random 3 >"$o" 2>&1 </dev/null
check_run "np=3, rank 1 with another secret: the job fails at once, saying why" $? 1 \
    "did not prove the job's secret: another program on that port, or a rank with another KOLO_SECRET" "$o"

# KOLO_REQUIRE_SECRET=1: no job without one; kolorun's is one.
env -u KOLO_SECRET -u HOROVOD_SECRET_KEY KOLO_REQUIRE_SECRET=1 \
    timeout -k 10 "$limit" "$prog" random 3 >"$o" 2>&1 </dev/null
check_run "KOLO_REQUIRE_SECRET=1 without a secret: refused" $? 1 \
    "KOLO_REQUIRE_SECRET=1, and no job secret is set" "$o"
KOLO_REQUIRE_SECRET=1 KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo \
    timeout -k 10 "$limit" "$kolorun" --no-tag-output -np 2 "$prog" random 3 >"$o" 2>&1 </dev/null
check_run "KOLO_REQUIRE_SECRET=1 under kolorun: runs" $? 0 "^rank 1 of 2: PASS random" "$o"
KOLO_SECRET=too-short timeout -k 10 "$limit" "$prog" random 3 >"$o" 2>&1 </dev/null
check_run "a secret of 9 characters: refused" $? 1 \
    "KOLO_SECRET has 9 characters; a job secret needs at least 16" "$o"
HOROVOD_SECRET_KEY=short env -u KOLO_SECRET timeout -k 10 "$limit" "$prog" random 3 >"$o" 2>&1 </dev/null
check_run "Horovod's HOROVOD_SECRET_KEY is read too" $? 1 \
    "HOROVOD_SECRET_KEY has 5 characters" "$o"
_HOROVOD_SECRET_KEY=short6 env -u KOLO_SECRET timeout -k 10 "$limit" "$prog" random 3 >"$o" 2>&1 </dev/null
check_run "and _HOROVOD_SECRET_KEY, where Horovod's launchers put their key" $? 1 \
    "_HOROVOD_SECRET_KEY has 6 characters" "$o"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
