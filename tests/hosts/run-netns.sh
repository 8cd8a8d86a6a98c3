#!/usr/bin/env bash
# run-netns.sh — jobs over several hosts, on one machine: each "host" is a
# network namespace with its own address, joined to the others by a veth
# pair into a bridge in the root namespace:
#
#     root namespace: bridge kb<pid> 10.A.B.1/24, redis-server on it
#        |-- veth --> namespace kolo<pid>-h0: kolo0 10.A.B.10
#        |-- veth --> namespace kolo<pid>-h1: kolo0 10.A.B.11
#        |-- veth --> namespace kolo<pid>-h2: kolo0 10.A.B.12
#        '-- veth --> namespace kolo<pid>-h3: kolo0 10.A.B.13, a stranger's
#
# kolorun's launch command runs every rank inside its host's namespace
# (--launch-command 'ip netns exec {host}'), the ranks bind the address of
# kolo0 (--network-interface kolo0: each namespace's loopback is its own, so
# only the veth network connects them) and meet through Redis. Checked: the
# placement every rank sees (local and cross ranks, the address it runs
# at), the multi-rank test programs of tests/multi across 2 and 3 hosts,
# two jobs at once on one Redis server, start-up failures naming the
# host, and a stranger in a namespace of its own (h3), as the user nobody,
# on every port of a job's ranks and on its Redis server
# (tests/multi/stranger.py: well-formed hellos with made-up proofs, and
# every Redis command refused), the job ending with the right sums. Needs root, iproute2 and redis-server; skips with a message (exit
# 77, "0 passed, 0 failed") where it cannot run. The namespaces, links and
# the Redis server go away at the end, also on failure or interrupt.
#
# Usage: tests/hosts/run-netns.sh   (from the build directory; `make check`
# runs it with KOLO_TOP_BUILDDIR set)
set -u
top=${KOLO_TOP_BUILDDIR:-.}
kolorun=$(cd "$top" && pwd)/kolorun
multi=$(cd "$top" && pwd)/tests/multi

. "$(dirname "$0")/../script-lib.sh"
skip() { skip_test --counted "$@"; }
need_root_netns
require_executables run-netns "$kolorun" "$multi/test-allreduce" "$multi/test-collectives"

. "$(dirname "$0")/../run-lib.sh"

tag=$$
net=10.$((100 + tag % 100)).$((tag / 100 % 250))
br=kb$tag
hosts=("kolo$tag-h0" "kolo$tag-h1" "kolo$tag-h2" "kolo$tag-h3")
redis_pid=
work=$(mktemp -d)

cleanup() {
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    for h in "${hosts[@]}"; do
        ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$h" 2>/dev/null # its end of the veth goes with it
    done
    for i in 0 1 2 3; do ip link del "kv${tag}h$i" 2>/dev/null; done
    ip link del "$br" 2>/dev/null
    # run_log: run-lib.sh's, whose EXIT trap this one replaces.
    # shellcheck disable=SC2154
    rm -rf "$work" "$run_log"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

setup() {
    ip link add "$br" type bridge &&
        ip addr add "$net.1/24" dev "$br" &&
        ip link set "$br" up || return 1
    for i in 0 1 2 3; do
        local h=${hosts[$i]} v=kv${tag}h$i
        ip netns add "$h" &&
            ip link add "$v" type veth peer name kolo0 netns "$h" &&
            ip link set "$v" master "$br" up &&
            ip -n "$h" addr add "$net.$((10 + i))/24" dev kolo0 &&
            ip -n "$h" link set kolo0 up &&
            ip -n "$h" link set lo up || return 1
    done
}
setup >"$work/setup.log" 2>&1 ||
    skip "cannot make network namespaces here: $(head -n 1 "$work/setup.log")"

# A Redis server for the jobs that bring none (--redis), on the bridge.
port=$((20000 + tag % 20000))
redis-server --bind "$net.1" --port "$port" --save "" --appendonly no \
    --protected-mode no >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/$net.1/$port") 2>/dev/null && break
    sleep 0.1
done

H0=${hosts[0]} H1=${hosts[1]} H2=${hosts[2]} H3=${hosts[3]}
# kolorun over the namespaces: every test below goes through this
# (untagged: the checks read the ranks' lines as written, but where a case
# asks for --tag-output).
kn=$work/kn
printf '#!/bin/sh\nexec "%s" --no-tag-output --launch-command "ip netns exec {host}" --network-interface kolo0 "$@"\n' \
    "$kolorun" >"$kn"
chmod +x "$kn"
export kn net work port multi H0 H1 H2 H3

# Placement: 5 ranks on 3 hosts (2, 1, 2). Each rank prints what it sees
# and the address of kolo0 in its namespace: the host it really runs on.
placement() {
    "$kn" -H "$H0:2,$H1:1,$H2:2" --start-redis --redis-bind "$net.1" \
        --tag-output sh -c 'echo "$KOLO_RANK $KOLO_SIZE $KOLO_LOCAL_RANK $KOLO_LOCAL_SIZE $KOLO_CROSS_RANK $KOLO_CROSS_SIZE $(ip -o -4 addr show kolo0 | awk "{print \$4}") ${KOLO_RENDEZVOUS%%/*}"' \
        >"$work/place.out" || return 1
    local want
    want=$(printf '%s\n' \
        "[0]<stdout>:0 5 0 2 0 3 $net.10/24 redis:$net.1" \
        "[1]<stdout>:1 5 1 2 0 3 $net.10/24 redis:$net.1" \
        "[2]<stdout>:2 5 0 1 1 3 $net.11/24 redis:$net.1" \
        "[3]<stdout>:3 5 0 2 2 3 $net.12/24 redis:$net.1" \
        "[4]<stdout>:4 5 1 2 2 3 $net.12/24 redis:$net.1")
    # The Redis port is free-chosen: cut it off before comparing.
    got=$(sed -E 's/(redis:[0-9.]+):[0-9]+$/\1/' "$work/place.out" | sort)
    [ "$got" = "$want" ] || { echo "want:"; echo "$want"; echo "got:"; echo "$got"; return 1; }
}
export -f placement
run "placement on 3 hosts (2+1+2): local/cross ranks, addresses" bash -c placement

# Placement from a hostfile, -np smaller than the slots: the last host
# gets no rank and is not counted.
hostfile() {
    printf '# hosts\n%s slots=2\n\n%s   # one slot\n%s slots=4\n' \
        "$H0" "$H1" "$H2" >"$work/hosts"
    "$kn" --hostfile "$work/hosts" -np 3 --start-redis --redis-bind "$net.1" \
        sh -c 'echo "$KOLO_RANK $KOLO_LOCAL_RANK $KOLO_LOCAL_SIZE $KOLO_CROSS_RANK $KOLO_CROSS_SIZE $(ip -o -4 addr show kolo0 | awk "{print \$4}")"' \
        >"$work/hf.out" || return 1
    want=$(printf '%s\n' "0 0 2 0 2 $net.10/24" "1 1 2 0 2 $net.10/24" \
        "2 0 1 1 2 $net.11/24")
    [ "$(sort "$work/hf.out")" = "$want" ] ||
        { echo "want:"; echo "$want"; echo "got:"; cat "$work/hf.out"; return 1; }
}
export -f hostfile
run "placement from a hostfile, -np 3 of 7 slots" bash -c hostfile

for np in 2 3 4; do
    run "test-allreduce random, 2 hosts, np=$np, --redis" \
        "$kn" -np "$np" -H "$H0:2,$H1:2" --redis "$net.1:$port" \
        "$multi/test-allreduce" random 3
done
# Two ranks over Gloo: allreduces up to 64 KiB are one exchange, larger
# ones Gloo's ring (ops/gloo/gloo_ops.cc); both sides of that limit.
run "test-collectives allreduce-sizes, 2 hosts x 1" \
    "$kn" -H "$H0:1,$H1:1" --redis "$net.1:$port" \
    "$multi/test-collectives" allreduce-sizes
run "test-allreduce random, 3 hosts x 1, --start-redis" \
    "$kn" -H "$H0:1,$H1:1,$H2:1" --start-redis --redis-bind "$net.1" \
    "$multi/test-allreduce" random 3
for mode in allreduce-matrix broadcast allgather alltoall reducescatter \
    process-sets; do
    run "test-collectives $mode, 3 hosts (2+1+1)" \
        "$kn" -H "$H0:2,$H1:1,$H2:1" --redis "$net.1:$port" \
        "$multi/test-collectives" "$mode"
done

# Two hosts of two ranks: allreduce is hierarchical by default (ops/hier:
# shared memory within each namespace, Gloo over the veths across); the
# debug log says which backend carries the data.
hierarchical() {
    KOLO_LOG_LEVEL=debug "$kn" -H "$H0:2,$H1:2" --redis "$net.1:$port" \
        "$multi/test-collectives" "$1" >"$work/hier.out" 2>&1 ||
        { tail -20 "$work/hier.out"; return 1; }
    [ "$(grep -c 'initialised: rank .* hier backend' "$work/hier.out")" = 4 ] ||
        { echo "not every rank ran on the hier backend:"; grep initialised "$work/hier.out"; return 1; }
}
export -f hierarchical
for mode in allreduce-matrix grouped join; do
    run "hierarchical allreduce, 2 hosts x 2, $mode" bash -c "hierarchical $mode"
done
run "flat allreduce with KOLO_HIERARCHICAL_ALLREDUCE=0, 2 hosts x 2" \
    env KOLO_HIERARCHICAL_ALLREDUCE=0 "$kn" -H "$H0:2,$H1:2" \
    --redis "$net.1:$port" "$multi/test-collectives" allreduce-matrix

# Two jobs at once on one Redis server: each under its own keys, and no
# key left after them (every earlier --redis job's are gone too).
two_jobs() {
    "$kn" -H "$H0:1,$H1:1" --redis "$net.1:$port" "$multi/test-allreduce" random 3 \
        >"$work/a.out" 2>&1 &
    local a=$!
    "$kn" -H "$H1:1,$H2:1" --redis "$net.1:$port" "$multi/test-allreduce" random 3 \
        >"$work/b.out" 2>&1
    local rb=$?
    wait "$a"
    local ra=$?
    [ "$ra" = 0 ] && [ "$rb" = 0 ] ||
        { echo "job a: $ra, job b: $rb"; tail -n 5 "$work/a.out" "$work/b.out"; return 1; }
    # kolorun removed each job's keys at its end.
    if command -v redis-cli >/dev/null 2>&1; then
        local left
        left=$(redis-cli -h "$net.1" -p "$port" keys 'kolo-*' | head -n 3)
        [ -z "$left" ] || { echo "keys left on the server: $left"; return 1; }
    fi
}
export -f two_jobs
run "two jobs at once on one Redis server" bash -c two_jobs

# run_fail DESC "PATTERN..." ARGS...: kolorun ARGS must fail within 30 s
# and its stderr hold every PATTERN (words; "_" stands for a blank).
run_fail() {
    local desc=$1 list=$2
    shift 2
    export PATS_LIST=$list
    run "$desc" bash -c '
        PATS=($PATS_LIST)
        t0=$SECONDS
        "$kn" "$@" >"$work/f.out" 2>"$work/f.err"
        rc=$?
        [ "$rc" != 0 ] || { echo "kolorun exited 0"; exit 1; }
        [ $((SECONDS - t0)) -lt 30 ] || { echo "took $((SECONDS - t0)) s"; exit 1; }
        for p in "${PATS[@]}"; do
            p=${p//_/ }
            grep -q -- "$p" "$work/f.err" ||
                { echo "no \"$p\" in stderr:"; head -n 10 "$work/f.err"; exit 1; }
        done' _ "$@"
}

run_fail "a host whose ranks cannot start (no such namespace) is named" \
    "host_kolo-nosuch-$tag" \
    -H "$H0:1,kolo-nosuch-$tag:1" --start-redis --redis-bind "$net.1" \
    --start-timeout 20 --failure-grace 0 "$multi/test-allreduce" random 1
run_fail "a command missing on a host is named with the host" \
    "on_host_kolo${tag}-h was_not_found" \
    -H "$H0:1,$H1:1" --start-redis --redis-bind "$net.1" --failure-grace 0 \
    /nonexistent/kolo-prog
run_fail "an absent --network-interface names it and the host" \
    "on_host_kolo${tag}-h no_interface_nosuch0" \
    -H "$H0:1,$H1:1" --start-redis --redis-bind "$net.1" --failure-grace 0 \
    --network-interface nosuch0 "$multi/test-allreduce" random 1
run_fail "a rendezvous that times out names the host of the failing rank" \
    "rank_0_on_host_${H0} rank_1_never_arrived" \
    -H "$H0:1,$H1:1" --redis "$net.1:$port" --start-timeout 3 --failure-grace 0 \
    sh -c '[ "$KOLO_RANK" = 1 ] && exec sleep 30; exec "$0" random 1' \
    "$multi/test-allreduce"

# A host whose launch command hangs: its ranks never reach the rendezvous,
# the others time out, and kolorun names the host that never came.
printf '#!/bin/sh\nh=$1; shift\n[ "$h" = "%s" ] && exec sleep 60\nexec ip netns exec "$h" "$@"\n' \
    "$H1" >"$work/launch"
chmod +x "$work/launch"
run_fail "a host that never arrives at the rendezvous is named" \
    "never_reached_the_rendezvous rank_2,_3_on_host_${H1}" \
    -H "$H0:2,$H1:2" --start-redis --redis-bind "$net.1" --start-timeout 3 \
    --failure-grace 0 --launch-command "$work/launch {host}" \
    "$multi/test-allreduce" random 1

# A stranger on host h3, as nobody, while a job of 3 ranks on h0 and h1
# meets over Gloo: rank 2 waits (KOLO_TEST_HOLD_CONNECT) until the
# stranger has struck every port ranks 0 and 1 listen on (MODE hello) or
# the job's Redis server (MODE redis); the job must end with the right
# sums, and the stranger must have got nothing.
stranger_netns() {
    local mode=$1 d=$work/stranger-$1 rc src
    rm -rf "$d" && mkdir -p "$d" && chmod 755 "$d" "$work" && mkfifo "$d/go"
    # shellcheck disable=SC2016 # the ranks expand these
    echo 'echo $$ >"$STRANGER_DIR/pid.$KOLO_RANK"
        [ "$KOLO_RANK" = 2 ] && export KOLO_TEST_HOLD_CONNECT=$STRANGER_DIR/go
        exec "$@"' >"$d/rank.sh"
    ip netns exec "$H3" timeout -k 5 90 /usr/bin/python3 "$stranger" "$mode" "$d" 3 \
        >"$d/out" 2>&1 </dev/null &
    src=$!
    STRANGER_DIR=$d KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo \
        "$kn" -H "$H0:2,$H1:1" --start-redis --redis-bind "$net.1" \
        bash "$d/rank.sh" "$multi/test-allreduce" random 3 >"$d/log" 2>&1
    rc=$?
    wait "$src"
    src=$?
    cat "$d/out"
    [ "$rc" = 0 ] && [ "$src" = 0 ] &&
        [ "$(grep -c '^rank [0-2] of 3: PASS random$' "$d/log")" = 3 ] ||
        { echo "kolorun $rc, stranger $src"; head -n 20 "$d/log"; return 1; }
    [ "$mode" != hello ] ||
        grep -q "WARNING: Gloo: dropped a connection from $net.13:[0-9]* .*: it did not prove the job's secret" "$d/log" ||
        { echo "no rank said it dropped the stranger's connection"; head -n 20 "$d/log"; return 1; }
}
stranger=${KOLO_TOP_SRCDIR:-$(dirname "$0")/../..}/tests/multi/stranger.py
stranger=$(cd "$(dirname "$stranger")" && pwd)/stranger.py
export stranger
export -f stranger_netns
if [ -x /usr/bin/python3 ]; then
    run "a stranger on a host of its own (nobody): hellos with made-up proofs on every port" \
        bash -c 'stranger_netns hello'
    run "a stranger on a host of its own (nobody): the job's Redis server refuses it" \
        bash -c 'stranger_netns redis'
fi

# SIGTERM to kolorun reaches the ranks in the namespaces at once.
signals() {
    "$kn" -H "$H0:1,$H1:1" --start-redis --redis-bind "$net.1" sleep 60 &
    local k=$! t0=$SECONDS
    sleep 1
    kill -TERM "$k"
    wait "$k"
    local rc=$?
    [ "$rc" = 143 ] && [ $((SECONDS - t0)) -lt 10 ] ||
        { echo "status $rc after $((SECONDS - t0)) s"; return 1; }
    for h in "$H0" "$H1"; do
        [ -z "$(ip netns pids "$h")" ] || { echo "left running in $h"; return 1; }
    done
}
export -f signals
run "SIGTERM to kolorun stops the ranks on every host" bash -c signals

finish
