#!/usr/bin/env bash
# test-kolo-bench.sh — kolo-bench runs a short configuration (--quick) and
# reports correct values: exit status 0, a table, and a JSON file with every
# workload asked for, each with numeric kolo, raw and ratio figures and no
# WRONG result. Also: a wrong answer is caught (KOLO_BENCH_FAULT=1 corrupts
# one element of the runtime's result: WRONG in the table and the JSON, exit
# status 1), a bad option exits 2, and a job of one rank (local backend)
# works. --backend nccl (CUDA tensors against NCCL called directly) runs a
# short configuration under one rank where a CUDA device is visible; where
# none is, or in a build without GPU support, kolo-bench must say so in one
# line and exit 77, and the case is reported as SKIP with that line (not
# counted). Timings are not checked: the benchmark is kept out of the timed
# tests. kolorun runs with --no-tag-output: the checks read the table as
# kolo-bench wrote it. Each run is bounded in time; prints one line per run
# and a summary "N passed, N failed".
#
# Usage: tests/test-kolo-bench.sh   (from the build directory; `make check`
# runs it with KOLO_TOP_BUILDDIR set)
set -u
top=${KOLO_TOP_BUILDDIR:-.}
kolorun=$top/kolorun
bench=$top/kolo-bench
limit=${KOLO_TEST_TIMEOUT:-120}
# The full --quick run takes a few seconds, but about a minute under
# ThreadSanitizer (resnet50 moves 102 MB a step): it gets a longer bound.
long_limit=${KOLO_TEST_TIMEOUT_LONG:-$((limit * 3))}
python=${PYTHON:-/usr/bin/python3}
[ -x "$python" ] || python=python3
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/log

# [bound=SECONDS] run DESC EXPECTED_STATUS COMMAND...: passes when the
# command exits with EXPECTED_STATUS within the time limit ($limit s, or
# bound) and every check queued in $checks
# (shell commands, run after it) succeeds. With skip77 set (a shell
# command), exit status 77 is a SKIP instead when that command succeeds;
# it prints why (on its stdout).
checks=()
run() {
    local desc=$1 want=$2 start end rc c why="" bound=${bound:-$limit}
    local skip=${skip77:-} skipped
    shift 2
    start=$(date +%s.%N)
    timeout -k 10 "$bound" "$@" >"$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    if [ $rc -eq 77 ] && [ -n "$skip" ]; then
        checks=()
        if skipped=$(eval "$skip" 2>&1); then
            printf 'SKIP %s (%s)\n' "$desc" "$skipped"
            return
        fi
        why="exit 77, and not for a reason that skips: $skipped"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        why="timed out after ${bound}s"
    elif [ $rc -ne "$want" ]; then
        why="exit $rc, expected $want"
    else
        for c in "${checks[@]}"; do
            if ! eval "$c" >>"$log" 2>&1; then
                why="check failed: $c"
                break
            fi
        done
    fi
    checks=()
    if [ -z "$why" ]; then
        pass=$((pass + 1))
        printf 'PASS %-58s %ss\n' "$desc" \
            "$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')"
        sed 's/^/    /' "$log"
    else
        fail=$((fail + 1))
        printf 'FAIL %s (%s)\n' "$desc" "$why"
        tail -n 40 "$log" | sed 's/^/    /'
    fi
}

# json_ok FILE RANKS WORKLOADS [EXPECT]: the JSON parses; it names RANKS
# ranks; every workload of the comma-separated list has results, each with
# numeric kolo, raw and ratio (finite, > 0) and check "ok" (EXPECT "wrong":
# at least one result is WRONG and "ok" is false instead).
json_ok() {
    "$python" - "$@" <<'EOF'
import json, math, sys
path, ranks, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
expect_wrong = len(sys.argv) > 4 and sys.argv[4] == "wrong"
with open(path) as f:
    doc = json.load(f)
def fail(msg):
    print("JSON check:", msg)
    sys.exit(1)
if doc.get("ranks") != ranks:
    fail("ranks is %r, expected %d" % (doc.get("ranks"), ranks))
for key in ("KOLO_FUSION_THRESHOLD", "KOLO_CYCLE_TIME"):
    if key not in doc.get("env", {}):
        fail("env has no %s" % key)
results = doc.get("results")
if not isinstance(results, list) or not results:
    fail("no results")
def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) \
        and math.isfinite(v) and v > 0
wrong = 0
for r in results:
    for key in ("kolo", "raw", "ratio"):
        if not num(r.get(key)):
            fail("%s %s: %s is %r" % (r.get("workload"), r.get("size"), key,
                                      r.get(key)))
    if r.get("check") == "WRONG":
        wrong += 1
    elif r.get("check") != "ok":
        fail("%s %s: check is %r" % (r.get("workload"), r.get("size"),
                                     r.get("check")))
    if r.get("workload") == "fp16" and not num(r.get("speedup")):
        fail("fp16 %s: speedup is %r" % (r.get("size"), r.get("speedup")))
    # On the host, the memory pass and the bound it gives (fp32 / pass).
    if r.get("workload") == "fp16" and doc.get("backend") != "nccl":
        for key in ("memory_pass", "memory_pass_time_s", "speedup_bound"):
            if not num(r.get(key)):
                fail("fp16 %s: %s is %r" % (r.get("size"), key, r.get(key)))
        if num(r.get("memory_pass_time_s")) and \
                num(r.get("kolo_fp32_time_s")) and num(r.get("speedup_bound")) \
                and abs(r["speedup_bound"] - r["kolo_fp32_time_s"] /
                        r["memory_pass_time_s"]) > 1e-3 * r["speedup_bound"]:
            fail("fp16 %s: speedup_bound %r is not kolo_fp32_time_s / "
                 "memory_pass_time_s" % (r.get("size"), r["speedup_bound"]))
names = [r.get("workload") for r in results]
for w in workloads:
    if w not in names:
        fail("no results for workload %s" % w)
for w in names:
    if w not in workloads:
        fail("results for %s, which was not asked for" % w)
if "large" in workloads:
    sizes = [r.get("size_bytes") for r in results if r["workload"] == "large"]
    want = [4 ** k for k in range(1, 11)]  # 4 B ... 1 MiB (--quick)
    if sizes != want:
        fail("large sizes %r, expected %r" % (sizes, want))
if expect_wrong:
    if wrong == 0 or doc.get("ok") is not False or doc.get("wrong") != wrong:
        fail("a wrong result was not reported (wrong=%r, ok=%r)"
             % (doc.get("wrong"), doc.get("ok")))
elif wrong or doc.get("ok") is not True or doc.get("wrong") != 0:
    fail("%d WRONG results" % wrong)
print("JSON ok: %d results, workloads %s" % (len(results), ",".join(workloads)))
EOF
}

all=large,resnet50,small,latency,fp16

# kolo runs as a training job does (shared memory within this host), the
# raw side is Gloo called directly; the header and the JSON say so.
checks=("json_ok '$tmp/np2.json' 2 $all"
        "grep -q '^large ' '$log'" "! grep -q WRONG '$log'"
        "grep -q 'moves tensors over shm .*raw = gloo called directly' '$log'"
        "grep -q '\"raw_backend\": \"gloo\", \"kolo_controller\": \"shm\", \"kolo_cpu_operations\": \"shm\"' '$tmp/np2.json'")
bound=$long_limit run "np=2 --workload all --quick, JSON" 0 \
    "$kolorun" --no-tag-output -np 2 "$bench" --workload all --quick --json "$tmp/np2.json"

# KOLO_CPU_OPERATIONS=gloo puts kolo's tensors on Gloo: the header says so,
# and the timeline shows that the runtime really reduced them there.
checks=("json_ok '$tmp/gloo.json' 2 latency,small" "! grep -q WRONG '$log'"
        "grep -q 'negotiates over gloo and moves tensors over gloo' '$log'"
        "grep -q '\"kolo_cpu_operations\": \"gloo\"' '$tmp/gloo.json'"
        "grep -q GLOO_ALLREDUCE '$tmp/gloo-timeline.json'"
        "! grep -q SHM_ALLREDUCE '$tmp/gloo-timeline.json'")
run "np=2 KOLO_CPU_OPERATIONS=gloo: kolo's Gloo path against Gloo" 0 \
    env KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo \
    KOLO_TIMELINE="$tmp/gloo-timeline.json" "$kolorun" --no-tag-output -np 2 "$bench" \
    --workload latency,small --quick --json "$tmp/gloo.json"

checks=("json_ok '$tmp/np3.json' 3 latency,small" "! grep -q WRONG '$log'")
run "np=3 --workload latency,small --quick, JSON" 0 \
    "$kolorun" --no-tag-output -np 3 "$bench" --workload latency,small --quick \
    --json "$tmp/np3.json"

checks=("json_ok '$tmp/np1.json' 1 latency,small,large")
run "np=1 (local backend) --workload latency,small,large --quick" 0 \
    "$kolorun" --no-tag-output -np 1 "$bench" --workload latency,small,large --quick \
    --json "$tmp/np1.json"

# A wrong answer must not pass as a fast one.
checks=("json_ok '$tmp/fault.json' 2 latency,small wrong"
        "grep -q '^latency .*WRONG' '$log'")
run "np=2 a corrupted result is reported WRONG, exit 1" 1 \
    env KOLO_BENCH_FAULT=1 "$kolorun" --no-tag-output -np 2 "$bench" --workload latency,small \
    --quick --json "$tmp/fault.json"

checks=("grep -q \"unknown workload 'bogus'\" '$log'")
run "np=2 unknown workload: usage, exit 2" 2 \
    "$kolorun" --no-tag-output -np 2 "$bench" --workload bogus

# --backend nccl: a short run on one CUDA device where there is one, with
# every value checked; else the one-line reason and exit 77, a SKIP. A GPU
# that nvidia-smi lists (CUDA_VISIBLE_DEVICES unset) must be used, not
# skipped.
nccl_skip_ok() {
    local line
    line=$(grep -m1 -E 'kolo-bench: --backend nccl (needs a CUDA device, and none is visible|cannot run: this kolo-bench was built without GPU support)' "$log") || {
        echo "no line saying why --backend nccl cannot run"
        return 1
    }
    if [ "$(grep -c . "$log")" -gt 2 ]; then
        echo "more than the reason (and kolorun's line): $(head -c 300 "$log")"
        return 1
    fi
    case $line in
    *"needs a CUDA device"*)
        if [ -z "${CUDA_VISIBLE_DEVICES+set}" ] &&
            nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
            echo "nvidia-smi lists a GPU, yet: $line"
            return 1
        fi ;;
    esac
    echo "$line"
}
checks=("json_ok '$tmp/nccl.json' 1 $all" "! grep -q WRONG '$log'"
        "grep -q '\"raw_backend\": \"nccl\"' '$tmp/nccl.json'"
        "grep -q 'every result checked: ok' '$log'")
bound=$long_limit skip77=nccl_skip_ok run \
    "np=1 --backend nccl --workload all --quick, JSON" 0 \
    "$kolorun" --no-tag-output -np 1 "$bench" --backend nccl --workload all --quick \
    --json "$tmp/nccl.json"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
