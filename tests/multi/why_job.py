"""why_job.py MODE — the jobs tests/multi/run-why.sh explains after
the fact: each rank runs steps of named allreduces through the NumPy API
and checks every result against the sum it computes itself.

Modes (R = the last rank):
  healthy    FLIGHT_STEPS steps (default 40), FLIGHT_STEP_S apart (0.05)
  skip       step 3: rank R skips 'grad.b' and goes on to 'metric.loss'
  sleep      step 3: rank 1 sleeps in load_batch() (FLIGHT_SLEEP_S, 600)
  busy       rank R computes FLIGHT_BUSY_MS (60) longer than the others
             every step (a busy loop): a straggler
  mismatch   step 2: rank 1 sends 'grad.a' with 5 elements, the others 4
  long       steps without end (a rank is then stopped or killed)
Every rank writes its pid to $FLIGHT_PIDS/rank<R>.pid first.
"""
import os
import sys
import time

import numpy as np

import kolo


def load_batch(seconds):
    """Stands for a data loader that never returns."""
    time.sleep(seconds)


def compute(seconds):
    """A busy loop: a rank whose step costs more."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def allreduce(name, n, step):
    v = np.full(n, kolo.rank() + step, np.float32)
    out = kolo.allreduce(v, op=kolo.Sum, name=name)
    want = sum(r + step for r in range(kolo.size()))
    if not np.all(out == want):
        sys.exit("rank %d: %s = %s, want %s" % (kolo.rank(), name, out[:3], want))


def step(mode, i, last):
    me = kolo.rank()
    if mode == "sleep" and i == 3 and me == 1:
        load_batch(float(os.environ.get("FLIGHT_SLEEP_S", "600")))
    if mode == "busy":
        extra = float(os.environ.get("FLIGHT_BUSY_MS", "60")) / 1e3
        compute(0.02 + (extra if me == last else 0))
    else:
        time.sleep(float(os.environ.get("FLIGHT_STEP_S", "0.05")))
    n = 5 if mode == "mismatch" and i == 2 and me == 1 else 4
    allreduce("grad.a", n, i)
    if not (mode == "skip" and i == 3 and me == last):
        allreduce("grad.b", 256, i)
    allreduce("metric.loss", 1, i)


def main():
    mode = sys.argv[1]
    kolo.init()
    pids = os.environ.get("FLIGHT_PIDS")
    if pids:
        with open(os.path.join(pids, "rank%d.pid" % kolo.rank()), "w") as f:
            f.write("%d\n" % os.getpid())
    steps = int(os.environ.get("FLIGHT_STEPS", "40"))
    i = 0
    while mode == "long" or i < steps:
        step(mode, i, kolo.size() - 1)
        i += 1
    print("rank %d: %d steps, every result right" % (kolo.rank(), i))
    kolo.shutdown()


if __name__ == "__main__":
    main()
