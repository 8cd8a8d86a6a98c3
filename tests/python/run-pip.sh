#!/usr/bin/env bash
# run-pip.sh — kolo installed the way a Horovod user installs Horovod: with
# pip, into a virtual environment that sees Debian's torch
# (--system-site-packages), from a copy of this source tree (pip builds
# there) and from a wheel of it. For each:
#
#   - pip install --no-build-isolation builds with ./configure and make;
#   - the environment's python imports kolo.torch and loads the libkolo
#     inside the installed package (no KOLO_LIBRARY, no PYTHONPATH, away
#     from the tree);
#   - the environment's kolorun (on its bin, as PATH gives it) runs a
#     2-rank kolo.torch job whose every rank checks its results against
#     its own reference, with a timeline that the environment's
#     kolo-timeline summarizes; the environment's kolo-bench runs a short
#     benchmark under it; kolorun --check-build names that library;
#   - pip uninstall kolo leaves the environment as it was, file for file.
#
# The wheel is built with HOROVOD_WITHOUT_MPI=1 and must show no MPI in
# --check-build (the tree's build has MPI where configure finds it); the
# wheel installs with --only-binary :all: (nothing compiled). Build
# variables kolo cannot honour stop pip, saying why, before anything is
# built, and a configure that fails stops it with configure's message.
#
# Skips (exit 77) without python3-venv, python3-pip, python3-setuptools and
# python3-wheel, and in sanitizer builds (pip builds its own, plain, copy:
# the sanitized suites have nothing to add). Every command is bounded by
# KOLO_TEST_TIMEOUT (900 s: a build). Prints one line per check and
# "N passed, N failed". A smoke run (KOLO_TEST_SMOKE: the tarball's make
# check in CI) ends after the install from the tree: one build, not two.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../script-lib.sh"
python_env
python_needs venv ""
python_needs ensurepip " (apt-get install python3-venv)"
python_needs setuptools " (apt-get install python3-setuptools)"
python_needs wheel " (apt-get install python3-wheel)"
python_needs torch ": the job is a kolo.torch job"
skip_if_sanitized "pip builds its own plain copy (the plain suite runs this)"
smoke_auto=0 # a smoke run (KOLO_TEST_SMOKE) ends after the tree's section
. "$here/../run-lib.sh"
limit=${KOLO_TEST_TIMEOUT:-900}
clear_kolo_env
unset PYTHONPATH
make_work run-pip
export WORK
trap 'rm -rf "$WORK" "$run_log"' EXIT

# The tree as pip sees it: a clone's tracked and untracked-but-not-ignored
# files, or the whole (tarball) tree; writable, whatever the source's mode
# (make distcheck's is read-only).
tree=$WORK/src
mkdir -p "$tree"
if [ -d "$src/.git" ] && command -v git >/dev/null; then
    (cd "$src" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do
            [ -e "$f" ] && printf '%s\0' "$f"
        done | tar --null -T - -cf - | tar -C "$tree" -xf -)
else
    cp -R "$src/." "$tree"
fi
chmod -R u+w "$tree"

cat >"$WORK/job.py" <<'PY'
import os
import sys

import torch
import kolo.torch as hvd
import kolo._lib

hvd.init()
r, n = hvd.rank(), hvd.size()
x = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1)
got = hvd.allreduce(x, op=hvd.Sum, name="pip.sum")
want = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (n * (n + 1) // 2)
assert torch.equal(got, want), (got, want)
b = hvd.broadcast(torch.full((4,), float(r)), root_rank=n - 1, name="pip.b")
assert torch.equal(b, torch.full((4,), float(n - 1))), b
g = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int64), name="pip.g")
assert g.tolist() == [[k, k] for k in range(n) for _ in range(k + 1)], g
lib = kolo._lib.path
assert lib.startswith(sys.prefix) and lib.endswith("kolo/_native/libkolo.so.0"), lib
print("rank %d of %d ok %s" % (r, n, lib))
hvd.shutdown()
PY

# install_checks NAME VENV: the checks of an installed kolo.
install_checks() {
    local name=$1 venv=$2
    run "$name: python -c 'import kolo.torch' loads the package's own libkolo" \
        env -C "$WORK" "$venv/bin/python" -c '
import sys, kolo.torch, kolo._lib
p = kolo._lib.path
assert p == sys.prefix + "/lib/python%d.%d/site-packages/kolo/_native/libkolo.so.0" % sys.version_info[:2], p
print(p)'
    run "$name: kolorun -np 2, a kolo.torch job, its timeline summarized by kolo-timeline" \
        env -C "$WORK" PATH="$venv/bin:$PATH" KOLO_TIMELINE="$WORK/$name.json" \
        sh -c 'kolorun --no-tag-output -np 2 python job.py >"$0.out" 2>&1 &&
               [ "$(grep -c "^rank [01] of 2 ok " "$0.out")" = 2 ] &&
               kolo-timeline summary "$0.json" | grep -q "pip.sum" ||
               { cat "$0.out"; exit 1; }' "$WORK/$name"
    run "$name: kolorun -np 2 kolo-bench --workload small --quick (the environment's)" \
        env -C "$WORK" PATH="$venv/bin:$PATH" sh -c \
        'kolorun -np 2 kolo-bench --workload small --quick >"$0.bench" 2>&1 &&
         grep -q "small" "$0.bench" && ! grep -q WRONG "$0.bench" ||
         { cat "$0.bench"; exit 1; }' "$WORK/$name"
    run "$name: kolorun --check-build names the installed library" \
        env -C "$WORK" sh -c '"$0/bin/kolorun" --check-build >"$1" 2>&1 &&
            grep -qF "(libkolo: $("$0/bin/python" -c "import sys; print(sys.prefix)")/lib/" "$1" &&
            ! grep -q "cannot import the kolo package" "$1" || { cat "$1"; exit 1; }' \
        "$venv" "$WORK/$name.check"
}

# uninstall_check NAME VENV: pip uninstall, then the environment's files
# are those it had before the install.
uninstall_check() {
    run "$1: pip uninstall kolo removes every file it installed" \
        sh -c '"$0/bin/pip" uninstall -y kolo &&
               find "$0" | sort >"$0.after" &&
               diff "$0.before" "$0.after"' "$2"
}

# venv_new NAME: a venv, and the list of its files before any install.
venv_new() {
    run "venv --system-site-packages ($1)" sh -c \
        '"$0" -m venv --system-site-packages "$1" && find "$1" | sort >"$1.before"' \
        "$python" "$WORK/$1"
}

pip_quiet="--no-build-isolation --no-index --no-cache-dir --disable-pip-version-check"

# ---- from the tree -----------------------------------------------------------
venv_new tree-venv
run "tree: pip install --no-build-isolation builds and installs kolo" \
    "$WORK/tree-venv/bin/pip" install $pip_quiet "$tree"
install_checks tree "$WORK/tree-venv"
if grep -q '^#define KOLO_HAVE_MPI 1' "$top/config.h" 2>/dev/null; then
    run "tree: the build has what configure finds (MPI here)" \
        grep -q '\[X\] MPI' "$WORK/tree.check"
fi
uninstall_check tree "$WORK/tree-venv"

smoke_point "$pass" "$fail"

# ---- a wheel -------------------------------------------------------------------
run "pip wheel (HOROVOD_WITHOUT_MPI=1) makes one platform wheel" \
    env HOROVOD_WITHOUT_MPI=1 "$WORK/tree-venv/bin/pip" wheel $pip_quiet \
    --no-deps -w "$WORK/wheels" "$tree"
wheel=$(ls "$WORK"/wheels/kolo-*-linux_*.whl 2>/dev/null | head -n 1)
venv_new wheel-venv
run "wheel: pip install --only-binary :all: (nothing built)" \
    "$WORK/wheel-venv/bin/pip" install $pip_quiet --only-binary :all: \
    "${wheel:-$WORK/wheels/no-wheel-was-made.whl}"
install_checks wheel "$WORK/wheel-venv"
run "wheel: HOROVOD_WITHOUT_MPI=1 left MPI out" \
    sh -c 'grep -q "\[ \] MPI" "$0" && ! grep -q "\[X\] MPI" "$0"' \
    "$WORK/wheel.check"
uninstall_check wheel "$WORK/wheel-venv"

# ---- what the build refuses ----------------------------------------------------
# expect_refused DESCRIPTION PATTERN VAR=VALUE...: pip install fails with
# PATTERN in its output.
expect_refused() {
    local desc=$1 pattern=$2
    shift 2
    run "$desc" sh -c '"$@" >"$WORK/refused" 2>&1 && exit 1
        grep -q -e "$0" "$WORK/refused" || { tail -n 20 "$WORK/refused"; exit 1; }' \
        "$pattern" env "$@" "$WORK/tree-venv/bin/pip" install \
        $pip_quiet "$tree"
}
expect_refused "HOROVOD_GPU_OPERATIONS=MPI is refused: NCCL only" \
    "kolo carries CUDA tensors on NCCL only" HOROVOD_GPU_OPERATIONS=MPI
expect_refused "HOROVOD_WITH_TENSORFLOW=1 is refused: no TensorFlow binding" \
    "kolo has no TensorFlow binding" HOROVOD_WITH_TENSORFLOW=1
expect_refused "KOLO_WITHOUT_MPI=maybe is refused, naming the variable" \
    "KOLO_WITHOUT_MPI=maybe: expected 1" KOLO_WITHOUT_MPI=maybe
expect_refused "without Gloo and MPI, configure's own message stops pip" \
    "configure: error: kolo needs a host backend" \
    HOROVOD_WITHOUT_GLOO=1 KOLO_WITHOUT_MPI=1
run "nothing of kolo is left in the venv" \
    sh -c '[ -x "$0/bin/pip" ] && ! find "$0" -name "*kolo*" | grep .' \
    "$WORK/tree-venv"

finish
