"""GradScaler: dynamic loss scaling whose decisions agree across ranks."""

import math
import warnings

import pytest

torch = pytest.importorskip("torch")

import kolo.torch as hvd  # noqa: E402

nn = torch.nn


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Linear(3, 2).to(dtype)


def data(r, dtype=torch.float32):
    g = torch.Generator().manual_seed(r)
    return torch.randn(4, 3, generator=g).to(dtype)


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("distributed", [False, True])
def test_skip_on_every_rank_when_one_rank_overflows(rank, size, distributed):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if distributed:
        opt = hvd.DistributedOptimizer(opt,
                                       named_parameters=model.named_parameters())
    scaler = hvd.GradScaler(init_scale=1024.0, growth_interval=100)
    bad = size - 1
    for step in range(3):
        before = snapshot(model)
        opt.zero_grad()
        loss = model(data(rank)).sum()
        if step == 1 and rank == bad:  # only this rank overflows
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        changed = any(not torch.equal(a, b)
                      for a, b in zip(before, model.parameters()))
        assert changed == (step != 1), "step %d on rank %d" % (step, rank)
    assert scaler.get_scale() == 512.0  # lowered once, on every rank
    scales = hvd.allgather_object(scaler.get_scale())
    assert all(s == 512.0 for s in scales)
    st = scaler.stats(opt)
    assert st["steps"] == 3 and st["skipped_steps"] == 1
    assert st["overflow_frequency"] == pytest.approx(1 / 3)
    assert st["loss_scale"] == 512.0 and st["lr"] == 0.1
    if distributed:
        sums = hvd.allgather_object([float(p.sum())
                                     for p in model.parameters()])
        assert all(s == sums[0] for s in sums)


def test_scaled_gradients_survive_fp16_allreduce(rank, size):
    """Gradients too small for float16 vanish in an fp16 allreduce unless
    they are scaled first; the scaler unscales them after it."""
    tiny = 1e-8  # below float16's smallest subnormal (6e-8)

    def run(scale):
        w = nn.Parameter(torch.zeros(8))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD([w], lr=1.0), named_parameters=[("w.%g" % scale,
                                                             w)],
            compression=hvd.Compression.fp16)
        scaler = hvd.GradScaler(init_scale=scale, enabled=scale != 1.0)
        loss = (w * tiny * (rank + 1)).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return w.detach()

    unscaled = run(1.0)
    assert torch.equal(unscaled, torch.zeros(8))  # underflowed on the wire
    scaled = run(2.0 ** 20)
    want = -tiny * sum(r + 1 for r in range(size)) / size
    assert torch.allclose(scaled, torch.full((8,), want), rtol=1e-2, atol=0)


def test_fp16_training_matches_fp32(rank, size):
    def train(compression, scaler):
        model = make_model()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=[("%s.%s" % (compression.__name__, n), p)
                              for n, p in model.named_parameters()],
            compression=compression)
        for _ in range(3):
            opt.zero_grad()
            loss = model(data(rank)).pow(2).mean()
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        return snapshot(model)

    ref = train(hvd.Compression.none, None)
    got = train(hvd.Compression.fp16, hvd.GradScaler(init_scale=256.0))
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, atol=2e-3)


def test_unscale_then_clip(rank, size):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    scaler = hvd.GradScaler(init_scale=64.0)
    scaler.scale(model(data(rank)).sum()).backward()
    scaler.unscale_(opt)  # synchronizes: these are the averaged gradients
    norm = nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    assert norm > 1e-3
    total = math.sqrt(sum(float(p.grad.pow(2).sum())
                          for p in model.parameters()))
    assert total == pytest.approx(1e-3, rel=1e-4)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        scaler.step(opt)  # no second synchronize, no warning
    assert not [w for w in record if "skip_synchronize" in str(w.message)]
    with pytest.raises(RuntimeError, match="step\\(\\) has already"):
        scaler.step(opt)
    scaler.update()
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: 0.0)


def test_scale_dynamics():
    scaler = hvd.GradScaler(init_scale=8.0, growth_interval=2,
                            min_scale=1.0)
    p = nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)

    def step(overflow):
        opt.zero_grad()
        loss = p.sum() * (float("nan") if overflow else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    step(False)
    assert scaler.get_scale() == 8.0
    step(False)
    assert scaler.get_scale() == 16.0  # log2 + 1 after growth_interval
    step(True)
    assert scaler.get_scale() == 8.0 and scaler.last_step_skipped
    for _ in range(5):
        step(True)
    assert scaler.get_scale() == 1.0  # clamped at min_scale
    assert scaler.log2_loss_scale == 0.0
    assert scaler.skipped_steps == 6
    state = scaler.state_dict()
    other = hvd.GradScaler()
    other.load_state_dict(state)
    assert other.get_scale() == 1.0 and other.overflow_frequency == \
        pytest.approx(6 / 8)
    assert scaler.scale([torch.ones(1), (torch.ones(1),)])[0].item() == 1.0
    with pytest.raises(ValueError):
        hvd.GradScaler(growth_factor=0.5)


def test_disabled_scaler_and_autocast(rank, size):
    scaler = hvd.GradScaler(enabled=False)
    assert not scaler.is_enabled() and scaler.get_scale() == 1.0
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(data(rank))
    assert out.dtype == torch.bfloat16
    loss = out.float().sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    scaler.step(opt)
    scaler.update()
    sums = hvd.allgather_object([float(p.sum()) for p in model.parameters()])
    assert all(s == sums[0] for s in sums)
