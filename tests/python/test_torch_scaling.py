"""kolo.torch's prescale, postscale and Average bit for bit as horovod.torch
(0.28.1) computes them on the CPU, and the gradients of reducescatter as
horovod.torch defines them.

Horovod's arithmetic, which the expected values here redo with NumPy
(horovod/common/ops/collective_operations.{h,cc}: ScaleBuffer and
ScaleBufferCPUImpl; gloo_operations.cc and mpi_operations.cc: where it is
applied; horovod/torch/mpi_ops.py: HorovodReducescatter.backward):
  * every rank's input is multiplied by prescale_factor, the results are
    summed, the sum is multiplied by postscale_factor; Average is that Sum
    with postscale_factor / size (a double division) as the factor; a
    factor of exactly 1.0 is not applied;
  * float32: x * float32(factor), a float32 product;
  * float16: float32(x) * float32(factor), rounded to float16 (to nearest
    even); sums in float32, rounded to float16 at every step;
  * float64: x * factor in double;
  * integers: x * factor in double, truncated toward zero.
Results are compared with zero tolerance.

The sums: in the "identical" tests every rank holds the same tensor (as in
Horovod's own tests); the sum of 2 or 3 equal values does not depend on the
order of the additions, so results must equal Horovod's exactly at 2 and 3
ranks. At 4 ranks an element may be summed as ((y + y) + y) + y or
(y + y) + (y + y), as the backend goes; it must equal one of the two. In
the "disjoint" tests each element is nonzero on one rank only, so every
sum is exact and results are compared exactly at any number of ranks.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kolo.torch as hvd  # noqa: E402
from kolo_testutil import split_rows  # noqa: E402

FLOATS = [torch.float16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]
NP = {torch.float16: np.float16, torch.float32: np.float32,
      torch.float64: np.float64, torch.uint8: np.uint8, torch.int8: np.int8,
      torch.int32: np.int32, torch.int64: np.int64}
OPS = [hvd.Sum, hvd.Average]
# (prescale, postscale): 0.3 and 1/3 are where a float32 product and a
# double product rounded to float32 differ; the last pair is arbitrary.
FACTORS = [(0.3, 1.0), (1.0, 1.0 / 3.0), (0.3, 1.7), (1.0, 1.0),
           (0.8170311617, 1.2318874125)]


# ---- Horovod's arithmetic in NumPy -------------------------------------------


def hvd_scale(a, f):
    """Horovod's ScaleBufferCPUImpl on a NumPy array (not applied when the
    factor is exactly 1.0)."""
    if f == 1.0:
        return a
    dt = a.dtype
    if dt == np.float32:
        return a * np.float32(f)
    if dt == np.float16:
        return (a.astype(np.float32) * np.float32(f)).astype(np.float16)
    if dt == np.float64:
        return a * np.float64(f)
    return np.trunc(a.astype(np.float64) * np.float64(f)).astype(dt)


def add(x, y):
    """One addition of the reduction, rounded in the dtype."""
    if x.dtype == np.float16:
        return (x.astype(np.float32) + y.astype(np.float32)).astype(np.float16)
    if x.dtype.kind in "iu":
        return (x.astype(np.int64) + y.astype(np.int64)).astype(x.dtype)
    return x + y


def sums(arrays):
    """The sums the backends may compute: in rank order, and (4 ranks) in
    pairs."""
    acc = arrays[0]
    for a in arrays[1:]:
        acc = add(acc, a)
    out = [acc]
    if len(arrays) == 4:
        out.append(add(add(arrays[0], arrays[1]), add(arrays[2], arrays[3])))
    return out


def hvd_reduce(arrays, op, pre, post):
    """Horovod's results (one per summation order) of an allreduce of
    `arrays` (one per rank) with op, prescale_factor and postscale_factor."""
    n = len(arrays)
    factor = post / n if op == hvd.Average else post
    return [hvd_scale(s, factor) for s in sums([hvd_scale(a, pre)
                                                for a in arrays])]


def assert_horovod(got, wants):
    """got (a tensor) equals one of wants (NumPy arrays) element by
    element, bit for bit in value; with one candidate, torch.equal."""
    want0 = torch.from_numpy(np.ascontiguousarray(wants[0]))
    if len(wants) == 1 or torch.equal(got, want0):
        assert got.dtype == want0.dtype and got.shape == want0.shape
        assert torch.equal(got, want0), (
            "differs from Horovod's result at %d of %d elements: got %s, "
            "want %s" % (int((got != want0).sum()), got.numel(),
                         got[got != want0][:4].tolist(),
                         want0[got != want0][:4].tolist()))
        return
    g = got.numpy()
    ok = np.zeros(g.shape, dtype=bool)
    for w in wants:
        ok |= g == w
    assert ok.all(), "differs from every summation order of Horovod's"


# ---- inputs -------------------------------------------------------------------


def identical(seed, shape, dtype):
    """The same tensor on every rank."""
    rng = np.random.default_rng(seed)
    if dtype in INTS:
        lo = 0 if dtype == torch.uint8 else -9
        return rng.integers(lo, 10, shape).astype(NP[dtype])
    return rng.uniform(-100.0, 100.0, shape).astype(NP[dtype])


def disjoint(seed, r, n, shape, dtype):
    """Rank r's tensor: element i is nonzero on rank i % n only."""
    a = identical(seed * 131 + r, shape, dtype)
    owner = np.arange(a.size).reshape(shape) % n
    return np.where(owner == r, a, np.zeros_like(a))


def arrays_for(kind, seed, n, shape, dtype):
    if kind == "identical":
        return [identical(seed, shape, dtype)] * n
    return [disjoint(seed, r, n, shape, dtype) for r in range(n)]


CASES = [(kind, dtype) for kind in ("identical", "disjoint")
         for dtype in FLOATS + INTS]


def case_id(case):
    return "%s-%s" % (case[0], str(case[1]).replace("torch.", ""))


# ---- forward -------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_allreduce_scaling_is_horovods(rank, size, case):
    kind, dtype = case
    for k, (pre, post) in enumerate(FACTORS):
        for op in OPS:
            arrays = arrays_for(kind, 300 + k, size, (5, 7), dtype)
            x = torch.from_numpy(arrays[rank].copy())
            got = hvd.allreduce(x, op=op, prescale_factor=pre,
                                postscale_factor=post,
                                name="sc.ar.%s.%d.%d" % (case_id(case), k, op))
            assert_horovod(got, hvd_reduce(arrays, op, pre, post))
            # in place, and asynchronously: the same arithmetic
            y = x.clone()
            h = hvd.allreduce_async_(y, op=op, prescale_factor=pre,
                                     postscale_factor=post)
            assert hvd.synchronize(h) is y
            assert torch.equal(y, got)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_grouped_allreduce_scaling_is_horovods(rank, size, case):
    kind, dtype = case
    for k, (pre, post) in enumerate(FACTORS):
        for op in OPS:
            a = arrays_for(kind, 400 + k, size, (9,), dtype)
            b = arrays_for(kind, 500 + k, size, (2, 3), dtype)
            got = hvd.grouped_allreduce(
                [torch.from_numpy(a[rank].copy()),
                 torch.from_numpy(b[rank].copy())],
                op=op, prescale_factor=pre, postscale_factor=post,
                name="sc.gar.%s.%d.%d" % (case_id(case), k, op))
            assert_horovod(got[0], hvd_reduce(a, op, pre, post))
            assert_horovod(got[1], hvd_reduce(b, op, pre, post))


def my_rows(full, rank, size):
    split = split_rows(full.shape[0], size)
    start = sum(split[:rank])
    return full[start:start + split[rank]]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_reducescatter_scaling_is_horovods(rank, size, case):
    kind, dtype = case
    rows = 2 * size + 1  # uneven shares
    for k, (pre, post) in enumerate(FACTORS):
        for op in OPS:
            arrays = arrays_for(kind, 600 + k, size, (rows, 3), dtype)
            x = torch.from_numpy(arrays[rank].copy())
            got = hvd.reducescatter(x, op=op, prescale_factor=pre,
                                    postscale_factor=post,
                                    name="sc.rs.%s.%d.%d" % (case_id(case),
                                                             k, op))
            wants = [my_rows(w, rank, size)
                     for w in hvd_reduce(arrays, op, pre, post)]
            assert_horovod(got, wants)
            arrays2 = arrays_for(kind, 700 + k, size, (size, 2), dtype)
            outs = hvd.grouped_reducescatter(
                [x, torch.from_numpy(arrays2[rank].copy())], op=op,
                prescale_factor=pre, postscale_factor=post)
            assert torch.equal(outs[0], got)
            assert_horovod(outs[1], [my_rows(w, rank, size) for w in
                                     hvd_reduce(arrays2, op, pre, post)])


def test_float32_scaling_differs_from_double_rounding(rank, size):
    """The case that motivated this file: 3.0 * 0.3 summed. A product in
    double rounded once to float32 gives 0x3f666666 per rank, Horovod's
    float32 product 0x3f666667: kolo must give Horovod's."""
    x = torch.full((4,), 3.0)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.3)
    y = np.float32(3.0) * np.float32(0.3)
    assert y.view(np.uint32) == 0x3f666667
    assert_horovod(got, hvd_reduce([np.full(4, 3.0, np.float32)] * size,
                                   hvd.Sum, 0.3, 1.0))
    # Average at 3 ranks: 7.0 * 3 / 3 is 7.0 * 3 * float32(1/3), not 7.0
    avg = hvd.allreduce(torch.full((4,), 7.0), op=hvd.Average,
                        name="sc.avg7")
    assert_horovod(avg, hvd_reduce([np.full(4, 7.0, np.float32)] * size,
                                   hvd.Average, 1.0, 1.0))


def test_compression_fp16_scaling_is_horovods(rank, size):
    """Compression.fp16: Horovod casts to float16 in Python, reduces and
    scales in float16, casts back; kolo's float16 wire must agree."""
    arrays = [identical(800, (33,), torch.float32)] * size
    x = torch.from_numpy(arrays[rank].copy())
    for pre, post in FACTORS:
        for op in OPS:
            got = hvd.allreduce(x, op=op, prescale_factor=pre,
                                postscale_factor=post,
                                compression=hvd.Compression.fp16)
            halves = [a.astype(np.float16) for a in arrays]
            wants = [w.astype(np.float32)
                     for w in hvd_reduce(halves, op, pre, post)]
            assert_horovod(got, wants)


def test_process_set_average_divides_by_its_size(rank, size):
    even = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    try:
        if even.included():
            n = even.size()
            arrays = [identical(900, (6,), torch.float32)] * n
            x = torch.from_numpy(arrays[0].copy())
            got = hvd.allreduce(x, op=hvd.Average, postscale_factor=0.7,
                                process_set=even)
            assert_horovod(got, hvd_reduce(arrays, hvd.Average, 1.0, 0.7))
            rows = np.ones((n, 2), np.float32) * np.float32(5.0)
            rs = hvd.reducescatter(torch.from_numpy(rows), op=hvd.Average,
                                   prescale_factor=0.3, process_set=even)
            want = hvd_reduce([rows] * n, hvd.Average, 0.3, 1.0)
            assert_horovod(rs, [w[even.rank():even.rank() + 1] for w in want])
    finally:
        hvd.remove_process_set(even)


# ---- gradients of reducescatter ---------------------------------------------


def torch_mul(a, s):
    """torch's CPU product of a tensor by a Python number, as Horovod's
    backward computes it: with this torch's own arithmetic, which changed
    for float16 (torch 1.13 rounds the number to float16 first; torch 2
    multiplies by it in float32 and rounds the product once)."""
    return (torch.from_numpy(a.copy()) * s).numpy()


def hvd_rs_grad(g, op, pre, post, n):
    """horovod.torch's HorovodReducescatter.backward before the allgather:
    grad * size for Sum, then * prescale, then * postscale (each skipped at
    1.0), every product a torch product of its own."""
    if op == hvd.Sum:
        g = torch_mul(g, n)
    if pre != 1.0:
        g = torch_mul(g, pre)
    if post != 1.0:
        g = torch_mul(g, post)
    return g


GRAD_DTYPES = [torch.float32, torch.float64, torch.float16]


def grad_data(seed, r, shape, dtype):
    rng = np.random.default_rng([seed, r])
    return rng.uniform(-3.0, 3.0, shape).astype(NP[dtype])


@pytest.mark.parametrize("dtype", GRAD_DTYPES,
                         ids=lambda d: str(d).replace("torch.", ""))
def test_reducescatter_grad_is_horovods(rank, size, dtype):
    rows = 2 * size + 1
    split = split_rows(rows, size)
    for k, (pre, post) in enumerate(FACTORS):
        for op in OPS:
            x = torch.from_numpy(grad_data(1000 + k, rank, (rows, 2), dtype))
            x.requires_grad_()
            y = hvd.reducescatter(x, op=op, prescale_factor=pre,
                                  postscale_factor=post)
            gs = [grad_data(1100 + k, r, (split[r], 2), dtype)
                  for r in range(size)]
            g = torch.from_numpy(gs[rank].copy())
            y.backward(g)
            want = np.concatenate([hvd_rs_grad(a, op, pre, post, size)
                                   for a in gs])
            assert torch.equal(x.grad, torch.from_numpy(want)), (op, pre, post)
            # kolo leaves the gradient it was given as it was (Horovod
            # multiplies it in place)
            assert torch.equal(g, torch.from_numpy(gs[rank]))


def test_reducescatter_grad_sum_of_ones(rank, size):
    """The issue's example: Sum over n ranks, the output's gradient all
    ones: the input's gradient is n everywhere (Horovod's), not 1. Through
    y.sum(), whose gradient is an expanded (read-only) tensor."""
    for op, want in ((hvd.Sum, float(size)), (hvd.Average, 1.0)):
        x = torch.ones(size, 3, requires_grad=True)
        hvd.reducescatter(x, op=op).sum().backward()
        assert torch.equal(x.grad, torch.full((size, 3), want))
        c = torch.ones(size, 2, dtype=torch.float64, requires_grad=True)
        yc, = hvd.grouped_reducescatter([c], op=op, postscale_factor=0.5)
        yc.sum().backward()
        assert torch.equal(c.grad, torch.full((size, 2), want * 0.5,
                                              dtype=torch.float64))


def test_grouped_reducescatter_grad_is_horovods(rank, size):
    rows_a, rows_b = size + 1, 2 * size
    sa, sb = split_rows(rows_a, size), split_rows(rows_b, size)
    for k, (pre, post) in enumerate(FACTORS):
        for op in OPS:
            a = torch.from_numpy(grad_data(1200 + k, rank, (rows_a, 3),
                                           torch.float32)).requires_grad_()
            b = torch.from_numpy(grad_data(1300 + k, rank, (rows_b,),
                                           torch.float64)).requires_grad_()
            ya, yb = hvd.grouped_reducescatter([a, b], op=op,
                                               prescale_factor=pre,
                                               postscale_factor=post)
            ga = [grad_data(1400 + k, r, (sa[r], 3), torch.float32)
                  for r in range(size)]
            gb = [grad_data(1500 + k, r, (sb[r],), torch.float64)
                  for r in range(size)]
            torch.autograd.backward([ya, yb], [torch.from_numpy(ga[rank]),
                                               torch.from_numpy(gb[rank])])
            want_a = np.concatenate([hvd_rs_grad(g, op, pre, post, size)
                                     for g in ga])
            want_b = np.concatenate([hvd_rs_grad(g, op, pre, post, size)
                                     for g in gb])
            assert torch.equal(a.grad, torch.from_numpy(want_a))
            assert torch.equal(b.grad, torch.from_numpy(want_b))


def test_reducescatter_grad_in_process_set(rank, size):
    """The size that multiplies a Sum's gradient is the process set's, and
    the allgather runs in the set."""
    even = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    try:
        if even.included():
            n, me = even.size(), even.rank()
            rows = 2 * n + 1
            split = split_rows(rows, n)
            for op in OPS:
                x = torch.from_numpy(grad_data(1600, me, (rows, 2),
                                               torch.float32))
                x.requires_grad_()
                y = hvd.reducescatter(x, op=op, process_set=even,
                                      prescale_factor=0.3,
                                      postscale_factor=1.7)
                gs = [grad_data(1700, r, (split[r], 2), torch.float32)
                      for r in range(n)]
                y.backward(torch.from_numpy(gs[me].copy()))
                want = np.concatenate([hvd_rs_grad(g, op, 0.3, 1.7, n)
                                       for g in gs])
                assert torch.equal(x.grad, torch.from_numpy(want))
                c = torch.from_numpy(grad_data(1800, me, (n, 2),
                                               torch.float64))
                c.requires_grad_()
                yc, = hvd.grouped_reducescatter([c], op=op, process_set=even)
                cg = [grad_data(1900, r, (1, 2), torch.float64)
                      for r in range(n)]
                yc.backward(torch.from_numpy(cg[me].copy()))
                want = np.concatenate([hvd_rs_grad(g, op, 1.0, 1.0, n)
                                       for g in cg])
                assert torch.equal(c.grad, torch.from_numpy(want))
    finally:
        hvd.remove_process_set(even)
