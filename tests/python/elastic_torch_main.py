"""elastic_torch_main.py — an elastic horovod.torch-style training job for
tests/python/run-elastic.sh, written against the API only (import
kolo.torch as hvd, hvd.elastic.run, hvd.elastic.TorchState,
state.commit(), register_reset_callbacks).

3 epochs of 10 batches of a Linear(2, 2) model under DistributedOptimizer
(plain SGD, lr = LR * size, rescaled by a reset callback after every
re-form). Every rank trains on the same batch at each (epoch, batch), so
the averaged gradient does not depend on the number of ranks and the
weights after a run depend only on the learning rate in force at each
committed step: the driver replays that sequence and checks the final
weights exactly.

At the end of each epoch rank 0 appends one JSON line to LOGFILE (the
discovery scripts of the tests read how many lines there are): epoch,
batch, commits, hostname, start_rank, rank, size, rendezvous, lr. At the
end every rank appends its final weights to LOGFILE.weights.

--zero: a ZeroRedundancyOptimizer of SGD with momentum 0.9 (its state is
sharded over the ranks and must survive the failures and re-forms).

--exit-schedule '{"1,0": [0]}': the worker first started as rank 0 fails
at epoch 1, batch 0, before the step: --exit-mode exception raises,
--exit-mode kill SIGKILLs itself.
"""
import argparse
import json
import os
import signal
import socket
import sys
import time

import torch

import kolo.torch as hvd
from kolo import _core  # kolo_hosts_updated(), for the wait below

LR = 0.01
MOMENTUM = 0.9  # --zero
EPOCHS = 3
BATCHES = 10


def batch_data(epoch, batch):
    g = torch.Generator().manual_seed(1000 * epoch + batch)
    return torch.rand(4, 2, generator=g, dtype=torch.float64)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--logfile", required=True)
    p.add_argument("--exit-schedule", default="{}")
    p.add_argument("--exit-mode", default="exception",
                   choices=["exception", "kill"])
    p.add_argument("--step-sleep", type=float, default=0,
                   help="seconds each step lasts at least")
    p.add_argument("--zero", action="store_true",
                   help="kolo.torch.ZeroRedundancyOptimizer (SGD with "
                        "momentum) instead of DistributedOptimizer")
    p.add_argument("--wait-update", default="",
                   help="epochs after which rank 0 waits for a new membership")
    args = p.parse_args()
    args.wait_update = {int(e) for e in args.wait_update.split(",") if e}
    schedule = {tuple(int(v) for v in k.split(",")): set(r)
                for k, r in json.loads(args.exit_schedule).items()}

    hvd.init()
    # The rank this worker had when it started, as Horovod's test keeps it.
    start_rank = int(os.environ.get("HOROVOD_RANK",
                                    os.environ.get("KOLO_RANK", "0")))
    hostname = os.environ.get("KOLO_HOSTNAME", socket.gethostname())

    torch.manual_seed(7)
    model = torch.nn.Linear(2, 2).double()
    if args.zero:
        # The state sharded: momentum buffers the job must keep across
        # failures and re-forms.
        optimizer = hvd.ZeroRedundancyOptimizer(
            model.parameters(), torch.optim.SGD, lr=LR * hvd.size(),
            momentum=MOMENTUM)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=LR * hvd.size())
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters())

    state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0,
                                   commits=0, rendezvous=0)

    def on_reset():
        for group in optimizer.param_groups:
            group["lr"] = LR * hvd.size()

    state.register_reset_callbacks([on_reset])

    def check_exit(epoch, batch):
        if start_rank in schedule.get((epoch, batch), ()):
            # When it failed, for the recovery time the driver reports.
            with open(args.logfile + ".failed_at", "a") as f:
                f.write("%.6f\n" % time.time())
            if args.exit_mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("scheduled failure of start rank %d at epoch "
                               "%d, batch %d" % (start_rank, epoch, batch))

    @hvd.elastic.run
    def train(state):
        state.rendezvous += 1
        first = True
        while state.epoch < EPOCHS:
            while state.batch < BATCHES:
                check_exit(state.epoch, state.batch)
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                optimizer.zero_grad()
                loss = model(batch_data(state.epoch, state.batch)).pow(2).sum()
                loss.backward()
                optimizer.step()
                if first and hvd.rank() == 0 and state.rendezvous > 1:
                    # The first step completed after a re-form.
                    with open(args.logfile + ".recovered", "a") as f:
                        f.write("%.6f\n" % time.time())
                first = False
                state.batch += 1
                state.commits += 1
                state.commit()
            if hvd.rank() == 0:
                wait_update = state.epoch in args.wait_update
                with open(args.logfile, "a") as f:
                    f.write(json.dumps({
                        "epoch": state.epoch, "batch": state.batch,
                        "commits": state.commits, "hostname": hostname,
                        "start_rank": start_rank, "rank": hvd.rank(),
                        "size": hvd.size(), "rendezvous": state.rendezvous,
                        "lr": optimizer.param_groups[0]["lr"]}) + "\n")
                if wait_update:
                    # The discovery script changes the hosts on this line:
                    # give kolorun time to publish before the commit looks
                    # (as Horovod's test waits for its notification).
                    deadline = time.time() + 10
                    while not _core.hosts_updated() and \
                            time.time() < deadline:
                        time.sleep(0.05)
            state.epoch += 1
            state.batch = 0
            state.commits += 1
            state.commit()

    train(state)
    weights = [v.tolist() for v in model.state_dict().values()]
    with open(args.logfile + ".weights", "a") as f:
        f.write(json.dumps({"rank": hvd.rank(), "size": hvd.size(),
                            "commits": state.commits,
                            "weights": weights}) + "\n")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
