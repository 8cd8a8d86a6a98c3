"""ZeroRedundancyOptimizer against DistributedOptimizer: every rank trains
two copies of one model on the same batches, one with each optimizer, and
compares them (the sharded update must give what the replicated one
gives); and the sharded parameters must be bit for bit the same on every
rank after every step."""

import sys

import pytest

torch = pytest.importorskip("torch")

import kolo.torch as hvd  # noqa: E402

nn = torch.nn

# Small buckets, so that the models below span several buckets and ranks
# own blocks that cut parameters in two.
TINY = 200 * 8 / (1024 * 1024)


def make_model(seed=0, dtype=torch.float64, width=24):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, width), nn.Tanh(), nn.Linear(width, 13),
                         nn.Tanh(), nn.Linear(13, 3)).to(dtype)


def batch(step, r, dtype=torch.float64):
    g = torch.Generator().manual_seed(1000 * step + r)
    return (torch.randn(5, 7, generator=g).to(dtype),
            torch.randn(5, 3, generator=g).to(dtype))


def loss_of(model, step, dtype=torch.float64):
    x, y = batch(step, hvd.rank(), dtype)
    return ((model(x) - y) ** 2).mean()


def named(model):
    prefix = sys._getframe(1).f_code.co_name
    return [(prefix + "." + n, p) for n, p in model.named_parameters()]


def same_on_every_rank(model, process_set=hvd.global_process_set):
    """The parameters' bytes are the same on every rank of the set."""
    mine = [bytes(p.detach().contiguous().view(torch.uint8).numpy())
            for p in model.parameters()]
    every = hvd.allgather_object(mine, process_set=process_set)
    return all(e == every[0] for e in every)


def assert_close(m1, m2, tol):
    for (n, p), q in zip(m1.named_parameters(), m2.parameters()):
        d = float((p.detach() - q.detach()).abs().max())
        assert d <= tol, "%s differs by %g" % (n, d)


def train_in_step(pairs, steps):
    """Trains each (model, optimizer) of `pairs` on the same batches, one
    step after the other: the steps given."""
    for step in steps:
        for m, o in pairs:
            o.zero_grad()
            loss_of(m, step).backward()
            o.step()


def copy_of(model):
    """A fresh model with model's weights."""
    m = make_model()
    m.load_state_dict(model.state_dict())
    return m


def train_pair(make_dist, make_zero, steps, dtype=torch.float64, passes=1,
               width=24):
    m1, m2 = make_model(dtype=dtype, width=width), make_model(dtype=dtype,
                                                              width=width)
    o1, o2 = make_dist(m1), make_zero(m2)
    for step in range(steps):
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            for k in range(passes):
                loss_of(m, step * passes + k, dtype).backward()
            o.step()
        assert same_on_every_rank(m2), "step %d: ranks differ" % step
    return m1, o1, m2, o2


OPTIMIZERS = [
    (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
    (torch.optim.Adam, dict(lr=0.01)),
    (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
]


@pytest.mark.parametrize("cls,kw", OPTIMIZERS, ids=lambda x: getattr(
    x, "__name__", ""))
def test_same_as_distributed_optimizer(cls, kw):
    m1, _, m2, o2 = train_pair(
        lambda m: hvd.DistributedOptimizer(cls(m.parameters(), **kw),
                                           named(m)),
        lambda m: hvd.ZeroRedundancyOptimizer(m.parameters(), cls,
                                              bucket_cap_mb=TINY, **kw),
        steps=40)
    assert len(o2._kolo_buckets) > 1
    assert_close(m1, m2, 1e-12)


def test_float32_and_default_buckets():
    m1, _, m2, o2 = train_pair(
        lambda m: hvd.DistributedOptimizer(
            torch.optim.Adam(m.parameters(), lr=0.01), named(m)),
        lambda m: hvd.ZeroRedundancyOptimizer(m.parameters(),
                                              torch.optim.Adam, lr=0.01),
        steps=30, dtype=torch.float32)
    assert len(o2._kolo_buckets) == 1
    assert_close(m1, m2, 1e-5)


def test_state_is_sharded():
    model = make_model(width=200)
    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam,
                                      lr=0.01, bucket_cap_mb=TINY * 4)
    loss_of(model, 0).backward()
    opt.step()
    total = sum(p.numel() for p in model.parameters())
    held = sum(v.numel() for st in opt.optim.state.values()
               for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
    buckets = len(opt._kolo_buckets)
    # exp_avg and exp_avg_sq of this rank's blocks: 1/n of the elements,
    # plus at most one padding element per bucket
    assert held <= 2 * (total // hvd.size() + buckets), (held, total)
    assert held >= 2 * (total // hvd.size() - buckets)


def test_backward_passes_per_step():
    for average in (False, True):
        m1, _, m2, _ = train_pair(
            lambda m: hvd.DistributedOptimizer(
                torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5),
                named(m) if not average else
                [("avg." + n, p) for n, p in named(m)],
                backward_passes_per_step=3,
                average_aggregated_gradients=average),
            lambda m: hvd.ZeroRedundancyOptimizer(
                m.parameters(), torch.optim.SGD, lr=0.05, momentum=0.5,
                bucket_cap_mb=TINY, backward_passes_per_step=3,
                average_aggregated_gradients=average),
            steps=8, passes=3)
        assert_close(m1, m2, 1e-12)


def test_too_many_passes():
    model = make_model()
    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD,
                                      lr=0.1)
    loss_of(model, 0).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        loss_of(model, 1).backward()
    opt._kolo_drain()


def test_sum_and_predivide():
    m1, _, m2, _ = train_pair(
        lambda m: hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.01), named(m), op=hvd.Sum),
        lambda m: hvd.ZeroRedundancyOptimizer(
            m.parameters(), torch.optim.SGD, lr=0.01, op=hvd.Sum,
            bucket_cap_mb=TINY),
        steps=5)
    assert_close(m1, m2, 1e-12)
    m1, _, m2, _ = train_pair(
        lambda m: hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.01),
            [("pre." + n, p) for n, p in named(m)],
            gradient_predivide_factor=2.0),
        lambda m: hvd.ZeroRedundancyOptimizer(
            m.parameters(), torch.optim.SGD, lr=0.01,
            gradient_predivide_factor=2.0, bucket_cap_mb=TINY),
        steps=5)
    assert_close(m1, m2, 1e-12)


def test_clip_grad_norm():
    """The norm over the shards is the norm of the whole averaged
    gradient, and clipping by it gives the replicated run's update."""
    m1, m2 = make_model(), make_model()
    o1 = hvd.DistributedOptimizer(torch.optim.SGD(m1.parameters(), lr=0.1),
                                  named(m1))
    o2 = hvd.ZeroRedundancyOptimizer(m2.parameters(), torch.optim.SGD,
                                     lr=0.1, bucket_cap_mb=TINY)
    for step in range(6):
        loss_of(m1, step).backward()
        o1.synchronize()
        n1 = torch.nn.utils.clip_grad_norm_(m1.parameters(), 0.05)
        with o1.skip_synchronize():
            o1.step()
        o1.zero_grad()
        loss_of(m2, step).backward()
        n2 = o2.clip_grad_norm_(0.05)
        o2.step()
        o2.zero_grad()
        assert abs(float(n1) - float(n2)) <= 1e-9 * float(n1)
        inf2 = None
        if step == 5:
            loss_of(m2, 99).backward()
            inf2 = o2.clip_grad_norm_(1e9, norm_type=float("inf"))
            m1.zero_grad()
            loss_of(m1, 99).backward()
            o1.synchronize()
            inf1 = max(float(p.grad.abs().max()) for p in m1.parameters())
            assert float(inf2) == pytest.approx(inf1, rel=1e-6)
            o2.step()
            with o1.skip_synchronize():
                o1.step()
    assert_close(m1, m2, 1e-12)


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_16_bit_compression(kind):
    comp = getattr(hvd.Compression, kind)
    m1, _, m2, o2 = train_pair(
        lambda m: hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.05),
            [(kind + n, p) for n, p in named(m)], compression=comp),
        lambda m: hvd.ZeroRedundancyOptimizer(
            m.parameters(), torch.optim.SGD, lr=0.05, bucket_cap_mb=TINY,
            compression=comp),
        steps=10, dtype=torch.float32)
    assert o2._kolo_buckets[0].grad.dtype == (
        torch.float16 if kind == "fp16" else torch.bfloat16)
    assert_close(m1, m2, 2e-3 if kind == "fp16" else 2e-2)


def test_grad_scaler_skips_on_every_rank():
    """An Inf in one rank's gradient, in a parameter another rank owns,
    skips the step on every rank and lowers the scale everywhere."""
    model = make_model(dtype=torch.float32)
    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD,
                                      lr=0.1, bucket_cap_mb=TINY)
    scaler = hvd.GradScaler(init_scale=2.0 ** 8)
    before = [p.detach().clone() for p in model.parameters()]
    hook = None
    if hvd.rank() == hvd.size() - 1:
        # the last parameter: the first of the first bucket, rank 0's
        hook = model[4].bias.register_hook(lambda g: g * float("inf"))
    scaler.scale(loss_of(model, 0, torch.float32)).backward()
    if hook is not None:
        hook.remove()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 7
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p.detach(), q)
    opt.zero_grad()
    scaler.scale(loss_of(model, 1, torch.float32)).backward()
    scaler.unscale_(opt)
    opt.clip_grad_norm_(10.0)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 7
    assert any(not torch.equal(p.detach(), q)
               for p, q in zip(model.parameters(), before))
    assert same_on_every_rank(model)


def test_state_dict_round_trip(tmp_path):
    """Consolidated on one rank, the state is the replicated optimizer's
    own state dict; loaded back (into a ZeroRedundancyOptimizer of another
    number of ranks, and into a DistributedOptimizer), training goes on as
    if nothing happened."""
    kw = dict(lr=0.01, betas=(0.8, 0.99))
    m1, o1, m2, o2 = train_pair(
        lambda m: hvd.DistributedOptimizer(
            torch.optim.Adam(m.parameters(), **kw), named(m)),
        lambda m: hvd.ZeroRedundancyOptimizer(
            m.parameters(), torch.optim.Adam, bucket_cap_mb=TINY, **kw),
        steps=5)
    to = hvd.size() - 1
    o2.consolidate_state_dict(to=to)
    if hvd.rank() == to:
        sd, ref = o2.state_dict(), o1.state_dict()
        assert sorted(sd["state"]) == sorted(ref["state"])
        for i in ref["state"]:
            for k, v in ref["state"][i].items():
                assert torch.allclose(sd["state"][i][k], v, rtol=0,
                                      atol=1e-12), (i, k)
        assert sd["param_groups"][0]["betas"] == (0.8, 0.99)
    else:
        with pytest.raises(RuntimeError, match="consolidate_state_dict"):
            o2.state_dict()
    sd = hvd.broadcast_object(o2.state_dict() if hvd.rank() == to else None,
                              root_rank=to, name="zero.sd")
    # Into a fresh ZeroRedundancyOptimizer over the first two ranks only
    # (another number of ranks than the one that saved it), and into a
    # fresh DistributedOptimizer: both go on like o1.
    pair = hvd.ProcessSet([0, 1])
    hvd.add_process_set(pair)
    try:
        m3 = copy_of(m2)
        o3 = hvd.ZeroRedundancyOptimizer(m3.parameters(), torch.optim.Adam,
                                         pair, bucket_cap_mb=TINY, lr=0.5)
        o3.load_state_dict(sd)
        assert o3.param_groups[0]["lr"] == 0.01
        m4 = copy_of(m2)
        o4 = hvd.DistributedOptimizer(torch.optim.Adam(m4.parameters(),
                                                       lr=0.5), named(m4))
        o4.load_state_dict(sd)
        train_in_step(((m1, o1), (m4, o4)), range(5, 9))
        assert_close(m1, m4, 1e-12)
        if pair.included():
            # Two ranks: the reference averages the first two ranks'
            # batches only.
            m5 = copy_of(m2)
            o5 = hvd.DistributedOptimizer(
                torch.optim.Adam(m5.parameters(), lr=0.5),
                [("pair." + n, p) for n, p in named(m5)], process_set=pair)
            o5.load_state_dict(sd)
            train_in_step(((m5, o5), (m3, o3)), range(5, 9))
            assert_close(m5, m3, 1e-12)
            assert same_on_every_rank(m3, pair)
    finally:
        hvd.remove_process_set(pair)
    path = tmp_path / "opt.pt"
    if hvd.rank() == to:
        torch.save(o2.state_dict(), path)
        assert torch.load(path)["state"]


def test_process_set():
    if hvd.size() < 3:
        pytest.skip("needs 3 ranks: a set of 2 and a rank outside it")
    ps = hvd.ProcessSet([0, 2])
    hvd.add_process_set(ps)
    try:
        m1, m2 = make_model(), make_model()
        o1 = hvd.DistributedOptimizer(torch.optim.Adam(m1.parameters(),
                                                       lr=0.01), named(m1),
                                      process_set=ps)
        o2 = hvd.ZeroRedundancyOptimizer(m2.parameters(), torch.optim.Adam,
                                         ps, lr=0.01, bucket_cap_mb=TINY)
        train_in_step(((m1, o1), (m2, o2)), range(6))
        assert_close(m1, m2, 1e-12)
        if ps.included():
            assert same_on_every_rank(m2, ps)
    finally:
        hvd.remove_process_set(ps)


def test_lr_scheduler_and_add_param_group():
    m1, m2 = make_model(), make_model()
    first1 = list(m1[0].parameters()) + list(m1[2].parameters())
    first2 = list(m2[0].parameters()) + list(m2[2].parameters())
    o1 = hvd.DistributedOptimizer(torch.optim.SGD(first1, lr=0.1,
                                                  momentum=0.9), named(m1))
    o2 = hvd.ZeroRedundancyOptimizer(first2, torch.optim.SGD, lr=0.1,
                                     momentum=0.9, bucket_cap_mb=TINY)
    s1 = torch.optim.lr_scheduler.StepLR(o1, 2, gamma=0.5)
    s2 = torch.optim.lr_scheduler.StepLR(o2, 2, gamma=0.5)
    for step in range(4):
        for m, o, s in ((m1, o1, s1), (m2, o2, s2)):
            o.zero_grad()
            loss_of(m, step).backward()
            o.step()
            s.step()
    assert o2.param_groups[0]["lr"] == pytest.approx(0.025)
    assert_close(m1, m2, 1e-12)
    # The last layer joins, with a learning rate of its own.
    o2.add_param_group({"params": list(m2[4].parameters()), "lr": 0.3})
    assert len(o2.param_groups) == 2
    model = make_model()
    m2[4].weight.data.mul_(1.0)
    before = m2[4].weight.detach().clone()
    o2.zero_grad()
    loss_of(m2, 9).backward()
    o2.step()
    assert not torch.equal(before, m2[4].weight.detach())
    assert same_on_every_rank(m2)
    del model


def test_sparse_gradient_refused():
    emb = nn.Embedding(10, 3, sparse=True).double()
    opt = hvd.ZeroRedundancyOptimizer(emb.parameters(), torch.optim.SGD,
                                      lr=0.1)
    with pytest.raises(ValueError, match="sparse gradient"):
        emb(torch.tensor([1, 2])).sum().backward()
    assert opt._kolo_buckets


def test_errors_users_can_cause():
    # A parameter in two groups (torch's own check) and classes that
    # cannot be sharded.
    model = make_model()
    w = model[0].weight
    with pytest.raises(ValueError, match="more than one parameter group"):
        hvd.ZeroRedundancyOptimizer([{"params": [w]}, {"params": [w]}],
                                    torch.optim.SGD, lr=0.1)
    for cls in (torch.optim.LBFGS, torch.optim.SparseAdam):
        with pytest.raises(ValueError, match="cannot shard"):
            hvd.ZeroRedundancyOptimizer(model.parameters(), cls, lr=0.1)
    with pytest.raises(TypeError, match="optimizer_class"):
        hvd.ZeroRedundancyOptimizer(model.parameters(),
                                    torch.optim.SGD(model.parameters(),
                                                    lr=0.1))
    with pytest.raises(ValueError, match="Average or Sum"):
        hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD,
                                    op=hvd.Adasum, lr=0.1)


def test_parameters_differ_across_ranks():
    # Shapes: every rank says which rank has which parameter.
    model = make_model(width=24 + (hvd.rank() == 1))
    with pytest.raises(ValueError, match=r"\[24, 7\] on rank 0, .* \[25, 7\] on rank 1"):
        hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD,
                                    lr=0.1)
    # Values, at the first step: the ranks were not broadcast.
    model = make_model(seed=hvd.rank())
    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD,
                                      lr=0.1)
    loss_of(model, 0).backward()
    with pytest.raises(ValueError, match="broadcast_parameters"):
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss_of(model, 1).backward()
    opt.step()
    assert same_on_every_rank(model)


def test_moved_model_is_an_error():
    model = make_model(dtype=torch.float32)
    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD,
                                      lr=0.1)
    model.double()
    loss_of(model, 0).backward()
    with pytest.raises(RuntimeError, match="moved or replaced"):
        opt.step()


class WithUnused(nn.Module):
    """A model with a parameter the loss does not reach and a frozen one."""

    def __init__(self):
        super().__init__()
        self.seq = make_model()
        self.extra = nn.Linear(3, 3).double()
        self.seq[0].bias.requires_grad_(False)

    def forward(self, x):
        return self.seq(x)


def test_parameter_without_gradient_and_frozen():
    """A parameter the loss does not reach gets a zero gradient (as with
    DistributedOptimizer: weight decay still moves it); a frozen one is not
    sharded and stays."""
    m1, m2 = WithUnused(), WithUnused()
    o1 = hvd.DistributedOptimizer(torch.optim.AdamW(m1.parameters(),
                                                    lr=0.01), named(m1))
    o2 = hvd.ZeroRedundancyOptimizer(m2.parameters(), torch.optim.AdamW,
                                     lr=0.01, bucket_cap_mb=TINY)
    train_in_step(((m1, o1), (m2, o2)), range(4))
    assert_close(m1, m2, 1e-12)
    assert torch.equal(m2.seq[0].bias, make_model()[0].bias)
    assert not torch.equal(m2.extra.weight, WithUnused().extra.weight)


def test_broadcast_optimizer_state():
    model = make_model()
    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam,
                                      lr=0.01 * (hvd.rank() + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01
    assert opt.optim.param_groups[0]["lr"] == 0.01
    loss_of(model, 0).backward()
    opt.step()
    assert same_on_every_rank(model)


def _uneven(model, opt, steps, clip=None, scaler=None, inf_at=None):
    """Rank r trains steps + r steps, then joins; returns join()'s answer."""
    for step in range(steps + hvd.rank()):
        opt.zero_grad()
        loss = loss_of(model, step)
        if scaler is not None:
            if step == inf_at and hvd.rank() == hvd.size() - 1:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        if clip is not None:
            clip(model, opt)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        elif clip is not None and isinstance(opt,
                                             hvd.ZeroRedundancyOptimizer):
            opt.step()
        elif clip is not None:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    return hvd.join()


def test_join_with_uneven_data():
    """Ranks that run out of data join (hvd.join) while the others go on:
    the joined ranks stand in for the steps of the others (their blocks
    updated with zero gradients, as DistributedOptimizer's joined ranks
    contribute zeros), gradient clipping included, and the result is
    DistributedOptimizer's under the same join."""
    def clip_dist(model, opt):
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)

    def clip_zero(model, opt):
        opt.clip_grad_norm_(0.5)

    m1, m2 = make_model(), make_model()
    o1 = hvd.DistributedOptimizer(torch.optim.Adam(m1.parameters(), lr=0.01),
                                  named(m1))
    last1 = _uneven(m1, o1, 3, clip=clip_dist)
    o2 = hvd.ZeroRedundancyOptimizer(m2.parameters(), torch.optim.Adam,
                                     lr=0.01, bucket_cap_mb=TINY)
    last2 = _uneven(m2, o2, 3, clip=clip_zero)
    assert last1 == last2 == hvd.size() - 1
    assert same_on_every_rank(m2)
    # A joined rank's DistributedOptimizer stops updating its replica and
    # its state; the rank that trained longest has every update, and the
    # reference goes on from it.
    hvd.broadcast_parameters(m1.state_dict(), root_rank=hvd.size() - 1)
    hvd.broadcast_optimizer_state(o1, root_rank=hvd.size() - 1)
    assert_close(m1, m2, 1e-12)
    # and the sharded optimizer goes on afterwards, every rank training
    train_in_step(((m1, o1), (m2, o2)), range(50, 52))
    assert same_on_every_rank(m2)
    assert_close(m1, m2, 1e-12)


def test_join_with_grad_scaler_and_scheduler():
    """While ranks are joined, an overflow on one training rank skips the
    step on every rank, joined ones included, and a learning rate changed
    by a scheduler on the training ranks reaches the joined ones."""
    m1, m2 = make_model(), make_model()
    o1 = hvd.DistributedOptimizer(torch.optim.SGD(m1.parameters(), lr=0.1),
                                  named(m1))
    o2 = hvd.ZeroRedundancyOptimizer(m2.parameters(), torch.optim.SGD,
                                     lr=0.1, bucket_cap_mb=TINY)
    results = []
    for m, o in ((m1, o1), (m2, o2)):
        sched = torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5)
        scaler = hvd.GradScaler(init_scale=2.0 ** 4)
        # the scheduler steps after every optimizer step of this rank
        original = scaler.update

        def update(new_scale=None, original=original, sched=sched):
            original(new_scale)
            sched.step()
        scaler.update = update
        results.append(_uneven(m, o, 2, scaler=scaler,
                               inf_at=hvd.size()))
        results.append(scaler.get_scale())
    assert results[0] == results[2] == hvd.size() - 1
    if hvd.rank() == hvd.size() - 1:
        assert results[1] == results[3] == 2.0 ** 3
    assert same_on_every_rank(m2)
    hvd.broadcast_parameters(m1.state_dict(), root_rank=hvd.size() - 1)
    assert_close(m1, m2, 1e-12)
