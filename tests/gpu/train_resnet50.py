"""ResNet-50 training steps on one GPU: plain torch, kolo.torch's
DistributedOptimizer, or torch's DistributedDataParallel, so that the cost
of kolo in a training step is measured against both in one run.

    python3 train_resnet50.py plain|ddp [fp32|bf16]
    kolorun -np 1 python3 train_resnet50.py kolo [fp32|bf16]

torchvision's ResNet-50, batch 128, channels_last, synthetic data, SGD
with momentum; bf16 runs the forward pass under torch.autocast. After 15
warm-up steps it times 5 rounds of 10 steps (each round ends with
torch.cuda.synchronize) and prints one line

    RESULT {"mode": ..., "precision": ..., "ms_median": ..., "ms_min": ...}

with the median and the fastest round's time per step. DDP runs a process
group of one rank over NCCL (MASTER_ADDR/MASTER_PORT default to a local
address), as kolo runs one rank under kolorun.

With KOLO_RESNET_PROFILE=DIR it then runs 3 more steps under
torch.profiler, prints the operators that took the most device and host
time, and writes the Chrome trace to DIR/prof-MODE-PRECISION.json.gz.
"""

import json
import os
import sys
import time

import torch
import torchvision

BATCH = 128
WARMUP = 15
ROUNDS = 5
STEPS = 10


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    precision = sys.argv[2] if len(sys.argv) > 2 else "fp32"
    if mode not in ("plain", "kolo", "ddp") or precision not in ("fp32",
                                                                 "bf16"):
        sys.exit(__doc__)
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    model = torchvision.models.resnet50().to(dev)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if mode == "kolo":
        import kolo.torch as hvd
        hvd.init()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(
            opt, named_parameters=model.named_parameters())
    elif mode == "ddp":
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29555")
        dist.init_process_group("nccl", rank=0, world_size=1)
        model = torch.nn.parallel.DistributedDataParallel(model,
                                                          device_ids=[0])
    x = torch.randn(BATCH, 3, 224, 224, device=dev)
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (BATCH,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16,
                            enabled=precision == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / STEPS)
    times.sort()
    print("RESULT", json.dumps({
        "mode": mode, "precision": precision,
        "ms_median": round(times[ROUNDS // 2] * 1e3, 2),
        "ms_min": round(times[0] * 1e3, 2)}), flush=True)
    if os.environ.get("KOLO_RESNET_PROFILE"):
        profile(step, os.path.join(os.environ["KOLO_RESNET_PROFILE"],
                                   "prof-%s-%s.json.gz" % (mode, precision)))
    if mode == "kolo":
        hvd.shutdown()
    elif mode == "ddp":
        dist.destroy_process_group()


def profile(step, path):
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CPU,
                                            ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    for key in ("self_cuda_time_total", "self_cpu_time_total"):
        try:
            print(avg.table(sort_by=key, row_limit=22, max_name_column_width=60),
                  flush=True)
        except Exception as e:  # a column another torch names otherwise
            print("profile table by %s: %s" % (key, e), flush=True)
    if path.endswith(".gz"):
        import gzip
        import shutil
        raw = path[:-3]
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(raw)
    else:
        prof.export_chrome_trace(path)


if __name__ == "__main__":
    main()
