"""A torch.compile'd model trains through kolo.torch's DistributedOptimizer
with the losses of the same model run eagerly, on the CPU and on CUDA.

torch.compile exists from torch 2.0: with an older torch (Debian's 1.13)
every test skips, saying so. The CUDA case takes the GPU of the local rank
and skips without one (run-pytest.sh runs this file at 1 rank too).

Each rank trains the same model twice from the same weights (rank 0's,
broadcast) on its own data: once eagerly, once compiled. The averaged
gradients, hence the weights, must agree across ranks (every rank checks
the others' weights) and the compiled run's losses must follow the eager
run's step by step.
"""

import pytest

torch = pytest.importorskip("torch")

import kolo.torch as hvd  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "compile"),
    reason="torch %s has no torch.compile (torch 2.0 or later)"
    % torch.__version__)

STEPS = 6


def _cuda_skip():
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    if not hvd.nccl_built():
        return "libkolo is built without NCCL"
    if torch.cuda.device_count() < hvd.local_size():
        return ("%d CUDA device(s) for %d local ranks"
                % (torch.cuda.device_count(), hvd.local_size()))
    return None


def _train(device, compiled, tag):
    torch.manual_seed(41)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 4)).to(device)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    run = torch.compile(model) if compiled else model
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=[(tag + "." + n, p)
                          for n, p in model.named_parameters()])
    gen = torch.Generator().manual_seed(1000 + hvd.rank())
    x = torch.randn(8, 16, generator=gen).to(device)
    y = torch.randn(8, 4, generator=gen).to(device)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(run(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    weights = torch.cat([p.detach().reshape(-1).cpu()
                         for p in model.parameters()])
    return losses, weights


def _check(device, tag):
    eager, w_eager = _train(device, False, tag + ".eager")
    comp, w_comp = _train(device, True, tag + ".compiled")
    # Every rank holds the same weights after each run: the gradients were
    # averaged, whatever produced them.
    for w, what in ((w_eager, "eager"), (w_comp, "compiled")):
        every = hvd.allgather_object(w.tolist(), name=tag + ".w." + what)
        for r, other in enumerate(every):
            assert torch.equal(torch.tensor(other), w), (
                "%s weights differ between rank %d and rank %d"
                % (what, r, hvd.rank()))
    # Compiled kernels may round differently from eager ones: the losses
    # agree to float32's precision, step by step.
    for step, (a, b) in enumerate(zip(eager, comp)):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6), (
            "step %d: compiled loss %r, eager loss %r (rank %d)"
            % (step, b, a, hvd.rank()))
    assert torch.allclose(w_comp, w_eager, rtol=1e-4, atol=1e-5)
    assert eager[-1] < eager[0], "the model did not learn: %r" % eager


def test_compiled_matches_eager_cpu():
    _check(torch.device("cpu"), "compile.cpu")


def test_compiled_matches_eager_cuda():
    why = _cuda_skip()
    if why is not None:
        pytest.skip("CUDA case: " + why)
    dev = torch.device("cuda", hvd.local_rank())
    torch.cuda.set_device(dev)
    _check(dev, "compile.cuda")
