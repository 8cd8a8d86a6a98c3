"""kolo.bench: what the Python binding (kolo.torch) costs, against the C
API called from the same process.

    kolorun -np N python3 -m kolo.bench [--workload small,resnet50|all]
                                       [--iters N] [--warmup N]
                                       [--small-count N] [--resnet-scale S]
                                       [--json FILE] [--quick]

Run it beside kolo-bench (tools/kolo-bench/), in the same job script: kolo-
bench compares the runtime with a backend called directly; this compares
kolo.torch with the runtime's C API, so that the two ratios together say
where a training loop's time goes. As in kolo-bench, the figure that counts
is the ratio measured within one run: on a shared machine wall times are
noise, a ratio is not.

Sides (each workload, the same tensors and names on both sides):
  torch   through kolo.torch as a training loop calls it
  capi    the C API (kolo_allreduce_async_opts, kolo_wait) called through
          ctypes with everything prepared in advance (names encoded,
          addresses, options): one foreign call per enqueue and per wait,
          the least any Python code can spend per operation

Workloads:
  small     --small-count (1000) tensors of one float32, each enqueued with
            allreduce_async_(t, name=..., op=Sum), then each synchronized:
            allreduces per second; ratio torch/capi (higher is better)
  resnet50  the 161 parameter tensors of torchvision's ResNet-50 (25,557,032
            float32; --resnet-scale divides every first dimension, for
            tests): one training step's backward pass on a model whose
            parameters have these shapes (loss = (rank+1) * sum of every
            parameter's sum, so every gradient is rank+1), gradients
            allreduced (Average). torch: DistributedOptimizer's hooks
            enqueue each gradient as autograd produces it, then
            optimizer.synchronize(); capi: the same backward on an identical
            model with no hooks, then every gradient enqueued in backward
            order through the C API and waited. Time per step (ms); ratio
            torch/capi time (lower is better)

How a figure is measured: every iteration, the sides alternate (the order
swapped every other iteration), each after a barrier; every result is
checked (a wrong value is reported as WRONG and the exit status is 1). A
figure is the slowest rank's (an allreduce with Max over every rank's times
once at the end); the table shows the median over the timed iterations
(after --warmup) with the min and the max.

Output: a table on rank 0's stdout; with --json FILE, rank 0 writes one
JSON document: the job (ranks, library, versions) and "results", one object
per workload with "torch", "capi" and "ratio".
"""

import argparse
import ctypes
import json
import os
import sys
import time

# torchvision.models.resnet50(): the shapes of its 161 parameters in
# backward order (the reverse of named_parameters()), as in kolo-bench
# (tools/kolo-bench/resnet50_table.c).


def _resnet50_shapes():
    fwd = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)),
           ("bn1.bias", (64,))]
    inplanes = 64
    for li, (planes, blocks) in enumerate(
            [(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            pre = "layer%d.%d." % (li, b)
            fwd += [(pre + "conv1.weight", (planes, inplanes, 1, 1)),
                    (pre + "bn1.weight", (planes,)),
                    (pre + "bn1.bias", (planes,)),
                    (pre + "conv2.weight", (planes, planes, 3, 3)),
                    (pre + "bn2.weight", (planes,)),
                    (pre + "bn2.bias", (planes,)),
                    (pre + "conv3.weight", (planes * 4, planes, 1, 1)),
                    (pre + "bn3.weight", (planes * 4,)),
                    (pre + "bn3.bias", (planes * 4,))]
            if b == 0:
                fwd += [(pre + "downsample.0.weight",
                         (planes * 4, inplanes, 1, 1)),
                        (pre + "downsample.1.weight", (planes * 4,)),
                        (pre + "downsample.1.bias", (planes * 4,))]
            inplanes = planes * 4
    fwd += [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]
    return fwd[::-1]


RESNET50 = _resnet50_shapes()
RESNET50_ELEMENTS = 25557032


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


assert len(RESNET50) == 161
assert sum(_numel(s) for _, s in RESNET50) == RESNET50_ELEMENTS


class _CApi:
    """The C API through ctypes, everything prepared in advance."""

    def __init__(self, lib, _lib):
        self.enqueue = lib.kolo_allreduce_async_opts
        self.wait = lib.kolo_wait
        self.OK = _lib.OK
        self._lib = _lib

    def prepare(self, names, tensors, op, shapes=True):
        """Per tensor: the arguments of kolo_allreduce_async_opts."""
        _lib = self._lib
        keep, calls = [], []
        for name, t in zip(names, tensors):
            opts = _lib.new_opts()
            opts.op = op
            if shapes and t.dim() > 0:
                arr = (ctypes.c_int64 * t.dim())(*t.shape)
                opts.ndim = t.dim()
                opts.shape = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))
                keep.append(arr)
            keep.append(opts)
            h = _lib.handle_t(0)
            keep.append(h)
            calls.append((name.encode(), t.numel(), ctypes.byref(opts),
                          ctypes.byref(h), h))
        return keep, calls

    def run(self, calls, ptrs, dtype):
        """Enqueues every tensor (in place at the addresses ptrs), then
        waits for each."""
        enqueue, wait, ok = self.enqueue, self.wait, self.OK
        for (name, n, opts, ph, _h), ptr in zip(calls, ptrs):
            if enqueue(name, ptr, ptr, n, dtype, opts, ph) != ok:
                raise RuntimeError("kolo_allreduce_async_opts failed")
        for c in calls:
            if wait(c[4].value) != ok:
                raise RuntimeError("kolo_wait failed")


def _stats(xs):
    s = sorted(xs)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    return med, s[0], s[-1]


def _parse_args(argv):
    """The options, the workloads asked for, and the iterations and
    warm-up iterations --quick implies where not given."""
    ap = argparse.ArgumentParser(prog="python3 -m kolo.bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="all")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--small-count", type=int, default=1000)
    ap.add_argument("--resnet-scale", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true",
                    help="few iterations (a smoke test)")
    args = ap.parse_args(argv)
    known = ["small", "resnet50"]
    args.workloads = known if args.workload == "all" else \
        args.workload.split(",")
    for w in args.workloads:
        if w not in known:
            ap.error("unknown workload %r (known: %s, all)"
                     % (w, ", ".join(known)))
    if args.iters is None:
        args.iters = 3 if args.quick else 20
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    if args.iters < 1 or args.warmup < 0 or args.small_count < 1 or \
            args.resnet_scale < 1:
        ap.error("--iters, --small-count and --resnet-scale must be >= 1, "
                 "--warmup >= 0")
    return args


class _Bench:
    """What every workload shares: the job, the two sides, and how a side
    is timed and checked."""

    def __init__(self, args, torch, hvd, _lib, lib):
        self.args, self.torch, self.hvd, self._lib = args, torch, hvd, _lib
        self.rank, self.size = hvd.rank(), hvd.size()
        self.capi = _CApi(lib, _lib)
        self.wrong = False

    def timed(self, fn):
        self.hvd.barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def slowest(self, times):
        """Per iteration, the slowest rank's time."""
        t = self.torch.tensor(times, dtype=self.torch.float64)
        return self.hvd.allreduce(t, op=self.hvd.Max,
                                  name="kolo.bench.times").tolist()

    def alternate(self, prepare, run, check):
        """Runs both sides warmup + iters times, taking turns (the order
        swapped every other iteration): prepare(side) sets its inputs,
        run[side] is timed, check(side) says whether its result is right.
        Returns each side's times (after the warm-up) and correctness."""
        times = {"torch": [], "capi": []}
        ok = {"torch": True, "capi": True}
        warmup = self.args.warmup
        for it in range(warmup + self.args.iters):
            order = ["torch", "capi"] if it % 2 == 0 else ["capi", "torch"]
            for side in order:
                prepare(side)
                dt = self.timed(run[side])
                if not check(side):
                    ok[side] = False
                if it >= warmup:
                    times[side].append(dt)
        return times, ok

    def figures(self, times, ok, figure):
        """Each side's figure from the slowest rank's times: figure(median,
        min, max) gives its numbers, to which "correct" is added."""
        fig = {}
        for side in ("torch", "capi"):
            fig[side] = dict(figure(*_stats(self.slowest(times[side]))),
                             correct=ok[side])
            self.wrong = self.wrong or not ok[side]
        return fig


def _bench_small(b):
    """The small workload: many one-float tensors, allreduces a second."""
    torch, hvd, _lib = b.torch, b.hvd, b._lib
    n = b.args.small_count
    expect = float(sum(r + 1 for r in range(b.size)))
    ts = [torch.zeros(1) for _ in range(n)]
    cs = [torch.zeros(1) for _ in range(n)]
    tnames = ["bench.small.%d" % i for i in range(n)]
    # the names kolo.torch gives the runtime: the sides take turns, so
    # they share the response cache as one training loop's steps do (two
    # sets of n names would each evict the other from a cache of
    # KOLO_CACHE_CAPACITY = 1024 entries, and every operation would
    # be negotiated in full on both sides)
    cnames = ["allreduce." + nm for nm in tnames]
    keep, calls = b.capi.prepare(cnames, cs, _lib.OP_SUM)
    cptrs = [t.data_ptr() for t in cs]

    def run_torch():
        hs = [hvd.allreduce_async_(t, name=nm, op=hvd.Sum)
              for t, nm in zip(ts, tnames)]
        for h in hs:
            hvd.synchronize(h)

    def run_capi():
        b.capi.run(calls, cptrs, _lib.FLOAT32)

    def fill(side):
        for t in (ts if side == "torch" else cs):
            t.fill_(b.rank + 1)

    def check(side):
        return not any(t.item() != expect
                       for t in (ts if side == "torch" else cs))

    times, ok = b.alternate(fill, {"torch": run_torch, "capi": run_capi},
                            check)
    del keep
    fig = b.figures(times, ok, lambda med, lo, hi: {
        "ops_per_s": n / med, "min_ops_per_s": n / hi,
        "max_ops_per_s": n / lo})
    return {"workload": "small", "count": n, "unit": "ops/s",
            "torch": fig["torch"], "capi": fig["capi"],
            "ratio": fig["torch"]["ops_per_s"] / fig["capi"]["ops_per_s"]}


def _bench_resnet50(b):
    """The resnet50 workload: one backward pass's gradients, ms a step."""
    torch, hvd, _lib = b.torch, b.hvd, b._lib
    sc = b.args.resnet_scale
    shapes = [(nm, (max(1, s[0] // sc),) + tuple(s[1:]))
              for nm, s in RESNET50]
    elements = sum(_numel(s) for _, s in shapes)

    def model():
        m = torch.nn.Module()
        for nm, s in shapes[::-1]:  # forward order
            m.register_parameter(nm.replace(".", "_"),
                                 torch.nn.Parameter(torch.zeros(s)))
        return m

    scale = torch.tensor(float(b.rank + 1))
    expect = (b.size + 1) / 2.0

    def loss_of(m):
        return sum(p.sum() for p in m.parameters()) * scale

    mt, mc = model(), model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(mt.parameters(), lr=0.0),
        named_parameters=mt.named_parameters(), op=hvd.Average)
    # backward order: the order in which autograd produces gradients
    cparams = list(mc.parameters())[::-1]
    cnames = ["allreduce.bench.cresnet.%d" % i for i in range(len(cparams))]

    def run_torch():
        loss_of(mt).backward()
        opt.synchronize()

    ckeep, ccalls = b.capi.prepare(cnames, cparams, _lib.OP_AVERAGE)

    def run_capi():
        loss_of(mc).backward()
        # the gradients are new tensors every step: their addresses
        # are taken after the backward pass, as any binding must
        b.capi.run(ccalls, [p.grad.data_ptr() for p in cparams],
                   _lib.FLOAT32)

    def zero_grad(side):
        if side == "torch":
            opt.zero_grad(set_to_none=True)
        else:
            mc.zero_grad(set_to_none=True)

    def check(side):
        m = mt if side == "torch" else mc
        return all(bool((p.grad == expect).all()) for p in m.parameters())

    times, ok = b.alternate(zero_grad, {"torch": run_torch,
                                        "capi": run_capi}, check)
    fig = b.figures(times, ok, lambda med, lo, hi: {
        "ms": med * 1e3, "min_ms": lo * 1e3, "max_ms": hi * 1e3})
    return {"workload": "resnet50", "tensors": len(shapes),
            "elements": elements, "unit": "ms/step",
            "torch": fig["torch"], "capi": fig["capi"],
            "ratio": fig["torch"]["ms"] / fig["capi"]["ms"]}


def _print_table(b, results):
    print("kolo.bench: %d ranks, %d iterations (+%d warm-up), %s"
          % (b.size, b.args.iters, b.args.warmup, b._lib.path))
    print("%-9s %-22s %14s %14s %8s" % ("workload", "size", "torch",
                                        "capi", "ratio"))
    # (the ratio is torch over capi: for allreduces a second, near 1 or
    # above is good; for milliseconds a step, near 1 or below)
    for r in results:
        if r["workload"] == "small":
            f = lambda s: ("%.0f/s" % r[s]["ops_per_s"]
                           if r[s]["correct"] else "WRONG")
            what = "%d x 4 B" % r["count"]
        else:
            f = lambda s: ("%.2f ms" % r[s]["ms"]
                           if r[s]["correct"] else "WRONG")
            what = "%d t, %d el" % (r["tensors"], r["elements"])
        better = ("higher is better" if r["workload"] == "small"
                  else "lower is better")
        print("%-9s %-22s %14s %14s %8.3f  (torch/capi: %s)"
              % (r["workload"], what, f("torch"), f("capi"), r["ratio"],
                 better))


def _write_json(b, results):
    doc = {"tool": "kolo.bench", "ranks": b.size, "iters": b.args.iters,
           "warmup": b.args.warmup, "library": b._lib.path,
           "python": sys.version.split()[0],
           "torch": b.torch.__version__,
           # (never the job's secret: a results file is shared)
           "env": {k: v for k, v in os.environ.items()
                   if k.startswith("KOLO_") and k not in
                   ("KOLO_RANK", "KOLO_LOCAL_RANK", "KOLO_CROSS_RANK",
                    "KOLO_SECRET")},
           "results": results}
    with open(b.args.json, "w") as fp:
        json.dump(doc, fp, indent=1)
        fp.write("\n")


def main(argv=None):
    args = _parse_args(argv)

    import torch
    import kolo.torch as hvd
    from kolo import _lib
    from kolo._lib import lib

    torch.set_num_threads(1)
    hvd.init()
    b = _Bench(args, torch, hvd, _lib, lib)
    results = []
    if "small" in args.workloads:
        results.append(_bench_small(b))
    if "resnet50" in args.workloads:
        results.append(_bench_resnet50(b))
    if b.rank == 0:
        _print_table(b, results)
        if args.json:
            _write_json(b, results)
    hvd.shutdown()
    return 1 if b.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
