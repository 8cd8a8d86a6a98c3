#!/usr/bin/env bash
# run-bench.sh — the Python benchmark (python3 -m kolo.bench) runs a short
# configuration at 2 ranks and reports in its format: exit status 0, a table
# on rank 0's stdout with both workloads (each ratio saying which way is
# better), and a JSON file naming 2 ranks with
# "small" (torch and capi ops_per_s) and "resnet50" (torch and capi ms), every
# side correct, and a numeric ratio each. A bad workload name exits 2.
# Timings are not checked. kolorun runs with --no-tag-output: the checks
# read the table as written. Bounded in time; prints one line per run and a
# summary "N passed, N failed". Exit 77 (SKIP) where the interpreter lacks
# torch.
#
# Usage: tests/python/run-bench.sh   (from the build directory; `make check`
# runs it with KOLO_TOP_BUILDDIR and KOLO_TOP_SRCDIR set)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../script-lib.sh"
python_test 300 torch ": kolo.bench needs it"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

result() { # DESC OK LOG
    if [ "$2" = 0 ]; then
        pass=$((pass + 1)); echo "PASS $1"; sed 's/^/    /' "$3"
    else
        fail=$((fail + 1)); echo "FAIL $1"; tail -n 40 "$3" | sed 's/^/    /'
    fi
}

# np=2, both workloads, small sizes
timeout -k 10 "$limit" "$kolorun" --no-tag-output -np 2 "$python" -m kolo.bench \
    --workload all --quick --small-count 50 --resnet-scale 64 \
    --json "$tmp/np2.json" >"$tmp/log" 2>&1
rc=$?
ok=1
if [ $rc -eq 0 ] && grep -q '^small .*(torch/capi: higher is better)$' "$tmp/log" &&
    grep -q '^resnet50 .*(torch/capi: lower is better)$' "$tmp/log" &&
    ! grep -q WRONG "$tmp/log" &&
    "$python" - "$tmp/np2.json" >>"$tmp/log" 2>&1 <<'PY'
import json, math, sys
doc = json.load(open(sys.argv[1]))
assert doc["tool"] == "kolo.bench" and doc["ranks"] == 2, doc
# kolorun gave the ranks a secret; a results file must not carry it
assert doc["env"].get("KOLO_RENDEZVOUS") and "KOLO_SECRET" not in doc["env"]
res = {r["workload"]: r for r in doc["results"]}
assert sorted(res) == ["resnet50", "small"], sorted(res)
assert res["small"]["count"] == 50
assert res["resnet50"]["tensors"] == 161
for w, field in (("small", "ops_per_s"), ("resnet50", "ms")):
    r = res[w]
    for side in ("torch", "capi"):
        v = r[side][field]
        assert r[side]["correct"] is True, (w, side)
        assert isinstance(v, float) and math.isfinite(v) and v > 0, (w, v)
    assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r
PY
then ok=0; fi
[ $rc -ne 0 ] && echo "exit status $rc" >>"$tmp/log"
result "np=2 python3 -m kolo.bench --workload all --quick, JSON" $ok "$tmp/log"

# a bad option: argparse's exit status 2, before any rank starts kolo
timeout -k 10 "$limit" "$kolorun" --no-tag-output -np 2 "$python" -m kolo.bench \
    --workload nosuch >"$tmp/log" 2>&1
rc=$?
ok=1
[ $rc -ne 0 ] && grep -q "unknown workload" "$tmp/log" && ok=0
result "np=2 an unknown workload is refused" $ok "$tmp/log"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
