"""flight_error_job.py — a kolo.torch job whose ranks disagree on a
tensor's shape (tests/multi/run-flight.sh):

    kolorun -np 2 python3 flight_error_job.py OUT

Both ranks' allreduce of 'odd' fails (a mismatch, which kolo reports
through the handle); the job catches it, waits (20 s at most) for its own
dump to say "error: ..." and copies it to OUT/error.rank<R>.json; then an
allreduce checked against the sum computed here shows the job goes on,
and each rank writes OUT/result.rank<R>.
"""

import json
import os
import sys
import time

import torch

import kolo.torch as hvd


def wait_dump(folder, rank, out):
    path = os.path.join(folder, "rank%d.json" % rank)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            with open(path, "rb") as f:
                data = f.read()
            if json.loads(data.decode("utf-8"))["reason"].startswith("error: "):
                with open(os.path.join(out, "error.rank%d.json" % rank), "wb") as f:
                    f.write(data)
                return True
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    return False


def main():
    out = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    try:
        hvd.allreduce(torch.ones(4 if rank == 0 else 3), name="odd")
        raise SystemExit("rank %d: the mismatch did not fail" % rank)
    except hvd.HorovodInternalError:
        pass
    seen = wait_dump(os.environ["KOLO_FLIGHT_DIR"], rank, out)
    y = hvd.allreduce(torch.full((5,), float(rank + 1)), name="even", op=hvd.Sum)
    if not torch.all(y == float(sum(range(1, size + 1)))):
        raise SystemExit("rank %d: even is %s" % (rank, y.tolist()))
    with open(os.path.join(out, "result.rank%d" % rank), "w") as f:
        f.write("ok seen=%d\n" % seen)
    hvd.shutdown()


if __name__ == "__main__":
    main()
