"""op=Adasum: allreduce, grouped allreduce (kolo.torch and kolo's NumPy
API) and DistributedOptimizer(op=Adasum), against NumPy references
computed here (every rank computes every rank's input).

Two references, written independently of kolo/_adasum.py:
 * vhdd(): Horovod's vector-halving distance-doubling allreduce simulated
   rank by rank (horovod/common/ops/adasum/adasum.h: each level halves the
   slice a rank owns, the dot products and norms of a slice are summed over
   the ranks that share the pair, the slices are allgathered back), for a
   power-of-two number of ranks;
 * tree(): the recursive definition, adasum(tree(first half), tree(second
   half)), with kolo's rule for other sizes: rank p + i is first combined
   with rank i, p the largest power of two <= n.
Both compute in float64 (np.dot) from the inputs as the ranks hold them.

Tolerances: kolo computes in float64 and rounds the result to the tensor's
dtype once, so it may differ from the float64 reference by the rounding of
the result (half an ulp of the dtype, an ulp where torch rounds float64 to
float16/bfloat16 through float32) plus float64 rounding in the sums (about
1e-16 of the largest input): rtol = the dtype's machine epsilon, atol = 1e-12
times the largest input.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kolo  # noqa: E402
import kolo.torch as hvd  # noqa: E402
from kolo_testutil import rank_data  # noqa: E402

FLOOR = 1e-8  # Horovod's: a squared norm below it keeps the coefficient 1

EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7,
       torch.float32: 2.0 ** -23, torch.float64: 2.0 ** -50}


# ---- references ------------------------------------------------------------


def ref_pair(a, b):
    dot, aa, bb = np.dot(a, b), np.dot(a, a), np.dot(b, b)
    ca = 1.0 - dot / (2.0 * aa) if aa >= FLOOR else 1.0
    cb = 1.0 - dot / (2.0 * bb) if bb >= FLOOR else 1.0
    return ca * a + cb * b


def _pow2_tree(vs):
    if len(vs) == 1:
        return vs[0]
    h = len(vs) // 2
    return ref_pair(_pow2_tree(vs[:h]), _pow2_tree(vs[h:]))


def tree(vs):
    vs = [np.asarray(v, dtype=np.float64).reshape(-1) for v in vs]
    n = len(vs)
    p = 1
    while 2 * p <= n:
        p *= 2
    folded = [ref_pair(vs[i], vs[p + i]) if p + i < n else vs[i]
              for i in range(p)]
    return _pow2_tree(folded)


def vhdd(vs):
    """Horovod's VHDD Adasum, simulated: returns what every rank holds at
    the end (they must all hold the same)."""
    n = len(vs)
    assert n & (n - 1) == 0
    buf = [np.asarray(v, dtype=np.float64).reshape(-1).copy() for v in vs]
    m = len(buf[0])
    lo, hi = [0] * n, [m] * n
    level = 1
    while level < n:
        new = [b.copy() for b in buf]
        nlo, nhi = lo[:], hi[:]
        for r in range(n):
            first = (hi[r] - lo[r]) // 2
            if r & level:
                nlo[r] = lo[r] + first
            else:
                nhi[r] = lo[r] + first
        # the ranks of a block of 2*level share one pair: the left half of
        # the block holds the left vector, the right half the right one
        for block in range(0, n, 2 * level):
            ranks = range(block, block + 2 * level)
            dot = aa = bb = 0.0
            for r in ranks:
                s = slice(nlo[r], nhi[r])
                left, right = (r, r ^ level) if not r & level else \
                    (r ^ level, r)
                a, b = buf[left][s], buf[right][s]
                dot += np.dot(a, b) / 2  # each slice is seen by both ranks
                aa += np.dot(a, a) / 2
                bb += np.dot(b, b) / 2
            ca = 1.0 - dot / (2.0 * aa) if aa >= FLOOR else 1.0
            cb = 1.0 - dot / (2.0 * bb) if bb >= FLOOR else 1.0
            for r in ranks:
                s = slice(nlo[r], nhi[r])
                left, right = (r, r ^ level) if not r & level else \
                    (r ^ level, r)
                new[r][s] = ca * buf[left][s] + cb * buf[right][s]
        buf, lo, hi = new, nlo, nhi
        level *= 2
    # allgather phase: every slice from the rank that owns it
    out = np.empty(m)
    for r in range(n):
        out[lo[r]:hi[r]] = buf[r][lo[r]:hi[r]]
    return out


def reference(vs):
    n = len(vs)
    return vhdd(vs) if n & (n - 1) == 0 else tree(vs)


def test_references_agree():
    """The two references are the same computation at 2^k ranks."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 4, 8):
        for m in (1, 5, 64):
            vs = [rng.normal(size=m) * (k + 1) for k in range(n)]
            np.testing.assert_allclose(vhdd(vs), tree(vs), rtol=1e-12,
                                       atol=1e-12)


# ---- helpers ---------------------------------------------------------------


def data(seed, r, shape, dtype):
    a = rank_data(seed, r, shape, np.float64)
    return torch.from_numpy(a).to(dtype)


def as64(t):
    return t.detach().to(torch.float64).numpy().copy()


def check_close(got, vs, dtype, scale=1.0):
    ref = reference([as64(v) for v in vs]).reshape(tuple(got.shape))
    big = max(float(np.abs(as64(v)).max()) for v in vs) if got.numel() else 0
    np.testing.assert_allclose(as64(got), ref * scale, rtol=EPS[dtype],
                               atol=1e-12 * big * abs(scale) + 1e-300)


# ---- constants -------------------------------------------------------------


def test_adasum_constant():
    """hvd.Adasum is a plain int module constant, like Horovod's (and
    Average, Sum), distinct from the other ops, the same in kolo and
    kolo.torch."""
    ops = [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product]
    assert all(type(o) is int for o in ops)
    assert len(set(ops)) == len(ops)
    assert kolo.Adasum == hvd.Adasum and "Adasum" in hvd.__all__


# ---- allreduce -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16,
                                   torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(17,), (3, 4, 5), ()])
def test_allreduce_matches_reference(rank, size, dtype, shape):
    vs = [data(11, r, shape, dtype) for r in range(size)]
    got = hvd.allreduce(vs[rank], op=hvd.Adasum)
    assert got.dtype == dtype and got.shape == vs[rank].shape
    check_close(got, vs, dtype)
    # every rank holds the same bits
    everyone = hvd.allgather_object(got.numpy().tobytes()
                                    if dtype != torch.bfloat16 else
                                    got.view(torch.int16).numpy().tobytes())
    assert all(e == everyone[0] for e in everyone)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16,
                                   torch.float32, torch.float64])
def test_orthogonal_summed_parallel_averaged(rank, size, dtype):
    # one unit direction per rank, lengths 1..size: exactly their sum
    e = torch.zeros(size + 3, dtype=dtype)
    e[rank] = rank + 1
    got = hvd.allreduce(e, op=hvd.Adasum, name="ada.orth")
    want = torch.zeros(size + 3, dtype=dtype)
    want[:size] = torch.arange(1, size + 1, dtype=dtype)
    assert torch.equal(got, want)
    # the same vector everywhere: exactly that vector
    v = torch.tensor([0.5, -1.0, 2.0, 3.0], dtype=dtype)
    assert torch.equal(hvd.allreduce(v, op=hvd.Adasum, name="ada.par"), v)
    # parallel vectors of different lengths: their average (2 ranks), and
    # at any size a vector in the same direction
    w = v * (rank + 1)
    got = hvd.allreduce(w, op=hvd.Adasum, name="ada.par2").double()
    ratio = got / v.double()
    assert torch.allclose(ratio, ratio[0].expand(4), rtol=EPS[dtype] * 4)
    if size == 2:
        assert abs(ratio[0].item() - 1.5) <= 1.5 * EPS[dtype] * 2


def test_small_norms_keep_coefficient_one(rank, size):
    """As in Horovod, a tensor whose squared norm is below 1e-8 is taken as
    it is: equal tiny tensors are summed, not averaged."""
    v = torch.full((4,), 1e-5, dtype=torch.float64)  # |v|^2 = 4e-10
    got = hvd.allreduce(v, op=hvd.Adasum, name="ada.tiny")
    assert torch.allclose(got, v * size, rtol=1e-12, atol=0)


def test_inplace_async_and_scaling(rank, size):
    vs = [data(12, r, (6,), torch.float32) for r in range(size)]
    t = vs[rank].clone()
    h = hvd.allreduce_async_(t, op=hvd.Adasum, name="ada.inplace")
    while not hvd.poll(h):
        pass
    assert hvd.synchronize(h) is t
    check_close(t, vs, torch.float32)
    h = hvd.allreduce_async(vs[rank], op=hvd.Adasum, prescale_factor=0.5,
                            postscale_factor=3.0)
    out = hvd.synchronize(h)
    assert torch.equal(vs[rank], data(12, rank, (6,), torch.float32))
    check_close(out, [v * 0.5 for v in vs], torch.float32, scale=3.0)
    t = vs[rank].clone()
    assert hvd.allreduce_(t, op=hvd.Adasum) is t
    check_close(t, vs, torch.float32)


def test_input_copied_at_enqueue(rank, size):
    """The input is the tensor as it was when the operation was enqueued,
    whatever the program does to it before synchronize()."""
    vs = [data(13, r, (5,), torch.float64) for r in range(size)]
    t = vs[rank].clone()
    h = hvd.allreduce_async(t, op=hvd.Adasum, name="ada.copy")
    t.fill_(1e6)
    check_close(hvd.synchronize(h), vs, torch.float64)


def test_grouped(rank, size):
    dts = [torch.float32, torch.float64, torch.float16, torch.float32]
    shapes = [(3,), (2, 2), (7,), (1,)]
    vs = [[data(20 + i, r, s, d) for r in range(size)]
          for i, (s, d) in enumerate(zip(shapes, dts))]
    mine = [v[rank] for v in vs]
    outs = hvd.grouped_allreduce(mine, op=hvd.Adasum, name="ada.group")
    # each tensor gets its own coefficients
    for got, v, d in zip(outs, vs, dts):
        check_close(got, v, d)
    ts = [m.clone() for m in mine]
    h = hvd.grouped_allreduce_async_(ts, op=hvd.Adasum)
    assert hvd.synchronize(h) == ts
    for got, v, d in zip(ts, vs, dts):
        check_close(got, v, d)
    outs = hvd.synchronize(hvd.grouped_allreduce_async(mine, op=hvd.Adasum))
    for got, v, d in zip(outs, vs, dts):
        check_close(got, v, d)
    assert hvd.grouped_allreduce_([m.clone() for m in mine],
                                  op=hvd.Adasum)[1].shape == (2, 2)


def test_compression_fp16(rank, size):
    """Compression.fp16: float32 tensors travel and are combined as float16
    (Horovod compresses, reduces the float16 tensor, decompresses)."""
    vs = [data(14, r, (9,), torch.float32) for r in range(size)]
    got = hvd.allreduce(vs[rank], op=hvd.Adasum,
                        compression=hvd.Compression.fp16, name="ada.fp16")
    assert got.dtype == torch.float32
    check_close(got, [v.half() for v in vs], torch.float16)


def test_autograd(rank, size):
    """As in Horovod, the gradient of allreduce(op=Adasum) is the Adasum
    allreduce of the gradients."""
    x = data(15, rank, (4,), torch.float64).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Adasum, name="ada.grad")
    gs = [data(16, r, (4,), torch.float64) for r in range(size)]
    y.backward(gs[rank])
    check_close(x.grad, gs, torch.float64)


def test_process_set(rank, size):
    ps = hvd.add_process_set(hvd.ProcessSet([r for r in range(size)
                                             if r != 0]))
    try:
        if ps.included():
            vs = [data(17, r, (8,), torch.float32) for r in ps.ranks]
            got = hvd.allreduce(vs[ps.rank()], op=hvd.Adasum,
                                process_set=ps, name="ada.ps")
            check_close(got, vs, torch.float32)
    finally:
        hvd.remove_process_set(ps)


def test_errors(rank, size):
    with pytest.raises(TypeError, match="Adasum.*floating"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum)
    # Horovod refuses it at enqueue with a HorovodInternalError (a
    # RuntimeError), as its test_horovod_reducescatter_adasum expects
    with pytest.raises(hvd.HorovodInternalError,
                       match="only supports AVERAGE and SUM, not Adasum"):
        hvd.reducescatter(torch.ones(size, 1), op=hvd.Adasum)
    with pytest.raises(ValueError, match="op parameter supersedes"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum, average=True)
    # shapes that differ between ranks fail on every rank, naming it
    with pytest.raises(hvd.HorovodInternalError, match="ada.shape"):
        hvd.allreduce(torch.ones(2, 3 + (rank == 0)), op=hvd.Adasum,
                      name="ada.shape")
    # Adasum here, Sum there: fails on every rank, naming the tensor
    with pytest.raises(hvd.HorovodInternalError, match="ada.mixed"):
        hvd.allreduce(torch.ones(2), name="ada.mixed",
                      op=hvd.Adasum if rank == 0 else hvd.Sum)
    # and the job goes on
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_numpy(rank, size):
    vs = [rank_data(18, r, (3, 3), np.float32) for r in range(size)]
    got = kolo.allreduce(vs[rank], op=kolo.Adasum, name="ada.np")
    assert got.dtype == np.float32
    check_close(torch.from_numpy(got), [torch.from_numpy(v) for v in vs],
                torch.float32)
    a = vs[rank].copy()
    assert kolo.allreduce_(a, op=kolo.Adasum) is a
    np.testing.assert_array_equal(a, got)
    ws = [rank_data(19, r, (4,), np.float64) for r in range(size)]
    outs = kolo.grouped_allreduce([vs[rank], ws[rank]], op=kolo.Adasum)
    np.testing.assert_array_equal(outs[0], got)
    check_close(torch.from_numpy(outs[1]), [torch.from_numpy(w) for w in ws],
                torch.float64)
    with pytest.raises(TypeError, match="Adasum"):
        kolo.allreduce(np.ones(2, dtype=np.int64), op=kolo.Adasum)


# ---- DistributedOptimizer(op=Adasum) ---------------------------------------


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 2)
        self.unused = torch.nn.Linear(2, 2)

    def forward(self, x, use_fc2=True):
        h = torch.tanh(self.fc1(x))
        return self.fc2(h) if use_fc2 else h[:, :2]


def batch(step, r, rows=5):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(rows, 4, generator=g, dtype=torch.float64)


def make_model():
    torch.manual_seed(3)
    return Net().double()


def test_optimizer_matches_reference(rank, size):
    """Every rank applies SGD with momentum locally; the changes of the
    parameters are Adasum-combined. Simulated here for every rank: each
    rank's model and optimizer state, step by step."""
    lr, mom, steps = 0.1, 0.9, 3
    models = [make_model() for _ in range(size)]
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=mom)
            for m in models]
    model = make_model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=mom),
        named_parameters=model.named_parameters(), op=hvd.Adasum)
    # Horovod gives every parameter a zero gradient at once
    assert all(torch.equal(p.grad, torch.zeros_like(p))
               for p in model.parameters())
    names = [n for n, _ in model.named_parameters()]
    for step in range(steps):
        # reference: each rank's local update, then the tree of the deltas
        deltas = []
        for r in range(size):
            before = [p.detach().clone() for p in models[r].parameters()]
            opts[r].zero_grad()
            models[r](batch(step, r)).pow(2).sum().backward()
            opts[r].step()
            deltas.append([p.detach() - b for p, b in
                           zip(models[r].parameters(), before)])
            for p, b in zip(models[r].parameters(), before):
                p.data.copy_(b)
        for i, ps in enumerate(zip(*[m.parameters() for m in models])):
            d = reference([as64(dl[i]) for dl in deltas])
            for p in ps:
                p.data.add_(torch.from_numpy(d).view_as(p))
        # kolo
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        model(batch(step, rank)).pow(2).sum().backward()
        # the update is applied at step(): the weights are unchanged
        assert all(torch.equal(p, b) for p, b in
                   zip(model.parameters(), before))
        with pytest.raises(AssertionError, match="zero_grad"):
            opt.zero_grad()
        opt.step()
        for n, p, q in zip(names, model.parameters(),
                           models[rank].parameters()):
            np.testing.assert_allclose(as64(p), as64(q), rtol=1e-12,
                                       atol=1e-13, err_msg=n)
        # gradients stay local; so does the optimizer's state
        ref_opt = opts[rank]
        for p, q in zip(model.parameters(), models[rank].parameters()):
            if q.grad is not None:
                np.testing.assert_allclose(as64(p.grad), as64(q.grad),
                                           rtol=1e-12, atol=1e-13)
                np.testing.assert_allclose(
                    as64(opt.state[p]["momentum_buffer"]),
                    as64(ref_opt.state[q]["momentum_buffer"]),
                    rtol=1e-12, atol=1e-13)
    everyone = hvd.allgather_object([as64(p).tobytes()
                                     for p in model.parameters()])
    assert all(e == everyone[0] for e in everyone)


def test_optimizer_same_data_is_local_training(rank, size):
    """The same data on every rank: Adasum of equal deltas is that delta,
    so the model is the one of a single process (float32: start + (new -
    start) may differ from new by the rounding of the difference)."""
    torch.manual_seed(5)
    ref = torch.nn.Linear(6, 3)
    model = torch.nn.Linear(6, 3)
    model.load_state_dict(ref.state_dict())
    ropt = torch.optim.Adam(ref.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(),
                                                    lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   op=hvd.Adasum)
    for step in range(4):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)


def test_optimizer_passes_missing_and_rules(rank, size):
    """backward_passes_per_step, a parameter without a gradient on some
    ranks (updated in step(), from its .grad as it is), synchronize() doing
    nothing, skip_synchronize() refused, too many passes refused."""
    lr = 0.05
    model = make_model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr),
        named_parameters=model.named_parameters(), op=hvd.Adasum,
        backward_passes_per_step=2)
    with pytest.raises(AssertionError, match="Skipping synchronization"):
        with opt.skip_synchronize():
            pass
    start = [as64(p) for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    # rank 0 does not use fc2 (no gradient: its zero .grad is stepped)
    grads = []
    for r in range(size):
        m = make_model()
        for k in range(2):
            m(batch(10 + k, r), use_fc2=r != 0).sum().backward()
        grads.append([as64(p.grad) if p.grad is not None else
                      np.zeros(tuple(p.shape)) for p in m.parameters()])
    opt.zero_grad()
    for k in range(2):
        model(batch(10 + k, rank), use_fc2=rank != 0).sum().backward()
    opt.synchronize()  # does nothing
    opt.step()
    for i, (n, p) in enumerate(zip(names, model.parameters())):
        want = start[i] + reference([-lr * g[i] for g in grads]).reshape(
            start[i].shape)
        np.testing.assert_allclose(as64(p), want, rtol=1e-12, atol=1e-13,
                                   err_msg=n)
    opt.zero_grad()
    for k in range(2):
        model(batch(20 + k, rank)).sum().backward()
    with pytest.raises(AssertionError, match="more than backward_passes"):
        model(batch(22, rank)).sum().backward()
    opt.step()
    opt.set_backward_passes_per_step(1)
    opt.zero_grad()
    model(batch(23, rank)).sum().backward()
    opt.step()
    everyone = hvd.allgather_object([as64(p).tobytes()
                                     for p in model.parameters()])
    assert all(e == everyone[0] for e in everyone)


def test_optimizer_compression_and_arguments(rank, size):
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), op=hvd.Adasum,
        compression=hvd.Compression.fp16)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(rank))
    model(x).sum().backward()
    opt.step()
    assert model.weight.dtype == torch.float32
    everyone = hvd.allgather_object([as64(p).tobytes()
                                     for p in model.parameters()])
    assert all(e == everyone[0] for e in everyone)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1),
                                 op=hvd.Adasum, gradient_predivide_factor=2)
    with pytest.raises(ValueError, match="already"):
        hvd.DistributedOptimizer(opt, op=hvd.Average)
    # a process set of one rank: the plain optimizer (as Horovod on one
    # rank): the gradient as it is
    one = hvd.add_process_set(hvd.ProcessSet([0]))
    try:
        if one.included():
            m = torch.nn.Linear(2, 1)
            o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(),
                                                         lr=1.0),
                                         op=hvd.Adasum, process_set=one)
            w = m.weight.detach().clone()
            m(torch.ones(1, 2)).sum().backward()
            o.step()
            assert torch.allclose(m.weight, w - 1.0)
    finally:
        hvd.remove_process_set(one)


def test_training_as_horovod_mnist_example(rank, size):
    """Horovod's examples/pytorch/pytorch_mnist.py --use-adasum, in small:
    SGD with momentum, the learning rate not scaled by the number of ranks,
    each rank on its own shard. The loss goes down and every rank ends with
    the same parameters (bitwise)."""
    g = torch.Generator().manual_seed(99)
    x = torch.randn(512, 8, generator=g)
    y = (x @ torch.randn(8, 4, generator=g)).argmax(1)
    torch.manual_seed(rank)  # different on purpose: broadcast fixes it
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt,
                                   named_parameters=model.named_parameters(),
                                   op=hvd.Adasum)
    shard_x, shard_y = x[rank::size], y[rank::size]
    loss_fn = torch.nn.CrossEntropyLoss()

    def mean_loss():
        with torch.no_grad():
            return hvd.allreduce(loss_fn(model(shard_x), shard_y)).item()
    first = mean_loss()
    for epoch in range(3):
        for i in range(0, len(shard_x), 16):
            opt.zero_grad()
            loss_fn(model(shard_x[i:i + 16]), shard_y[i:i + 16]).backward()
            opt.step()
    assert mean_loss() < 0.8 * first
    everyone = hvd.allgather_object([p.detach().numpy().tobytes()
                                     for p in model.parameters()])
    assert all(e == everyone[0] for e in everyone)
    scaler = hvd.GradScaler()
    with pytest.raises(ValueError, match="Adasum"):
        scaler.step(opt)
