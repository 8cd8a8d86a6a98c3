#!/usr/bin/env bash
# run-bench-hosts.sh — tools/kolo-bench-hosts, as a user runs it: kolo-bench
# across network-namespace hosts, and nothing left behind.
#
#   - 2 hosts x 1 rank and 2 hosts x 2 ranks, short workloads: exits 0, and
#     each layout's JSON has every rank, kolo negotiating over Gloo (so the
#     ranks really stood on different hosts: on one host kolo uses shared
#     memory) and every result checked "ok";
#   - a layout it cannot make is refused (exit 2, the reason), with no
#     namespace made;
#   - --rate puts a token bucket on every host's link while the job runs,
#     and a rate tc would not read is refused;
#   - SIGTERM in the middle of a run: the namespaces and links go away.
#
# Needs root, iproute2 and redis-server; skips with a message (exit 77,
# "0 passed, 0 failed") where it cannot run.
#
# Usage: tests/hosts/run-bench-hosts.sh   (from the build directory; `make
# check` runs it with KOLO_TOP_BUILDDIR and KOLO_TOP_SRCDIR set)
set -u
top=$(cd "${KOLO_TOP_BUILDDIR:-.}" && pwd)
src=$(cd "${KOLO_TOP_SRCDIR:-$top}" && pwd)
tool=$src/tools/kolo-bench-hosts
py=/usr/bin/python3
[ -x "$py" ] || py=${KOLO_PYTHON:-python3}

. "$(dirname "$0")/../script-lib.sh"
skip() { skip_test --counted "$@"; }
need_root_netns
require_executables run-bench-hosts "$top/kolorun" "$top/kolo-bench"
# Can this machine make a namespace at all?
probe=kbprobe$$
ip netns add "$probe" 2>/dev/null || skip "cannot make network namespaces here"
ip netns del "$probe"

. "$(dirname "$0")/../run-lib.sh"
work=$(mktemp -d)
# run_log: run-lib.sh's, whose EXIT trap this one replaces.
# shellcheck disable=SC2154
trap 'rm -rf "$work" "$run_log"' EXIT
kbh=("$tool" --kolorun "$top/kolorun" --bench "$top/kolo-bench")
export work py

# What the script's namespaces and links leave: its names carry its pid.
leftovers() { # leftovers PID
    { ip netns list; ip -o link; } 2>/dev/null | grep -E "kbench$1-|kbb$1|kbv$1h" || true
}
export -f leftovers

runs() {
    "$@" --out "$work/runs" --layouts 2x1,2x2 -- --workload latency,small --quick \
        --iters 3 --warmup 1 \
        >"$work/runs.out" 2>&1 &
    local pid=$! rc
    wait "$pid"
    rc=$?
    cat "$work/runs.out"
    [ "$rc" = 0 ] || { echo "kolo-bench-hosts exited $rc"; return 1; }
    grep -qx '2 passed, 0 failed' "$work/runs.out" || { echo "no '2 passed, 0 failed'"; return 1; }
    "$py" - "$work/runs" <<'EOF' || return 1
import json, sys
d = sys.argv[1]
for layout, ranks in (("2x1", 2), ("2x2", 4)):
    j = json.load(open("%s/%s.json" % (d, layout)))
    bad = []
    if j["ranks"] != ranks:
        bad.append("ranks %r, want %d" % (j["ranks"], ranks))
    if j["kolo_controller"] != "gloo":
        bad.append("kolo negotiates over %r, want gloo (ranks on different hosts)"
                   % j["kolo_controller"])
    got = sorted({r["workload"] for r in j["results"]})
    if got != ["latency", "small"]:
        bad.append("workloads %s, want latency and small" % got)
    if not j["ok"] or any(r["check"] != "ok" for r in j["results"]):
        bad.append("results not all checked ok: %s" % [r["check"] for r in j["results"]])
    if bad:
        print("%s: %s" % (layout, "; ".join(bad)))
        sys.exit(1)
    print("%s: %d ranks over %s, %d results ok" % (layout, ranks,
          j["kolo_controller"], len(j["results"])))
EOF
    local left
    left=$(leftovers "$pid")
    [ -z "$left" ] || { echo "left behind: $left"; return 1; }
}
export -f runs
run "2x1 and 2x2: every rank, Gloo between hosts, results ok" bash -c 'runs "$@"' runs "${kbh[@]}"

# must_refuse OUT TEXT COMMAND...: COMMAND exits 2 saying TEXT (output in
# OUT), and makes no namespace.
must_refuse() {
    local out=$1 text=$2 pid rc
    shift 2
    "$@" >"$out" 2>&1 &
    pid=$!
    wait "$pid"
    rc=$?
    cat "$out"
    [ "$rc" = 2 ] || { echo "exit $rc, want 2"; return 1; }
    grep -q "$text" "$out" || { echo "no '$text' in its output"; return 1; }
    [ -z "$(leftovers "$pid")" ] || { echo "it made namespaces"; return 1; }
}
export -f must_refuse
refused() {
    must_refuse "$work/bad.out" "a layout is HOSTSxRANKS with 2-9 hosts" \
        "$@" --layouts 1x2
}
export -f refused
run "a layout of one host is refused, nothing made" bash -c 'refused "$@"' refused "${kbh[@]}"

# --rate: every host's kolo0 gets a token bucket of that rate while the
# job runs (seen from outside, not timed), and the results stay right; a
# rate tc would not read is refused before anything is made.
rated() {
    "$@" --out "$work/rate" --rate 300mbit --layouts 2x1 -- --workload large \
        --max-bytes 1M --iters 2 --warmup 1 >"$work/rate.out" 2>&1 &
    local pid=$! rc seen=
    for _ in $(seq 300); do
        seen=$(ip netns exec "kbench$pid-h1" tc qdisc show dev kolo0 2>/dev/null |
            grep -o 'tbf .* rate 300Mbit') && break
        sleep 0.1
    done
    wait "$pid"
    rc=$?
    cat "$work/rate.out"
    [ "$rc" = 0 ] || { echo "kolo-bench-hosts --rate exited $rc"; return 1; }
    [ -n "$seen" ] || { echo "no tbf of 300Mbit on host 1's kolo0 while it ran"; return 1; }
    echo "host 1's kolo0: $seen"
    grep -q "each host sends at most 300mbit" "$work/rate.out" || return 1
    grep -q "^every result checked: ok" "$work/rate.out" || return 1
    must_refuse "$work/badrate.out" "not 'fast'" "$@" --rate fast --layouts 2x1
}
export -f rated
if command -v tc >/dev/null 2>&1; then
    run "--rate: a token bucket on every host's link, results ok; a bad rate refused" \
        bash -c 'rated "$@"' rated "${kbh[@]}"
else
    echo "SKIP --rate: no tc here (iproute2)"
fi

# SIGTERM once the hosts stand and a job runs in them.
interrupted() {
    "$@" --out "$work/int" --layouts 2x1 -- --workload large >"$work/int.out" 2>&1 &
    local pid=$! rc h=0
    for _ in $(seq 300); do
        if [ -n "$(ip netns pids "kbench$pid-h0" 2>/dev/null)" ]; then
            h=1
            break
        fi
        sleep 0.1
    done
    kill -TERM "$pid"
    wait "$pid"
    rc=$?
    [ "$h" = 1 ] || { echo "no rank ever ran in kbench$pid-h0"; cat "$work/int.out"; return 1; }
    [ "$rc" = 130 ] || { echo "exit $rc after SIGTERM, want 130"; return 1; }
    local left
    left=$(leftovers "$pid")
    [ -z "$left" ] || { echo "left behind after SIGTERM: $left"; return 1; }
}
export -f interrupted
run "SIGTERM mid-run: namespaces and links removed" bash -c 'interrupted "$@"' interrupted "${kbh[@]}"

finish
