"""pytorch_synthetic_benchmark.py — images per second of a torchvision
model trained on synthetic data with DistributedOptimizer: the benchmark
Horovod users know (its flags and its output lines), written for kolo. A
script written for horovod.torch needs only its import changed.

    kolorun -np 2 python3 pytorch_synthetic_benchmark.py --model resnet50

Rank 0 prints the images per second of each iteration, then the mean and
its 95% confidence interval per rank and over all ranks.
"""
import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim
from torchvision import models

import kolo.torch as hvd  # Horovod: import horovod.torch as hvd

parser = argparse.ArgumentParser(
    description="PyTorch synthetic benchmark",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="resnet50",
                    help="model to benchmark (a torchvision model's name)")
parser.add_argument("--batch-size", type=int, default=32,
                    help="input batch size, per rank")
parser.add_argument("--image-size", type=int, default=224,
                    help="height and width of the synthetic images")
parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="number of warm-up batches that don't count "
                         "towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10,
                    help="number of benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="use adasum algorithm to do reduction")


def main():
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
    else:
        # One thread per rank: the ranks of a host share its cores.
        torch.set_num_threads(1)

    model = getattr(models, args.model)()
    # Adasum keeps the learning rate; a sum scales it by the number of ranks.
    lr_scaler = 1 if args.use_adasum else hvd.size()
    if args.cuda:
        model.cuda()
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = hvd.local_size()
    optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = (hvd.Compression.fp16 if args.fp16_allreduce
                   else hvd.Compression.none)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average)

    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Synthetic data, the same every batch.
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.LongTensor(args.batch_size).random_() % 1000
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    device = "GPU" if args.cuda else "CPU"
    log("Model: %s" % args.model)
    log("Batch size: %d" % args.batch_size)
    log("Number of %ss: %d" % (device, hvd.size()))

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        img_secs.append(img_sec)

    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log("Img/sec per %s: %.1f +-%.1f" % (device, img_sec_mean, img_sec_conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f"
        % (hvd.size(), device, hvd.size() * img_sec_mean,
           hvd.size() * img_sec_conf))


if __name__ == "__main__":
    main()
