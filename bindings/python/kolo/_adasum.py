"""Adasum: Horovod's adaptive summation, for the NumPy and torch bindings.

WHAT IT COMPUTES

Adasum combines two vectors a and b (one tensor of two ranks) as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

which is a + b when a and b are orthogonal and (a + b) / 2 = a when they
are equal: orthogonal gradients are summed, parallel ones averaged. As in
Horovod (horovod/common/ops/adasum/adasum.h), a vector whose squared norm
is below 1e-8 keeps the coefficient 1, and each tensor of a group gets its
own coefficients (they are never computed over a fused buffer).

The ranks' tensors are combined as a binary tree, the order Horovod's
vector-halving distance-doubling (VHDD) allreduce combines them in: with
n = 2^k ranks, level 1 combines ranks (0, 1), (2, 3), ...; level 2
combines the results of {0, 1} and {2, 3}; and so on until one vector is
left. Horovod refuses any other number of ranks ("Running Adasum with
non-power of 2 ranks is not supported yet"; its user guide: "AdaSum needs
the number of nodes to be a power of 2"). kolo takes any number: with
p = the largest power of two <= n, rank p + i is first combined with rank
i (for every i < n - p), as a recursive-halving allreduce folds its extra
ranks in before it starts; the tree over the p results follows. So at 3
ranks the result is adasum(adasum(g0, g2), g1), at 5 ranks
adasum(adasum(adasum(g0, g4), g1), adasum(g2, g3)). It is still a sum of
orthogonal vectors and the average of equal ones, but at a size that is
not a power of two the ranks do not all weigh the same in between.

HOW

Every rank allgathers every tensor (one row per rank, in the order of the
ranks in the process set), then computes the whole tree itself. Each rank
computes the same float64 operations, in the same order, on the same
bytes, so every rank ends with the same bits: the sums are NumPy's
single-threaded pairwise summation (np.add.reduce), not BLAS or torch,
whose order may depend on the number of threads or on the CPU. float16,
bfloat16 and float32 inputs are widened to float64 exactly; the result is
rounded to the tensor's dtype once (Horovod rounds at every level).

Cost, for a tensor of N elements on n ranks: each rank receives (n - 1) N
elements (VHDD: about 2 N), holds n N elements of the input's dtype plus
float64 intermediates (about (n/2 + 2) N doubles at the first level), and
computes n - 1 combinations of N elements (VHDD spreads them: about
2 N log2(n) / n per rank). It is the price of a result that is the same on
every rank by construction and of an implementation that works on every
backend (Horovod has Adasum only over MPI and for GPUs; over Gloo its
first step fails).
"""

import ctypes

import numpy as np

from . import _core, _lib

# Horovod's threshold: a squared norm below this keeps the coefficient 1.
NORM_FLOOR = 1e-8

# kolo dtypes that Adasum takes (Horovod: float16, float32, float64).
DTYPES = (_lib.FLOAT16, _lib.BFLOAT16, _lib.FLOAT32, _lib.FLOAT64)
_NUMPY = {_lib.FLOAT16: np.float16, _lib.FLOAT32: np.float32,
          _lib.FLOAT64: np.float64}
_ITEMSIZE = {_lib.FLOAT16: 2, _lib.BFLOAT16: 2, _lib.FLOAT32: 4,
             _lib.FLOAT64: 8}


def _sum(v):
    # pairwise summation, single-threaded: the same order on every rank
    return float(np.add.reduce(v, dtype=np.float64))


def pair(a, b):
    """adasum(a, b) of two float64 vectors, as a new float64 vector."""
    dot = _sum(np.multiply(a, b))
    anorm = _sum(np.multiply(a, a))
    bnorm = _sum(np.multiply(b, b))
    acoeff = 1.0 - dot / anorm * 0.5 if anorm >= NORM_FLOOR else 1.0
    bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm >= NORM_FLOOR else 1.0
    return np.add(np.multiply(a, acoeff), np.multiply(b, bcoeff))


def tree(rows):
    """The Adasum of a list of float64 vectors (one per rank, in rank
    order): see the module's docstring for the order of the pairs."""
    n = len(rows)
    if n == 0:
        raise ValueError("Adasum of no vectors")
    p = 1
    while p * 2 <= n:
        p *= 2
    level = [pair(rows[i], rows[p + i]) if p + i < n else rows[i]
             for i in range(p)]
    while len(level) > 1:
        level = [pair(level[k], level[k + 1])
                 for k in range(0, len(level), 2)]
    return level[0]


def check_dtype(kd, what, dtype_name):
    if kd not in DTYPES:
        raise TypeError("%s: op=Adasum takes floating-point tensors (float16, "
                        "bfloat16, float32, float64), not %s"
                        % (what, dtype_name))


def row_shape(shape):
    """The shape each rank contributes to the allgather: the tensor's
    shape behind one leading row (so that tensors of different shapes on
    different ranks fail, naming the tensor, as an allreduce does)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) + 1 > _lib.MAX_DIMS:
        n = 1
        for d in shape:
            n *= d
        shape = (n,)
    return (1,) + shape


def enqueue(keys, addresses, shapes, kd, process_set):
    """Enqueues the allgather of host buffers (dtype kd, the given shapes,
    contiguous) as one group; returns the kolo handles (each handing over
    a kolo_result_t)."""
    opts, _ = _core.make_opts(process_set=process_set)
    return _core.grouped_allgather_async(
        keys, addresses, [row_shape(s) for s in shapes], kd, opts)


def enqueue_by_dtype(keys, addresses, shapes, kds, process_set, keep, what):
    """Enqueues the allgathers of host buffers (buffer i: kolo dtype
    kds[i]), one group per dtype; returns (the kolo handles, the buffers'
    indices in the handles' order). If enqueuing fails half-way, what was
    enqueued is registered, keeping `keep` alive, so that it still
    completes, and the error is raised."""
    groups = {}
    for i, kd in enumerate(kds):
        groups.setdefault(kd, []).append(i)
    order, handles = [], []
    try:
        for kd, idx in groups.items():
            handles += enqueue([keys[i] for i in idx],
                               [addresses[i] for i in idx],
                               [shapes[i] for i in idx], kd, process_set)
            order += idx
    except Exception:
        if handles:  # what was enqueued must still complete
            _core.register(handles, keep, None, results=True, what=what)
        raise
    return handles, order


def _gathered(res, kd, count):
    """The rows of an allgather's result as a float64 array [n, count]."""
    data, nbytes = _core.result_bytes(res)
    size = _ITEMSIZE[kd]
    if count == 0:
        n = _core.result_shape(res)[0] if res.ndim else 0
        return np.zeros((n, 0))
    if nbytes % (count * size):
        raise _core.KoloError("Adasum: the runtime returned %d bytes, not "
                              "rows of %d elements" % (nbytes, count),
                              _lib.ERR_INTERNAL)
    raw = np.empty(nbytes, dtype=np.uint8)
    ctypes.memmove(raw.ctypes.data, data, nbytes)
    if kd == _lib.BFLOAT16:
        # bfloat16 is the upper half of a float32: widen exactly
        wide = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        wide = raw.view(_NUMPY[kd])
    return wide.astype(np.float64).reshape(-1, count)


def reduce(res, kd, count, prescale=1.0, postscale=1.0):
    """The Adasum of an allgather's rows, as a float64 vector of count
    elements: postscale * adasum(prescale * row for each rank)."""
    g = _gathered(res, kd, count)
    rows = [g[i] for i in range(g.shape[0])]
    if prescale != 1.0:
        rows = [np.multiply(r, prescale) for r in rows]
    out = tree(rows)
    if postscale != 1.0:
        out = np.multiply(out, postscale)
    return out
