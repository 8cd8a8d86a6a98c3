"""A rank that fails, for tests/python/run-blame.sh.

    blame_main.py VICTIM KIND

Every rank runs small allreduces with the NumPy binding; at step 5 rank
VICTIM fails in one of three ways, as a training script does:

    raise   an uncaught Python exception (exit status 1; kolo shuts down
            at exit, so the others are told "rank VICTIM has shut down")
    exit    sys.exit(3)
    kill    SIGKILL to itself

The others then fail on their next allreduce with kolo's error, uncaught:
they exit 1 too, often before the victim has finished exiting, which is
what kolorun must not take for the cause.
"""

import os
import signal
import sys

import numpy as np

import kolo


def main():
    victim, kind = int(sys.argv[1]), sys.argv[2]
    kolo.init()
    x = np.ones(4, dtype=np.float32)
    for step in range(20):
        if step == 5 and kolo.rank() == victim:
            if kind == "raise":
                raise RuntimeError("a bug in rank %d's training step" % victim)
            if kind == "exit":
                sys.exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        kolo.allreduce(x, name="grad")


if __name__ == "__main__":
    main()
