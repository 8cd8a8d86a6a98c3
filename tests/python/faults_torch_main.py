"""A short kolo.torch training job for tests/multi/run-faults.sh.

Two ranks train a small network for a few steps with the horovod.torch API
(broadcast_parameters, DistributedOptimizer with its backward hooks, an
averaged metric), then each rank prints a hash of its weights:

    rank R: weights hash HEX

run-faults.sh makes one allocation of libkolo fail on one rank and checks
that the job either ends with the same weights as a clean run or fails on
every rank with a message naming the cause.
"""

import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "bindings", "python"))

import torch  # noqa: E402

import kolo.torch as hvd  # noqa: E402


def main():
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
