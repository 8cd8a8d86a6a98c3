"""kolo.zero_bench: the sharded optimizer against the replicated one.

    python3 -m kolo.zero_bench [--ranks 2,4] [--steps 100] [--layers 8]
                               [--width 2048] [--batch 32] [--json FILE]

starts one kolorun job per side and number of ranks, one after the other
(each its own processes, so that each has its own peak memory), and prints
a table. The sides train the same model (--layers Linear layers of
--width x --width with ReLU between: 8 x 2048 x 2048 is 33.6 million
parameters) with Adam on the same batches (seeded by step and rank):

  dist        kolo.torch.DistributedOptimizer (every rank holds the whole
              Adam state)
  zero        kolo.torch.ZeroRedundancyOptimizer (each rank holds 1/n)
  torch-zero  torch.distributed.optim.ZeroRedundancyOptimizer with
              DistributedDataParallel on torch's Gloo backend (the same
              ranks; no kolo in the step)

For each: the step time (forward, backward, reduction, update; the
slowest rank's, median over the steps after the first 10), the bytes of
the optimizer's state on a rank, the peak resident memory of a rank (the
largest over the ranks), and how far the parameters are, after the last
step, from dist's (the largest absolute difference of an element).
Timings on a shared machine are noise: compare the sides of one run.

Inside a job (what the driver starts):
    kolorun -np N python3 -m kolo.zero_bench --side dist|zero|torch-zero
        --out DIR [--steps ...]
"""

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SIDES = ("dist", "zero", "torch-zero")


def _model(args, torch):
    torch.manual_seed(0)
    layers = []
    for i in range(args.layers):
        layers.append(torch.nn.Linear(args.width, args.width))
        if i < args.layers - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _batch(args, torch, step, rank):
    g = torch.Generator().manual_seed(100003 * step + rank)
    return (torch.randn(args.batch, args.width, generator=g),
            torch.randn(args.batch, args.width, generator=g))


def _state_bytes(state, torch):
    return sum(v.numel() * v.element_size() for st in state.values()
               for v in st.values() if torch.is_tensor(v))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_side(args):
    import torch
    import kolo.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = _model(args, torch)
    lr = 1e-4
    if args.side == "dist":
        opt = hvd.DistributedOptimizer(
            torch.optim.Adam(model.parameters(), lr=lr),
            named_parameters=model.named_parameters())
        net, state = model, lambda: opt.state
    elif args.side == "zero":
        opt = hvd.ZeroRedundancyOptimizer(model.parameters(),
                                          torch.optim.Adam, lr=lr)
        net, state = model, lambda: opt.optim.state
    else:
        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer
        port = hvd.broadcast_object(_free_port() if rank == 0 else None, 0,
                                    name="zero_bench.port")
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d"
                                % port, rank=rank, world_size=size)
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = ZeroRedundancyOptimizer(model.parameters(),
                                      optimizer_class=torch.optim.Adam, lr=lr)
        state = lambda: opt.optim.state  # noqa: E731
    times = []
    for step in range(args.steps):
        x, y = _batch(args, torch, step, rank)
        hvd.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    every = hvd.allgather_object(
        {"times": times, "state": _state_bytes(state(), torch),
         "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss},
        name="zero_bench.report")
    if rank == 0:
        torch.save([p.detach() for p in model.parameters()],
                   os.path.join(args.out, "%s.params.pt" % args.side))
        slowest = [max(r["times"][i] for r in every)
                   for i in range(args.steps)]
        timed = sorted(slowest[min(10, args.steps - 1):])
        with open(os.path.join(args.out, "%s.json" % args.side), "w") as f:
            json.dump({"step_s": timed[len(timed) // 2],
                       "state_bytes": max(r["state"] for r in every),
                       "peak_bytes": 1024 * max(r["peak_kb"] for r in every),
                       "params": sum(p.numel() for p in model.parameters())},
                      f)
    if args.side == "torch-zero":
        import torch.distributed as dist
        dist.destroy_process_group()
    hvd.shutdown()


def _kolorun(args):
    if args.kolorun:
        return args.kolorun
    found = shutil.which("kolorun")
    if found:
        return found
    # a build tree: bindings/python/kolo/zero_bench.py -> ./kolorun
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.join(here, "..", "..", "..", "kolorun")
    if os.path.exists(tree):
        return os.path.abspath(tree)
    sys.exit("kolo.zero_bench: kolorun is not on PATH (--kolorun PATH)")


def drive(args):
    import torch
    kolorun = _kolorun(args)
    out = tempfile.mkdtemp(prefix="kolo-zero-bench.")
    rows = []
    try:
        for n in [int(r) for r in args.ranks.split(",")]:
            got = {}
            for side in SIDES:
                cmd = [kolorun, "-np", str(n), sys.executable, "-m",
                       "kolo.zero_bench", "--side", side, "--out", out,
                       "--steps", str(args.steps), "--layers",
                       str(args.layers), "--width", str(args.width),
                       "--batch", str(args.batch)]
                rc = subprocess.call(cmd)
                if rc != 0:
                    sys.exit("kolo.zero_bench: %s at %d ranks failed (exit "
                             "%d): %s" % (side, n, rc, " ".join(cmd)))
                with open(os.path.join(out, "%s.json" % side)) as f:
                    got[side] = json.load(f)
                got[side]["final"] = torch.load(
                    os.path.join(out, "%s.params.pt" % side))
            ref = got["dist"]["final"]
            for side in SIDES:
                r = got[side]
                r["max_diff"] = max(float((a - b).abs().max())
                                    for a, b in zip(r.pop("final"), ref))
                r["ranks"], r["side"] = n, side
                rows.append(r)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("kolo.zero_bench: %d parameters (%d layers of %d x %d), Adam, "
          "batch %d per rank, %d steps" % (rows[0]["params"], args.layers,
                                           args.width, args.width,
                                           args.batch, args.steps))
    print("%-5s %-11s %9s %8s %11s %8s %11s %8s %10s" % (
        "ranks", "side", "step ms", "/dist", "state MiB", "/dist",
        "peak MiB", "-dist", "max diff"))
    for r in rows:
        d = next(x for x in rows if x["ranks"] == r["ranks"] and
                 x["side"] == "dist")
        print("%-5d %-11s %9.1f %8.2f %11.1f %8.3f %11.1f %8.1f %10.2g" % (
            r["ranks"], r["side"], 1e3 * r["step_s"],
            r["step_s"] / d["step_s"], r["state_bytes"] / 2 ** 20,
            r["state_bytes"] / d["state_bytes"], r["peak_bytes"] / 2 ** 20,
            (r["peak_bytes"] - d["peak_bytes"]) / 2 ** 20, r["max_diff"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m kolo.zero_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", default=None)
    ap.add_argument("--kolorun", default=None)
    ap.add_argument("--side", choices=SIDES, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.side:
        if not args.out:
            ap.error("--side needs --out")
        run_side(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
