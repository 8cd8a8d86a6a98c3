"""A short kolo.torch training job for tests/multi/run-faults.sh.

Two ranks train a small network for a few steps with the horovod.torch API
(broadcast_parameters, DistributedOptimizer with its backward hooks, an
averaged metric), then each rank prints a hash of its weights:

    rank R: weights hash HEX

run-faults.sh makes one allocation of libkolo fail on one rank and checks
that the job either ends with the same weights as a clean run or fails on
every rank with a message naming the cause.

With the argument "catch", each rank runs 200 small allreduces and catches
kolo's error instead, printing "rank R: caught: MESSAGE"; the rank where
the test makes allocations fail (KOLO_TEST_FAIL_ALLOC set) then goes on
without kolo (it sleeps), the others exit 1: a program that handles the
error itself must not leave the other ranks waiting for it.
"""

import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "bindings", "python"))

import torch  # noqa: E402

import kolo.torch as hvd  # noqa: E402


def catch():
    hvd.init()
    try:
        for i in range(200):
            hvd.allreduce(torch.ones(10), name="x%d" % (i % 7))
    except Exception as e:  # what a program that handles it would catch
        print("rank %d: caught: %s" % (hvd.rank(), e), flush=True)
        if os.environ.get("KOLO_TEST_FAIL_ALLOC"):
            time.sleep(600)
        sys.exit(1)
    print("rank %d: no error" % hvd.rank(), flush=True)


def main():
    if sys.argv[1:] == ["catch"]:
        catch()
        return
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(1234 + hvd.rank())  # unlike weights: the broadcast
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(99 + hvd.rank())
    for _ in range(steps):
        x = torch.randn(32, 8, generator=gen)
        y = torch.randint(0, 4, (32,), generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        hvd.allreduce(loss.detach(), name="loss")
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print("rank %d: weights hash %s" % (hvd.rank(), h.hexdigest()[:16]),
          flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
