"""kolo.torch collectives, autograd and helpers against references computed
here (every rank computes every rank's input)."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kolo.torch as hvd  # noqa: E402
from kolo_testutil import (check_controllers, rank_data,  # noqa: E402
                           reference_reduce, split_rows, tolerance)

TORCH_DTYPES = {
    torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
    torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16,
    torch.float32: np.float32, torch.float64: np.float64, torch.bool: np.bool_,
}
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def t_data(seed, r, shape, dtype=torch.float64):
    if dtype == torch.bfloat16:
        return torch.from_numpy(rank_data(seed, r, shape,
                                          np.float32)).to(torch.bfloat16)
    return torch.from_numpy(rank_data(seed, r, shape, TORCH_DTYPES[dtype]))


def t_all(seed, shape, dtype=torch.float64):
    return [t_data(seed, r, shape, dtype) for r in range(hvd.size())]


def test_basics(rank, size):
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (rank, size)
    assert hvd.local_rank() == rank and hvd.local_size() == size
    assert hvd.cross_rank() == 0 and hvd.cross_size() == 1
    check_controllers(hvd)
    assert isinstance(hvd.nccl_built(), int) and isinstance(hvd.cuda_built(), bool)
    # NCCL carries CUDA tensors only (and needs kolo built with it)
    assert not hvd.nccl_enabled() or (hvd.nccl_built() and
                                      torch.cuda.is_available())
    assert hvd.mpi_threads_supported() is False
    assert hvd.HorovodInternalError is hvd.KoloError
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    hvd.init()  # idempotent


def test_built_flags():
    """Horovod's *_built() answer what the loaded libkolo was built with
    (kolo_built); nccl_built() is an int, as Horovod's: NCCL's version code
    or 0."""
    from kolo import _lib

    def built(name):
        return bool(_lib.lib.kolo_built(name.encode()))
    assert hvd.gloo_built() is built("gloo")
    assert hvd.mpi_built() is built("mpi")
    assert hvd.cuda_built() is built("cuda")
    assert type(hvd.nccl_built()) is int
    assert hvd.nccl_built() == _lib.lib.kolo_built(b"nccl")
    assert (hvd.nccl_built() >= 20000) == built("nccl")
    assert hvd.rocm_built() is built("rocm") is False
    assert hvd.ddl_built() is False and hvd.ccl_built() is False


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES) + [torch.bfloat16],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_allreduce_dtypes_and_ops(rank, size, dtype):
    handles = []
    for op in OPS:
        if dtype == torch.bool and op == hvd.Average:
            continue
        x = t_data(7, rank, (4, 3), dtype)
        handles.append((op, x.clone(), x, hvd.allreduce_async(
            x, op=op, name="t.ar.%s.%d" % (dtype, op))))
    for op, before, x, h in handles:
        got = hvd.synchronize(h)
        assert got.dtype == dtype and got.shape == (4, 3)
        assert torch.equal(x, before)
        if dtype == torch.bfloat16:
            ins = [t.to(torch.float64).numpy() for t in t_all(7, (4, 3), dtype)]
            want = reference_reduce(ins, op)
            np.testing.assert_allclose(got.to(torch.float64).numpy(), want,
                                       rtol=3e-2, atol=3e-2)
            continue
        want = reference_reduce([t.numpy() for t in t_all(7, (4, 3), dtype)],
                                op)
        np.testing.assert_allclose(got.numpy().astype(np.float64),
                                   want.astype(np.float64),
                                   **tolerance(TORCH_DTYPES[dtype]))


def test_allreduce_average_and_deprecated_average(rank, size):
    x = torch.full((3,), float(rank))
    mean = (size - 1) / 2.0
    assert torch.allclose(hvd.allreduce(x), torch.full((3,), mean))
    with pytest.warns(DeprecationWarning):
        got = hvd.allreduce(x, average=False)
    assert torch.allclose(got, torch.full((3,), float(sum(range(size)))))
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def test_allreduce_in_place_and_async(rank, size):
    x = t_data(8, rank, (50,), torch.float32)
    ptr = x.data_ptr()
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="t.inplace")
    assert hvd.synchronize(h) is x and x.data_ptr() == ptr
    want = sum(t_all(8, (50,), torch.float32))
    assert torch.allclose(x, want, atol=1e-5)
    y = t_data(9, rank, (5,), torch.int64)
    assert hvd.allreduce_(y, op=hvd.Max, name="t.inplace2") is y
    assert torch.equal(y, torch.stack(t_all(9, (5,), torch.int64)).max(0)[0])
    h = hvd.allreduce_async(t_data(10, rank, (6,)), op=hvd.Min)
    while not hvd.poll(h):
        pass
    assert torch.equal(hvd.synchronize(h),
                       torch.stack(t_all(10, (6,))).min(0)[0])


def test_allreduce_non_contiguous(rank, size):
    base = t_data(11, rank, (4, 6))
    view = base.t()  # not contiguous
    got = hvd.allreduce(view, op=hvd.Sum, name="t.nc")
    want = sum(t.t() for t in t_all(11, (4, 6)))
    assert torch.allclose(got, want)
    view2 = t_data(12, rank, (4, 6))[:, ::2]
    hvd.allreduce_(view2, op=hvd.Sum, name="t.nc_")  # copied back in place
    assert torch.allclose(view2, sum(t[:, ::2] for t in t_all(12, (4, 6))))


def test_allreduce_scaling(rank, size):
    x = t_data(13, rank, (7,))
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                        postscale_factor=4.0, name="t.scale")
    assert torch.allclose(got, 4.0 * sum(0.5 * t for t in t_all(13, (7,))))
    avg = hvd.allreduce(x, op=hvd.Average, prescale_factor=2.0)
    assert torch.allclose(avg, 2.0 * sum(t_all(13, (7,))) / size)


def test_compression(rank, size):
    x = t_data(14, rank, (300,), torch.float32)
    want = sum(t.double() for t in t_all(14, (300,), torch.float32))
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16,
                        name="t.fp16.wire")
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-2, atol=1e-2)
    # float64 takes the host path: compress to float16, decompress
    x64 = t_data(14, rank, (300,), torch.float64)
    got64 = hvd.allreduce(x64, op=hvd.Sum, compression=hvd.Compression.fp16,
                          name="t.fp16.host")
    assert got64.dtype == torch.float64
    assert torch.allclose(got64, want, rtol=1e-2, atol=1e-2)
    c, ctx = hvd.Compression.fp16.compress(x64)
    assert c.dtype == torch.float16
    assert hvd.Compression.fp16.decompress(c, ctx).dtype == torch.float64
    c, ctx = hvd.Compression.none.compress(x)
    assert c is x and hvd.Compression.none.decompress(c, ctx) is x
    bf = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.bf16)
    assert torch.allclose(bf.double(), want, rtol=5e-2, atol=5e-2)
    ints = torch.full((4,), rank + 1, dtype=torch.int32)
    got = hvd.allreduce(ints, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert torch.equal(got, torch.full((4,), sum(range(1, size + 1)),
                                       dtype=torch.int32))


def test_grouped_allreduce(rank, size):
    xs = [t_data(20, rank, (3,)), t_data(21, rank, (2, 2), torch.float32),
          t_data(22, rank, (5,), torch.int32)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="t.grp")
    for i, o in enumerate(outs):
        want = sum(t_all(20 + i, tuple(xs[i].shape), xs[i].dtype))
        assert o.dtype == xs[i].dtype and torch.allclose(o, want.to(o.dtype))
    ys = [t_data(23, rank, (4,)), t_data(24, rank, (4,))]
    res = hvd.grouped_allreduce_(ys, op=hvd.Max, name="t.grp_")
    assert res[0] is ys[0] and res[1] is ys[1]
    assert torch.equal(ys[1], torch.stack(t_all(24, (4,))).max(0)[0])
    h = hvd.grouped_allreduce_async([torch.ones(2), torch.ones(3)])
    assert [o.tolist() for o in hvd.synchronize(h)] == [[1.0] * 2, [1.0] * 3]
    h = hvd.grouped_allreduce_async_([torch.ones(2)], op=hvd.Sum)
    assert hvd.synchronize(h)[0].tolist() == [float(size)] * 2
    f = hvd.grouped_allreduce([torch.ones(3)], op=hvd.Sum,
                              compression=hvd.Compression.fp16)
    assert f[0].tolist() == [float(size)] * 3


def test_allgather(rank, size):
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
        x = t_data(30, rank, (rank + 1, 3), dtype)
        got = hvd.allgather(x, name="t.ag.%s" % dtype)
        assert got.dtype == dtype
        assert torch.equal(got, torch.cat([t_data(30, r, (r + 1, 3), dtype)
                                           for r in range(size)]))
    h = hvd.allgather_async(torch.arange(rank, dtype=torch.float64))
    assert hvd.synchronize(h).tolist() == [float(i) for r in range(size)
                                           for i in range(r)]
    outs = hvd.grouped_allgather([torch.full((1,), rank),
                                  torch.full((rank + 1, 2), float(rank))])
    assert outs[0].tolist() == list(range(size))
    assert outs[1].shape == (sum(range(1, size + 1)), 2)


def test_broadcast(rank, size):
    for root in range(size):
        x = t_data(40 + root, rank, (3, 2))
        got = hvd.broadcast(x, root, name="t.bc.%d" % root)
        assert torch.equal(got, t_data(40 + root, root, (3, 2)))
        assert torch.equal(x, t_data(40 + root, rank, (3, 2)))
        y = torch.full((4,), rank, dtype=torch.int32)
        assert hvd.broadcast_(y, root, name="t.bc_.%d" % root) is y
        assert y.tolist() == [root] * 4
    h = hvd.broadcast_async(torch.tensor([rank]), 0)
    assert hvd.synchronize(h).tolist() == [0]
    z = torch.tensor([rank + 10])
    h = hvd.broadcast_async_(z, size - 1)
    assert hvd.synchronize(h) is z and z.tolist() == [size - 1 + 10]


def _sets_without_rank_0(size):
    """Process sets whose set ranks differ from their global ranks: every
    rank but 0, and the odd ranks (at 2 ranks both are {1})."""
    return [list(range(1, size)), [r for r in range(size) if r % 2]]


def test_broadcast_root_is_a_global_rank(rank, size):
    """As in Horovod, root_rank is a global rank (hvd.rank() of the root)
    whatever the process set: broadcast, broadcast_, broadcast_async(_),
    the gradient of broadcast, broadcast_object, broadcast_parameters and
    broadcast_optimizer_state."""
    for k, members in enumerate(_sets_without_rank_0(size)):
        ps = hvd.add_process_set(members)
        try:
            if rank in members:
                for root in members:
                    tag = "t.gr.%d.%d" % (k, root)
                    x = t_data(200 + root, rank, (3, 2))
                    want = t_data(200 + root, root, (3, 2))
                    got = hvd.broadcast(x, root, name=tag, process_set=ps)
                    assert torch.equal(got, want)
                    assert torch.equal(x, t_data(200 + root, rank, (3, 2)))
                    y = x.clone()
                    assert hvd.broadcast_(y, root, name=tag + "_",
                                          process_set=ps) is y
                    assert torch.equal(y, want)
                    h = hvd.broadcast_async(x, root, name=tag + ".a",
                                            process_set=ps)
                    assert torch.equal(hvd.synchronize(h), want)
                    z = x.clone()
                    h = hvd.broadcast_async_(z, root, name=tag + ".a_",
                                             process_set=ps)
                    assert hvd.synchronize(h) is z and torch.equal(z, want)
                    # the gradient: the set's average on the root, else 0
                    xg = x.clone().requires_grad_()
                    out = hvd.broadcast(xg, root, name=tag + ".g",
                                        process_set=ps)
                    (out * (rank + 1)).sum().backward()
                    mean = sum(m + 1 for m in members) / len(members)
                    assert torch.equal(xg.grad, torch.full_like(
                        x, mean if rank == root else 0.0))
                    assert hvd.broadcast_object(
                        {"from": rank}, root_rank=root, name=tag + ".o",
                        process_set=ps) == {"from": root}
                    torch.manual_seed(300 + rank)
                    m = torch.nn.Linear(3, 2)
                    hvd.broadcast_parameters(m.state_dict(), root_rank=root,
                                             process_set=ps)
                    torch.manual_seed(300 + root)
                    ref = torch.nn.Linear(3, 2)
                    assert torch.equal(m.weight, ref.weight)
                    assert torch.equal(m.bias, ref.bias)
                    opt = torch.optim.SGD(m.parameters(), lr=0.5 + rank,
                                          momentum=0.25 * rank)
                    hvd.broadcast_optimizer_state(opt, root_rank=root,
                                                  process_set=ps)
                    assert opt.param_groups[0]["lr"] == 0.5 + root
                    assert opt.param_groups[0]["momentum"] == 0.25 * root
                # a root outside the set: refused, naming the set's ranks
                outside = [r for r in range(size) if r not in members]
                with pytest.raises(ValueError, match=r"root rank %d is not a "
                                   r"member of process set %d, whose ranks "
                                   r"are %s" % (outside[0], ps.process_set_id,
                                                ", ".join(map(str, members)))):
                    hvd.broadcast(torch.ones(1), outside[0], process_set=ps)
            hvd.barrier()
        finally:
            hvd.remove_process_set(ps)


def test_alltoall(rank, size):
    splits = [j + 1 for j in range(size)]
    x = torch.cat([torch.full((j + 1, 2), 100.0 * rank + j)
                   for j in range(size)])
    out, rsplits = hvd.alltoall(x, splits=splits, name="t.a2a")
    assert rsplits.dtype == torch.int32
    assert rsplits.tolist() == [rank + 1] * size
    want = torch.cat([torch.full((rank + 1, 2), 100.0 * r + rank)
                      for r in range(size)])
    assert torch.equal(out, want)
    out2, rs2 = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
    assert torch.equal(out2, want) and torch.equal(rs2, rsplits)
    # Horovod's received splits are like the splits tensor given (its
    # splits.new()): int64 splits give int64 received splits
    _, rs64 = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int64))
    assert rs64.dtype == torch.int64 and rs64.tolist() == rsplits.tolist()
    even = torch.arange(size * 2) + 10 * rank
    got = hvd.alltoall(even)  # no splits: the tensor alone
    assert isinstance(got, torch.Tensor)
    assert got.tolist() == [2 * rank + k + 10 * r for r in range(size)
                            for k in range(2)]
    h = hvd.alltoall_async(even)
    out3, rs3 = hvd.synchronize(h)
    assert torch.equal(out3, got) and rs3.tolist() == [2] * size


def test_reducescatter(rank, size):
    rows = 2 * size + 1
    for op in (hvd.Sum, hvd.Average):
        x = t_data(50, rank, (rows, 2))
        got = hvd.reducescatter(x, op=op, name="t.rs.%d" % op)
        full = torch.from_numpy(reference_reduce(
            [t.numpy() for t in t_all(50, (rows, 2))], op))
        split = split_rows(rows, size)
        start = sum(split[:rank])
        assert torch.allclose(got, full[start:start + split[rank]])
        outs = hvd.grouped_reducescatter([x, x.float()], op=op)
        assert torch.allclose(outs[0], got)
        assert outs[1].dtype == torch.float32
    assert hvd.reducescatter(torch.ones(size, 1)).tolist() == [[1.0]]  # Average
    h = hvd.reducescatter_async(torch.ones(size, 1), op=hvd.Sum,
                                prescale_factor=2.0)
    assert hvd.synchronize(h).tolist() == [[2.0 * size]]
    h = hvd.grouped_reducescatter_async([torch.ones(size)], op=hvd.Sum)
    assert hvd.synchronize(h)[0].tolist() == [float(size)]
    fp = hvd.reducescatter(torch.ones(size, 2), op=hvd.Sum,
                           compression=hvd.Compression.fp16)
    assert fp.dtype == torch.float32 and fp.tolist() == [[float(size)] * 2]


def test_join_and_barrier(rank, size):
    hvd.barrier()
    if rank == 0:
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="t.join")
        assert got.tolist() == [1.0] * 3
    assert hvd.join() == 0


def test_process_sets(rank, size):
    even = hvd.ProcessSet([r for r in range(size) if r % 2 == 0])
    hvd.init(process_sets=[even])  # already initialized: adds the set
    try:
        assert even.process_set_id is not None
        assert even.included() == (rank % 2 == 0)
        if even.included():
            got = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum,
                                process_set=even)
            assert got.item() == sum(r for r in range(size) if r % 2 == 0)
            g = hvd.allgather(torch.tensor([rank]), process_set=even)
            assert g.tolist() == even.ranks
            rs = hvd.reducescatter(torch.ones(even.size(), 1), op=hvd.Sum,
                                   process_set=even)
            assert rs.tolist() == [[float(even.size())]]
            hvd.barrier(process_set=even)
        # an unnamed collective after ops inside the set: ranks outside
        # the set did not count those, and the names still agree
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size
    finally:
        assert hvd.remove_process_set(even)
    ps = hvd.add_process_set(hvd.ProcessSet(range(size)))
    assert ps.size() == size and ps.rank() == rank
    assert hvd.remove_process_set(ps)


# ---- autograd --------------------------------------------------------------


def coeffs(seed, r, shape):
    return t_data(seed, r, shape)


def test_allreduce_grad(rank, size):
    for op in (hvd.Sum, hvd.Average):
        x = t_data(60, rank, (3, 2)).requires_grad_()
        y = hvd.allreduce(x, op=op, name="t.g.ar.%d" % op,
                          postscale_factor=2.0)
        (y * coeffs(61, rank, (3, 2))).sum().backward()
        cs = [coeffs(61, r, (3, 2)) for r in range(size)]
        want = 2.0 * (sum(cs) if op == hvd.Sum else sum(cs) / size)
        assert torch.allclose(x.grad, want)


def test_allgather_grad(rank, size):
    x = t_data(62, rank, (rank + 1, 2)).requires_grad_()
    z = hvd.allgather(x, name="t.g.ag")
    total = sum(r + 1 for r in range(size))
    (z * coeffs(63, rank, (total, 2))).sum().backward()
    avg = sum(coeffs(63, r, (total, 2)) for r in range(size)) / size
    start = sum(r + 1 for r in range(rank))
    assert torch.allclose(x.grad, avg[start:start + rank + 1])


def test_broadcast_grad(rank, size):
    root = size - 1
    x = t_data(64, rank, (4,)).requires_grad_()
    y = hvd.broadcast(x, root, name="t.g.bc")
    (y * coeffs(65, rank, (4,))).sum().backward()
    if rank == root:
        want = sum(coeffs(65, r, (4,)) for r in range(size)) / size
    else:
        want = torch.zeros(4, dtype=torch.float64)
    assert torch.allclose(x.grad, want)


def test_broadcast_grad_is_multiplied_by_zero(rank, size):
    """Horovod multiplies the averaged gradient by 0 on the other ranks:
    -0.0 where it is negative, NaN where it is not finite."""
    x = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    y = hvd.broadcast(x, 0, name="t.g.bc0")
    g = torch.tensor([-1.0, 2.0, float("inf")], dtype=torch.float64)
    y.backward(g)
    if rank == 0:
        assert torch.equal(x.grad[:2], torch.tensor([-1.0, 2.0],
                                                     dtype=torch.float64))
    else:
        assert torch.signbit(x.grad[0]) and x.grad[0] == 0
        assert x.grad[1] == 0 and not torch.signbit(x.grad[1])
        assert torch.isnan(x.grad[2])


def test_alltoall_grad(rank, size):
    def splits_of(r):
        return [(r + j) % 2 + 1 for j in range(size)]
    x = t_data(66, rank, (sum(splits_of(rank)), 2)).requires_grad_()
    out, rsplits = hvd.alltoall(x, splits=splits_of(rank), name="t.g.a2a")
    assert rsplits.tolist() == [splits_of(r)[rank] for r in range(size)]
    rows_in = [sum(splits_of(k)[j] for k in range(size)) for j in range(size)]
    (out * coeffs(67, rank, (rows_in[rank], 2))).sum().backward()
    # the rows this rank sent to rank j come back from j's coefficients
    want = []
    for j in range(size):
        c = coeffs(67, j, (rows_in[j], 2))
        off = sum(splits_of(k)[j] for k in range(rank))
        want.append(c[off:off + splits_of(rank)[j]])
    assert torch.allclose(x.grad, torch.cat(want))


def test_reducescatter_grad(rank, size):
    rows = 2 * size + 1
    split = split_rows(rows, size)
    for op in (hvd.Sum, hvd.Average):
        x = t_data(68, rank, (rows, 2)).requires_grad_()
        y = hvd.reducescatter(x, op=op, name="t.g.rs.%d" % op,
                              prescale_factor=3.0)
        (y * coeffs(69, rank, (split[rank], 2))).sum().backward()
        # Horovod's: the allgather of the gradient times the size for Sum
        # (as is for Average), times prescale
        want = 3.0 * torch.cat([coeffs(69, r, (split[r], 2))
                                for r in range(size)])
        if op == hvd.Sum:
            want = want * size
        assert torch.allclose(x.grad, want)


def test_grouped_grads(rank, size):
    a = t_data(70, rank, (2,)).requires_grad_()
    b = t_data(71, rank, (rank + 1, 1)).requires_grad_()
    ya, = hvd.grouped_allreduce([a], op=hvd.Sum)
    yb, = hvd.grouped_allgather([b])
    (ya * 2).sum().backward()
    yb.sum().backward()
    assert torch.allclose(a.grad, torch.full((2,), 2.0 * size,
                                             dtype=torch.float64))
    assert torch.allclose(b.grad, torch.ones(rank + 1, 1, dtype=torch.float64))
    c = t_data(72, rank, (size, 2)).requires_grad_()
    yc, = hvd.grouped_reducescatter([c], op=hvd.Sum)
    yc.sum().backward()
    assert torch.allclose(c.grad, torch.full((size, 2), float(size),
                                             dtype=torch.float64))


def test_sparse_allreduce(rank, size):
    i = torch.tensor([[rank, size]])  # 1-D sparse tensor of size+1 entries
    v = torch.tensor([1.0, float(rank)])
    s = torch.sparse_coo_tensor(i, v, (size + 1,))
    h = hvd.sparse_allreduce_async(s, "t.sparse", op=hvd.Sum)
    got = hvd.synchronize(h).to_dense()
    want = torch.ones(size + 1)
    want[size] = float(sum(range(size)))
    assert torch.allclose(got, want)


# ---- objects and state -----------------------------------------------------


def test_objects(rank, size):
    assert hvd.broadcast_object({"r": rank}, root_rank=size - 1) == \
        {"r": size - 1}
    assert hvd.broadcast_object(None) is None
    got = hvd.allgather_object([rank] * rank, name="t.objs")
    assert got == [[r] * r for r in range(size)]


def test_broadcast_parameters(rank, size):
    torch.manual_seed(rank)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    sums = hvd.allgather_object([float(t.double().sum())
                                 for t in m.state_dict().values()])
    assert all(s == sums[0] for s in sums)
    torch.manual_seed(rank + 100)
    m2 = torch.nn.Linear(2, 2)
    hvd.broadcast_parameters(list(m2.named_parameters()), root_rank=size - 1)
    torch.manual_seed(size - 1 + 100)
    ref = torch.nn.Linear(2, 2)
    assert torch.equal(m2.weight, ref.weight) and torch.equal(m2.bias,
                                                              ref.bias)
    with pytest.raises(ValueError, match="invalid params"):
        hvd.broadcast_parameters(m2.parameters(), 0)
    # A list of bare tensors, as Horovod accepts (list(model.parameters())).
    torch.manual_seed(rank + 200)
    m3 = torch.nn.Linear(2, 3)
    hvd.broadcast_parameters(list(m3.parameters()), root_rank=0)
    torch.manual_seed(200)
    ref = torch.nn.Linear(2, 3)
    assert torch.equal(m3.weight, ref.weight) and torch.equal(m3.bias,
                                                              ref.bias)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.01),
], ids=["sgd", "adam"])
def test_broadcast_optimizer_state(rank, size, make):
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    opt = make(m.parameters())
    for g in opt.param_groups:
        g["lr"] = 0.1 * (rank + 1)  # differs by rank
    if rank == 0:  # only the root has state
        m(torch.randn(5, 3)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["lr"] == pytest.approx(0.1)
    flat = []
    for st in sd["state"].values():
        for v in st.values():
            flat.append(float(torch.as_tensor(v).double().sum()))
    everyone = hvd.allgather_object(flat)
    assert len(flat) > 0 and all(f == everyone[0] for f in everyone)


# ---- errors ----------------------------------------------------------------


def test_errors(rank, size):
    x = torch.ones(3)
    # Rank 0's t.dup stays in flight until the others enqueue it, which
    # they do only after t.dup.sync, which rank 0 joins after its check (a
    # fast backend, MPI, completed it before the check otherwise).
    if rank == 0:
        h = hvd.allreduce_async(x, name="t.dup")
        with pytest.raises(ValueError, match="already in flight"):
            hvd.allreduce_async(x, name="t.dup")
        hvd.allreduce(torch.ones(1), name="t.dup.sync")
    else:
        hvd.allreduce(torch.ones(1), name="t.dup.sync")
        h = hvd.allreduce_async(x, name="t.dup")
    hvd.synchronize(h)
    with pytest.raises(hvd.HorovodInternalError, match="t.mismatch"):
        hvd.allreduce(torch.ones(2 + (rank == 0)), name="t.mismatch")
    with pytest.raises(RuntimeError, match="t.mismatch.dtype"):
        hvd.allreduce(torch.ones(2, dtype=torch.float32 if rank else
                                 torch.float64), name="t.mismatch.dtype")
    with pytest.raises(TypeError, match="dtype"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    # grouped collectives take the tensors of one device, as Horovod's
    # (a RuntimeError, "Tensors in list must be on same device")
    for grouped in (hvd.grouped_allreduce, hvd.grouped_allgather,
                    hvd.grouped_reducescatter):
        with pytest.raises(RuntimeError, match="same device"):
            grouped([torch.ones(size, 1), torch.ones(size, 1, device="meta")])
    with pytest.raises(ValueError, match="meta.*CPU and CUDA tensors"):
        hvd.allreduce(torch.empty(2, device="meta"))
    with pytest.raises(ValueError, match="sparse"):
        hvd.allreduce(torch.ones(2).to_sparse())
    with pytest.raises(TypeError):
        hvd.allreduce([1.0, 2.0])
    with pytest.raises(TypeError, match="Adasum"):
        hvd.allreduce(x.long(), op=hvd.Adasum)
    # Horovod: HorovodInternalError (a RuntimeError) at enqueue
    with pytest.raises(hvd.HorovodInternalError,
                       match="only supports AVERAGE and SUM, not Max"):
        hvd.reducescatter(torch.ones(size, 1), op=hvd.Max)
    with pytest.raises(ValueError, match="root"):
        hvd.broadcast(x, size)
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.ones(4, 1), splits=[4])  # one split per rank
    with pytest.raises(ValueError, match="dimension"):
        hvd.allgather(torch.tensor(1.0))
    with pytest.raises(ValueError, match="unknown handle"):
        hvd.synchronize(987654321)
    # Rank 0 writes the timeline (Horovod's coordinator); the others have
    # no file to fail on.
    if hvd.rank() == 0:
        with pytest.raises(ValueError, match="timeline"):
            hvd.start_timeline("/nonexistent-dir/timeline.json")
    else:
        hvd.start_timeline("/nonexistent-dir/timeline.json")
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(x, process_set=hvd.ProcessSet([0]))
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


# ---- memory changed in flight -----------------------------------------------

# 4 MiB: freed, such a block goes back to the system, and a runtime still
# writing to it crashes the process instead of quietly corrupting the heap.
N_SWAP = 1 << 20


def _changed_in_flight(rank, enqueue, change):
    """Rank 0 enqueues (enqueue() returns the handle), then change()s the
    tensor, and only then lets the others enqueue: the runtime reads and
    writes rank 0's memory after the change. Returns the handle."""
    if rank == 0:
        h = enqueue()
        change()
        hvd.barrier()
    else:
        hvd.barrier()
        h = enqueue()
    return h


def test_memory_replaced_in_flight(rank, size):
    """A tensor given other memory (set_(), .data =) between the enqueue
    and synchronize: the memory the runtime uses stays alive (no crash);
    an in-place result is copied into the tensor's new memory when the
    tensor kept its shape, dtype and device, and a RuntimeError naming the
    tensor says why it cannot be otherwise."""
    total = float(sum(range(1, size + 1)))

    def fill():
        return torch.full((N_SWAP,), float(rank + 1))

    # in place, new memory of the same shape: the result lands in it
    for name, change in (
            ("swap.set", lambda t: t.set_(torch.zeros(N_SWAP))),
            ("swap.data", lambda t: setattr(t, "data", torch.zeros(N_SWAP)))):
        t = fill()
        h = _changed_in_flight(
            rank, lambda: hvd.allreduce_async_(t, op=hvd.Sum, name=name),
            lambda: change(t))
        assert hvd.synchronize(h) is t
        assert t.shape == (N_SWAP,) and bool(torch.all(t == total)), name

    # in place, new memory of another shape: a clear error on rank 0
    t = fill()
    h = _changed_in_flight(
        rank,
        lambda: hvd.allreduce_async_(t, op=hvd.Sum, name="swap.shape"),
        lambda: t.set_(torch.zeros(10)))
    if rank == 0:
        with pytest.raises(RuntimeError, match=r"allreduce\.swap\.shape: the "
                           r"tensor was given other memory.*now \[10\]"):
            hvd.synchronize(h)
    else:
        hvd.synchronize(h)
        assert bool(torch.all(t == total))

    # not contiguous: the copy-back goes to the view's new memory
    base = torch.full((N_SWAP // 512, 1024), float(rank + 1))
    view = base[:, ::2]
    h = _changed_in_flight(
        rank,
        lambda: hvd.allreduce_async_(view, op=hvd.Sum, name="swap.nc"),
        lambda: view.set_(torch.zeros(view.shape)))
    assert hvd.synchronize(h) is view and bool(torch.all(view == total))

    # the input of an out-of-place allreduce: its values at the enqueue
    t = fill()
    h = _changed_in_flight(
        rank,
        lambda: hvd.allreduce_async(t, op=hvd.Sum, name="swap.input"),
        lambda: t.set_(torch.zeros(3)))
    out = hvd.synchronize(h)
    assert out.shape == (N_SWAP,) and bool(torch.all(out == total))

    # an in-place broadcast and grouped allreduce
    t = torch.full((N_SWAP,), float(rank))
    h = _changed_in_flight(
        rank,
        lambda: hvd.broadcast_async_(t, 1, name="swap.bcast"),
        lambda: t.set_(torch.zeros(N_SWAP)))
    assert hvd.synchronize(h) is t and bool(torch.all(t == 1.0))
    a, b = fill(), fill()
    h = _changed_in_flight(
        rank,
        lambda: hvd.grouped_allreduce_async_([a, b], op=hvd.Sum,
                                             name="swap.group"),
        lambda: a.set_(torch.zeros(N_SWAP)))
    got = hvd.synchronize(h)
    assert got[0] is a and got[1] is b
    assert bool(torch.all(a == total)) and bool(torch.all(b == total))
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_resize_in_flight_refused(rank, size):
    """Growing a tensor reallocates its storage, freeing the memory whoever
    holds it: while an operation uses that storage, resize_ and resize_as_
    refuse to grow it, naming the operation; resizing within the storage,
    and any resize after synchronize, work."""
    total = float(sum(range(1, size + 1)))
    t = torch.full((N_SWAP,), float(rank + 1))
    h = hvd.allreduce_async_(t, op=hvd.Sum, name="grow")
    with pytest.raises(RuntimeError, match=r"resize_\(\).*allreduce\.grow.*"
                       r"synchronize the handle first"):
        t.resize_(4 * N_SWAP)
    with pytest.raises(RuntimeError, match=r"resize_as_\(\).*allreduce\.grow"):
        t.resize_as_(torch.empty(2, N_SWAP))
    with pytest.raises(RuntimeError, match=r"allreduce\.grow"):
        t[:10].resize_(2 * N_SWAP)  # another view of the same storage
    assert t.resize_(N_SWAP) is t  # within the storage: fine
    assert hvd.synchronize(h) is t and bool(torch.all(t == total))
    t.resize_(4 * N_SWAP)  # synchronized: the memory is the program's again
    assert t.numel() == 4 * N_SWAP
    u = torch.ones(4)
    u.resize_(8)  # a tensor no operation uses
    assert u.numel() == 8


def test_timeline_start_stop(rank, size, tmp_path):
    """start_timeline/stop_timeline write a Chrome trace that a JSON parser
    loads, with the collectives run in between and none after. As in
    Horovod, rank 0 (the coordinator) writes it; the others write none."""
    import json
    path = tmp_path / ("timeline.%d.json" % rank)
    hvd.start_timeline(str(path), mark_cycles=True)
    hvd.allreduce(torch.ones(10), name="tl.inside", op=hvd.Sum)
    hvd.stop_timeline()
    # Rank 0 records a tensor's negotiation as soon as any rank asks for
    # it: the others wait here until rank 0 has stopped its timeline, so
    # that no request for tl.after can reach it before.
    hvd.barrier()
    hvd.allreduce(torch.ones(10), name="tl.after", op=hvd.Sum)
    if rank != 0:
        assert not path.exists()
        return
    events = json.load(open(path))
    names = {e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    # Like Horovod, the binding names a tensor "allreduce.<name>".
    assert "allreduce.tl.inside" in names, names
    assert not any("tl.after" in n for n in names)
    phases = {e.get("name") for e in events if e.get("ph") == "B"}
    # The data backend's phase: SHM_ALLREDUCE on one host (MPI_ALLREDUCE
    # when MPI started the job, as Horovod), unless KOLO_CPU_OPERATIONS
    # names another (GLOO_ALLREDUCE, MPI_ALLREDUCE).
    backend = os.environ.get("KOLO_CPU_OPERATIONS", "auto")
    if backend == "auto":
        backend = "MPI" if hvd.mpi_enabled() else "SHM"
    backend = backend.upper()
    assert ({"NEGOTIATE_ALLREDUCE", "ALLREDUCE", backend + "_ALLREDUCE"}
            <= phases or size == 1), phases
    assert events[0]["args"]["start_time_since_epoch_in_micros"] > 0
