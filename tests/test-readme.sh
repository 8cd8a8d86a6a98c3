#!/usr/bin/env bash
# test-readme.sh — the README's commands, run as a user runs them, so that
# they cannot go stale. Every ```sh block of README.md is preceded by a
# marker that says how it is checked:
#
#   <!-- docs-test: run -->          the block runs here (bash -e, pipefail)
#                                    in a scratch directory laid out as the
#                                    top of a built tree (examples/,
#                                    bindings/, .libs/, ./kolorun) with
#                                    kolorun, kolo-bench, kolo-timeline and
#                                    python3 on PATH, as after an install;
#                                    it must exit 0 within the time limit.
#   <!-- expect: REGEX -->           (after a run marker, any number) the
#                                    block's output has a line matching
#                                    REGEX (grep -E)
#   <!-- docs-test: install -->      the first command: every Debian package
#                                    it installs is one .ci/run installs
#                                    (CI runs its build), and the job at its
#                                    end (after the last "make -j2 &&") runs
#   <!-- docs-test: elsewhere FILE --> needs what one machine lacks (other
#                                    hosts, pip's venv build, Slurm):
#                                    FILE, which runs the same, must exist
#                                    and be one of make check's TESTS (or
#                                    .ci/run)
#
# A block without a marker fails the test, and so does a link from the
# README or docs/*.md to a file of the tree that does not exist. Prints a
# line per block and "N passed, N failed". A sanitizer build runs nothing
# (the commands are the plain build's; its suite runs them).
#
# Usage: tests/test-readme.sh   (from the build directory; `make check`
# runs it with KOLO_TOP_BUILDDIR and KOLO_TOP_SRCDIR set)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/script-lib.sh"
python_env
case $top in /*) ;; *) top=$PWD/$top ;; esac
limit=${KOLO_TEST_TIMEOUT:-300}
readme=$src/README.md
[ -f "$readme" ] || { echo "no README.md in $src" >&2; exit 2; }
skip_if_sanitized "the README's commands are the plain build's (the plain suite runs them)"
python_needs torch ": the README's examples are kolo.torch scripts"
python_needs torchvision " (python3-torchvision): the benchmark's models"
require_executables test-readme "$top/kolorun" "$top/kolo-bench" "$src/tools/kolo-timeline"
python_kolo
make_work test-readme
pass=0
fail=0
ok() { passed_case "PASS $1"; }
bad() {
    failed_case "FAIL $1"
    shift
    [ $# -eq 0 ] || printf '    %s\n' "$@"
}

# ---- links: every relative link of the README and docs/ names a file ----
for doc in "$readme" "$src"/docs/*.md; do
    [ -f "$doc" ] || continue
    dir=$(dirname "$doc")
    missing=
    for link in $(grep -o '](\([^)#: ]*\)[#)]' "$doc" | sed 's/^](//; s/[#)]$//'); do
        [ -n "$link" ] && [ ! -e "$dir/$link" ] && missing="$missing $link"
    done
    name=${doc#"$src"/}
    if [ -z "$missing" ]; then ok "$name: every link names a file"; else
        bad "$name: links to files that do not exist:$missing"; fi
done

# ---- the scratch tree: a user's top of the tree, tools on PATH ----
t=$WORK/tree
mkdir -p "$t" "$WORK/bin" "$WORK/tmp"
ln -s "$top/examples" "$t/examples"
ln -s "$top/.libs" "$t/.libs"
ln -s "$src/bindings" "$t/bindings"
for cmd in kolorun kolo-bench; do
    printf '#!/bin/sh\nexec %q "$@"\n' "$top/$cmd" >"$WORK/bin/$cmd"
done
printf '#!/bin/sh\nexec %q %q "$@"\n' "$python" "$src/tools/kolo-timeline" >"$WORK/bin/kolo-timeline"
printf '#!/bin/sh\nexec %q "$@"\n' "$python" >"$WORK/bin/python3"
cp "$WORK/bin/kolorun" "$t/kolorun"
chmod +x "$WORK/bin/"* "$t/kolorun"
export PATH=$WORK/bin:$PATH TMPDIR=$WORK/tmp

# ---- the blocks: (line, marker, expects, text), split by awk ----
# Each block becomes a file blocks/N with a header: line, marker, expects.
mkdir -p "$WORK/blocks"
awk -v out="$WORK/blocks" '
    function flush_marks() { marker = ""; nexp = 0 }
    /^<!-- docs-test: .* -->$/ { m = $0; sub(/^<!-- docs-test: /, "", m); sub(/ -->$/, "", m); marker = m; nexp = 0; next }
    /^<!-- expect: .* -->$/ { e = $0; sub(/^<!-- expect: /, "", e); sub(/ -->$/, "", e); ex[++nexp] = e; next }
    inblock && /^```$/ { inblock = 0; close(f); next }
    inblock { print > f; next }
    /^```sh$/ {
        n++; f = out "/" n; inblock = 1
        print NR > (f ".line"); print marker > (f ".marker")
        for (i = 1; i <= nexp; i++) print ex[i] > (f ".expect")
        close(f ".line"); close(f ".marker"); close(f ".expect")
        printf "" > f
        flush_marks(); next
    }
    /^[^ ]/ && !/^<!--/ { flush_marks() }
' "$readme"

# .ci/run is in a clone, not in a release tarball (make dist): there the
# checks that need it say so and pass.
ci=$src/.ci/run
[ -f "$ci" ] || ci=
cipkgs=
[ -z "$ci" ] || cipkgs=$(sed -n '/^install()/,/^}/p' "$ci" | tr ' \\' '\n\n' | grep -E '^[a-z0-9][a-z0-9.+-]*$')
in_tests() { # in_tests FILE: FILE is one of make check's TESTS, or .ci/run
    [ "$1" = .ci/run ] && return 0
    [ -e "$src/$1" ] && grep -Eq "(^|[[:space:]=])$1([[:space:]\\]|$)" "$src/Makefile.am"
}

# run_block DESC FILE [EXPECT-FILE]: runs FILE's commands in the tree
run_block() {
    local desc=$1 body=$2 expects=${3:-} rc missing= re
    (cd "$t" && timeout -k 10 "$limit" bash -eo pipefail "$body") >"$WORK/out" 2>&1
    rc=$?
    if [ -n "$expects" ] && [ -f "$expects" ]; then
        while IFS= read -r re; do
            grep -Eq -- "$re" "$WORK/out" || missing="$missing '$re'"
        done <"$expects"
    fi
    if [ $rc -eq 0 ] && [ -z "$missing" ]; then
        ok "$desc"
    else
        bad "$desc: exit $rc${missing:+, no line matching$missing}" \
            "$(sed 's/^/| /' "$body")" "$(tail -n 25 "$WORK/out" | sed 's/^/> /')"
    fi
}

n=0
while [ -f "$WORK/blocks/$((n + 1))" ]; do
    n=$((n + 1))
    b=$WORK/blocks/$n
    line=$(cat "$b.line")
    marker=$(cat "$b.marker")
    first=$(head -n 1 "$b")
    desc="README.md:$line ${first:0:70}"
    case $marker in
    run)
        run_block "$desc" "$b" "$b.expect"
        ;;
    install)
        missing=
        for p in $(grep -o 'apt-get install -y [^&]*' "$b" | cut -d' ' -f4-); do
            [ -z "$ci" ] || printf '%s\n' "$cipkgs" | grep -qx -- "$p" || missing="$missing $p"
        done
        [ -n "$ci" ] || desc="$desc (no .ci/run in a tarball: packages not compared)"
        if [ -n "$missing" ]; then
            bad "$desc: installs packages .ci/run does not:$missing"
        else
            sed 's/.*make -j2 && //' "$b" >"$b.job"
            run_block "$desc (the job at its end)" "$b.job"
        fi
        ;;
    elsewhere\ *)
        f=${marker#elsewhere }
        if in_tests "$f"; then
            ok "$desc (as $f, in the suite)"
        else
            bad "$desc: '$f' is not a test of the suite"
        fi
        ;;
    *)
        bad "$desc: no docs-test marker before the block (tests/test-readme.sh says which)"
        ;;
    esac
    smoke_point "$pass" "$fail"
done
[ "$n" -gt 0 ] || bad "no sh blocks found in $readme"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
