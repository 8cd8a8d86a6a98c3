#!/usr/bin/env bash
# run-pytest.sh — runs the Python binding tests (tests/python/test_*.py) as
# real jobs under kolorun, at 2, 3 and 4 ranks: every pytest process is one
# rank, and every rank runs the same tests in the same order. One job per
# rank count runs every file (torch and kolo start once); files a failed
# job never reached run again, each in a job of its own. Each job is
# bounded in time (timeout -k 10 $KOLO_TEST_TIMEOUT, 300 s by default) so a
# hang fails instead of hanging CI. A test counts as passed when it passed
# on every rank, as failed when it failed on any rank. Prints a line per
# file and per job, pytest's summary lines (one per rank), the log's tail
# for a failed job, and ends with one line "N passed, N failed". A smoke
# run (KOLO_TEST_SMOKE: the tarball's make check in CI) runs at the first
# rank count only.
#
# Usage: tests/python/run-pytest.sh [test_file.py ...]
#   (from the build directory; `make check` runs it with KOLO_TOP_BUILDDIR,
#   KOLO_TOP_SRCDIR and KOLO_PYTHON set)
# Environment: KOLO_PYTHON (default /usr/bin/python3), KOLO_LIBRARY
#   (default BUILDDIR/.libs/libkolo.so), KOLO_PYTEST_RANKS ("2 3 4"),
#   KOLO_PYTEST_CUDA_RANKS (the rank counts of test_torch_cuda.py: "1"
#   and KOLO_PYTEST_RANKS, since it needs one GPU per rank and a machine
#   may have one; "1" alone where torch sees no GPU), KOLO_TEST_TIMEOUT (300).
# test_torch_cuda.py skips every test, with the reason, where torch sees no
# GPU or libkolo has no NCCL.
# Exit status 77 (skipped) when the interpreter cannot import numpy or
# pytest; without torch, the kolo.torch tests are skipped (and counted so).
# Against a sanitizer build of libkolo (address, undefined) the sanitizer
# runtimes are preloaded into the interpreter; a ThreadSanitizer build is
# skipped.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../script-lib.sh"
python_env # kolorun: KOLO_TEST_LAUNCHER (run-mpi.sh: kolorun --mpi)
lib=${KOLO_LIBRARY:-$top/.libs/libkolo.so}
limit=${KOLO_TEST_TIMEOUT:-300}
ranks=${KOLO_PYTEST_RANKS:-2 3 4}
cuda_ranks=${KOLO_PYTEST_CUDA_RANKS:-1 $ranks}
tests=$src/tests/python

skip() { skip_test "$@"; }
python_needs numpy " (python3-numpy): no Python binding tests"
python_needs pytest " (python3-pytest): no Python binding tests"
if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "NOTE: $python cannot import torch (python3-torch): the kolo.torch tests are skipped"
fi
# Without a GPU, test_torch_cuda.py skips everything at any rank count: say
# so once, at one rank, instead of starting three more jobs to skip it.
if [ -z "${KOLO_PYTEST_CUDA_RANKS:-}" ] &&
    ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' \
        2>/dev/null; then
    cuda_ranks=1
fi
for f in "$kolorun" "$lib"; do
    if [ ! -e "$f" ]; then
        echo "FAIL: $f is missing: build kolo first (make)"
        echo "0 passed, 1 failed"
        exit 1
    fi
done

if [ $# -gt 0 ]; then
    files=("$@")
else
    files=(test_numpy.py test_torch_ops.py test_torch_optimizer.py
           test_torch_mixed_precision.py test_torch_scaling.py
           test_torch_cuda.py test_lifecycle.py test_torch_horovod_api.py
           test_torch_adasum.py test_torch_sync_batch_norm.py
           test_elastic.py test_torch_compile.py test_torch_zero.py)
fi

# A sanitizer build of libkolo: preload its runtime (ThreadSanitizer: skip).
# shellcheck source=tests/python/sanitizer-preload.sh
. "$here/sanitizer-preload.sh"
kolo_python_preload "$lib" || skip "$kolo_preload_why"

export PYTHONPATH=$src/bindings/python${PYTHONPATH:+:$PYTHONPATH}
export KOLO_LIBRARY=$lib
export PYTHONDONTWRITEBYTECODE=1 # nothing written into the source tree
export OMP_NUM_THREADS=1

pass=0
fail=0
skipped=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

elapsed() {
    awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

# run NP FILE...: one pytest job over FILEs (every file's tests in one
# session: the interpreter, torch and kolo start once); adds their tests to
# the counts, with one line per file. A job that stops early (a test failed,
# a rank crashed) leaves files it never reached: those run again, each in
# a job of its own, so that every test is counted as it is without it.
run() {
    local np=$1 dir log start rc file p f s left=() total_f=0 ran
    shift
    dir=$(mktemp -d "$work/run.XXXXXX")
    log=$dir/log
    start=$(date +%s.%N)
    timeout -k 10 "$limit" env KOLO_PYTEST_RESULTS="$dir" \
        "$kolorun" -np "$np" --tag-output \
        "$python" -m pytest -q -rs -p no:cacheprovider --rootdir "$tests" \
        -o faulthandler_timeout=$((limit > 40 ? limit - 20 : limit)) \
        "${@/#/$tests/}" >"$log" 2>&1
    rc=$?
    ran=$(cat "$dir"/rank*.txt 2>/dev/null)
    if [ "$rc" -eq 5 ] && [ -z "$ran" ]; then
        # pytest's "no tests ran": the modules skipped themselves (no torch)
        skipped=$((skipped + $#))
        printf 'SKIP np=%d %-34s %s\n' "$np" "$*" \
            "$(grep -m1 -oE 'SKIPPED.*|[0-9]+ skipped' "$log" | head -n 1)"
        return
    fi
    for file in "$@"; do
        # Per test: failed if it failed on any rank, passed if it passed
        # on all NP ranks, skipped if skipped everywhere.
        read -r p f s <<<"$(echo "$ran" | awk -v np="$np" -v file="$file" '
            index($2, file "::") != 1 { next }
            { id = $2; n[id]++
              if ($1 == "failed") bad[id] = 1
              else if ($1 == "passed") ok[id]++
              else if ($1 == "skipped") sk[id]++ }
            END { p = f = s = 0
                  for (id in n) {
                      if (bad[id]) f++
                      else if (ok[id] == np) p++
                      else if (sk[id] == np) s++
                      else if (ok[id] + sk[id] == np) p++
                      else f++ }
                  print p, f, s }')"
        if [ $((p + f + s)) -eq 0 ] && [ "$rc" -ne 0 ]; then
            left+=("$file") # never reached: the job stopped before it
            continue
        fi
        pass=$((pass + p))
        fail=$((fail + f))
        skipped=$((skipped + s))
        total_f=$((total_f + f))
        if [ "$f" -eq 0 ]; then
            printf 'PASS np=%d %-34s %3d passed, %d skipped\n' "$np" "$file" "$p" "$s"
        else
            printf 'FAIL np=%d %s: %d passed, %d failed\n' "$np" "$file" "$p" "$f"
        fi
        if [ "$p" -eq 0 ] && [ "$s" -gt 0 ]; then
            # everything skipped (test_torch_cuda.py without a GPU): say why
            # (without the colours pytest uses under mpirun)
            sed -e 's/\x1b\[[0-9;]*m//g' "$log" |
                grep -oE "SKIPPED \[[0-9]+\] [^ ]*$file:[0-9]+: .*" | head -n 1 |
                sed -e 's/^SKIPPED \[[0-9]*\] [^ ]*: /    skipped: /' \
                    -e 's/\[[0-9,]*\]<std[a-z]*>:.*$//'
        fi
    done
    if [ "$rc" -ne 0 ] && [ "$total_f" -eq 0 ]; then
        fail=$((fail + 1)) # the job failed without a failed test: it crashed or hung
    fi
    if [ "$rc" -eq 0 ]; then
        printf 'PASS np=%d job of %d files  %ss\n' "$np" "$#" "$(elapsed "$start")"
    else
        local why=""
        [ "$rc" -eq 124 ] && why=" (timed out after ${limit}s)"
        printf 'FAIL np=%d job of %d files: exit %d%s\n' "$np" "$#" "$rc" "$why"
        tail -n 80 "$log" | sed 's/^/    /'
    fi
    # pytest's own summary line, from every rank
    grep -E '^\[[0-9]+\]<stdout>:.*[0-9]+ (passed|failed|error|errors|skipped)( |,|$)' \
        "$log" | sort | sed 's/^/    /'
    if [ ${#left[@]} -gt 0 ]; then
        echo "    not reached, each run again on its own: ${left[*]}"
        for file in "${left[@]}"; do
            run "$np" "$file"
        done
    fi
}

# ranks_of FILE: the rank counts FILE runs at.
ranks_of() {
    case $1 in
    test_torch_cuda.py) echo "$cuda_ranks" ;;
    test_torch_compile.py) echo "$ranks $cuda_ranks" ;;
    *) echo "$ranks" ;;
    esac
}
# A smoke run (KOLO_TEST_SMOKE: the tarball's make check) runs at the first
# rank count only, without the ctypes run below.
[ -z "${KOLO_TEST_SMOKE:-}" ] || ranks=${ranks%% *} cuda_ranks=${cuda_ranks%% *}
for np in $(printf '%s\n' $ranks $cuda_ranks | sort -n -u); do
    these=()
    for file in "${files[@]}"; do
        case " $(ranks_of "$file") " in
        *" $np "*) these+=("$file") ;;
        esac
    done
    [ ${#these[@]} -eq 0 ] || run "$np" "${these[@]}"
done

# The extension module kolo/_fastpath (bindings/python/kolo/_fastpath.c),
# where the build has it: the bindings must find it beside the library
# (everything above then ran through it), and without it they must fall
# back to ctypes with the same results: test_torch_ops.py again at 2 ranks
# against a libkolo with no _fastpath.so beside it.
if [ $# -eq 0 ] && [ -z "${KOLO_TEST_SMOKE:-}" ] &&
    [ -f "$(dirname "$lib")/_fastpath.so" ]; then
    start=$(date +%s.%N)
    want=$(cd "$(dirname "$lib")" && pwd)/_fastpath.so
    got=$("$python" -c 'import kolo._lib as l; print(l.fast_path)' 2>&1)
    if [ "$got" = "$want" ]; then
        pass=$((pass + 1))
        printf 'PASS %-39s the bindings call through %s  %ss\n' \
            "fast path found" "$got" "$(elapsed "$start")"
    else
        fail=$((fail + 1))
        printf 'FAIL fast path found: kolo._lib.fast_path is "%s", not %s\n' \
            "$got" "$want"
    fi
    mkdir -p "$work/ctypes"
    ln -s "$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")" "$work/ctypes/libkolo.so"
    got=$(KOLO_LIBRARY=$work/ctypes/libkolo.so "$python" -c \
        'import kolo._lib as l; print(l.fast_path)' 2>&1)
    if [ "$got" = None ]; then
        pass=$((pass + 1))
        printf 'PASS %-39s none beside %s: ctypes\n' "fast path absent" \
            "$work/ctypes/libkolo.so"
        KOLO_LIBRARY=$work/ctypes/libkolo.so run 2 test_torch_ops.py
    else
        fail=$((fail + 1))
        printf 'FAIL fast path absent: kolo._lib.fast_path is "%s", not None\n' "$got"
    fi
fi

# The harness itself: a rank that fails in the middle of a test, while the
# others wait for it in a collective, must end the job (with a failure)
# instead of hanging it.
if [ $# -eq 0 ]; then
    start=$(date +%s.%N)
    log=$work/selfcheck.log
    timeout -k 5 60 "$kolorun" -np 3 --tag-output "$python" -m pytest -q \
        -p no:cacheprovider --rootdir "$tests" "$tests/selfcheck_failure.py" \
        >"$log" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] &&
        grep -q 'deliberate failure on rank 2' "$log"; then
        pass=$((pass + 1))
        printf 'PASS np=3 %-34s a failing rank stops the job (exit %d)  %ss\n' \
            "selfcheck_failure.py" "$rc" "$(elapsed "$start")"
    else
        fail=$((fail + 1))
        printf 'FAIL np=3 selfcheck_failure.py: a failing rank did not stop the job cleanly (exit %d)\n' "$rc"
        tail -n 40 "$log" | sed 's/^/    /'
    fi
fi

[ "$skipped" -gt 0 ] && echo "($skipped tests or files skipped)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
