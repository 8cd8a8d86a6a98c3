#!/usr/bin/env bash
# run-mpi.sh — kolo under MPI: the multi-rank suites run under plain
# `mpirun` (no kolorun: the ranks take their places from MPI), under
# `kolorun --mpi` with KOLO_CONTROLLER=mpi and KOLO_CPU_OPERATIONS=mpi,
# with the backends mixed (Gloo negotiates, MPI moves the tensors, through
# the rendezvous directory kolo makes under mpirun, and the reverse), and
# with MPI's int counts lowered (KOLO_MPI_TEST_MAX_COUNT) so that the paths
# for tensors beyond 2 GiB run on small ones; then test-mpi (placement from
# MPI, the program's own MPI_Init), the Python tests under kolorun --mpi,
# kolorun --mpi's errors and kolo-bench
# --backend mpi. At 2, 3 and 4 ranks; every run is bounded in time
# (run-lib.sh). Prints one line per run and "N passed, N failed".
# Skips (exit 77) when kolo was built without MPI or mpirun is missing.
#
# Usage: tests/multi/run-mpi.sh   (from the build directory; `make check`
# runs it with KOLO_TOP_BUILDDIR and KOLO_TOP_SRCDIR set)
set -u
top=${KOLO_TOP_BUILDDIR:-.}
src=${KOLO_TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
here=$src/tests/multi
if ! grep -q '^#define KOLO_HAVE_MPI 1' "$top/config.h" 2>/dev/null; then
    echo "run-mpi: SKIP: kolo was built without MPI (./configure --with-mpi)"
    exit 77
fi
if ! command -v "${KOLO_MPIRUN:-mpirun}" >/dev/null; then
    echo "run-mpi: SKIP: no mpirun in PATH (install openmpi-bin)"
    exit 77
fi
. "$here/../run-lib.sh"

tmp=$(mktemp -d)
trap 'rm -f "$run_log"; rm -rf "$tmp"' EXIT
mpirun_sh=$here/mpirun.sh
count_rdv() { ls -d "${TMPDIR:-/tmp}"/kolo-mpi-* 2>/dev/null | wc -l; }
rdv_before=$(count_rdv)
printf '#!/bin/sh\nexec "%s/kolorun" --mpi "$@"\n' "$top" >"$tmp/kolorun-mpi"
chmod +x "$tmp/kolorun-mpi"

# suite DESC ENV... SCRIPT ARGS...: runs a whole driver script and adds its
# "N passed, N failed" to ours, its failed runs shown.
suite() {
    local desc=$1 out p f
    shift
    smoke_point "$pass" "$fail"
    echo "---- $desc"
    out=$(env "$@" 2>&1)
    echo "$out" | grep -E '^(PASS|FAIL|    )'
    p=$(echo "$out" | sed -n -E 's/^([0-9]+) passed, ([0-9]+) failed$/\1/p' | tail -n 1)
    f=$(echo "$out" | sed -n -E 's/^([0-9]+) passed, ([0-9]+) failed$/\2/p' | tail -n 1)
    if [ -z "$p" ] && echo "$out" | grep -q '^SKIP'; then
        echo "$out" | grep '^SKIP'
        return
    fi
    if [ -z "$p" ]; then
        echo "FAIL $desc: the suite printed no summary"
        echo "$out" | tail -n 20 | sed 's/^/    /'
        fail=$((fail + 1))
        return
    fi
    pass=$((pass + p))
    fail=$((fail + f))
}

suite "run-multirank.sh under mpirun" KOLO_TEST_LAUNCHER="$mpirun_sh" \
    KOLO_SOAK_STEPS=500 "$here/run-multirank.sh"
suite "run-collectives.sh under kolorun --mpi, controller and data mpi" \
    KOLO_TEST_LAUNCHER="$tmp/kolorun-mpi" KOLO_CONTROLLER=mpi \
    KOLO_CPU_OPERATIONS=mpi "$here/run-collectives.sh"
suite "run-collectives.sh under mpirun, controller gloo, data mpi" \
    KOLO_TEST_LAUNCHER="$mpirun_sh" KOLO_CONTROLLER=gloo \
    KOLO_CPU_OPERATIONS=mpi KOLO_TEST_NP="2 3" "$here/run-collectives.sh"
suite "run-collectives.sh under mpirun, controller mpi, data gloo" \
    KOLO_TEST_LAUNCHER="$mpirun_sh" KOLO_CONTROLLER=mpi \
    KOLO_CPU_OPERATIONS=gloo KOLO_TEST_NP="2 4" "$here/run-collectives.sh" \
    allreduce-matrix allgather alltoall reducescatter process-sets
suite "run-collectives.sh under mpirun, int counts lowered to 16" \
    KOLO_TEST_LAUNCHER="$mpirun_sh" KOLO_MPI_TEST_MAX_COUNT=16 \
    KOLO_TEST_NP="2 3" "$here/run-collectives.sh" \
    allreduce-matrix broadcast allgather alltoall reducescatter grouped
suite "run-pytest.sh (the Python bindings) under kolorun --mpi" \
    KOLO_TEST_LAUNCHER="$tmp/kolorun-mpi" KOLO_PYTEST_RANKS="2 3" \
    "$src/tests/python/run-pytest.sh" test_numpy.py test_torch_ops.py \
    test_torch_optimizer.py test_torch_adasum.py test_torch_scaling.py

echo "---- test-mpi, kolorun --mpi, kolo-bench --backend mpi"
for np in 2 3 4; do
    run "np=$np placement from MPI, init twice" \
        "$mpirun_sh" -np "$np" "$top/tests/multi/test-mpi" placement
done
run "np=3 placement, controller gloo (rendezvous made under mpirun)" \
    env KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo \
    "$mpirun_sh" -np 3 "$top/tests/multi/test-mpi" placement
run "np=2 placement under kolorun --mpi" \
    "$top/kolorun" --mpi -np 2 "$top/tests/multi/test-mpi" placement
run "np=2 program's own MPI_Init_thread(MULTIPLE)" \
    "$mpirun_sh" -np 2 "$top/tests/multi/test-mpi" own-multiple
run "np=2 program's own MPI_Init: clear error" \
    "$mpirun_sh" -np 2 "$top/tests/multi/test-mpi" own-single

# expect_fail DESC STATUS PATTERN COMMAND...: exits STATUS and says PATTERN.
expect_fail() {
    local desc=$1 want=$2 pattern=$3 rc
    shift 3
    timeout -k 10 "$limit" "$@" >"$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -eq "$want" ] && grep -q -- "$pattern" "$tmp/out"; then
        pass=$((pass + 1))
        printf 'PASS %s\n' "$desc"
    else
        fail=$((fail + 1))
        printf 'FAIL %s (exit %d, wanted %d and "%s")\n' "$desc" "$rc" \
            "$want" "$pattern"
        tail -n 10 "$tmp/out" | sed 's/^/    /'
    fi
}
expect_fail "kolorun --mpi --gloo: usage error" 2 "choose different launchers" \
    "$top/kolorun" --mpi --gloo -np 2 true
expect_fail "kolorun --mpi --failure-grace: usage error" 2 "no effect with --mpi" \
    "$top/kolorun" --mpi --failure-grace 3 -np 2 true
expect_fail "kolorun --mpi without mpirun: exit 127" 127 "cannot run" \
    env KOLO_MPIRUN=/nonexistent/mpirun "$top/kolorun" --mpi -np 2 true
expect_fail "KOLO_CONTROLLER=mpi under plain kolorun: clear error" 1 \
    "needs the job to be started by mpirun" \
    env KOLO_CONTROLLER=mpi "$top/kolorun" -np 2 "$top/tests/multi/test-mpi" placement
expect_fail "kolo-bench --backend mpi under plain kolorun: clear error" 2 \
    "needs the job started by MPI" \
    "$top/kolorun" -np 2 "$top/kolo-bench" --backend mpi --quick
# Under mpirun MPI negotiates and moves the tensors unless told otherwise,
# as Horovod under mpirun; rank 0 says so at start (KOLO_LOG_LEVEL=info).
for launcher in "$mpirun_sh" "$top/kolorun --mpi"; do
    # shellcheck disable=SC2086
    run "np=2 $(basename "${launcher%% *}")${launcher#* --mpi}: MPI carries the job by default" \
        sh -c 'KOLO_LOG_LEVEL=info "$@" 2>&1 | tee /dev/stderr |
               grep -q "negotiation over mpi, host tensors over mpi"' run-mpi \
        $launcher -np 2 "$top/tests/multi/test-mpi" placement
done
run "np=2 kolo-bench --backend mpi --quick (latency, small)" \
    "$top/kolorun" --mpi -np 2 "$top/kolo-bench" --backend mpi --quick \
    --workload latency,small
run "np=2 kolo-bench --backend mpi, kolo on MPI too (KOLO_CPU_OPERATIONS=mpi)" \
    env KOLO_CONTROLLER=mpi KOLO_CPU_OPERATIONS=mpi \
    "$top/kolorun" --mpi -np 2 "$top/kolo-bench" --backend mpi --quick \
    --workload latency,small
# No rendezvous directory is left behind by the runs above.
left=$(($(count_rdv) - rdv_before))
if [ "$left" -le 0 ]; then
    pass=$((pass + 1)); echo "PASS no kolo-mpi-* rendezvous directory left"
else
    fail=$((fail + 1)); echo "FAIL $left kolo-mpi-* rendezvous directories left in ${TMPDIR:-/tmp}"
fi

finish
