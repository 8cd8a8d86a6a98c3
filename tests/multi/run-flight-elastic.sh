#!/usr/bin/env bash
# run-flight-elastic.sh — the flight recorder across an elastic re-form,
# under kolorun's elastic mode with the real runtime:
#
#   sigkill   kolorun -H localhost:1,127.0.0.1:2 -np 3 --min-np 2
#             --flight-dir DIR tests/multi/test-elastic 30: the worker of
#             localhost (rank 0 of generation 1) SIGKILLs itself before
#             step 3 (test-elastic's cue file); kolorun leaves its host
#             out, the two workers of 127.0.0.1 (ranks 1 and 2) re-form
#             as ranks 0 and 1 of generation 2 and finish the 30 steps
#             with the weights a reference computes (3 steps at 3 ranks,
#             27 at 2).
#
# Checked in DIR after the job: every rank<R>.json is whole JSON and no
# .tmp is left; rank0.json and rank1.json are generation 2's shutdown
# dumps (elastic_generation 2, the generation the workers printed), each
# written by the process that joined generation 2 as that rank (their
# pids, which a wrapper records), with generation 2's 55 collectives (the
# state's broadcast, then two per step) all done; rank2.json is the
# generation 1 dump the worker renumbered from 2 to 1 left behind (its
# shutdown at the re-form: size 3, the set stopped by the lost rank 0,
# naming its pid, the failed allreduce of step 3); the killed worker left
# none. `kolo-timeline why DIR` exits 0, says the job ended normally at 2
# ranks of generation 2, and sets rank2.json aside with a note (also with
# --json: kind, missing ranks, the dumps it read, the note).
#
# Bounded by `timeout`; a few seconds. Prints "N passed, N failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../script-lib.sh"
multi_job run-flight-elastic tests/multi/test-elastic 60 KOLO_PYTHON
src=${KOLO_TOP_SRCDIR:-$(cd "$here/../.." && pwd)}
python=${KOLO_PYTHON-/usr/bin/python3}
case $python in "" | :) skip_test --counted "configure found no Python interpreter (kolo-timeline needs one)" ;; esac
tool=$src/tools/kolo-timeline
steps=30
kill_step=3
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "PASS $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    [ -z "${2:-}" ] || sed -n '1,40p' "$2" | sed 's/^/    /'
}
# check DESC FILE COMMAND...: DESC passes when COMMAND does; else FILE is
# shown.
check() {
    local what=$1 file=$2
    shift 2
    if "$@"; then ok "$what"; else bad "$what" "$file"; fi
}
has() { grep -E -q -- "$2" "$1"; }

# The worker: records "ID PID" in TEST_DIR/pids, then is test-elastic
# (the single quotes are the wrapper's own expansions).
worker=$WORK/worker.sh
# shellcheck disable=SC2016
printf '#!/bin/sh\necho "$KOLO_ELASTIC_ID $$" >>"$TEST_DIR/pids"\nexec %s "$@"\n' \
    "'$prog'" >"$worker"
chmod +x "$worker"

# The job: output in $WORK/out, kolorun's status in rc.
td=$WORK/td
dir=$WORK/flight
mkdir -p "$td"
touch "$td/kill.localhost:0.$kill_step"
TEST_DIR=$td timeout -k 5 "$limit" "$kolorun" -H localhost:1,127.0.0.1:2 \
    -np 3 --min-np 2 --flight-dir "$dir" "$worker" "$steps" \
    >"$WORK/out" 2>&1 </dev/null
rc=$?

# The job itself: kolorun's lines and the results, against the reference
# w0 = 3 steps * (3 + 1) / 2 + 27 steps * (2 + 1) / 2 (each step adds the
# mean of rank + 1 over the ranks).
w0=$(awk -v k=$kill_step -v n=$steps 'BEGIN { print k * 2 + (n - k) * 1.5 }')
check "kolorun exits 0 (got $rc)" "$WORK/out" [ "$rc" = 0 ]
check "kolorun names the killed worker" "$WORK/out" has "$WORK/out" \
    "^kolorun: rank 0 of generation 1 \(localhost:0, pid [0-9]+\) was killed by signal 9"
check "generation 2 has the two workers of 127.0.0.1" "$WORK/out" has "$WORK/out" \
    "^kolorun: generation 2 \(failure\): 2 ranks: 127.0.0.1:0 127.0.0.1:1$"
for id in 127.0.0.1:0 127.0.0.1:1; do
    check "$id finishes $steps steps at 2 ranks of generation 2 with w0 = $w0" \
        "$WORK/out" has "$WORK/out" "<stdout>:DONE $id $steps $w0 2 2$"
done
killed=$(sed -n 's/^kolorun: rank 0 of generation 1 (localhost:0, pid \([0-9]*\)) was killed.*/\1/p' "$WORK/out")

# The dumps, read with Python's json; each failed check is one line.
"$python" - "$dir" "$td/pids" "$WORK/out" "${killed:-0}" "$steps" "$kill_step" >"$WORK/dumps" 2>&1 <<'EOF'
import json, os, re, sys
d, pids_file, out_file = sys.argv[1:4]
killed, steps, kill_step = (int(a) for a in sys.argv[4:7])
# Generation 2 runs: the state's broadcast, then two per step left.
total = 1 + 2 * (steps - kill_step)
pid = dict(l.split() for l in open(pids_file))
pid = {k: int(v) for k, v in pid.items()}
# The workers' own word on their place: "JOIN id gen rank size".
joined = {}
for l in open(out_file):
    m = re.search(r"<stdout>:JOIN (\S+) (\d+) (\d+) (\d+)$", l.rstrip("\n"))
    if m:
        joined[(int(m.group(2)), int(m.group(3)))] = m.group(1)
bad = []
def want(cond, what):
    if not cond:
        bad.append(what)
names = sorted(os.listdir(d))
want(not [n for n in names if n.endswith(".tmp")], "a .tmp file is left: %s" % names)
want([n for n in names if n.endswith(".json")] == ["rank0.json", "rank1.json", "rank2.json"],
     "rank0.json, rank1.json, rank2.json expected: %s" % names)
dumps = {}
for n in names:
    if re.fullmatch(r"rank\d+\.json", n):
        try:
            dumps[n] = json.load(open(os.path.join(d, n)))
        except ValueError as e:
            bad.append("%s is not whole JSON: %s" % (n, e))
for n, x in dumps.items():
    want(x.get("kolo_flight") == 1 and "rank%s.json" % x.get("rank") == n,
         "%s: kolo_flight %r, rank %r" % (n, x.get("kolo_flight"), x.get("rank")))
    want(x.get("pid") != killed, "%s was written by the killed worker (pid %d)" % (n, killed))
def gen2(r):
    x = dumps.get("rank%d.json" % r, {})
    who = joined.get((2, r))
    want(who is not None, "no worker printed JOIN as rank %d of generation 2" % r)
    got = (x.get("elastic_generation"), x.get("size"), x.get("reason"), x.get("pid"))
    exp = (2, 2, "shutdown", pid.get(who))
    want(got == exp, "rank%d.json: (generation, size, reason, pid) = %r, expected %r (%s's pid)"
         % (r, got, exp, who))
    s = (x.get("sets") or [{}])[0]
    got = (s.get("size"), s.get("enqueued"), s.get("completed"))
    want(got == (2, total, total), "rank%d.json: set 0 (size, enqueued, completed) = %r, expected %r"
         % (r, got, (2, total, total)))
    recs = x.get("records") or []
    want([q["seq"] for q in recs] == list(range(1, total + 1)) and
         all(q["state"] == "done" for q in recs),
         "rank%d.json: records are not seq 1..%d, all done" % (r, total))
gen2(0)
gen2(1)
x = dumps.get("rank2.json", {})
who = joined.get((1, 2))
got = (x.get("elastic_generation"), x.get("size"), x.get("reason"), x.get("pid"))
want(who == "127.0.0.1:1" and joined.get((2, 1)) == who,
     "127.0.0.1:1 was not rank 2 of generation 1 and rank 1 of generation 2: %r" % joined)
exp = (1, 3, "shutdown", pid.get(who))
want(got == exp, "rank2.json: (generation, size, reason, pid) = %r, expected %r (%s's pid)"
     % (got, exp, who))
stopped = ((x.get("sets") or [{}])[0].get("stopped") or "")
want(stopped.startswith("lost rank 0 (pid %d) has exited or was killed" % killed),
     "rank2.json: set 0 stopped: %r, expected the lost rank 0 (pid %d)" % (stopped, killed))
last = (x.get("records") or [{}])[-1]
want((last.get("name"), last.get("state")) == ("grad", "failed") and
     "lost rank 0" in (last.get("error") or ""),
     "rank2.json: the last record is not step %d's failed allreduce: %r" % (kill_step, last))
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
EOF
check "the dumps: whole; generation 2's under the new ranks; generation 1's left by the renumbered worker" \
    "$WORK/dumps" [ $? = 0 ]

# kolo-timeline why over them.
"$python" "$tool" why "$dir" >"$WORK/why" 2>&1
check "kolo-timeline why exits 0 (got $?)" "$WORK/why" [ $? = 0 ]
check "why: the job ended normally at 2 ranks" "$WORK/why" has "$WORK/why" \
    "^the job ended normally: all 2 ranks shut down with nothing pending$"
check "why reads ranks 0, 1 of generation 2" "$WORK/why" has "$WORK/why" \
    "^  dumps: ranks 0, 1 of 2 in .* \(elastic generation 2\)"
check "why sets generation 1's rank2.json aside, with a note" "$WORK/why" has "$WORK/why" \
    "note: rank2.json: of elastic generation 1, older than the newest \(2\): set aside"
"$python" "$tool" why --json "$dir" >"$WORK/why.json" 2>&1
"$python" - "$WORK/why.json" >"$WORK/why.check" 2>&1 <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
got = (j["kind"], j["size"], j["missing"],
       [(x["rank"], x["file"], x["generation"]) for x in j["dumps"]],
       [n for n in j["notes"] if n.startswith("rank2.json:")])
want = ("finished", 2, [], [(0, "rank0.json", 2), (1, "rank1.json", 2)],
        ["rank2.json: of elastic generation 1, older than the newest (2): set aside"])
if got != want:
    sys.exit("why --json: %r\n expected %r" % (got, want))
EOF
check "why --json: finished, 2 ranks, none missing, generation 2's dumps, the note" \
    "$WORK/why.check" [ $? = 0 ]

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
