"""allgather, alltoall and reducescatter on torch tensors: the
collectives whose output's size is known only after negotiation, which
the runtime hands over as a result (kolo_result_t) that becomes a new
tensor on the input's device; their grouped and asynchronous forms and
their autograd functions.
"""

import torch

from .. import _core, _lib
from .._core import Adasum, Average, Sum, global_process_set
from ._allreduce import allreduce, grouped_allreduce
from ._inflight import _held
from ._tensors import (_by_dtype_and_place, _contig, _kdtype, _one_device,
                       _place, _tensor_from_result)
from .compression import Compression


# ---- allgather -------------------------------------------------------------


def _rows(t, what):
    if t.dim() == 0:
        raise ValueError("%s needs a tensor of at least one dimension (the "
                         "first dimension is the one concatenated)" % what)


def _results_async(coll, tensors, name, process_set, grouped, opts_of,
                   enqueue_fn, with_splits=False):
    """Enqueues an allgather or reducescatter (coll) of tensors, whose
    results the runtime hands over (kolo_result_t): one grouped call per
    (dtype, place), with the options opts_of(place) and the _core function
    enqueue_fn. synchronize() gives each result as a tensor on its input's
    device ((tensor, splits) with with_splits); the list when grouped."""
    tensors = list(tensors)
    what = "grouped_" + coll if grouped else coll
    if not tensors:
        raise ValueError("grouped_%s: the list of tensors is empty" % coll)
    for t in tensors:
        _rows(t, coll)
    _one_device(tensors, what)
    groups = _by_dtype_and_place(tensors, coll)
    base = _core.op_key(what, name, process_set)
    keys = (["%s.%d" % (base, i) for i in range(len(tensors))] if grouped
            else [base])
    ins = [_contig(t) for t in tensors]
    order = []

    def enqueue(handles):
        for (kd, place), idx in groups.items():
            handles += enqueue_fn(
                [keys[i] for i in idx], [ins[i].data_ptr() for i in idx],
                [tuple(ins[i].shape) for i in idx], kd, opts_of(place))
            order.extend(idx)
    held, handles = _held(base, ins, enqueue, results=True)
    dtypes = [t.dtype for t in tensors]
    devices = [t.device for t in tensors]

    def finish(rs):
        held.check()
        outs = [None] * len(tensors)
        for i, r in zip(order, rs):
            out = _tensor_from_result(r, dtypes[i], devices[i])
            outs[i] = (out, _core.result_splits(r)) if with_splits else out
        return outs if grouped else outs[0]
    return _core.register(handles, (tensors, ins, held), finish, results=True,
                          what=base, release=held.release)


def _allgather_async(tensors, name, process_set, grouped, with_splits=False):
    return _results_async(
        "allgather", tensors, name, process_set, grouped,
        lambda place: _core.make_opts(process_set=process_set,
                                      place=place)[0],
        _core.grouped_allgather_async, with_splits)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather: the ranks' tensors concatenated along the first
    dimension (which may differ between ranks, the others must agree), in
    rank order."""
    return _allgather_async([tensor], name, process_set, grouped=False)


def grouped_allgather_async(tensors, name=None,
                            process_set=global_process_set):
    return _allgather_async(tensors, name, process_set, grouped=True)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        out, splits = _core.synchronize(_allgather_async(
            [tensor], name, process_set, grouped=False, with_splits=True))
        ctx.process_set = process_set
        ctx.splits = splits
        return out

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        r = _core.set_rank(ctx.process_set)
        offset = sum(ctx.splits[:r])
        return reduced.narrow(0, offset, ctx.splits[r]), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """The ranks' tensors concatenated along the first dimension, in rank
    order; differentiable."""
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        pairs = _core.synchronize(_allgather_async(
            tensors, name, process_set, grouped=True, with_splits=True))
        ctx.process_set = process_set
        ctx.splits = [s for _, s in pairs]
        return tuple(o for o, _ in pairs)

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), op=Average,
                                    process_set=ctx.process_set)
        r = _core.set_rank(ctx.process_set)
        out = [g.narrow(0, sum(s[:r]), s[r]) for g, s in zip(reduced,
                                                             ctx.splits)]
        return (None, None) + tuple(out)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """The allgather of every tensor of the list, as one group;
    differentiable."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# ---- alltoall --------------------------------------------------------------


def _splits_list(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return [int(s) for s in splits.reshape(-1).tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None,
                   process_set=global_process_set):
    """Starts an alltoall: splits[j] rows of `tensor` go to rank j (None:
    the first dimension split evenly). synchronize(handle) returns
    (output, received_splits)."""
    kd = _kdtype(tensor, "alltoall")
    _rows(tensor, "alltoall")
    inp = _contig(tensor)
    sp = _splits_list(splits)
    opts, _ = _core.make_opts(process_set=process_set, place=_place(inp))
    key = _core.op_key("alltoall", name, process_set)
    held, hs = _held(key, [inp], lambda done: done.append(
        _core.alltoall_async(key, inp.data_ptr(), tuple(inp.shape), kd, sp,
                             opts)), results=True)
    dtype, device = tensor.dtype, tensor.device
    # Horovod's received splits: like the splits tensor given (its device
    # and dtype: int32 on the GPU for splits on the GPU), else int32 on
    # the CPU
    if isinstance(splits, torch.Tensor):
        sdtype, sdevice = splits.dtype, splits.device
    else:
        sdtype, sdevice = torch.int32, torch.device("cpu")

    def finish(rs):
        held.check()
        return (_tensor_from_result(rs[0], dtype, device),
                torch.tensor(_core.result_splits(rs[0]), dtype=sdtype,
                             device=sdevice))
    return _core.register(hs, (tensor, inp, held), finish, results=True,
                          what=key, release=held.release)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, rsplits = _core.synchronize(alltoall_async(tensor, splits, name,
                                                        process_set))
        ctx.process_set = process_set
        ctx.rsplits = rsplits
        ctx.mark_non_differentiable(rsplits)
        return out, rsplits

    @staticmethod
    def backward(ctx, grad, *_unused):
        g, _ = _Alltoall.apply(grad, ctx.rsplits, None, ctx.process_set)
        return g, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters rows of `tensor` to the ranks (splits[j] rows to rank j;
    None: evenly) and gathers what every rank sent here, in rank order.
    Returns the output tensor, or (output, received_splits) when splits are
    given, as Horovod does; differentiable."""
    out, rsplits = _Alltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, rsplits)


# ---- reducescatter ---------------------------------------------------------


def _rs_op(op):
    if op != Adasum:
        op = _core.check_op(op)
    if op not in (Sum, Average):
        # Horovod refuses it at enqueue with a HorovodInternalError (a
        # RuntimeError), not a ValueError
        raise _core.KoloError("Reducescatter currently only supports "
                              "AVERAGE and SUM, not %s" % _core.op_name(op),
                              _lib.ERR_UNSUPPORTED)
    return op


def _reducescatter_async(tensors, name, op, process_set, prescale_factor,
                         postscale_factor, grouped):
    op = _rs_op(op)
    return _results_async(
        "reducescatter", tensors, name, process_set, grouped,
        lambda place: _core.make_opts(op, prescale_factor, postscale_factor,
                                      process_set, place=place)[0],
        _core.grouped_reducescatter_async)


def reducescatter_async(tensor, name=None, op=Average,
                        process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reducescatter: the ranks' tensors (same shape) reduced with
    op (Average or Sum) and the first dimension of the result split as
    evenly as possible (rank r of n gets shape[0] // n rows, plus one if
    r < shape[0] % n)."""
    return _reducescatter_async([tensor], name, op, process_set,
                                prescale_factor, postscale_factor, False)


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _reducescatter_async(tensors, name, op, process_set,
                                prescale_factor, postscale_factor, True)


def _rs_grads_in(grads, op, prescale, postscale, process_set):
    """The gradients of a reducescatter's outputs, scaled as horovod.torch
    scales them before allgathering them: times the process set's size for
    Sum (none for Average: the gradient of an average over ranks is the
    output's gradient itself, Horovod's convention of the allreduce's
    Average gradient), then times prescale, then times postscale, each a
    separate product rounded in the gradient's dtype, as Horovod's
    HorovodReducescatter.backward does them. Out of place: Horovod scales
    the incoming gradient in place (the caller's tensor, or a read-only
    expanded one), which kolo does not repeat."""
    out = []
    n = _core.set_size(process_set)
    for g in grads:
        if op == Sum:
            g = g * n
        if prescale != 1.0:
            g = g * prescale
        if postscale != 1.0:
            g = g * postscale
        out.append(g)
    return out


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):
        ctx.args = (op, process_set, prescale, postscale)
        return _core.synchronize(_reducescatter_async(
            [tensor], name, op, process_set, prescale, postscale, False))

    @staticmethod
    def backward(ctx, grad):
        op, process_set, prescale, postscale = ctx.args
        g, = _rs_grads_in([grad], op, prescale, postscale, process_set)
        return (allgather(g, process_set=process_set),
                None, None, None, None, None)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0,
                  postscale_factor=1.0):
    """This rank's share of the reduction of the ranks' tensors (see
    reducescatter_async); differentiable."""
    compressed, cctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, process_set,
                               prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, *tensors):
        ctx.args = (op, process_set, prescale, postscale)
        return tuple(_core.synchronize(_reducescatter_async(
            tensors, name, op, process_set, prescale, postscale, True)))

    @staticmethod
    def backward(ctx, *grads):
        op, process_set, prescale, postscale = ctx.args
        gs = _rs_grads_in(grads, op, prescale, postscale, process_set)
        gs = grouped_allgather(gs, process_set=process_set)
        return (None,) * 5 + tuple(gs)


def grouped_reducescatter(tensors, name=None, compression=Compression.none,
                          op=Average, process_set=global_process_set,
                          prescale_factor=1.0, postscale_factor=1.0):
    """The reducescatter of every tensor of the list, as one group;
    differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                       postscale_factor,
                                       *[c for c, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]
