#!/usr/bin/env bash
# run-launchers.sh — kolo jobs started by other launchers, Horovod's
# variables, and kolo.run. Each run is bounded in time (run-lib.sh), and
# prints one line; the summary is "N passed, N failed".
#
#  - torchrun: 2 ranks on one node (--standalone), and 2 agents of 2 ranks
#    each as two "nodes" of one machine (static rendezvous: torchrun's own
#    TCPStore holds MASTER_PORT, kolo's rank 0 serves MASTER_PORT+1, or a
#    next port where another program holds that one);
#  - srun: Slurm's variables of a job step, set by hand, one node and two;
#  - HOROVOD_* variables read as their KOLO_* twins by every rank, and the
#    warnings about twins that differ and variables kolo cannot honour;
#  - kolo.run at 2 ranks (tests/python/test_run.py, with plain pytest).
#
# Usage: tests/multi/run-launchers.sh   (from the build directory; `make
# check` runs it with KOLO_TOP_BUILDDIR, KOLO_TOP_SRCDIR, KOLO_PYTHON set)
set -u
top=${KOLO_TOP_BUILDDIR:-.}
src=${KOLO_TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
python=${KOLO_PYTHON:-/usr/bin/python3}
kolorun=$top/kolorun
prog=$top/tests/multi/test-allreduce
. "$(dirname "$0")/../run-lib.sh"
. "$(dirname "$0")/../script-lib.sh"

# Nothing of an outer job may leak into these: nor the caller's KOLO_*
# settings (kolo warns about some, which the cases count).
clear_kolo_env KOLO_PYTHON
unset KOLO_RANK KOLO_SIZE KOLO_LOCAL_RANK KOLO_LOCAL_SIZE KOLO_CROSS_RANK \
    KOLO_CROSS_SIZE KOLO_RENDEZVOUS KOLO_HOSTNAME RANK WORLD_SIZE LOCAL_RANK \
    LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE MASTER_ADDR MASTER_PORT
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\)=.*/\1/p; s/^\(HOROVOD_[A-Z_]*\)=.*/\1/p'); do
    unset "$v"
done
export prog kolorun

# A port nobody listens on, and the next one free too (kolo's rank 0
# serves MASTER_PORT+1 where it is free).
free_port() {
    "$python" - <<'PY'
import socket
while True:
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1)); print(p); break
    except OSError:
        pass
    finally:
        a.close(); b.close()
PY
}

# expect_all LOG N TEXT: LOG holds TEXT at least N times.
expect_all() {
    local got
    got=$(grep -c -- "$3" "$1")
    [ "$got" -ge "$2" ] || { echo "'$3': $got times in $1, want $2"; cat "$1"; return 1; }
}
export -f expect_all

# ---- torchrun -------------------------------------------------------------

torchrun() { "$python" -m torch.distributed.run --redirects 1 --tee 1 "$@"; }
if "$python" -c 'import torch.distributed.run' 2>/dev/null; then
    export python
    export -f torchrun
    run "torchrun --standalone, 2 ranks: allreduce, every rank placed" bash -c '
        log=$(mktemp) && trap "rm -f $log" EXIT &&
        KOLO_LOG_LEVEL=debug torchrun --standalone --nproc_per_node 2 \
            --no_python "$prog" random 3 >"$log" 2>&1 || {
            # the ranks lines last: what the tail of a failure shows
            cat "$log"; grep -a "ERROR\|FAIL\|rank [0-9]:" "$log" | tail -n 8; exit 1; }
        expect_all "$log" 1 "rank 0 of 2, shm backend" &&
        expect_all "$log" 1 "rank 1 of 2, shm backend" &&
        expect_all "$log" 1 "serving the job.s rendezvous on port"'
    port=$(free_port)
    run "torchrun, 2 nodes of 2 ranks (static, MASTER_PORT+1): hierarchical" bash -c '
        log=$(mktemp) && trap "rm -f $log*" EXIT
        pids= bad=0
        for node in 0 1; do
            KOLO_LOG_LEVEL=debug torchrun --nnodes 2 --node_rank $node \
                --nproc_per_node 2 --master_addr 127.0.0.1 --master_port '"$port"' \
                --no_python "$prog" random 3 >"$log.$node" 2>&1 &
            pids="$pids $!"
        done
        # By pid: a job spec (%2) is gone once that job has ended and been
        # reported, which made this case fail when node 1 ended first.
        for p in $pids; do wait "$p" || bad=1; done
        [ "$bad" = 0 ] || { cat "$log".*; exit 1; }
        cat "$log".* >"$log"
        for r in 0 1 2 3; do expect_all "$log" 1 "rank $r of 4, hier backend" || exit 1; done
        expect_all "$log" 1 "on port '"$((port + 1))"' (torchrun"'
    run "torchrun with KOLO_CONTROLLER=gloo: Gloo meets at rank 0's store" bash -c '
        KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo torchrun --standalone \
            --nproc_per_node 2 --no_python "$prog" random 2'
    # Another program listens on MASTER_PORT+1 (and never answers): rank 0
    # serves on a next port, and the others find it there.
    port=$(free_port)
    export port
    run "torchrun whose MASTER_PORT+1 another program holds: a next port serves" bash -c '
        log=$(mktemp) && trap "rm -f $log $log.held; kill \$holder 2>/dev/null" EXIT
        "$python" -c "import socket, sys, time
s = socket.socket(); s.bind((\"0.0.0.0\", int(sys.argv[1]))); s.listen(1)
print(\"held\", flush=True); time.sleep(300)" $((port + 1)) >"$log.held" &
        holder=$!
        for _ in $(seq 100); do [ -s "$log.held" ] && break; sleep 0.1; done
        KOLO_LOG_LEVEL=debug torchrun --nnodes 1 --nproc_per_node 2 \
            --master_addr 127.0.0.1 --master_port $port \
            --no_python "$prog" random 2 >"$log" 2>&1 || { cat "$log"; exit 1; }
        expect_all "$log" 2 "port $((port + 1)) was taken: the job.s rendezvous is redis:127.0.0.1:" &&
        expect_all "$log" 2 ": PASS random"'
else
    echo "SKIP torchrun: $python cannot import torch.distributed.run"
fi

# ---- srun -------------------------------------------------------------------

# srun_job NODES PER_NODE [VAR=VALUE...]: starts NODES*PER_NODE ranks of
# test-allreduce with the variables srun gives the tasks of a step (one
# machine plays every node), and waits for all of them.
srun_job() {
    local nodes=$1 per=$2 n pids="" log rc=0
    shift 2
    n=$((nodes * per))
    log=$(mktemp)
    for ((r = 0; r < n; r++)); do
        env "$@" SLURM_JOB_ID="${JOB:-$$}" SLURM_STEP_ID=0 SLURM_PROCID=$r \
            SLURM_NTASKS=$n SLURM_LOCALID=$((r % per)) SLURM_NODEID=$((r / per)) \
            SLURM_NNODES="$nodes" SLURM_TASKS_PER_NODE="$per(x$nodes)" \
            SLURM_JOB_NODELIST="localhost" KOLO_LOG_LEVEL=debug \
            "$prog" random 2 >>"$log" 2>&1 &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || rc=1; done
    if [ $rc -ne 0 ]; then cat "$log"; rm -f "$log"; return 1; fi
    for ((r = 0; r < n; r++)); do
        expect_all "$log" 1 "rank $r of $n, ${BACKEND:-shm} backend" || { rm -f "$log"; return 1; }
    done
    rm -f "$log"
}
export -f srun_job
# One node: the port comes from the job and step ids (30000 + (job * 16 +
# step) mod 30000): a job id whose port is free, as a real job's rarely
# collides.
job=$("$python" - <<'PY'
import random, socket
while True:
    job = random.randrange(1, 1 << 30)
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", 30000 + job * 16 % 30000)); print(job); break
    except OSError:
        pass
    finally:
        s.close()
PY
)
run "srun, one node of 2 tasks (Slurm's variables only)" \
    env JOB=$job bash -c 'srun_job 1 2'
port=$(free_port)
run "srun, 2 nodes of 2 tasks, MASTER_ADDR/MASTER_PORT given" \
    env BACKEND=hier bash -c "srun_job 2 2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port"

# ---- HOROVOD_* variables ------------------------------------------------------

run "HOROVOD_* twins set every rank's settings (units as Horovod's)" bash -c '
    log=$(mktemp) && trap "rm -f $log" EXIT &&
    HOROVOD_FUSION_THRESHOLD=65536 HOROVOD_CYCLE_TIME=2.5 HOROVOD_LOG_LEVEL=DEBUG \
        HOROVOD_CPU_OPERATIONS=GLOO HOROVOD_CONTROLLER=GLOO \
        "$kolorun" -np 2 "$prog" random 2 >"$log" 2>&1 || { cat "$log"; exit 1; }
    expect_all "$log" 2 "gloo backend, fusion threshold 65536 bytes, cycle time 2.5 ms"'
run "KOLO_* wins over a twin that differs, with a warning" bash -c '
    log=$(mktemp) && trap "rm -f $log" EXIT &&
    KOLO_CYCLE_TIME=3 HOROVOD_CYCLE_TIME=1 KOLO_LOG_LEVEL=debug \
        "$kolorun" -np 2 "$prog" random 1 >"$log" 2>&1 || { cat "$log"; exit 1; }
    expect_all "$log" 2 "cycle time 3 ms" &&
    expect_all "$log" 1 "WARNING: KOLO_CYCLE_TIME=3 and HOROVOD_CYCLE_TIME=1 are both set and differ: kolo uses KOLO_CYCLE_TIME"'
run "a HOROVOD_* variable kolo cannot honour: one warning, with the reason" bash -c '
    log=$(mktemp) && trap "rm -f $log" EXIT &&
    HOROVOD_HIERARCHICAL_ALLGATHER=1 HOROVOD_FUSION_TRESHOLD=1 \
        "$kolorun" -np 2 "$prog" random 1 >"$log" 2>&1 || { cat "$log"; exit 1; }
    expect_all "$log" 1 "HOROVOD_HIERARCHICAL_ALLGATHER=1 is ignored: kolo has no hierarchical allgather" &&
    expect_all "$log" 1 "HOROVOD_FUSION_TRESHOLD is not a Horovod variable kolo knows, and is ignored (did you mean HOROVOD_FUSION_THRESHOLD?)" &&
    [ "$(grep -c "HOROVOD_[A-Z_]*[= ].*is ignored" "$log")" -eq 2 ]'
run "ranks whose HOROVOD_FUSION_THRESHOLD differs: the agreement names it" bash -c '
    log=$(mktemp) && trap "rm -f $log" EXIT
    "$kolorun" -np 2 --failure-grace 10 sh -c \
        "HOROVOD_FUSION_THRESHOLD=\$((KOLO_RANK + 1))M exec \"\$0\" random 1" "$prog" \
        >"$log" 2>&1 && { echo "the job should have failed"; exit 1; }
    expect_all "$log" 1 "KOLO_FUSION_THRESHOLD is 1048576 on rank 0 and 2097152 on rank 1"'
run "a process started by horovodrun: kolo_init says to use kolorun" bash -c '
    log=$(mktemp) && trap "rm -f $log" EXIT
    HOROVOD_RANK=0 HOROVOD_SIZE=2 HOROVOD_GLOO_RENDEZVOUS_ADDR=127.0.0.1 \
        HOROVOD_GLOO_RENDEZVOUS_PORT=1 "$prog" random 1 >"$log" 2>&1 &&
        { echo "it should have failed"; exit 1; }
    expect_all "$log" 1 "started by horovodrun, whose rendezvous kolo cannot use"'

# ---- kolo.run ------------------------------------------------------------------

# A sanitizer build of libkolo: preload its runtime into the interpreter
# (this case comes last: the C programs above need none).
# shellcheck source=tests/python/sanitizer-preload.sh
. "$src/tests/python/sanitizer-preload.sh"
if ! kolo_python_preload "$top/.libs/libkolo.so"; then
    echo "SKIP kolo.run: $kolo_preload_why"
elif "$python" -c 'import numpy, pytest' 2>/dev/null; then
    run "kolo.run at 2 ranks: values in rank order, a rank's exception" \
        env PYTHONPATH="$src/bindings/python" KOLO_LIBRARY="$top/.libs/libkolo.so" \
        PYTHONDONTWRITEBYTECODE=1 "$python" -m pytest -q -p no:cacheprovider \
        --noconftest "$src/tests/python/test_run.py"
else
    echo "SKIP kolo.run: $python cannot import numpy and pytest"
fi

finish
