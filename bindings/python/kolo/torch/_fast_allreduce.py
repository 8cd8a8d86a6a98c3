"""The fast path of an in-place allreduce of a contiguous tensor.

What a training loop does most (DistributedOptimizer's hooks,
allreduce_async_ of a gradient): an in-place allreduce of a contiguous CPU
tensor. The general path (_allreduce.py) builds a kolo_opts_t, a shape
array, two aliases and three closures per call; this one does the same
checks with the least Python work: the kolo_opts_t (the runtime copies it,
shape included, at enqueue) is made once per combination of options and
shape and reused, so is the encoded name, one alias holds the memory, and
one small object (_InPlace) finishes and releases the operation and is its
own entry in the pending table. It updates no table of storages in flight:
the resize guard finds it among the pending handles (_in_flight_user). The
enqueue and the wait go through the extension module kolo._fastpath where
it was built (bindings/python/kolo/_fastpath.c: a ctypes call costs as much
as the runtime's own work for a small tensor), else through ctypes. Same
names, same checks, same results, same errors: anything it does not handle
(CUDA, non-contiguous tensors, Adasum, an unknown op or dtype, more than
MAX_DIMS dimensions, a tensor that is not a plain strided tensor) goes the
general way, which raises the errors.
"""

import ctypes

import torch

from .. import _core, _lib
from .._core import Average, Sum, global_process_set
from ._inflight import _InPlace
from ._tensors import _DTYPES, _HOST, _cuda_usable


_FAST_OPS = frozenset((Sum, Average, _core.Min, _core.Max, _core.Product))
_fast_opts = {}      # options and shape -> ctypes.byref(kolo_opts_t)
_FAST_OPTS_MAX = 4096
_fast_names = {}     # name -> (runtime name, the same encoded)
_FAST_NAMES_MAX = 65536
_enqueue_opts = _lib.lib.kolo_allreduce_async_opts
_fast = _lib.fast    # kolo._fastpath, or None: ctypes
_OK = _lib.OK
_STRIDED = torch.strided
_GLOBAL = global_process_set
_SCALARS = (float, int)
_CPU = torch.device("cpu")
_pending = _core._pending          # handle -> what synchronize finishes
_next_handle = _core._next_handle


def _fast_name(name):
    """The runtime name of an allreduce named `name` and its encoding, made
    and remembered (_fast_names holds those already made)."""
    k = "allreduce." + name
    named = (k, k.encode("utf-8"))
    if len(_fast_names) >= _FAST_NAMES_MAX:
        _fast_names.clear()
    _fast_names[name] = named
    return named


try:  # the current stream's address without a torch.cuda.Stream object
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


def _cuda_fast_place(t):
    """_place for the fast path: (device_type, device, stream)."""
    index = t.device.index
    if index is None:
        index = torch.cuda.current_device()
    return (_lib.DEVICE_CUDA, index, _raw_stream(index) or None)


def _allreduce_inplace_fast(tensor, name, op, prescale, postscale,
                            process_set, wire, passes, average_passes, key):
    """Enqueues an in-place allreduce of a contiguous CPU or CUDA tensor
    and returns its handle, or returns None (nothing done) where the
    general path must take it."""
    if (type(tensor) is not torch.Tensor or type(op) is not int or
            op not in _FAST_OPS or type(prescale) not in _SCALARS or
            type(postscale) not in _SCALARS or
            (wire is not None and type(wire) is not int) or
            type(passes) is not int or type(average_passes) is not bool or
            tensor.layout is not _STRIDED or not tensor.is_contiguous()):
        return None
    if tensor.is_cpu:
        place = _HOST
    elif tensor.is_cuda and passes == 1:
        _cuda_usable(tensor, "allreduce")
        place = _cuda_fast_place(tensor)
    else:
        return None
    dtype = tensor.dtype
    kd = _DTYPES.get(dtype)
    shape = tensor.shape  # (a torch.Size: a tuple)
    if kd is None or len(shape) > _lib.MAX_DIMS:
        return None
    if process_set is _GLOBAL or process_set is None:
        sid = 0
    else:
        sid = _core.set_id(process_set)
    okey = (op, prescale, postscale, sid, wire, passes, average_passes,
            shape, place)
    cached = _fast_opts.get(okey)
    if cached is None:
        opts, keep = _core.make_opts(op, prescale, postscale, process_set,
                                     wire, passes, average_passes,
                                     shape or None, place)
        # (the byref, what its memory belongs to, and its address)
        cached = (ctypes.byref(opts), opts, keep, ctypes.addressof(opts))
        if len(_fast_opts) >= _FAST_OPTS_MAX:
            _fast_opts.clear()
        _fast_opts[okey] = cached
    if key is None:
        if type(name) is str:
            named = _fast_names.get(name)
            if named is None:
                named = _fast_name(name)
            key, bkey = named
        else:
            key = _core.op_key("allreduce", name, process_set)
            bkey = key.encode("utf-8")
    else:
        bkey = key.encode("utf-8")
    return _enqueue_inplace(tensor, shape, dtype, key, bkey, kd, cached[0],
                            cached[3], place)


def _enqueue_inplace(tensor, shape, dtype, key, bkey, kd, opts_ref,
                     opts_address, place=_HOST):
    """The enqueue of both fast paths, the checks done: holds the tensor's
    memory in an _InPlace, enqueues, registers; returns the handle."""
    op_ = _InPlace()
    op_.key = key
    op_.tensor = tensor
    # (.data: an alias of the same memory, as detach() but cheaper)
    alias = op_.alias = tensor.data
    address = op_.address = alias.data_ptr()
    if place is _HOST:
        op_.spec = (shape, dtype, _CPU)
        op_.stream = None
    else:
        # synchronize orders the result on the current stream then
        op_.spec = (shape, dtype, tensor.device)
        index = place[1]
        op_.stream = lambda: _raw_stream(index) or None
    try:
        if _fast is not None:
            h = _fast.allreduce(bkey, address, alias.numel(), kd, opts_address)
        else:
            ch = _lib.handle_t(0)
            h = _enqueue_opts(bkey, address, address, alias.numel(), kd,
                              opts_ref, ctypes.byref(ch))
            if h == _OK:
                h = ch.value
        if h < 0:
            raise _core.refused(h, "allreduce of '%s'" % key)
    except BaseException:
        op_.alias = None
        raise
    op_.handles = (h,)
    h = next(_next_handle)
    _pending[h] = op_
    return h


# allreduce_async_ with every option at its default but the op, a named
# CPU tensor and kolo._fastpath built: the fast path above, with less still
# (no options tuple, no checks of options left at their defaults): about
# 0.3 us less per call, a tenth of what a small allreduce costs. (op,
# shape, dtype) -> (kolo dtype, address of the kolo_opts_t, what keeps it
# alive)
_default_opts = {}


def _enqueue_default(tensor, name, op):
    """allreduce_async_ of a named tensor with every option at its default
    but the op (the caller checked the options and that kolo._fastpath is
    built): enqueues it and returns the handle, or returns None (nothing
    done) where the tensor is not a contiguous CPU tensor of a dtype, op
    and shape the fast path takes."""
    shape = tensor.shape
    dtype = tensor.dtype
    okey = (op, shape, dtype)
    cached = _default_opts.get(okey)
    if (cached is None and type(op) is int and op in _FAST_OPS and
            dtype in _DTYPES and len(shape) <= _lib.MAX_DIMS):
        opts, keep = _core.make_opts(op, 1.0, 1.0, _GLOBAL, None, 1,
                                     False, shape or None, _HOST)
        cached = (_DTYPES[dtype], ctypes.addressof(opts), opts, keep)
        if len(_default_opts) >= _FAST_OPTS_MAX:
            _default_opts.clear()
        _default_opts[okey] = cached
    if (cached is None or not tensor.is_cpu or
            tensor.layout is not _STRIDED or not tensor.is_contiguous()):
        return None
    named = _fast_names.get(name)
    if named is None:
        named = _fast_name(name)
    return _enqueue_inplace(tensor, shape, dtype, named[0], named[1],
                            cached[0], None, cached[1])
