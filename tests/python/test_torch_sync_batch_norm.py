"""kolo.torch.SyncBatchNorm against torch.nn.BatchNorm on the global batch,
computed here in one process: every rank builds every rank's input (of
uneven sizes, sometimes none), the reference normalizes their
concatenation, and each rank compares its own rows, its input's gradient,
the sum over the ranks of its weight and bias gradients, and the running
statistics.

Tolerances. float64: 1e-10 (the two computations differ only by the order
of float64 sums). float32: rtol = atol = 2e-5 (relative to values of order
1; the gradients of order 1 too, the data being centred at 3 with spread
2). Both sides sum hundreds of float32 values in different orders (the
reference in one pass over the concatenated batch, kolo per rank then
combined in float64): each sum carries a relative error of a few times
float32's epsilon (1.2e-7) times the square root of the number of terms,
amplified by the centring (|mean| / std = 1.5) and by 1/std in the
normalization, which gives errors of order 1e-6; 2e-5 leaves a margin
without hiding a wrong formula (a biased running variance, for one, is off
by 1/(N-1) >= 1e-2 here, and a missing term of the gradient by 1e-1).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kolo.torch as hvd  # noqa: E402

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5),
       torch.float64: dict(rtol=1e-10, atol=1e-10)}
BN = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d,
      4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}
C = 3


def rows_of(r, size, empty_rank=None):
    """Uneven local batch sizes: 1, 3, 2, 4, ... rows (rank empty_rank has
    none)."""
    if r == empty_rank:
        return 0
    return [1, 3, 2, 4, 5][r % 5]


def spatial(dims):
    return {2: (), 3: (5,), 4: (3, 4), 5: (2, 3, 2)}[dims]


def make_inputs(seed, size, dims, dtype, empty_rank=None, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    xs, gs = [], []
    for r in range(size):
        shape = (rows_of(r, size, empty_rank), C) + spatial(dims)
        xs.append((3.0 + 2.0 * torch.randn(shape, generator=g,
                                           dtype=torch.float64))
                  .to(device, dtype))
        gs.append(torch.randn(shape, generator=g, dtype=torch.float64)
                  .to(device, dtype))
    return xs, gs


def pair(dims, dtype, device="cpu", process_set=hvd.global_process_set,
         **kw):
    """A SyncBatchNorm and the reference BatchNorm, with the same
    (non-trivial) weight and bias."""
    sbn = hvd.SyncBatchNorm(C, process_set=process_set, **kw).to(device,
                                                                 dtype)
    ref = BN[dims](C, **kw).to(device, dtype)
    if sbn.affine:
        with torch.no_grad():
            w = torch.tensor([0.5, 1.5, -2.0], dtype=dtype)
            b = torch.tensor([0.1, -0.3, 2.0], dtype=dtype)
            for m in (sbn, ref):
                m.weight.copy_(w)
                m.bias.copy_(b)
    return sbn, ref


def close(got, want, dtype, what):
    np.testing.assert_allclose(got.detach().cpu().double().numpy(),
                               want.detach().cpu().double().numpy(),
                               err_msg=what, **TOL[dtype])


def step_and_compare(sbn, ref, xs, gs, rank, dtype):
    """One training step of both, compared."""
    x = xs[rank].clone().requires_grad_()
    y = sbn(x)
    (y * gs[rank]).sum().backward()
    X = torch.cat(xs).requires_grad_()
    Y = ref(X)
    (Y * torch.cat(gs)).sum().backward()
    start = sum(t.shape[0] for t in xs[:rank])
    mine = slice(start, start + xs[rank].shape[0])
    assert y.dtype == dtype and y.shape == x.shape
    close(y, Y[mine], dtype, "output")
    close(x.grad, X.grad[mine], dtype, "input gradient")
    if sbn.affine:
        # local gradients; their sum over the ranks is the reference's
        for p, q, n in ((sbn.weight, ref.weight, "weight"),
                        (sbn.bias, ref.bias, "bias")):
            total = hvd.allreduce(p.grad.cpu(), op=hvd.Sum,
                                  name="sbn.t." + n)
            close(total, q.grad, dtype, n + " gradient")
            p.grad = None
            q.grad = None
    if ref.track_running_stats:
        close(sbn.running_mean, ref.running_mean, dtype, "running_mean")
        close(sbn.running_var, ref.running_var, dtype, "running_var")
        assert sbn.num_batches_tracked.item() == \
            ref.num_batches_tracked.item()
    else:
        assert sbn.running_mean is None and sbn.running_var is None


@pytest.mark.parametrize("dims", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_batchnorm_on_global_batch(rank, size, dims, dtype):
    sbn, ref = pair(dims, dtype)
    for step in range(3):
        xs, gs = make_inputs(100 * dims + step, size, dims, dtype)
        step_and_compare(sbn, ref, xs, gs, rank, dtype)
    # eval: the running statistics, locally (a rank with other data than
    # the others still gets the reference's rows)
    sbn.eval()
    ref.eval()
    xs, _ = make_inputs(7, size, dims, dtype)
    with torch.no_grad():
        close(sbn(xs[rank]), ref(xs[rank]), dtype, "eval output")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_rank_without_rows(rank, size, dtype):
    """Rank size-1 has an empty batch this step: the others normalize over
    theirs, and its empty output and gradient are fine."""
    sbn, ref = pair(4, dtype)
    for step in range(2):
        xs, gs = make_inputs(40 + step, size, 4, dtype,
                             empty_rank=size - 1)
        step_and_compare(sbn, ref, xs, gs, rank, dtype)


@pytest.mark.parametrize("kw", [dict(momentum=None), dict(affine=False),
                                dict(track_running_stats=False),
                                dict(momentum=0.5, eps=1e-3)],
                         ids=["cumulative", "no-affine", "no-running-stats",
                              "momentum-eps"])
def test_options(rank, size, kw):
    dtype = torch.float64
    sbn, ref = pair(4, dtype, **kw)
    for step in range(3):
        xs, gs = make_inputs(60 + step, size, 4, dtype)
        step_and_compare(sbn, ref, xs, gs, rank, dtype)
    # eval: without running statistics, the global batch's (communicates)
    sbn.eval()
    ref.eval()
    xs, gs = make_inputs(70, size, 4, dtype)
    step_and_compare(sbn, ref, xs, gs, rank, dtype)


def test_too_few_values(rank, size):
    """One value per channel in the whole batch: a ValueError on every
    rank, as BatchNorm raises on one."""
    sbn = hvd.SyncBatchNorm(C)
    x = torch.ones((1 if rank == 0 else 0, C))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        sbn(x)


def test_api(rank, size):
    """horovod.torch.SyncBatchNorm's arguments, in its order; torch's
    BatchNorm state, so that checkpoints move between the two."""
    sbn = hvd.SyncBatchNorm(4, 1e-3, 0.2, False, False)
    assert (sbn.num_features, sbn.eps, sbn.momentum, sbn.affine,
            sbn.track_running_stats) == (4, 1e-3, 0.2, False, False)
    assert isinstance(sbn, torch.nn.modules.batchnorm._BatchNorm)
    sbn = hvd.SyncBatchNorm(num_features=4)
    ref = torch.nn.BatchNorm2d(4)
    assert sbn.state_dict().keys() == ref.state_dict().keys()
    sbn.load_state_dict(ref.state_dict())
    assert sbn.process_set is hvd.global_process_set
    with pytest.raises(ValueError, match="2D"):
        sbn(torch.ones(4))
    with pytest.raises(ValueError, match="channels"):
        sbn(torch.ones(2, 5))
    d = hvd.SyncBatchNorm(2, dtype=torch.float64)
    assert d.weight.dtype == torch.float64


def test_process_set(rank, size):
    """The global batch of a process set is its ranks' batches."""
    ps = hvd.add_process_set(hvd.ProcessSet(range(1, size)))
    try:
        if ps.included():
            dtype = torch.float64
            sbn, ref = pair(3, dtype, process_set=ps)
            xs, gs = make_inputs(80, size, 3, dtype)
            xs, gs = xs[1:], gs[1:]
            x = xs[ps.rank()].clone().requires_grad_()
            y = sbn(x)
            (y * gs[ps.rank()]).sum().backward()
            X = torch.cat(xs).requires_grad_()
            Y = ref(X)
            (Y * torch.cat(gs)).sum().backward()
            start = sum(t.shape[0] for t in xs[:ps.rank()])
            mine = slice(start, start + x.shape[0])
            close(y, Y[mine], dtype, "output")
            close(x.grad, X.grad[mine], dtype, "input gradient")
            close(sbn.running_var, ref.running_var, dtype, "running_var")
    finally:
        hvd.remove_process_set(ps)


def _net(bn):
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Conv2d(2, C, 3, padding=1), bn(C),
                               torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(C * 16, 2)).double()


def test_training_with_distributed_optimizer(rank, size):
    """A conv net with SyncBatchNorm trained with DistributedOptimizer(op=
    Sum) on uneven shards, the loss being the global batch's mean: every
    step equals one step of the same net with BatchNorm2d on the whole
    batch in one process."""
    model = _net(hvd.SyncBatchNorm)
    ref = _net(torch.nn.BatchNorm2d)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), op=hvd.Sum)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        xs = [torch.randn(rows_of(r, size) + 1, 2, 4, 4, generator=g,
                          dtype=torch.float64) for r in range(size)]
        ys = [torch.randint(0, 2, (x.shape[0],), generator=g) for x in xs]
        total = sum(x.shape[0] for x in xs)
        loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
        opt.zero_grad()
        (loss_fn(model(xs[rank]), ys[rank]) / total).backward()
        opt.step()
        ropt.zero_grad()
        (loss_fn(ref(torch.cat(xs)), torch.cat(ys)) / total).backward()
        ropt.step()
        for (n, p), q in zip(model.state_dict().items(),
                             ref.state_dict().values()):
            close(p, q, torch.float64, n)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device visible to torch")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda(rank, size, dtype):
    """CUDA inputs (Horovod's only kind): the same results; the statistics
    travel through host memory, so ranks may share a GPU and kolo needs no
    NCCL for this."""
    device = "cuda:%d" % (rank % torch.cuda.device_count())
    sbn, ref = pair(4, dtype, device=device)
    for step in range(2):
        xs, gs = make_inputs(90 + step, size, 4, dtype, device=device)
        step_and_compare(sbn, ref, xs, gs, rank, dtype)
