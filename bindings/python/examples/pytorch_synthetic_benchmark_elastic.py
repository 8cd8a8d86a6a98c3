"""pytorch_synthetic_benchmark_elastic.py — images per second of a
torchvision model on synthetic data, as an elastic job: the structure of
Horovod's elastic PyTorch synthetic benchmark (hvd.elastic.run,
hvd.elastic.TorchState, state.commit(), register_reset_callbacks), written
for kolo. A script written for horovod.torch needs only its import changed.

    kolorun -np 4 --min-np 2 -H localhost:2,127.0.0.1:2 \\
        python3 pytorch_synthetic_benchmark_elastic.py --model resnet18 \\
        --batch-size 8 --num-iters 5

Kill one worker while it runs: its host is left out, the others go back to
the last commit and go on at the new size, and rank 0 prints the result.
"""
import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from torchvision import models

import kolo.torch as hvd  # Horovod: import horovod.torch as hvd

parser = argparse.ArgumentParser(
    description="PyTorch synthetic benchmark, elastic",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="resnet50",
                    help="model to benchmark")
parser.add_argument("--batch-size", type=int, default=32,
                    help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="number of warm-up batches that don't count "
                         "towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-batches-per-commit", type=int, default=1,
                    help="number of batches per commit of the elastic state")
parser.add_argument("--num-iters", type=int, default=10,
                    help="number of benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="use adasum algorithm to do reduction")

args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()

if args.cuda:
    torch.cuda.set_device(hvd.local_rank())

model = getattr(models, args.model)()

# Adasum keeps the learning rate; a sum scales it by the number of ranks.
lr_scaler = 1 if args.use_adasum else hvd.size()
if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

lr = 0.01
optimizer = optim.SGD(model.parameters(), lr=lr * lr_scaler)
compression = hvd.Compression.fp16 if args.fp16_allreduce \
    else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average)

# Synthetic data, the same every batch.
data = torch.randn(args.batch_size, 3, 224, 224)
target = torch.LongTensor(args.batch_size).random_() % 1000
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step(state):
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()
    state.batch += 1
    if state.batch == args.num_batches_per_commit:
        state.batch = 0
        state.commit()


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


@hvd.elastic.run
def run_benchmark(state):
    log("Model: %s" % args.model)
    log("Batch size: %d" % args.batch_size)
    device = "GPU" if args.cuda else "CPU"
    log("Number of %ss: %d" % (device, hvd.size()))

    if not state.warm:
        log("Running warmup...")
        timeit.timeit(lambda: benchmark_step(state),
                      number=args.num_warmup_batches)
        state.warm = True
        state.commit()

    log("Running benchmark...")
    for x in range(state.iter, args.num_iters):
        t = timeit.timeit(lambda: benchmark_step(state),
                          number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        state.img_secs.append(img_sec)
        state.iter = x
        state.commit()


def on_state_reset():
    # The number of ranks changed: scale the learning rate again.
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr * (1 if args.use_adasum else hvd.size())


state = hvd.elastic.TorchState(model, optimizer, img_secs=[], iter=0,
                               batch=0, warm=False)
state.register_reset_callbacks([on_state_reset])
run_benchmark(state)

img_sec_mean = np.mean(state.img_secs)
img_sec_conf = 1.96 * np.std(state.img_secs)
log("Img/sec per %s: %.1f +-%.1f" % ("GPU" if args.cuda else "CPU",
                                     img_sec_mean, img_sec_conf))
log("Total img/sec on %d %s(s): %.1f +-%.1f" % (
    hvd.size(), "GPU" if args.cuda else "CPU", hvd.size() * img_sec_mean,
    hvd.size() * img_sec_conf))
