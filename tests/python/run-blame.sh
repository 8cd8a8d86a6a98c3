#!/usr/bin/env bash
# run-blame.sh — kolorun names the rank that failed, not the ranks that
# failed because of it: 20 jobs at each of 2, 3 and 4 ranks (KOLO_TEST_NP;
# KOLO_TEST_BLAME_RUNS per count) of tests/python/blame_main.py, the victim
# varied over every rank (the coordinator, rank 0, too) and the way it fails
# cycling through an uncaught exception, sys.exit(3) and SIGKILL, with a
# busy loop beside the job (a loaded machine reorders the ranks' ends: the
# survivors often exit before the victim has finished tearing down).
# Each job: kolorun's line naming the cause must be the victim's, with how
# it ended ("exited with status 1", "exited with status 3", "was killed by
# signal 9"), and kolorun's exit status the victim's (1, 3, 137); after an
# exception, the others must name it ("rank V has shut down, which stops
# the job (it ended its program without calling shutdown: an uncaught
# RuntimeError: ...)").
# Prints one line per rank count and "N passed, N failed".
#
# Usage: tests/python/run-blame.sh   (from the build directory; `make
# check` runs it with KOLO_TOP_BUILDDIR and KOLO_TOP_SRCDIR set)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../script-lib.sh"
python_test 60 numpy " (python3-numpy): no kolorun blame test"
make_work run-blame
export TMPDIR=$WORK/tmp
mkdir -p "$TMPDIR"
runs=${KOLO_TEST_BLAME_RUNS:-20}
# The tarball's smoke run: a few jobs of the first rank count.
[ -z "${KOLO_TEST_SMOKE:-}" ] || runs=${KOLO_TEST_BLAME_RUNS:-3}
pass=0
fail=0

# The load: one busy loop, niced as little as the job itself.
sh -c 'while :; do :; done' &
hog=$!
trap 'kill $hog 2>/dev/null; rm -rf "$WORK"' EXIT

kinds=(raise exit kill)
for np in ${KOLO_TEST_NP:-2 3 4}; do
    bad=""
    for ((i = 0; i < runs; i++)); do
        victim=$((i % np))
        kind=${kinds[$(((i / np + i) % 3))]}
        case $kind in
        raise) how="exited with status 1" want=1 ;;
        exit) how="exited with status 3" want=3 ;;
        kill) how="was killed by signal 9" want=137 ;;
        esac
        timeout -k 5 "$limit" "$kolorun" -np "$np" "$python" \
            "$src/tests/python/blame_main.py" "$victim" "$kind" \
            >"$WORK/out" 2>"$WORK/err"
        rc=$?
        line=$(grep '^kolorun: rank [0-9]* ' "$WORK/err" | head -n 1)
        case $line in
        "kolorun: rank $victim (pid "*") $how"*) ;;
        *) bad="$bad
    run $i: victim rank $victim ($kind): kolorun said '${line:-nothing}', exit $rc" ;;
        esac
        [ "$rc" = "$want" ] || case $bad in *"run $i:"*) ;; *) bad="$bad
    run $i: victim rank $victim ($kind): kolorun exited $rc, want $want" ;;
        esac
        # The others say why the victim stopped: its uncaught exception.
        if [ "$kind" = raise ] &&
            ! grep -q "rank $victim has shut down, which stops the job (it ended its program without calling shutdown: an uncaught RuntimeError: a bug in rank $victim's training step)" "$WORK/err"; then
            bad="$bad
    run $i: victim rank $victim ($kind): no other rank named its exception"
        fi
    done
    verdict "$bad" "PASS np=$np: $runs jobs, kolorun named the victim every time" \
        "FAIL np=$np: kolorun blamed the wrong rank:$bad"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
