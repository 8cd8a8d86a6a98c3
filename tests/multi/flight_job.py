"""flight_job.py — a kolo.torch job that tests/multi/run-flight.sh signals
while it runs.

    kolorun -np N python3 flight_job.py SIGNALLED WANT_ALL OUT

Every step allreduces three tensors by name and checks each sum against
the one computed here. From step 5 on, rank SIGNALLED has its pid in
OUT/pid (written whole: the script sends it SIGUSR1 then), and every rank
looks at its own dump in KOLO_FLIGHT_DIR: the first time its reason is
the one the signal should bring ("SIGUSR1" on the signalled rank, "asked
by rank SIGNALLED ..." on the others), the rank copies the dump to
OUT/signalled.rank<R>.json. The ranks stop together (an allreduce of
whether each may stop) once the signalled rank has its copy, and every
rank too where WANT_ALL is 1, or after 40 s; each writes
OUT/result.rank<R> ("ok", the steps run and whether it saw its dump).
"""

import os
import sys
import time

import torch

import kolo.torch as hvd


def wanted(reason, rank, signalled):
    if rank == signalled:
        return reason == "SIGUSR1"
    return reason.startswith("asked by rank %d" % signalled)


def look(folder, rank, signalled, out):
    """Copies this rank's dump to OUT once its reason is the wanted one."""
    import json

    path = os.path.join(folder, "rank%d.json" % rank)
    try:
        with open(path, "rb") as f:
            data = f.read()
        reason = json.loads(data.decode("utf-8"))["reason"]
    except (OSError, ValueError, KeyError):
        return False
    if not wanted(reason, rank, signalled):
        return False
    with open(os.path.join(out, "signalled.rank%d.json" % rank), "wb") as f:
        f.write(data)
    return True


def step(i, rank, size):
    for t in range(3):
        x = torch.full((1000,), float(rank + 1 + i + t))
        y = hvd.allreduce(x, name="grad.%d" % t, op=hvd.Sum)
        want = float(sum(r + 1 + i + t for r in range(size)))
        if not torch.all(y == want):
            raise SystemExit("rank %d step %d: grad.%d is %s, not %s"
                             % (rank, i, t, y[:3].tolist(), want))


def main():
    signalled, want_all, out = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
    folder = os.environ["KOLO_FLIGHT_DIR"]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    start, seen, i = time.time(), False, 0
    while True:
        step(i, rank, size)
        if i == 5 and rank == signalled:
            with open(os.path.join(out, "pid.tmp"), "w") as f:
                f.write("%d\n" % os.getpid())
            os.rename(os.path.join(out, "pid.tmp"), os.path.join(out, "pid"))
        if i >= 5 and not seen:
            seen = look(folder, rank, signalled, out)
        may_stop = seen or (rank != signalled and not want_all)
        may_stop = may_stop or time.time() - start > 40
        flag = hvd.allreduce(torch.tensor([1.0 if may_stop else 0.0]),
                             name="may_stop", op=hvd.Min)
        i += 1
        if flag.item() == 1.0:
            break
        time.sleep(0.01)
    with open(os.path.join(out, "result.rank%d" % rank), "w") as f:
        f.write("ok steps=%d seen=%d\n" % (i, seen))
    hvd.shutdown()


if __name__ == "__main__":
    main()
