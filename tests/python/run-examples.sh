#!/usr/bin/env bash
# run-examples.sh — the Python examples a user starts from
# (bindings/python/examples, as Horovod's examples/pytorch) run as their
# docstrings say, briefly, at 2 ranks under kolorun:
#
#   pytorch_synthetic_benchmark.py   resnet18 on small synthetic images,
#        2 iterations: rank 0 prints Horovod's lines, ending with "Total
#        img/sec on 2 CPU(s): N +-M"
#   train_torch.py   one epoch: rank 0 prints the epoch's loss and
#        accuracy, and "parameters identical on all 2 ranks: yes"
#
# (The elastic example, pytorch_synthetic_benchmark_elastic.py, runs in
# tests/python/run-elastic.sh, a worker killed under it.) Bounded in time;
# prints one line per example and "N passed, N failed"; skips without
# torch and torchvision.
#
# Usage: tests/python/run-examples.sh   (from the build directory; `make
# check` runs it with KOLO_TOP_BUILDDIR and KOLO_TOP_SRCDIR set)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../script-lib.sh"
python_env
limit=${KOLO_TEST_TIMEOUT:-300}
python_needs torch ": the examples are kolo.torch scripts"
python_needs torchvision " (python3-torchvision): the benchmark's models"
python_kolo
make_work run-examples
export TMPDIR=$WORK/tmp
mkdir -p "$TMPDIR"
ex=$src/bindings/python/examples
pass=0
fail=0

# example DESC PATTERN... -- COMMAND...: COMMAND exits 0 and its output
# has a line matching each PATTERN (grep -E).
example() {
    local desc=$1 rc p missing=
    shift
    local patterns=()
    while [ "$1" != -- ]; do
        patterns+=("$1")
        shift
    done
    shift
    timeout -k 10 "$limit" "$@" >"$WORK/out" 2>&1
    rc=$?
    for p in "${patterns[@]}"; do
        grep -Eq "$p" "$WORK/out" || missing="$missing '$p'"
    done
    if [ $rc -eq 0 ] && [ -z "$missing" ]; then
        pass=$((pass + 1))
        echo "PASS $desc"
        grep -E "${patterns[-1]}" "$WORK/out" | head -n 1 | sed 's/^/    /'
    else
        fail=$((fail + 1))
        echo "FAIL $desc: exit $rc${missing:+, no line matching$missing}"
        tail -n 20 "$WORK/out" | sed 's/^/    | /'
    fi
    smoke_point "$pass" "$fail"
}

example "pytorch_synthetic_benchmark.py --model resnet18 (2 ranks, 2 iterations)" \
    '^Model: resnet18$' '^Number of CPUs: 2$' '^Iter #1: [0-9.]+ img/sec per CPU$' \
    '^Total img/sec on 2 CPU\(s\): [0-9.]+ \+-[0-9.]+$' -- \
    "$kolorun" -np 2 "$python" "$ex/pytorch_synthetic_benchmark.py" \
    --model resnet18 --batch-size 2 --image-size 64 --num-warmup-batches 1 \
    --num-batches-per-iter 2 --num-iters 2
example "train_torch.py --epochs 1 (2 ranks)" \
    '^epoch 1: loss [0-9.]+' 'parameters identical on all 2 ranks: yes' -- \
    "$kolorun" -np 2 "$python" "$ex/train_torch.py" --epochs 1
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
