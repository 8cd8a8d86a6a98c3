#!/usr/bin/env python3
"""Data-parallel training of a small MLP with kolo.torch, the way a Horovod
script does it (only the import changes):

    kolorun -np 2 /usr/bin/python3 bindings/python/examples/train_torch.py

The data set is synthetic (a fixed random teacher network labels Gaussian
inputs, 10 classes), the same on every rank; each rank trains on its own
shard of every epoch. Rank 0 prints the loss (averaged over the ranks), the
accuracy and the samples per second; at the end every rank checks that all
ranks hold identical parameters.

Options: --epochs N, --batch-size B (per rank), --lr LR (scaled by the
number of ranks), --fp16 (allreduce gradients in float16 with dynamic loss
scaling), --backward-passes N (accumulate N sub-batches per step),
--use-adasum (DistributedOptimizer(op=hvd.Adasum): each rank applies its own
update and the changes are combined with Adasum; as in Horovod's
pytorch_mnist.py --use-adasum, the learning rate is then not scaled by the
number of ranks. Horovod's example scales it by local_size() for CUDA
tensors with NCCL, where Horovod averages within a node; kolo applies the
same Adasum over all ranks on every device, so the factor stays 1.)
"""

import argparse
import time

import torch
import torch.nn as nn

import kolo.torch as hvd


def make_dataset(n=8192, dim=32, classes=10, seed=1234):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    teacher = torch.randn(dim, classes, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(n, classes, generator=g)).argmax(1)
    return x, y


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--backward-passes", type=int, default=1)
    ap.add_argument("--use-adasum", action="store_true")
    args = ap.parse_args()
    if args.use_adasum and args.fp16:
        ap.error("--use-adasum cannot be combined with --fp16 (loss scaling "
                 "is not supported with Adasum, as in Horovod)")
    return args


def make_model(args):
    """The model, and its optimizer wrapped in DistributedOptimizer, the
    same on every rank."""
    torch.manual_seed(hvd.rank())  # different on purpose: broadcast fixes it
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(),
                          nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    # Adasum needs no scaling of the learning rate by the number of ranks
    lr_scaler = 1 if args.use_adasum else hvd.size()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler,
                          momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16 else
        hvd.Compression.none,
        backward_passes_per_step=args.backward_passes,
        op=hvd.Adasum if args.use_adasum else hvd.Average)
    return model, opt


def train_epoch(epoch, model, opt, scaler, train_set, args):
    """One epoch on this rank's shard; the loss (averaged over the ranks)
    and the samples per second (summed)."""
    x_train, y_train = train_set
    loss_fn = nn.CrossEntropyLoss()
    passes = args.backward_passes
    step_rows = args.batch_size * passes
    model.train()
    perm = torch.randperm(len(x_train),
                          generator=torch.Generator().manual_seed(epoch))
    shard = perm[hvd.rank()::hvd.size()]  # this rank's part of the epoch
    steps = len(shard) // step_rows
    total, seen = 0.0, 0
    start = time.perf_counter()
    for step in range(steps):
        idx = shard[step * step_rows:(step + 1) * step_rows]
        opt.zero_grad()
        for k in range(passes):
            sub = idx[k * args.batch_size:(k + 1) * args.batch_size]
            loss = loss_fn(model(x_train[sub]), y_train[sub]) / passes
            scaler.scale(loss).backward()
            total += float(loss) * len(sub) * passes
            seen += len(sub)
        scaler.step(opt)
        scaler.update()
    elapsed = time.perf_counter() - start
    # every rank's figures, averaged (loss) and summed (throughput)
    mean_loss = hvd.allreduce(torch.tensor(total / max(seen, 1)),
                              name="epoch.loss").item()
    rate = hvd.allreduce(torch.tensor(seen / elapsed), op=hvd.Sum,
                         name="epoch.rate").item()
    return mean_loss, rate


def accuracy(model, x_test, y_test):
    model.eval()
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item()


def parameters_identical(model):
    """Whether every rank holds the same parameters: their checksums,
    compared."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    mine = [float(flat.double().sum()), float(flat.double().abs().sum())]
    everyone = hvd.allgather_object(mine)
    return all(e == everyone[0] for e in everyone), everyone


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)  # ranks share the machine's cores
    rank, size = hvd.rank(), hvd.size()

    x, y = make_dataset()
    split = int(0.9 * len(x))
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]
    model, opt = make_model(args)
    scaler = hvd.GradScaler(enabled=args.fp16)
    if rank == 0:
        print("kolo.torch: %d ranks, %d training samples, batch %d per rank%s%s%s"
              % (size, len(x_train), args.batch_size,
                 ", fp16 allreduce with loss scaling" if args.fp16 else "",
                 ", %d backward passes per step" % args.backward_passes
                 if args.backward_passes > 1 else "",
                 ", Adasum" if args.use_adasum else ""),
              flush=True)

    for epoch in range(args.epochs):
        loss, rate = train_epoch(epoch, model, opt, scaler,
                                 (x_train, y_train), args)
        acc = accuracy(model, x_test, y_test)
        if rank == 0:
            extra = (", loss scale %g" % scaler.get_scale()) if args.fp16 \
                else ""
            print("epoch %d: loss %.4f, test accuracy %.3f, %.0f samples/s "
                  "(all ranks)%s" % (epoch + 1, loss, acc, rate, extra),
                  flush=True)

    same, everyone = parameters_identical(model)
    if rank == 0:
        print("parameters identical on all %d ranks: %s"
              % (size, "yes" if same else "NO"), flush=True)
    hvd.shutdown()
    if not same:
        raise SystemExit("rank %d: parameters differ between ranks: %s"
                         % (rank, everyone))


if __name__ == "__main__":
    main()
