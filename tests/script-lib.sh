# script-lib.sh — what the test scripts share before they run anything
# (sourced; it defines functions and runs nothing):
#
#   . "$(dirname "$0")/../script-lib.sh"
#   skip_test [--counted] WHY...   # "SKIP: WHY" (and "0 passed, 0 failed"
#                                  # with --counted), exit 77 (automake's SKIP)
#   need_root_netns                # skip unless root with ip and
#                                  # redis-server: the network-namespace hosts
#   require_executables NAME FILE...  # exit 2, naming FILE, unless each is
#                                  # an executable file
#   clear_kolo_env [KEEP...]       # unset the caller's KOLO_* and HOROVOD_*
#                                  # variables but where the build and tests
#                                  # are, the time limit and KEEP: the ranks
#                                  # see only what the script gives them
#   clear_caller_env [KEEP...]     # unset them but the suite's knobs
#   smoke_point PASSED FAILED      # a smoke run (KOLO_TEST_SMOKE) ends
#                                  # the script after its first case
#   make_work NAME                 # WORK: a new directory, removed at exit
#   skip_if_sanitized [KIND] WHY   # skip in a build of libkolo with
#                                  # --enable-sanitizers (of KIND: thread)
#   multi_job NAME PROG LIMIT [KEEP...]   # the multi-rank scripts' setup
#                                  # (below)
#   python_env, python_needs MODULE TAIL   # the Python tests' setup (below)
#   python_test LIMIT MODULE TAIL  # all of it, for a script with one need
#   passed_case LINE, failed_case LINE...  # count a case in pass or fail
#                                  # and print its lines
#   verdict WHY PASS-LINE FAIL-LINE...  # one of the two (WHY empty:
#                                  # passed), then smoke_point
#   kolorun_cases, expect, case_end, cases_summary   # the launcher's
#                                  # case-by-case scripts (at the end)

skip_test() {
    local counted=
    if [ "${1:-}" = --counted ]; then
        counted=1
        shift
    fi
    echo "SKIP: $*"
    [ -z "$counted" ] || echo "0 passed, 0 failed"
    exit 77
}

need_root_netns() {
    [ "$(id -u)" = 0 ] || skip_test --counted "needs root to make network namespaces"
    command -v ip >/dev/null 2>&1 || skip_test --counted "needs ip (iproute2)"
    command -v redis-server >/dev/null 2>&1 ||
        skip_test --counted "needs redis-server (apt-get install redis-server)"
}

require_executables() {
    local name=$1 f
    shift
    for f in "$@"; do
        if [ ! -x "$f" ]; then
            echo "$name: '$f' is not an executable file" >&2
            exit 2
        fi
    done
}

clear_kolo_env() {
    local v keep=" KOLO_TOP_BUILDDIR KOLO_TOP_SRCDIR KOLO_TEST_TIMEOUT KOLO_TEST_SMOKE $* "
    for v in $(env | sed -n 's/^\(\(KOLO\|HOROVOD\)_[A-Za-z0-9_]*\)=.*/\1/p'); do
        case $keep in *" $v "*) ;; *) unset "$v" ;; esac
    done
}

# clear_caller_env: unset the caller's KOLO_* and HOROVOD_* variables but
# the test suite's own knobs (where the build is, KOLO_TEST_*, the rank
# counts, soak and fuzz lengths, which mpirun and Python): what a user's
# shell exports for their own jobs (HOROVOD_FUSION_THRESHOLD,
# KOLO_LOG_LEVEL, ...) must not change what the tests see. make check runs
# it before every test (AM_TESTS_ENVIRONMENT); the scripts' set-ups too
# (keeping KEEP...).
clear_caller_env() {
    local v keep=" $* "
    for v in $(env | sed -n 's/^\(\(KOLO\|HOROVOD\)_[A-Za-z0-9_]*\)=.*/\1/p'); do
        case $keep in *" $v "*) continue ;; esac
        case $v in
        KOLO_TEST_HOLD_CONNECT | KOLO_TEST_FAIL_* | KOLO_TEST_COUNT_FILE)
            unset "$v" ;; # the library's test hooks
        KOLO_TOP_* | KOLO_TEST_* | KOLO_PYTEST_* | KOLO_SOAK_STEPS | \
            KOLO_FUZZ_SECONDS | KOLO_MPIRUN | KOLO_GPU_WORK | KOLO_PYTHON) ;;
        *) unset "$v" ;;
        esac
    done
}

# smoke_point PASSED FAILED: in a smoke run (KOLO_TEST_SMOKE=1: the
# tarball's make check in CI, where the plain suite has just run every
# case), once a script's first case has run, end the script with its
# summary. The scripts call it before each case (run-lib.sh's run does).
smoke_point() {
    [ -n "${KOLO_TEST_SMOKE:-}" ] && [ $(($1 + $2)) -gt 0 ] || return 0
    echo "SMOKE: KOLO_TEST_SMOKE is set: the first case ran, not the others"
    echo "$1 passed, $2 failed"
    exit $(($2 > 0))
}

# skip_if_sanitized [KIND] WHY: CI runs the suite again in sanitizer
# builds (.ci/run); a test that gives a sanitizer nothing to see (a
# program built the same in every build, or with no thread of its own
# under ThreadSanitizer) skips there, saying why. KIND: only a build with
# that sanitizer (address, undefined, thread).
skip_if_sanitized() {
    local kind=
    [ $# -lt 2 ] || { kind=$1; shift; }
    grep -Eq "^SANITIZER_CFLAGS = .*-fsanitize=[a-z,]*$kind" \
        "${KOLO_TOP_BUILDDIR:-.}/Makefile" 2>/dev/null || return 0
    skip_test --counted "a ${kind:-sanitizer} build: $*"
}

passed_case() {
    pass=$((pass + 1))
    echo "$1"
}

failed_case() {
    fail=$((fail + 1))
    printf '%s\n' "$@"
}

verdict() {
    local why=$1 line=$2
    shift 2
    if [ -z "$why" ]; then
        passed_case "$line"
    else
        failed_case "$@"
    fi
    smoke_point "$pass" "$fail"
}

make_work() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || exit 2
    trap 'rm -rf "$WORK"' EXIT
}

# multi_job NAME PROG LIMIT [KEEP...]: top (the build), kolorun and prog
# ($top/PROG), absolute and executable; limit (KOLO_TEST_TIMEOUT, else
# LIMIT seconds); the caller's KOLO_* variables cleared but KEEP; WORK;
# TMPDIR=$WORK/tmp, where kolorun makes its rendezvous directories; log.
multi_job() {
    local name=$1 limit_default=$3
    top=${KOLO_TOP_BUILDDIR:-.}
    kolorun=$top/kolorun
    prog=$top/$2
    limit=${KOLO_TEST_TIMEOUT:-$limit_default}
    require_executables "$name" "$kolorun" "$prog"
    case $kolorun in /*) ;; *) kolorun=$PWD/$kolorun ;; esac
    case $prog in /*) ;; *) prog=$PWD/$prog ;; esac
    shift 3
    clear_kolo_env "$@"
    make_work "$name"
    export TMPDIR=$WORK/tmp
    mkdir -p "$TMPDIR"
    log=$WORK/log
}

# The Python test scripts' places (`here` set to the script's directory):
# top, src, python (KOLO_PYTHON, else Debian's), kolorun (KOLO_TEST_LAUNCHER:
# kolorun --mpi, say).
python_env() {
    clear_caller_env KOLO_LIBRARY
    top=${KOLO_TOP_BUILDDIR:-.}
    src=${KOLO_TOP_SRCDIR:-$(cd "$here/../.." && pwd)}
    python=${KOLO_PYTHON-/usr/bin/python3}
    kolorun=${KOLO_TEST_LAUNCHER:-$top/kolorun}
}

# python_kolo: the tree's kolo for the interpreter (PYTHONPATH, and
# KOLO_LIBRARY unless the caller set one); a sanitizer build of libkolo
# gets its runtime preloaded (tests/python/sanitizer-preload.sh), or the
# test skips where Python cannot load it (ThreadSanitizer).
python_kolo() {
    export PYTHONPATH=$src/bindings/python${PYTHONPATH:+:$PYTHONPATH}
    export KOLO_LIBRARY=${KOLO_LIBRARY:-$top/.libs/libkolo.so}
    # shellcheck source=tests/python/sanitizer-preload.sh
    . "$src/tests/python/sanitizer-preload.sh"
    kolo_python_preload "$KOLO_LIBRARY" || skip_test "$kolo_preload_why"
}

# python_needs MODULE TAIL: skips without an interpreter, or when it cannot
# import MODULE ("... cannot import MODULE" TAIL).
python_needs() {
    case $python in
    "" | :) skip_test "configure found no Python interpreter" ;;
    esac
    "$python" -c "import $1" 2>/dev/null || skip_test "$python cannot import $1$2"
}

# python_test LIMIT MODULE TAIL: the whole setup of a Python test script
# that needs one module: python_env; limit (KOLO_TEST_TIMEOUT, else LIMIT
# seconds); python_needs MODULE TAIL; python_kolo.
python_test() {
    python_env
    limit=${KOLO_TEST_TIMEOUT:-$1}
    python_needs "$2" "$3"
    python_kolo
}

# The launcher's case-by-case scripts (tests/test-kolorun*.sh):
#
#   kolorun_cases NAME [path/to/kolorun]   # KOLORUN (absolute, executable),
#       # WORK (removed at exit), TMPDIR=$WORK/tmp, where kolorun makes its
#       # rendezvous directories; D (exported: what a case's ranks leave for
#       # its checks), OUT and ERR (kolorun's output), the counts
#   expect DESCRIPTION COMMAND...  # DESCRIPTION is a failure unless COMMAND
#                                  # succeeds
#   case_end [LINES]               # TMPDIR must be empty again; "ok - NAME",
#       # or "FAIL - NAME" with the reasons, kolorun's exit status ($rc) and
#       # the first LINES (8) lines of its stderr; returns 1 on a failure
#   cases_summary                  # "N passed, M failed"; the status
kolorun_cases() {
    clear_caller_env
    KOLORUN=${2:-./kolorun}
    case $KOLORUN in /*) ;; *) KOLORUN=$PWD/$KOLORUN ;; esac
    require_executables "$1" "$KOLORUN"
    make_work "$1"
    export TMPDIR=$WORK/tmp
    mkdir "$TMPDIR"
    D=$WORK/d
    export D
    OUT=$WORK/out
    ERR=$WORK/err
    passed=0
    failed=0
    name=
    why=
}

expect() {
    local what=$1
    shift
    "$@" || why="$why
    - $what"
}

case_end() {
    local left
    left=$(ls -A "$TMPDIR")
    [ -z "$left" ] || why="$why
    - left behind in TMPDIR: $left"
    if [ -z "$why" ]; then
        passed=$((passed + 1))
        echo "ok - $name"
        smoke_point "$passed" "$failed"
        return 0
    fi
    failed=$((failed + 1))
    echo "FAIL - $name$why"
    echo "    kolorun exit status: ${rc:-?}; stderr (first lines):"
    head -n "${1:-8}" "$ERR" 2>/dev/null | cut -c1-200 | sed 's/^/      | /'
    smoke_point "$passed" "$failed"
    return 1
}

cases_summary() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
