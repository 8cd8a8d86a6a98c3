#!/usr/bin/env bash
# run-valgrind.sh — short multi-rank runs with every rank under valgrind's
# memcheck: invalid reads and writes, uses of uninitialised memory and
# definite leaks fail the run (tests/valgrind.supp lists the reports inside
# dependencies, each with its reason). Run from a build directory.
set -u
top=${KOLO_TOP_BUILDDIR:-.}
src=${KOLO_TOP_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
pass=0
fail=0
vg="$top/libtool --mode=execute valgrind -q --error-exitcode=99 \
--leak-check=full --errors-for-leak-kinds=definite \
--suppressions=$src/tests/valgrind.supp"
run() {
    local desc=$1
    shift
    if timeout -k 10 600 "$top/kolorun" "$@" >"$top/valgrind.log" 2>&1 &&
        ! grep -q "^==[0-9]*== [A-Z]" "$top/valgrind.log"; then
        pass=$((pass + 1))
        echo "PASS $desc"
    else
        fail=$((fail + 1))
        echo "FAIL $desc"
        tail -n 40 "$top/valgrind.log" | sed 's/^/    /'
    fi
}
run "memcheck np=2 random allreduce" -np 2 $vg "$top/tests/multi/test-allreduce" random 2
run "memcheck np=2 shutdown with pending work" -np 2 $vg "$top/tests/multi/test-allreduce" shutdown
run "memcheck np=3 mismatch" -np 3 $vg "$top/tests/multi/test-allreduce" mismatch
for mode in allgather alltoall reducescatter grouped join process-sets; do
    run "memcheck np=3 $mode" -np 3 $vg "$top/tests/multi/test-collectives" "$mode"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
