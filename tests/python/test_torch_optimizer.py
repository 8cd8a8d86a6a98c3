"""DistributedOptimizer against training on one process: every rank can
compute every rank's batch, so each rank also trains a local reference
model on the global batch and compares."""

import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import kolo.torch as hvd  # noqa: E402

nn = torch.nn


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(),
                         nn.Linear(8, 2)).double()


def batch(step, r, b):
    g = torch.Generator().manual_seed(1000 * step + r)
    return (torch.randn(b, 4, generator=g, dtype=torch.float64),
            torch.randn(b, 2, generator=g, dtype=torch.float64))


def global_batch(step, b):
    xs, ys = zip(*[batch(step, r, b) for r in range(hvd.size())])
    return torch.cat(xs), torch.cat(ys)


def loss_fn(model, x, y):
    return ((model(x) - y) ** 2).mean()


def named(model):
    """The model's named parameters, the names prefixed with the calling
    test's name: the runtime keeps per-name state (accumulators, cache
    entries), and tests should not share it."""
    prefix = sys._getframe(1).f_code.co_name
    return [(prefix + "." + n, p) for n, p in model.named_parameters()]


def rank_grads(ref, ropt, loss, size):
    """Every rank's gradients of the reference model (of its parameters
    that take one), from loss(ref, r, size) for each rank r. With
    set_to_none=False: torch 2's zero_grad() sets the gradients to None,
    torch 1.13's zeroes them; the reference writes into them."""
    grads = []
    for r in range(size):
        ropt.zero_grad(set_to_none=False)
        loss(ref, r, size).backward()
        grads.append([p.grad.clone() for p in ref.parameters()
                      if p.requires_grad])
    return grads


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_close(a, b, tol=1e-9):
    for p, q in zip(a, b):
        assert torch.allclose(p, q, rtol=tol, atol=tol), (p - q).abs().max()


def assert_same_everywhere(model):
    sums = hvd.allgather_object([float(p.sum()) for p in model.parameters()])
    assert all(s == sums[0] for s in sums)


def train_reference(steps, b, make_opt, passes=1):
    """One process, the global batch (size * b rows, split into `passes`
    sub-batches whose gradients are summed)."""
    ref = make_model()
    opt = make_opt(ref.parameters())
    for step in range(steps):
        opt.zero_grad()
        x, y = global_batch(step, b * passes)
        n = hvd.size()
        for k in range(passes):
            rows = torch.cat([torch.arange(r * b * passes + k * b,
                                           r * b * passes + (k + 1) * b)
                              for r in range(n)])
            (loss_fn(ref, x[rows], y[rows]) / passes).backward()
        opt.step()
    return params(ref)


def sgd(p):
    return torch.optim.SGD(p, lr=0.1, momentum=0.9)


def test_matches_one_process_on_the_global_batch(rank, size):
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=named(model))
    assert isinstance(opt, torch.optim.SGD)
    for step in range(3):
        opt.zero_grad()
        loss_fn(model, *batch(step, rank, 4)).backward()
        opt.step()
    assert_close(params(model), train_reference(3, 4, sgd))
    assert_same_everywhere(model)


def test_backward_passes_per_step_4_equals_1_at_4b(rank, size):
    b = 3
    m4 = make_model()
    o4 = hvd.DistributedOptimizer(sgd(m4.parameters()),
                                  named_parameters=named(m4),
                                  backward_passes_per_step=4)
    m1 = make_model()
    o1 = hvd.DistributedOptimizer(
        sgd(m1.parameters()),
        named_parameters=[("one." + n, p) for n, p in named(m1)])
    for step in range(3):
        x, y = batch(step, rank, 4 * b)
        o4.zero_grad()
        for k in range(4):
            sub = slice(k * b, (k + 1) * b)
            (loss_fn(m4, x[sub], y[sub]) / 4).backward()
            if k < 3:  # the runtime holds the partial sums
                assert all(p.grad is None for p in m4.parameters())
        o4.step()
        o1.zero_grad()
        loss_fn(m1, x, y).backward()
        o1.step()
    assert_close(params(m4), params(m1))
    assert_close(params(m1), train_reference(3, b, sgd, passes=4))
    assert_same_everywhere(m4)


def test_average_aggregated_gradients(rank, size):
    m = make_model()
    o = hvd.DistributedOptimizer(sgd(m.parameters()),
                                 named_parameters=named(m),
                                 backward_passes_per_step=2,
                                 average_aggregated_gradients=True)
    for step in range(2):
        x, y = batch(step, rank, 4)
        o.zero_grad()
        loss_fn(m, x[:2], y[:2]).backward()  # no division by the passes
        loss_fn(m, x[2:], y[2:]).backward()
        o.step()
    assert_close(params(m), train_reference(2, 2, sgd, passes=2))


def test_step_after_fewer_passes_flushes(rank, size):
    m = make_model()
    o = hvd.DistributedOptimizer(sgd(m.parameters()),
                                 named_parameters=named(m),
                                 backward_passes_per_step=4)
    x, y = batch(0, rank, 4)
    (loss_fn(m, x[:2], y[:2]) / 2).backward()
    (loss_fn(m, x[2:], y[2:]) / 2).backward()
    o.step()  # two passes of four: what was accumulated is reduced
    assert_close(params(m), train_reference(1, 2, sgd, passes=2))
    # the next group starts afresh (here with another number of passes)
    o.zero_grad()
    o.set_backward_passes_per_step(1)
    (loss_fn(m, x, y)).backward()
    o.step()
    assert_same_everywhere(m)


def test_set_backward_passes_per_step(rank, size):
    m = make_model()
    o = hvd.DistributedOptimizer(sgd(m.parameters()),
                                 named_parameters=named(m))
    o.set_backward_passes_per_step(2)
    assert o.backward_passes_per_step == 2
    x, y = batch(0, rank, 4)
    (loss_fn(m, x[:2], y[:2]) / 2).backward()
    with pytest.raises(ValueError, match="pending"):
        o.set_backward_passes_per_step(3)
    (loss_fn(m, x[2:], y[2:]) / 2).backward()
    o.step()
    assert_close(params(m), train_reference(1, 2, sgd, passes=2))
    with pytest.raises(ValueError):
        o.set_backward_passes_per_step(0)


def test_synchronize_then_clip_then_step(rank, size):
    m = make_model()
    o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.5),
                                 named_parameters=named(m))
    o.zero_grad()
    loss_fn(m, *batch(0, rank, 4)).backward()
    o.synchronize()
    nn.utils.clip_grad_norm_(m.parameters(), 0.05)
    with o.skip_synchronize():
        o.step()
    ref = make_model()
    loss_fn(ref, *global_batch(0, 4)).backward()
    nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    torch.optim.SGD(ref.parameters(), lr=0.5).step()
    assert_close(params(m), params(ref))
    # step() after synchronize() without skip_synchronize(): a warning
    o.zero_grad()
    loss_fn(m, *batch(1, rank, 4)).backward()
    o.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        o.step()
    assert_same_everywhere(m)


def test_clip_by_global_norm_before_the_allreduce(rank, size):
    max_norm = 0.05
    seen = {}

    def post(ps):
        seen["grads"] = [p.grad.clone() for p in ps]

    m = make_model()
    o = hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.5),
        named_parameters=named(m),
        pre_allreduce_hooks=[hvd.clip_grad_norm_hook(max_norm)],
        post_allreduce_hooks=[post])
    o.zero_grad()
    loss_fn(m, *batch(0, rank, 4)).backward()
    o.step()
    # reference: each rank's local gradient clipped, then averaged
    local = []
    for r in range(size):
        ref = make_model()
        loss_fn(ref, *batch(0, r, 4)).backward()
        nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
        local.append([p.grad for p in ref.parameters()])
    avg = [sum(g[i] for g in local) / size for i in range(len(local[0]))]
    assert_close(seen["grads"], avg)
    ref = make_model()
    for p, g in zip(ref.parameters(), avg):
        p.grad = g
    torch.optim.SGD(ref.parameters(), lr=0.5).step()
    assert_close(params(m), params(ref))
    # hooks registered later run too
    calls = []
    o.register_post_allreduce_hook(lambda ps: calls.append(len(ps)))
    o.zero_grad()
    loss_fn(m, *batch(1, rank, 4)).backward()
    o.step()
    assert calls == [4]


def test_none_gradients(rank, size):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(3, 1).double()
            self.unused = nn.Linear(3, 1).double()  # no rank uses it (yet)
            self.rank0 = nn.Linear(3, 1).double()   # only rank 0 uses it
            self.use_unused = False

        def forward(self, x):
            out = self.used(x)
            if hvd.rank() == 0:
                out = out + self.rank0(x)
                if self.use_unused:
                    out = out + self.unused(x)
            return out

    torch.manual_seed(0)
    net = Net()
    before = params(net)
    o = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                 named_parameters=named(net))
    x = torch.ones(2, 3, dtype=torch.float64) * (rank + 1)
    net(x).sum().backward()
    o.step()
    # As in Horovod: a parameter no rank has a gradient for gets a zero one
    # (plain SGD then leaves it as it was).
    zero = torch.zeros(1, 3, dtype=torch.float64)
    assert torch.equal(net.unused.weight.grad, zero)
    assert torch.equal(net.unused.bias.grad, torch.zeros(1, dtype=torch.float64))
    assert torch.equal(net.unused.weight, before[2])
    # rank0's gradient is averaged with zeros from the other ranks
    g0 = torch.ones(2, 3, dtype=torch.float64).sum(0)  # rank 0's x is ones
    assert torch.allclose(net.rank0.weight.grad, (g0 / size).reshape(1, 3))
    assert_same_everywhere(net)
    # a parameter unused so far that one rank starts using is reduced too
    net.use_unused = True
    o.zero_grad()
    net(x).sum().backward()
    o.step()
    assert torch.allclose(net.unused.weight.grad, (g0 / size).reshape(1, 3))
    assert not torch.equal(net.unused.weight, before[2])
    assert_same_everywhere(net)
    # no gradient for any parameter: an error
    o.zero_grad()
    with pytest.raises(ValueError, match="No gradients provided"):
        o.step()


def test_unused_parameter_decays_as_in_horovod(rank, size):
    """Horovod allreduces a zero gradient for a parameter that got none, so
    weight decay and momentum move it at every step, even with
    zero_grad(set_to_none=True); a one-process replay of that sequence
    must give the same bits."""
    def make(seed):
        torch.manual_seed(seed)
        return nn.ModuleDict({"used": nn.Linear(3, 1).double(),
                              "unused": nn.Linear(3, 1).double()})

    def opt_of(m):
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9,
                               weight_decay=0.05)
    net = make(7)
    o = hvd.DistributedOptimizer(opt_of(net),
                                 named_parameters=list(net.named_parameters()))
    x = torch.ones(2, 3, dtype=torch.float64)
    for _ in range(2):
        o.zero_grad(set_to_none=True)
        net["used"](x).sum().backward()
        o.step()
    ref = make(7)
    ropt = opt_of(ref)
    for _ in range(2):
        ropt.zero_grad(set_to_none=True)
        ref["used"](x).sum().backward()
        for p in ref["unused"].parameters():
            p.grad = torch.zeros_like(p)
        ropt.step()
    assert torch.equal(net["unused"].weight, ref["unused"].weight)
    assert torch.equal(net["unused"].bias, ref["unused"].bias)
    assert not torch.equal(net["unused"].weight, make(7)["unused"].weight)


def test_horovod_errors(rank, size):
    m = make_model()
    pairs = list(m.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd(m.parameters()),
                                 named_parameters=[("w", p) for _, p in pairs])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(sgd(m.parameters()),
                                 named_parameters=pairs[:1])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(sgd(m.parameters()),
                                 named_parameters=[p for _, p in pairs])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd(m.parameters()),
                                 backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(sgd(m.parameters()), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="Adasum.*hooks"):
        hvd.DistributedOptimizer(sgd(m.parameters()), op=hvd.Adasum,
                                 post_allreduce_hooks=[print])
    with pytest.raises(TypeError):
        hvd.DistributedOptimizer(m)
    o = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=pairs)
    with pytest.raises(ValueError, match="already"):
        hvd.DistributedOptimizer(o)
    x, y = batch(0, rank, 4)
    loss_fn(m, x, y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        o.zero_grad()
    with pytest.raises(AssertionError, match="more than "
                       "backward_passes_per_step"):
        loss_fn(m, x, y).backward()
    o.synchronize()  # the first pass's allreduces complete
    o.zero_grad()
    loss_fn(m, x, y).backward()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        o.step()  # after a synchronize(), as Horovod does
    assert_same_everywhere(m)


def test_without_named_parameters(rank, size):
    """Without named_parameters, Horovod names each parameter
    allreduce.noname.<group>.<index in the group> (_parameter_names maps
    parameter -> name): the same names on every rank, and training works."""
    m = make_model()
    ps = list(m.parameters())
    groups = [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.05}]
    o = hvd.DistributedOptimizer(torch.optim.SGD(groups, lr=0.1,
                                                 momentum=0.9))
    want = {id(p): "allreduce.noname.%d.%d" % (i, j)
            for i, g in enumerate(groups) for j, p in enumerate(g["params"])}
    assert {id(p): n for p, n in o._parameter_names.items()} == want
    names = [o._parameter_names[p] for p in ps]
    assert hvd.allgather_object(names) == [names] * size
    for step in range(2):
        o.zero_grad()
        loss_fn(m, *batch(step, rank, 4)).backward()
        o.step()
    ref = make_model()
    rps = list(ref.parameters())
    ropt = torch.optim.SGD([{"params": rps[:2]},
                            {"params": rps[2:], "lr": 0.05}],
                           lr=0.1, momentum=0.9)
    for step in range(2):
        ropt.zero_grad()
        loss_fn(ref, *global_batch(step, 4)).backward()
        ropt.step()
    assert_close(params(m), params(ref))
    # with named_parameters: Horovod's mapping of the names given
    pairs = named(m)
    o = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=pairs)
    assert o._parameter_names == {p: n for n, p in pairs}


@pytest.mark.parametrize("groups", [2, "list"])
def test_groups(rank, size, groups):
    m = make_model()
    ps = list(m.parameters())
    if groups == "list":
        groups = [[ps[0], ps[3]], [ps[1], ps[2]]]
    o = hvd.DistributedOptimizer(sgd(m.parameters()),
                                 named_parameters=named(m),
                                 groups=groups, backward_passes_per_step=2)
    for step in range(2):
        x, y = batch(step, rank, 4)
        o.zero_grad()
        (loss_fn(m, x[:2], y[:2]) / 2).backward()
        (loss_fn(m, x[2:], y[2:]) / 2).backward()
        o.step()
    assert_close(params(m), train_reference(2, 2, sgd, passes=2))
    with pytest.raises(ValueError, match="more than one group"):
        hvd.DistributedOptimizer(sgd(m.parameters()),
                                 groups=[[ps[0], ps[1]], [ps[1], ps[2]]])


def test_options(rank, size):
    """op=Sum, gradient_predivide_factor, fp16 compression."""
    def run(**kw):
        m = make_model()
        o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                     named_parameters=named(m),
                                     **kw)
        o.zero_grad()
        loss_fn(m, *batch(0, rank, 4)).backward()
        o.step()
        return params(m)

    base = run()
    assert_close(run(gradient_predivide_factor=2.0), base, tol=1e-12)
    # Sum: the step is size times larger
    ref = make_model()
    loss_fn(ref, *global_batch(0, 4)).backward()
    for p, q in zip(run(op=hvd.Sum), ref.parameters()):
        assert torch.allclose(p, q.detach() - 0.1 * size * q.grad)
    m = make_model().float()
    o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=named(m),
                                 compression=hvd.Compression.fp16)
    loss_fn(m, *[t.float() for t in batch(0, rank, 4)]).backward()
    o.step()
    for p, q in zip(m.parameters(), base):
        assert torch.allclose(p.double(), q, atol=1e-3)
    assert_same_everywhere(m)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding(rank, size, sparse_as_dense):
    def make(sparse):
        torch.manual_seed(0)
        return nn.Embedding(10, 3, sparse=sparse).double()

    emb = make(True)
    o = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                 named_parameters=named(emb),
                                 sparse_as_dense=sparse_as_dense)
    idx = [torch.tensor([r, r + 1, 7]) for r in range(size)]
    for _ in range(2):
        o.zero_grad()
        emb(idx[rank]).pow(2).sum().backward()
        assert emb.weight.grad is not None
        o.step()
    ref = make(False)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for _ in range(2):
        ropt.zero_grad()
        sum(ref(i).pow(2).sum() for i in idx).div(size).backward()
        ropt.step()
    assert torch.allclose(emb.weight, ref.weight, atol=1e-12)


def sparse_of(r, size):
    """Rank r's sparse gradient-like tensor: uncoalesced (index 1 twice),
    rows of a 6 x 2 matrix, r + 2 entries."""
    idx = torch.tensor([[1] + [(r + k) % 6 for k in range(r + 1)]])
    vals = torch.arange(2.0 * (r + 2)).reshape(r + 2, 2) + 10 * r
    return torch.sparse_coo_tensor(idx, vals, (6, 2))


@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_sparse_allreduce_async_handle(rank, size, op):
    """Horovod's sparse_allreduce_async returns a function: handle() is the
    allgather of every rank's indices and values, in rank order and not
    coalesced (the values divided by the size for Average)."""
    import types
    op = getattr(hvd, op)
    h = hvd.sparse_allreduce_async(sparse_of(rank, size),
                                   name="t.sparse.%d" % op, op=op)
    assert isinstance(h, types.FunctionType)
    out = h()
    assert out.is_sparse and not out.is_coalesced()
    assert out.shape == (6, 2) and out.dtype == torch.float32
    want_idx = torch.cat([sparse_of(r, size)._indices()
                          for r in range(size)], 1)
    want_vals = torch.cat([sparse_of(r, size)._values()
                           for r in range(size)])
    if op == hvd.Average:
        want_vals = want_vals / size
    assert torch.equal(out._indices(), want_idx)
    assert torch.equal(out._values(), want_vals)
    assert h() is out  # waited once, the same tensor at every call
    assert hvd.poll(h) and hvd.synchronize(h) is out


def sparse_model(seed=0):
    torch.manual_seed(seed)
    return nn.ModuleDict({"a": nn.Embedding(6, 3, sparse=True),
                          "b": nn.Embedding(4, 3, sparse=True)})


def sparse_loss(m, r, size):
    """Gradients independent of the weights, multiples of size / 4 (their
    averages, sums and the coalescing of duplicates are exact, whatever
    the order): rank r looks up rows r % 6 twice, 5 and (r + 1) % 4."""
    w = torch.tensor([[1.0, -2.0, 3.0]]) * size / 4 * (r + 1)
    a = m["a"](torch.tensor([r % 6, 5, r % 6]))
    b = m["b"](torch.tensor([(r + 1) % 4]))
    return (a * w).sum() + (b * w).sum()


@pytest.mark.parametrize("mode", ["allgather", "sparse_as_dense", "groups"])
def test_sparse_adam(rank, size, mode):
    """nn.Embedding(sparse=True) with torch.optim.SparseAdam: the gradients
    stay sparse, as in Horovod. The reference does on one process what
    Horovod does: broadcast_optimizer_state's step with zero (sparse)
    gradients, then per step the aggregated gradient (the ranks' indices
    and values concatenated, values / size; with sparse_as_dense the dense
    average made sparse), written into p.grad by zero_().add_()."""
    m = sparse_model()
    kw = {"sparse_as_dense": mode == "sparse_as_dense"}
    if mode == "groups":
        kw["groups"] = [[m["a"].weight, m["b"].weight]]
    o = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(m.parameters(), lr=0.1),
        named_parameters=named(m), **kw)
    hvd.broadcast_optimizer_state(o, root_rank=0)
    for step in range(2):
        o.zero_grad()
        sparse_loss(m, rank, size).backward()
        o.step()
        assert m["a"].weight.grad.is_sparse
        assert m["b"].weight.grad.is_sparse

    ref = sparse_model()
    ropt = torch.optim.SparseAdam(ref.parameters(), lr=0.1)
    for p in ref.parameters():
        p.grad = p.data.new_zeros(p.size()).to_sparse()
    ropt.step()
    for step in range(2):
        grads = rank_grads(ref, ropt, sparse_loss, size)
        ropt.zero_grad(set_to_none=False)
        for i, p in enumerate(ref.parameters()):
            gs = [g[i] for g in grads]
            if mode == "sparse_as_dense":
                agg = (sum(g.to_dense() for g in gs) / size).to_sparse()
            else:
                agg = torch.sparse_coo_tensor(
                    torch.cat([g._indices() for g in gs], 1),
                    torch.cat([g._values() for g in gs]) / size, p.shape)
            p.grad.zero_().add_(agg)
        ropt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    for st, rst in zip(o.state.values(), ropt.state.values()):
        assert st["step"] == rst["step"] == 3  # the creating step counts
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(st[k], rst[k])


def test_process_set(rank, size):
    if size < 2:
        pytest.skip("a set of all ranks but the last needs 2 ranks or more")
    members = [r for r in range(size) if r != size - 1]  # all but the last
    ps = hvd.add_process_set(members)
    try:
        m = make_model()
        o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                     named_parameters=named(m),
                                     process_set=ps)
        loss_fn(m, *batch(0, rank, 4)).backward()
        o.step()
        ref = make_model()
        if rank in members:
            xs, ys = zip(*[batch(0, r, 4) for r in members])
            loss_fn(ref, torch.cat(xs), torch.cat(ys)).backward()
        else:  # outside the set: purely local training
            loss_fn(ref, *batch(0, rank, 4)).backward()
        torch.optim.SGD(ref.parameters(), lr=0.1).step()
        assert_close(params(m), params(ref))
        hvd.barrier()
    finally:
        hvd.remove_process_set(ps)


def test_broadcast_then_train_stays_identical(rank, size):
    model = make_model(seed=rank)  # different on every rank
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=named(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(2):
            opt.zero_grad()
            loss_fn(model, *batch(step, rank, 4)).backward()
            opt.step()
    assert_same_everywhere(model)


class StateNet(nn.Module):
    """A Linear layer, a parameter the loss never reaches and a frozen one
    (requires_grad=False)."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(4, 3)
        self.unused = nn.Parameter(torch.randn(2))
        self.frozen = nn.Parameter(torch.randn(3), requires_grad=False)

    def forward(self, x):
        return self.fc(x) + self.frozen


def state_loss(net, r, size):
    """Gradients independent of the weights and exact: rank r's input is
    x0 + (r - (size - 1) / 2) * d, so the ranks' average gradient is that of
    x0, whatever the order of the sum (small multiples of 1/16)."""
    d = torch.tensor([[1.0, -1.0, 2.0, 0.0]]) / 8
    x = torch.tensor([[1.0, -0.5, 0.75, 2.0]]) + (r - (size - 1) / 2) * d
    c = torch.tensor([[0.5, -1.0, 1.5]])
    return (net(x) * c).sum()


def _state_counts(opt):
    """How many parameters of StateNet torch keeps state for: the three
    trained ones; an SGD without momentum keeps None buffers in torch 1.13
    and nothing in torch 2.11."""
    if (isinstance(opt, torch.optim.SGD)
            and not opt.param_groups[0]["momentum"]):
        return (0, 3)
    return (3,)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=5e-5),
    lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.25),
    lambda p: torch.optim.Adam(p, lr=0.01),
    lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
], ids=["sgd-momentum-wd", "sgd-wd", "adam", "adamw"])
def test_broadcast_optimizer_state_as_horovod(rank, size, make):
    """broadcast_optimizer_state on fresh optimizers creates their state as
    Horovod's does (a step with zero gradients, which counts and applies
    weight decay), for parameters without a gradient too; then two steps.
    The reference replays Horovod's sequence on one process, without kolo;
    the result must be the same bit for bit."""
    root = size - 1
    net = StateNet(seed=50 + rank)  # different on every rank
    opt = hvd.DistributedOptimizer(make(net.parameters()),
                                   named_parameters=named(net))
    hvd.broadcast_parameters(net.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    for step in range(2):
        opt.zero_grad(set_to_none=False)  # torch 1.13's default
        state_loss(net, rank, size).backward()
        opt.step()

    ref = StateNet(seed=50 + root)
    ropt = make(ref.parameters())
    # Horovod's broadcast_optimizer_state on an optimizer without state
    for p in ref.parameters():
        if p.requires_grad:
            p.grad = p.data.new(p.size()).zero_()
    ropt.step()
    for step in range(2):
        grads = rank_grads(ref, ropt, state_loss, size)
        live = [p for p in ref.parameters() if p.requires_grad]
        for i, p in enumerate(live):
            p.grad.copy_(sum(g[i] for g in grads) / size)
        ropt.step()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
    # State for the three trained parameters (not the frozen one), where
    # torch keeps any.
    assert len(opt.state) == len(ropt.state)
    assert len(ropt.state) in _state_counts(ropt)
    for p, q in zip(net.parameters(), ref.parameters()):
        st, rst = opt.state.get(p, {}), ropt.state.get(q, {})
        assert st.keys() == rst.keys()
        for k in st:
            if st[k] is None:  # SGD without momentum: a None buffer
                assert rst[k] is None, k
            else:
                assert torch.equal(torch.as_tensor(st[k]),
                                   torch.as_tensor(rst[k])), k
        if "step" in st:
            assert int(st["step"]) == 3  # the creating step counts


def test_broadcast_optimizer_state_of_a_stateless_optimizer(rank, size):
    """An optimizer with no state even after a step: Horovod broadcasts
    nothing, hyper-parameters included."""
    class Plain(torch.optim.Optimizer):
        def __init__(self, ps, lr):
            super().__init__(ps, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-g["lr"])

    net = StateNet(seed=7)
    before = params(net)
    opt = Plain(net.parameters(), lr=0.1 * (rank + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.1 * (rank + 1)
    assert not opt.state
    assert all(torch.equal(p, q) for p, q in zip(params(net), before))


def test_lr_scheduler_made_before_wrapping(rank, size):
    m = make_model()
    base = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)
    o = hvd.DistributedOptimizer(base, named_parameters=named(m))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scheduler counts base.step
        for step in range(2):
            o.zero_grad()
            loss_fn(m, *batch(step, rank, 4)).backward()
            o.step()  # the distributed step, not the scheduler's wrapper
            sched.step()
    assert o.param_groups[0]["lr"] == pytest.approx(0.025)
    ref = make_model()
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(2):
        ropt.zero_grad()
        loss_fn(ref, *global_batch(step, 4)).backward()
        ropt.step()
        for g in ropt.param_groups:
            g["lr"] *= 0.5
    assert_close(params(m), params(ref))



def test_explicit_allreduce_of_gradients(rank, size):
    """A custom training loop: gradients computed with autograd.grad,
    clipped by global norm before the allreduce, None kept in place."""
    m = make_model()
    unused = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    ps = list(m.parameters()) + [unused]
    loss = loss_fn(m, *batch(0, rank, 4))
    grads = torch.autograd.grad(loss, ps, allow_unused=True)
    assert grads[-1] is None
    norms, after = [], []
    with pytest.warns(UserWarning, match="no gradient for gradient.4"):
        out = hvd.allreduce_gradients(
            grads,
            pre_hooks=[lambda g: norms.append(hvd.clip_by_global_norm(g,
                                                                      0.01))],
            post_hooks=[lambda g: after.append(len(g))])
    assert out[-1] is None and after == [4] and norms[0] > 0.01
    local = []
    for r in range(size):
        ref = make_model()
        gs = torch.autograd.grad(loss_fn(ref, *batch(0, r, 4)),
                                 list(ref.parameters()))
        hvd.clip_by_global_norm(list(gs), 0.01)
        local.append(gs)
    for i in range(4):
        want = sum(g[i] for g in local) / size
        assert torch.allclose(out[i], want, atol=1e-12)
    with pytest.raises(ValueError, match="No gradients provided"):
        hvd.allreduce_gradients([None, None])


def test_change_backward_passes_between_steps(rank, size):
    """set_backward_passes_per_step between steps: groups of 2 passes, then
    of 3, then of 1, on the same gradients (the runtime's accumulators
    change their number of passes)."""
    m = make_model()
    o = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=named(m),
                                 backward_passes_per_step=2)
    ref = make_model()
    ropt = sgd(ref.parameters())
    for step, passes in enumerate([2, 3, 1]):
        o.set_backward_passes_per_step(passes)
        o.zero_grad()
        x, y = batch(step, rank, 2 * passes)
        for k in range(passes):
            sub = slice(2 * k, 2 * k + 2)
            (loss_fn(m, x[sub], y[sub]) / passes).backward()
        o.step()
        ropt.zero_grad()
        loss_fn(ref, *global_batch(step, 2 * passes)).backward()
        ropt.step()
    assert_close(params(m), params(ref))

