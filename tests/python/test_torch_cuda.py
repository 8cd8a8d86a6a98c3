"""kolo.torch on CUDA tensors (kolo_opts_t.device_type KOLO_DEVICE_CUDA),
checked against references every rank computes itself, on the CPU.

Every rank takes the GPU of its local rank (one GPU per rank). Each test
skips, with the reason, when torch sees no CUDA device, when libkolo is
built without NCCL, or when this host has fewer GPUs than ranks
(run-pytest.sh also runs this file at 1 rank, for a machine with one GPU).
"""

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kolo.torch as hvd  # noqa: E402
from kolo.torch import mpi_ops  # noqa: E402
from kolo_testutil import (rank_data, reference_reduce,  # noqa: E402
                           split_rows, tolerance)


def _why_skip():
    if not torch.cuda.is_available():
        return ("no CUDA device: torch.cuda.is_available() is False (torch "
                "%s, built for CUDA %s)" % (torch.__version__,
                                            torch.version.cuda))
    if not hvd.nccl_built():
        return ("libkolo is built without NCCL (kolo_built(\"nccl\") is 0), "
                "which CUDA tensors need")
    if torch.cuda.device_count() < hvd.local_size():
        return ("%d CUDA device(s) for %d ranks on this host: one GPU per "
                "rank is needed (KOLO_PYTEST_RANKS=1 runs one rank)"
                % (torch.cuda.device_count(), hvd.local_size()))
    return None


WHY = _why_skip()
pytestmark = pytest.mark.skipif(WHY is not None, reason="CUDA tests: %s"
                                % WHY)

NP_DTYPES = {torch.uint8: np.uint8, torch.int32: np.int32,
             torch.int64: np.int64, torch.float16: np.float16,
             torch.float32: np.float32, torch.float64: np.float64}
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
# GPU cycles torch.cuda._sleep spins: keeps a stream busy while the test
# enqueues work that must wait for it.
SPIN = 50_000_000


@pytest.fixture(scope="module")
def dev():
    d = torch.device("cuda", hvd.local_rank())
    torch.cuda.set_device(d)
    return d


def c_data(seed, r, shape, dtype):
    """Rank r's input, on the CPU (the reference's side)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(rank_data(seed, r, shape,
                                          np.float32)).to(torch.bfloat16)
    return torch.from_numpy(rank_data(seed, r, shape, NP_DTYPES[dtype]))


def c_all(seed, shape, dtype):
    return [c_data(seed, r, shape, dtype) for r in range(hvd.size())]


def ref_reduce(seed, shape, dtype, op):
    """The reduction every rank expects, computed here with NumPy (16-bit
    floats through float64)."""
    ins = c_all(seed, shape, dtype)
    if dtype in (torch.float16, torch.bfloat16):
        return reference_reduce([t.double().numpy() for t in ins], op)
    return reference_reduce([t.numpy() for t in ins], op)


def tol(dtype):
    if dtype == torch.bfloat16:
        return dict(rtol=3e-2, atol=3e-2)
    return tolerance(NP_DTYPES[dtype])


def check(got, want, dtype, dev):
    assert got.device == dev, got.device
    assert got.dtype == dtype
    np.testing.assert_allclose(got.cpu().double().numpy(),
                               np.asarray(want, dtype=np.float64),
                               **tol(dtype))


def test_built():
    assert hvd.nccl_built() >= 20000
    assert hvd.cuda_built()


# ---- allreduce -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16,
                                   torch.bfloat16, torch.int32, torch.int64,
                                   torch.uint8],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_allreduce_ops(dev, rank, dtype):
    pending = []
    for op in OPS:
        x = c_data(11, rank, (5, 3), dtype).to(dev)
        before = x.clone()
        h = hvd.allreduce_async(x, op=op, name="cu.ar.%s.%d" % (dtype, op))
        pending.append((op, x, before, h))
    for op, x, before, h in pending:
        got = hvd.synchronize(h)
        assert got.shape == (5, 3)
        assert torch.equal(x, before)  # out of place: the input is kept
        check(got, ref_reduce(11, (5, 3), dtype, op), dtype, dev)


def test_allreduce_in_place_scaled_and_strided(dev, rank, size):
    # in place, with prescale and postscale
    x = c_data(12, rank, (6, 4), torch.float32).to(dev)
    out = hvd.allreduce_(x, op=hvd.Sum, name="cu.ar.scaled",
                         prescale_factor=0.5, postscale_factor=3.0)
    assert out is x
    check(x, ref_reduce(12, (6, 4), torch.float32, hvd.Sum) * 1.5,
          torch.float32, dev)
    # a non-contiguous tensor in place: reduced in a contiguous copy on
    # the device and copied back
    base = c_data(13, rank, (4, 6), torch.float32).to(dev)
    view = base.t()
    assert not view.is_contiguous()
    hvd.allreduce_(view, op=hvd.Max, name="cu.ar.strided")
    want = ref_reduce(13, (4, 6), torch.float32, hvd.Max)
    check(base, want, torch.float32, dev)
    # average, the default op, out of place on a strided view
    got = hvd.allreduce(base.t(), name="cu.ar.strided.avg")
    check(got, want.T, torch.float32, dev)


@pytest.mark.parametrize("where", ["prescale", "postscale"])
def test_float16_scaling_is_horovods(dev, size, where):
    """Horovod scales a CUDA float16 tensor in half precision, the factor
    cast to float16 (its CUDA kernels; on the CPU it scales in float32),
    and its test_horovod_allreduce_prescale/postscale compare bit for bit:
    every rank holds the same tensor, the expected value is computed by
    torch on the GPU in float16. Here too, and for reducescatter (grouped
    and not), whose Average is folded into the postscale."""
    if size > 3:
        pytest.skip("the sum of float16 values rounds in NCCL's ring order "
                    "beyond 3 ranks (Horovod's test holds up to 3)")
    g = torch.Generator().manual_seed(1234)
    base = torch.randint(-100, 100, (17, 17), generator=g).to(torch.float16)
    x = base.to(dev)
    factors = [0.1, 0.3, 0.7, 1.7, 2.3]
    for k, f in enumerate(factors):
        half_f = torch.tensor(f, dtype=torch.float16, device=dev)
        kw = {where + "_factor": f}
        got = hvd.allreduce(x, op=hvd.Sum, name="cu.h16.%s.%d" % (where, k),
                            **kw)
        if where == "prescale":
            want = (half_f * x) * size
        else:
            want = (x * size) * half_f
        assert got.dtype == torch.float16
        assert torch.equal(got, want), (where, f)
        rows = size * 2
        xr = base[:rows].to(dev)
        rs = hvd.reducescatter(xr, op=hvd.Sum, name="cu.h16.rs.%s.%d"
                               % (where, k), **kw)
        lo = 2 * hvd.rank()
        assert torch.equal(rs, want[lo:lo + 2]), ("reducescatter", where, f)
        grs = hvd.grouped_reducescatter([xr], op=hvd.Sum,
                                        name="cu.h16.grs.%s.%d" % (where, k),
                                        **kw)
        assert torch.equal(grs[0], want[lo:lo + 2]), ("grouped", where, f)


def test_allreduce_waits_for_the_producing_stream(dev, rank, size):
    """The input is written on a side stream kept busy: the runtime must
    wait for that stream (kolo_opts_t.stream) before reading it."""
    n = 1 << 20
    s = torch.cuda.Stream(dev)
    x = torch.zeros(n, device=dev)
    y = torch.zeros(n, device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))  # x, y allocated, zeroed
    with torch.cuda.stream(s):
        torch.cuda._sleep(SPIN)
        x.add_(rank + 1)
        y.add_(rank + 1)
        h = hvd.allreduce_async(x, op=hvd.Sum, name="cu.stream.out")
        h_ = hvd.allreduce_async_(y, op=hvd.Sum, name="cu.stream.in")
    got = hvd.synchronize(h)
    assert hvd.synchronize(h_) is y
    want = size * (size + 1) / 2
    assert got.device == dev
    assert torch.all(got == want).item()
    assert torch.all(y == want).item()
    torch.cuda.current_stream(dev).wait_stream(s)
    assert torch.all(x == rank + 1).item()


def test_synchronize_does_not_wait_for_the_gpu(dev, rank, size):
    """Completion is ordered on the stream, as DDP's (Horovod's with
    HOROVOD_ENABLE_ASYNC_COMPLETION): while the GPU is still busy with the
    work producing the input, synchronize returns, the current stream
    waits for the result, and the host has not waited for the GPU."""
    x = torch.full((1 << 16,), float(rank + 1), device=dev)
    stream = torch.cuda.current_stream(dev)
    torch.cuda._sleep(8 * SPIN)  # the GPU is busy for a while
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="cu.async")
    got = hvd.synchronize(h)
    busy = not stream.query()
    y = got * 2  # queued behind the allreduce on the current stream
    assert busy, "synchronize waited for the GPU to finish"
    want = size * (size + 1) / 2
    assert torch.all(got == want).item()  # .item(): the host waits here
    assert torch.all(y == 2 * want).item()


def test_inputs_stay_alive_until_synchronized(dev, rank, size):
    """The binding keeps a temporary input (and its contiguous copy) alive
    while the runtime may read it: memory freed early would be reused by the
    tensors allocated right after."""
    n = 1 << 18
    torch.cuda._sleep(SPIN)  # the input is produced late on this stream
    h = hvd.allreduce_async(torch.full((n,), float(rank + 1), device=dev),
                            op=hvd.Sum, name="cu.alive")
    h2 = hvd.allreduce_async_(torch.full((2, n), float(rank + 1),
                                         device=dev).t(),
                              op=hvd.Sum, name="cu.alive.strided")
    gc.collect()
    junk = [torch.full((n,), -7.0, device=dev) for _ in range(8)]
    got = hvd.synchronize(h)
    got2 = hvd.synchronize(h2)
    want = size * (size + 1) / 2
    assert torch.all(got == want).item()
    assert torch.all(got2 == want).item() and got2.shape == (n, 2)
    assert all(torch.all(j == -7.0).item() for j in junk)


def test_allreduce_autograd(dev, rank, size):
    x = c_data(14, rank, (3, 2), torch.float32).to(dev).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum, name="cu.ar.grad")
    (y * 2).sum().backward()
    # the gradient of a Sum allreduce is the Sum allreduce of the gradient
    assert x.grad.device == dev
    assert torch.all(x.grad == 2 * size).item()


def test_compression_fp16(dev, rank):
    for dtype in (torch.float32, torch.float64):
        x = c_data(15, rank, (64,), dtype).to(dev)
        got = hvd.allreduce(x, op=hvd.Sum, name="cu.fp16.%s" % dtype,
                            compression=hvd.Compression.fp16)
        assert got.dtype == dtype and got.device == dev
        want = ref_reduce(15, (64,), dtype, hvd.Sum)
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=2e-2,
                                   atol=2e-2)


def test_wrong_devices_are_refused(dev):
    x = torch.ones(3, device=dev)
    with pytest.raises(ValueError, match="one device"):
        mpi_ops._allreduce_async(x, torch.empty(3), "cu.mixed", hvd.Sum, 1.0,
                                 1.0, hvd.global_process_set)
    with pytest.raises((ValueError, RuntimeError)):
        hvd.allreduce(torch.ones(2, dtype=torch.int16, device=dev),
                      name="cu.int16")  # NCCL has no 16-bit integers


# ---- grouped allreduce -----------------------------------------------------


def test_grouped_mixing_cpu_and_cuda_is_refused(dev, size):
    """Horovod's grouped collectives raise at enqueue (RuntimeError: a
    HorovodInternalError) for a list of tensors on different devices."""
    mixed = [torch.ones(size, 2, device=dev), torch.ones(size, 2)]
    for grouped in (hvd.grouped_allreduce, hvd.grouped_allgather,
                    hvd.grouped_reducescatter):
        with pytest.raises(RuntimeError,
                           match="Tensors in list must be on same device"):
            grouped(mixed)


def test_grouped_allreduce(dev, rank):
    dtypes = [torch.float32, torch.float16, torch.int64, torch.float32]
    shapes = [(4,), (2, 3), (5,), (3, 1)]
    for op in (hvd.Sum, hvd.Average):
        xs = [c_data(16 + i, rank, s, d).to(dev)
              for i, (s, d) in enumerate(zip(shapes, dtypes))]
        outs = hvd.grouped_allreduce(xs, op=op, name="cu.group.%d" % op)
        for i, (o, s, d) in enumerate(zip(outs, shapes, dtypes)):
            assert o.shape == s
            check(o, ref_reduce(16 + i, s, d, op), d, dev)
        # in place
        ys = [x.clone() for x in xs]
        assert all(a is b for a, b in zip(
            hvd.grouped_allreduce_(ys, op=op, name="cu.group_.%d" % op), ys))
        for i, (y, s, d) in enumerate(zip(ys, shapes, dtypes)):
            check(y, ref_reduce(16 + i, s, d, op), d, dev)


# ---- broadcast -------------------------------------------------------------


def test_broadcast(dev, rank, size):
    for root in range(size):
        for dtype in (torch.float32, torch.bfloat16, torch.int64,
                      torch.uint8):
            x = c_data(20, rank, (3, 4), dtype).to(dev)
            before = x.clone()
            got = hvd.broadcast(x, root, name="cu.bc.%d.%s" % (root, dtype))
            assert torch.equal(x, before)
            assert got.device == dev and got.dtype == dtype
            assert torch.equal(got.cpu(), c_data(20, root, (3, 4), dtype))
            # in place, on a strided view
            base = c_data(21, rank, (4, 3), dtype).to(dev)
            out = hvd.broadcast_(base.t(), root,
                                 name="cu.bc_.%d.%s" % (root, dtype))
            assert out.device == dev
            assert torch.equal(base.cpu(), c_data(21, root, (4, 3), dtype))


def test_broadcast_parameters_and_optimizer_state(dev, rank, size):
    torch.manual_seed(100 + rank)  # different weights on every rank
    model = torch.nn.Linear(4, 3).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if rank == 0:  # only the root has momentum buffers (on the GPU)
        model(torch.ones(2, 4, device=dev)).sum().backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for name, p in model.state_dict().items():
        assert p.device == dev
        rows = hvd.allgather(p.unsqueeze(0), name="cu.bp." + name)
        assert all(torch.equal(rows[r], p) for r in range(size))
    for i, p in enumerate(model.parameters()):
        buf = opt.state[p]["momentum_buffer"]
        assert buf.device == dev
        rows = hvd.allgather(buf.unsqueeze(0), name="cu.bos.%d" % i)
        assert all(torch.equal(rows[r], buf) for r in range(size))


# ---- allgather -------------------------------------------------------------


def test_allgather_uneven(dev, rank, size):
    for dtype in (torch.float32, torch.int32, torch.float16):
        x = c_data(30, rank, (rank + 1, 3), dtype).to(dev)
        got = hvd.allgather(x, name="cu.ag.%s" % dtype)
        want = torch.cat([c_data(30, r, (r + 1, 3), dtype)
                          for r in range(size)])
        assert got.device == dev and got.dtype == dtype
        assert got.shape == want.shape
        assert torch.equal(got.cpu(), want)
    # grouped, two dtypes (two grouped calls on the device)
    a = c_data(31, rank, (rank + 2,), torch.float32).to(dev)
    b = c_data(32, rank, (1, 2), torch.int64).to(dev)
    ga, gb = hvd.grouped_allgather([a, b], name="cu.gag")
    assert ga.device == dev and gb.device == dev
    assert torch.equal(ga.cpu(), torch.cat(
        [c_data(31, r, (r + 2,), torch.float32) for r in range(size)]))
    assert torch.equal(gb.cpu(), torch.cat(
        [c_data(32, r, (1, 2), torch.int64) for r in range(size)]))


def test_allgather_on_a_busy_stream_and_autograd(dev, rank, size):
    s = torch.cuda.Stream(dev)
    x = torch.zeros(rank + 1, 2, device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        torch.cuda._sleep(SPIN)
        x.add_(rank + 1)
        got = hvd.allgather(x, name="cu.ag.stream")  # result copied here
        assert torch.equal(got.cpu(), torch.cat(
            [torch.full((r + 1, 2), r + 1.0) for r in range(size)]))
    torch.cuda.current_stream(dev).wait_stream(s)
    # the gradient: this rank's rows of the averaged gradient
    w = torch.arange(size * (size + 1) // 2 * 2, dtype=torch.float32,
                     device=dev).reshape(-1, 2)
    xg = torch.ones(rank + 1, 2, device=dev, requires_grad=True)
    (hvd.allgather(xg, name="cu.ag.grad") * w).sum().backward()
    off = rank * (rank + 1) // 2
    assert xg.grad.device == dev
    assert torch.allclose(xg.grad, w[off:off + rank + 1])


# ---- alltoall --------------------------------------------------------------


def test_alltoall(dev, rank, size):
    # rank r sends (r + j) % 2 + 1 rows to rank j; row values say who sent
    # them to whom
    def sends(src, dst):
        return (src + dst) % 2 + 1

    def rows(src, dst):
        return torch.tensor([[src * 100 + dst * 10 + i, -i]
                             for i in range(sends(src, dst))],
                            dtype=torch.float32)

    x = torch.cat([rows(rank, j) for j in range(size)]).to(dev)
    splits = [sends(rank, j) for j in range(size)]
    out, rsplits = hvd.alltoall(x, splits=splits, name="cu.a2a")
    assert out.device == dev
    assert rsplits.device.type == "cpu"
    assert rsplits.tolist() == [sends(j, rank) for j in range(size)]
    # splits given on the GPU: the received splits come back there, int32,
    # as Horovod's (test_horovod_alltoall_splits_on_gpu)
    gsplits = torch.tensor(splits, dtype=torch.int32, device=dev)
    out_g, rs_g = hvd.alltoall(x, splits=gsplits, name="cu.a2a.gpu")
    assert rs_g.device == dev and rs_g.dtype == torch.int32
    assert rs_g.tolist() == rsplits.tolist()
    assert torch.equal(out_g, out)
    assert torch.equal(out.cpu(), torch.cat([rows(j, rank)
                                             for j in range(size)]))
    # even splits, int64
    y = torch.arange(size * 2, dtype=torch.int64, device=dev) + 1000 * rank
    got = hvd.alltoall(y, name="cu.a2a.even")
    want = torch.tensor([1000 * j + 2 * rank + k for j in range(size)
                         for k in range(2)])
    assert got.device == dev and torch.equal(got.cpu(), want)


# ---- reducescatter ---------------------------------------------------------


def test_reducescatter(dev, rank, size):
    nrows = 2 * size + 1  # uneven: the first ranks get one row more
    split = split_rows(nrows, size)
    lo = sum(split[:rank])
    for op, dtype in ((hvd.Sum, torch.float32), (hvd.Average, torch.float32),
                      (hvd.Sum, torch.int32)):
        x = c_data(40, rank, (nrows, 3), dtype).to(dev)
        got = hvd.reducescatter(x, op=op, name="cu.rs.%d.%s" % (op, dtype))
        want = ref_reduce(40, (nrows, 3), dtype, op)[lo:lo + split[rank]]
        assert got.shape == (split[rank], 3)
        check(got, want, dtype, dev)
    xs = [c_data(41, rank, (nrows, 2), torch.float32).to(dev),
          c_data(42, rank, (nrows,), torch.int64).to(dev)]
    outs = hvd.grouped_reducescatter(xs, op=hvd.Sum, name="cu.grs")
    check(outs[0], ref_reduce(41, (nrows, 2), torch.float32,
                              hvd.Sum)[lo:lo + split[rank]],
          torch.float32, dev)
    check(outs[1], ref_reduce(42, (nrows,), torch.int64,
                              hvd.Sum)[lo:lo + split[rank]],
          torch.int64, dev)


# ---- DistributedOptimizer --------------------------------------------------


def _model(dev):
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2)).to(dev)


def _batch(step, r, dev):
    g = torch.Generator().manual_seed(1000 * step + r)
    return (torch.randn(6, 4, generator=g).to(dev),
            torch.randn(6, 2, generator=g).to(dev))


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_distributed_optimizer(dev, rank, size, compression):
    """A tiny model trained 3 steps on every rank's own batch against the
    same model trained here on the average of every rank's gradient."""
    comp = getattr(hvd.Compression, compression)
    model = _model(dev)
    if rank != 0:  # broadcast_parameters must undo this
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), compression=comp)
    ref = _model(dev)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()
    for step in range(3):
        opt.zero_grad()
        x, y = _batch(step, rank, dev)
        loss_fn(model(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        for r in range(size):  # the average of the ranks' gradients
            x, y = _batch(step, r, dev)
            (loss_fn(ref(x), y) / size).backward()
        ref_opt.step()
    t = dict(rtol=1e-5, atol=1e-6) if compression == "none" else \
        dict(rtol=1e-2, atol=1e-3)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.device == dev and p.grad.device == dev
        np.testing.assert_allclose(p.detach().cpu().numpy(),
                                   q.detach().cpu().numpy(), err_msg=name,
                                   **t)
