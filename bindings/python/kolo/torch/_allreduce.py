"""allreduce and grouped_allreduce on torch tensors, their in-place and
asynchronous forms, and their autograd functions (the gradient of an
allreduce is the allreduce of the gradient, with the same op and
scaling). An in-place allreduce of a contiguous tensor goes the fast way
(_fast_allreduce.py) where it can; op=Adasum goes to adasum_ops.py.
"""

import torch

from .. import _core, _lib
from .._core import Adasum, Average, global_process_set
from . import adasum_ops
from ._fast_allreduce import (_GLOBAL, _SCALARS, _allreduce_inplace_fast,
                              _enqueue_default, _fast)
from ._inflight import _held, _write_back
from ._tensors import (_by_dtype_and_place, _contig, _kdtype, _new_like,
                       _one_device, _order_on, _place, _same_device,
                       _shape_or_none, _spec)
from .compression import Compression, wire_for


def _allreduce_async(tensor, output, name, op, prescale_factor,
                     postscale_factor, process_set, wire=None, passes=1,
                     average_passes=False, key=None):
    """Enqueues one allreduce of `tensor` into `output` (which may be
    `tensor`: in place). Returns a handle whose synchronize gives output."""
    if op == Adasum:
        return _adasum_async([tensor], [output], name, prescale_factor,
                             postscale_factor, process_set, wire, passes,
                             key, grouped=False)
    if output is tensor:
        h = _allreduce_inplace_fast(tensor, name, op, prescale_factor,
                                    postscale_factor, process_set, wire,
                                    passes, average_passes, key)
        if h is not None:
            return h
    kd = _kdtype(tensor, "allreduce")
    op = _core.check_op(op)
    if output is not tensor:
        if (output.shape != tensor.shape or output.dtype != tensor.dtype):
            raise ValueError("allreduce: the output must have the input's "
                             "shape and dtype")
        _same_device(tensor, output, "allreduce")
    inp = _contig(tensor)
    buf = inp if output is tensor else _contig(output)
    opts, keep = _core.make_opts(op, prescale_factor, postscale_factor,
                                 process_set, wire, passes, average_passes,
                                 _shape_or_none(tensor), _place(inp))
    if key is None:
        key = _core.op_key("allreduce", name, process_set)
    held, hs = _held(key, [inp, buf], lambda done: done.append(
        _core.allreduce_async(key, inp.data_ptr(), buf.data_ptr(),
                              inp.numel(), kd, opts)))
    back = [(output, held.aliases[1], _spec(output))]

    def finish(_r):
        held.check()
        _write_back(key, back)
        return output
    return _core.register(hs, (tensor, inp, buf, output, keep, held), finish,
                          what=key, release=held.release,
                          stream=_order_on(inp))


def allreduce_async(tensor, average=None, name=None, op=None,
                    prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts an allreduce of `tensor` (not modified) into a new tensor;
    synchronize(handle) returns it. op: Average (default), Sum, Min, Max,
    Product. Every rank must use the same name for one tensor (or issue its
    unnamed operations in the same order)."""
    op = _core.resolve_op(op, average)
    output = _new_like(tensor, "allreduce")
    return _allreduce_async(tensor, output, name, op, prescale_factor,
                            postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None,
                     prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """Starts an in-place allreduce; synchronize(handle) returns `tensor`."""
    # The options left at their defaults, a named tensor: the fastest way
    # (_fast_allreduce._enqueue_default), else the fast way, else the
    # general one, each trying the next where it does not apply.
    if (average is None and process_set is _GLOBAL and _fast is not None and
            type(name) is str and type(tensor) is torch.Tensor and
            type(prescale_factor) in _SCALARS and prescale_factor == 1 and
            type(postscale_factor) in _SCALARS and postscale_factor == 1):
        h = _enqueue_default(tensor, name, Average if op is None else op)
        if h is not None:
            return h
    if average is None:
        if op is None:
            op = Average
        h = _allreduce_inplace_fast(tensor, name, op, prescale_factor,
                                    postscale_factor, process_set, None, 1,
                                    False, None)
        if h is not None:
            return h
    op = _core.resolve_op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor,
                            postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Allreduces `tensor` in place and returns it."""
    return _core.synchronize(allreduce_async_(
        tensor, average, name, op, prescale_factor, postscale_factor,
        process_set))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set, wire):
        ctx.args = (op, prescale, postscale, process_set, wire)
        out = _new_like(tensor, "allreduce")
        return _core.synchronize(_allreduce_async(
            tensor, out, name, op, prescale, postscale, process_set, wire))

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set, wire = ctx.args
        g = _Allreduce.apply(grad, None, op, prescale, postscale, process_set,
                             wire)
        return g, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none,
              op=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    """The allreduce of `tensor` over the ranks of the process set, as a new
    tensor (the input is not modified); differentiable. compression:
    Compression.none or Compression.fp16 (float32 tensors are then
    compressed on the wire by the runtime)."""
    op = _core.resolve_op(op, average)
    wire = wire_for(compression, tensor)
    if wire is not None:
        return _Allreduce.apply(tensor, name, op, prescale_factor,
                                postscale_factor, process_set, wire)
    compressed, cctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, name, op, prescale_factor,
                           postscale_factor, process_set, None)
    return compression.decompress(out, cctx)


# ---- grouped allreduce -----------------------------------------------------


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                             postscale_factor, process_set, wire=None):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped_allreduce: the list of tensors is empty")
    if op == Adasum:
        return _adasum_async(tensors, outputs, name, prescale_factor,
                             postscale_factor, process_set, wire, 1, None,
                             grouped=True)
    op = _core.check_op(op)
    _one_device(tensors, "grouped_allreduce")
    groups = _by_dtype_and_place(tensors, "grouped_allreduce")
    for t, o in zip(tensors, outputs):
        if o is not t:
            _same_device(t, o, "grouped_allreduce")
    base = _core.op_key("grouped_allreduce", name, process_set)
    keys = ["%s.%d" % (base, i) for i in range(len(tensors))]
    ins = [_contig(t) for t in tensors]
    bufs = [ins[i] if outputs[i] is tensors[i] else _contig(outputs[i])
            for i in range(len(tensors))]

    def enqueue(handles):
        for (kd, place), idx in groups.items():
            w = wire if kd == _lib.FLOAT32 else None
            opts, _ = _core.make_opts(op, prescale_factor, postscale_factor,
                                      process_set, w, place=place)
            handles += _core.grouped_allreduce_async(
                [keys[i] for i in idx], [ins[i].data_ptr() for i in idx],
                [bufs[i].data_ptr() for i in idx],
                [ins[i].numel() for i in idx], kd, opts)
    held, handles = _held(base, ins + bufs, enqueue)
    n = len(tensors)
    back = [(outputs[i], held.aliases[n + i], _spec(outputs[i]))
            for i in range(n)]

    def finish(_r):
        held.check()
        _write_back(base, back)
        return list(outputs)
    return _core.register(handles, (tensors, ins, bufs, outputs, held),
                          finish, what=base, release=held.release,
                          stream=_order_on(tensors[0]))


def grouped_allreduce_async(tensors, average=None, name=None, op=None,
                            prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts the allreduce of a list of tensors as one group (negotiated and
    reduced together); synchronize(handle) returns the list of results."""
    op = _core.resolve_op(op, average)
    tensors = list(tensors)
    _one_device(tensors, "grouped_allreduce")
    outs = [_new_like(t, "grouped_allreduce") for t in tensors]
    return _grouped_allreduce_async(tensors, outs, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    op = _core.resolve_op(op, average)
    tensors = list(tensors)
    return _grouped_allreduce_async(tensors, tensors, name, op,
                                    prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None,
                       prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return _core.synchronize(grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor,
        process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, wire,
                *tensors):
        ctx.args = (op, prescale, postscale, process_set, wire)
        outs = [_new_like(t, "grouped_allreduce") for t in tensors]
        return tuple(_core.synchronize(_grouped_allreduce_async(
            tensors, outs, name, op, prescale, postscale, process_set, wire)))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set, wire = ctx.args
        gs = _GroupedAllreduce.apply(None, op, prescale, postscale,
                                     process_set, wire, *grads)
        return (None,) * 6 + tuple(gs)


def grouped_allreduce(tensors, average=None, name=None,
                      compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """The allreduce of every tensor of the list, as one group; returns the
    list of new tensors; differentiable."""
    op = _core.resolve_op(op, average)
    tensors = list(tensors)
    _one_device(tensors, "grouped_allreduce")
    if tensors and all(wire_for(compression, t) is not None for t in tensors):
        return list(_GroupedAllreduce.apply(
            name, op, prescale_factor, postscale_factor, process_set,
            wire_for(compression, tensors[0]), *tensors))
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, op, prescale_factor,
                                   postscale_factor, process_set, None,
                                   *[c for c, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def _adasum_async(tensors, outputs, name, prescale_factor, postscale_factor,
                  process_set, wire, passes, key, grouped):
    """op=Adasum (adasum_ops.py): the same names as any allreduce."""
    if passes != 1:
        raise ValueError("op=Adasum does not accumulate backward passes in "
                         "the runtime")
    if grouped:
        base = _core.op_key("grouped_allreduce", name, process_set)
        keys = ["%s.%d" % (base, i) for i in range(len(tensors))]
    else:
        base = key or _core.op_key("allreduce", name, process_set)
        keys = [base]
    return adasum_ops.allreduce_async(tensors, outputs, keys, base,
                                      prescale_factor, postscale_factor,
                                      process_set, wire, single=not grouped)
