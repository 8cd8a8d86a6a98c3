#!/usr/bin/env bash
# check-gpu.sh — everything kolo does on a GPU, in one call, on a machine
# with an NVIDIA GPU, CUDA and torch: builds kolo from a release tarball
# (`make dist`: no autotools needed), runs the GPU tests and the figures,
# and prints one summary.
#
#   tests/gpu/check-gpu.sh kolo-VERSION.tar.gz [DEBS_DIR]
#
# Steps, each bounded in time (about 6 minutes in all on one H200):
#  build       configure (CUDA from /usr/local/cuda or CUDA_HOME; NCCL from
#              nccl.h beside CUDA, else from the Python package
#              nvidia-nccl-* that torch uses, which ships libnccl.so.2 only)
#              and make, with the Python interpreter on PATH (torch's)
#  kernels     tests/gpu/test-gpu-kernels: the CUDA kernels against the
#              host's reference
#  device      tests/unit/test-device and test-protocol (where Check is
#              there: DEBS_DIR, below)
#  run-gpu     tests/gpu/run-gpu.sh: every collective on CUDA tensors, a
#              rank killed in a large allreduce
#  bench       kolo-bench --backend nccl, kolo against NCCL called directly
#  resnet50    tests/gpu/train_resnet50.py: a training step of plain torch,
#              kolo.torch's DistributedOptimizer and DDP, fp32 and bf16
#  timeline    a kolo bf16 ResNet-50 run with KOLO_TIMELINE: kolo-timeline
#              summary's per-step device table, and a plot
#  bench-timeline  kolo-bench's latency and large workloads with the
#              timeline: each tensor's device spans, median and max
#  pytest      tests/python/run-pytest.sh: kolo.torch's suites at 2 ranks,
#              the CUDA suite at 1 rank per GPU, torch.compile (last: the
#              longest step, after the figures)
# The summary gives each step's PASS or FAIL and the figures: kolo's
# ResNet-50 step against plain torch and DDP, 4-byte latency against raw
# NCCL, small allreduces per second, the ResNet-50 gradient set, and the
# bandwidth of the largest tensor. Logs go to $OUT (./gpu-out by default).
#
# DEBS_DIR (optional): Debian packages unpacked into /tmp/deb for what such
# a machine may lack (libsodium, which kolo needs; Check for the unit tests,
# Gloo for the hierarchical case), as `apt-get download libsodium23
# libsodium-dev check libsubunit-dev libsubunit0 libgloo0 libgloo-dev
# libhiredis0.14 libhiredis-dev libibverbs1 libibverbs-dev libnl-3-200
# libnl-route-3-200` gives them.
# A shorter round: KOLO_GPU_RESNET_MODES (default "plain kolo ddp"),
# KOLO_GPU_PYTEST_FILES (run-pytest.sh's files; all by default) and
# KOLO_PYTEST_RANKS (2). KOLO_RESNET_PROFILE=DIR profiles each ResNet-50
# run into DIR (train_resnet50.py).
# Exit status: 0 when every step passed, 1 otherwise, 2 on a wrong call.
set -u
if [ $# -lt 1 ] || [ ! -f "$1" ]; then
    echo "usage: $0 kolo-VERSION.tar.gz [DEBS_DIR]" >&2
    exit 2
fi
tarball=$(readlink -f "$1")
debs=${2:+$(readlink -f "$2")}
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")
exec > >(tee "$OUT/check-gpu.log") 2>&1
work=${KOLO_GPU_WORK:-/tmp/kolo-gpu}
py=$(command -v python3)
cuda=${CUDA_HOME:-/usr/local/cuda}
t_start=$SECONDS
summary=()
failed=0

note() { summary+=("$*"); }
step() { echo; echo "=== $1 (t=$((SECONDS - t_start)) s)"; }
# verdict NAME STATUS DETAIL: one line of the summary
verdict() {
    if [ "$2" -eq 0 ]; then
        note "PASS $1${3:+: $3}"
    elif [ "$2" -eq 77 ]; then
        note "SKIP $1${3:+: $3}"
    else
        note "FAIL $1 (exit $2)${3:+: $3}"
        failed=1
    fi
}

step machine
nvidia-smi -L 2>&1 | head -4
"$cuda/bin/nvcc" --version 2>&1 | tail -1
"$py" -c 'import torch; print("torch", torch.__version__, "CUDA available:", torch.cuda.is_available())'

# NCCL: beside CUDA, else torch's Python package (libnccl.so.2 only: give
# the linker a libnccl.so next to it).
nccl_opt=--with-nccl
if [ ! -f "$cuda/include/nccl.h" ]; then
    ncclpkg=$("$py" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
    if [ -n "$ncclpkg" ]; then
        mkdir -p /tmp/kolo-nccl/lib
        ln -sfn "$ncclpkg/include" /tmp/kolo-nccl/include
        for f in "$ncclpkg"/lib/libnccl.so*; do ln -sf "$f" /tmp/kolo-nccl/lib/; done
        ln -sf "$ncclpkg/lib/libnccl.so.2" /tmp/kolo-nccl/lib/libnccl.so
        nccl_opt=--with-nccl=/tmp/kolo-nccl
    fi
fi
deb_opts=()
if [ -n "$debs" ]; then
    mkdir -p /tmp/deb
    for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/deb; done
    export LD_LIBRARY_PATH=/tmp/deb/usr/lib:/tmp/deb/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    [ -d /tmp/deb/usr/include/gloo ] && deb_opts+=(--with-gloo=/tmp/deb/usr)
    [ -f /tmp/deb/usr/include/sodium.h ] && ! pkg-config --exists libsodium 2>/dev/null &&
        deb_opts+=(SODIUM_CFLAGS="-I/tmp/deb/usr/include"
                   SODIUM_LIBS="-L/tmp/deb/usr/lib/x86_64-linux-gnu -lsodium")
    [ -f /tmp/deb/usr/include/check.h ] && deb_opts+=(
        CHECK_CFLAGS="-I/tmp/deb/usr/include -pthread"
        CHECK_LIBS="-L/tmp/deb/usr/lib/x86_64-linux-gnu -lcheck_pic -lsubunit -lrt -lm -pthread")
fi

step build
rm -rf "$work" && mkdir -p "$work" &&
    tar xzf "$tarball" -C "$work" --strip-components=1 && cd "$work" || exit 1
rc=0
./configure --with-cuda="$cuda" $nccl_opt --without-mpi PYTHON="$py" \
    "${deb_opts[@]}" >"$OUT/configure.log" 2>&1 || rc=$?
if [ $rc -eq 0 ]; then
    sed -n '/Gloo backend/,/Fuzzing/p' "$OUT/configure.log"
    make -j"$(nproc)" >"$OUT/build.log" 2>&1 || rc=$?
fi
if [ $rc -eq 0 ]; then
    targets="tests/gpu/test-gpu-kernels tests/gpu/test-gpu"
    grep -q '^ *Check (unit tests): *yes' "$OUT/configure.log" &&
        targets="$targets tests/unit/test-device tests/unit/test-protocol"
    make -j"$(nproc)" $targets >>"$OUT/build.log" 2>&1 || rc=$?
fi
verdict build $rc "$(grep -m1 'GPU tensors:' "$OUT/configure.log" | sed 's/^ *//')"
if [ $rc -ne 0 ]; then
    tail -30 "$OUT/configure.log" "$OUT/build.log" 2>/dev/null
    printf '%s\n' "${summary[@]}"
    exit 1
fi
export PYTHONPATH=$work/bindings/python KOLO_LIBRARY=$work/.libs/libkolo.so

step kernels
rc=0
timeout -k 5 120 ./tests/gpu/test-gpu-kernels >"$OUT/kernels.log" 2>&1 || rc=$?
tail -3 "$OUT/kernels.log"
verdict "GPU kernels (test-gpu-kernels)" $rc "$(grep -Eo '[0-9]+ passed, [0-9]+ failed' "$OUT/kernels.log" | tail -1)"

step device
if [ -x tests/unit/test-device ]; then
    rc=0
    timeout -k 5 300 sh -c './tests/unit/test-device && ./tests/unit/test-protocol' >"$OUT/device.log" 2>&1 || rc=$?
    grep -E '^[0-9]+%' "$OUT/device.log"
    verdict "device path on the simulated device (test-device, test-protocol)" $rc
else
    verdict "device path on the simulated device" 77 "no Check here (give DEBS_DIR)"
fi

step run-gpu
rc=0
KOLO_TOP_BUILDDIR=. KOLO_TOP_SRCDIR=. timeout -k 5 200 bash tests/gpu/run-gpu.sh >"$OUT/run-gpu.log" 2>&1 || rc=$?
tail -12 "$OUT/run-gpu.log"
verdict "CUDA collectives (run-gpu.sh)" $rc "$(tail -1 "$OUT/run-gpu.log")"

step bench
rc=0
timeout -k 5 150 ./kolorun --no-tag-output -np 1 ./kolo-bench --backend nccl --workload all \
    --max-bytes 256M --json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1 || rc=$?
tail -40 "$OUT/bench.txt"
figures=$("$py" - "$OUT/bench.json" <<'EOF' 2>/dev/null
import json, sys
rows = json.load(open(sys.argv[1]))
rows = rows.get("results", rows) if isinstance(rows, dict) else rows
out = []
for r in rows:
    w, size = r.get("workload"), r.get("size", "")
    if w == "latency":
        out.append("4 B latency %.1f us (raw NCCL %.1f us)"
                   % (r["kolo"], r["raw"]))
    elif w == "small":
        out.append("1000 one-float allreduces %s %s (raw %s)"
                   % (format(r["kolo"], ".4g"), r["unit"],
                      format(r["raw"], ".4g")))
    elif w == "resnet50" and "fp16" not in size:
        out.append("ResNet-50 gradient set %.3g %s (one raw call %.3g)"
                   % (r["kolo"], r["unit"], r["raw"]))
large = [r for r in rows if r.get("workload") == "large"]
if large:
    r = max(large, key=lambda r: r.get("size_bytes", 0))
    out.append("%s: %.3g %s, %.2fx raw" % (r["size"], r["kolo"], r["unit"],
                                          r["ratio"]))
print("; ".join(out))
EOF
)
verdict "kolo-bench --backend nccl" $rc "$figures"

step resnet50
declare -A ms
rc=0
for prec in fp32 bf16; do
    for mode in ${KOLO_GPU_RESNET_MODES:-plain kolo ddp}; do
        cmd=("$py" "$here/train_resnet50.py" "$mode" "$prec")
        [ "$mode" = kolo ] && cmd=(./kolorun --no-tag-output -np 1 "${cmd[@]}")
        line=$(timeout -k 5 120 "${cmd[@]}" 2>>"$OUT/resnet50.err" |
            tee "$OUT/resnet50-$mode-$prec.txt" | grep '^RESULT')
        echo "$mode $prec: ${line:-no result}"
        v=$(echo "$line" | sed -n 's/.*"ms_median": \([0-9.]*\).*/\1/p')
        [ -n "$v" ] || rc=1
        ms[$mode.$prec]=${v:-0}
    done
done
res=""
for prec in fp32 bf16; do
    res+=$(awk -v p="${ms[plain.$prec]:-0}" -v k="${ms[kolo.$prec]:-0}" -v d="${ms[ddp.$prec]:-0}" -v n="$prec" \
        'BEGIN { if (p > 0) printf "%s: plain %.2f ms, kolo %.2f ms = %.3fx", n, p, k, k / p
                 if (p > 0 && d > 0) printf ", DDP %.2f ms = %.3fx", d, d / p
                 if (p > 0) printf "; " }')
done
verdict "ResNet-50 step, batch 128 (median of 5x10 steps)" $rc "$res"

step timeline
# One kolo bf16 ResNet-50 run with the timeline on (its step time is not a
# figure: the timeline costs events): the device rows and kolo-timeline's
# per-step table of the device's time and the stream's wait, and a picture.
rc=0
KOLO_TIMELINE="$OUT/timeline-resnet50.json" timeout -k 5 120 ./kolorun -np 1 \
    "$py" "$here/train_resnet50.py" kolo bf16 >"$OUT/timeline-run.txt" 2>&1 || rc=$?
if [ $rc -eq 0 ]; then
    "$py" ./tools/kolo-timeline summary "$OUT/timeline-resnet50.json" \
        >"$OUT/timeline-summary.txt" 2>&1 || rc=$?
    "$py" ./tools/kolo-timeline plot "$OUT/timeline-resnet50.json" \
        -o "$OUT/timeline-resnet50.svg" >/dev/null 2>&1 || rc=$?
    sed -n '/^device/,/median/p' "$OUT/timeline-summary.txt" | tail -8
fi
verdict "the timeline of a ResNet-50 run (device rows, kolo-timeline)" $rc \
    "$(grep -m1 '^ *median' "$OUT/timeline-summary.txt" 2>/dev/null | tr -s ' ')"

step bench-timeline
# kolo-bench's latency and large workloads again with the timeline on: the
# device rows say where a 4 B and a 256 MiB allreduce spend their time
# (waiting to start, on the device, the bench's stream waiting).
rc=0
KOLO_TIMELINE="$OUT/timeline-bench.json" timeout -k 5 120 ./kolorun -np 1 \
    ./kolo-bench --backend nccl --workload latency,large --max-bytes 256M \
    >"$OUT/bench-timeline.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] && "$py" - "$OUT/timeline-bench.json" <<'EOF' || rc=$?
import json, statistics, sys
ev = json.load(open(sys.argv[1]))
names = {e["pid"]: e["args"]["name"] for e in ev
         if e.get("ph") == "M" and e.get("name") == "process_name"}
rows = {}
for e in ev:
    if e.get("cat") == "device":
        rows.setdefault((names.get(e["pid"], "?"), e["name"]), []).append(e["dur"])
for (tensor, phase), d in sorted(rows.items()):
    print("%-28s %-20s n=%4d median %9.1f us  max %9.1f us"
          % (tensor[:28], phase, len(d), statistics.median(d), max(d)))
EOF
verdict "where latency and large go on the device (timeline of kolo-bench)" $rc

step pytest
rc=0
# shellcheck disable=SC2086 # KOLO_GPU_PYTEST_FILES: file names
KOLO_TOP_BUILDDIR=. KOLO_TOP_SRCDIR=. KOLO_PYTHON="$py" \
    KOLO_PYTEST_RANKS=${KOLO_PYTEST_RANKS:-2} KOLO_PYTEST_CUDA_RANKS=1 \
    timeout -k 5 300 bash tests/python/run-pytest.sh ${KOLO_GPU_PYTEST_FILES:-} \
    >"$OUT/pytest.log" 2>&1 || rc=$?
grep -E '^(PASS|FAIL)|passed, [0-9]+ failed$' "$OUT/pytest.log" | tail -25
verdict "kolo.torch on torch $("$py" -c 'import torch; print(torch.__version__)') (run-pytest.sh)" $rc "$(tail -1 "$OUT/pytest.log")"

echo
echo "=== summary (t=$((SECONDS - t_start)) s; logs in $OUT)"
printf '%s\n' "${summary[@]}"
exit $failed
