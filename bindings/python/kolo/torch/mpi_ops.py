"""The collectives of kolo.torch on torch tensors (CPU and CUDA), with
Horovod's names, arguments and results, and their autograd functions.

Tensors reach the runtime by address (tensor.data_ptr()): the runtime reads
the input and writes the output in place, and the binding keeps the memory
of every tensor it handed over alive until its handle is synchronized, even
if the program gives the tensor other memory meanwhile (see "Memory in
flight" below). A tensor that is not contiguous is copied once into a
contiguous buffer (and, for the in-place forms, copied back when the handle
is synchronized).

CUDA tensors (kolo built with NCCL) go the same way, with their place in
kolo_opts_t: device_type KOLO_DEVICE_CUDA, the device's ordinal, and the
current stream of that device when the operation is enqueued (the stream
on which the program, and this binding's contiguous() copies, queued the
work producing the input: the runtime's stream waits for it through an
event, so enqueuing never blocks). Outputs are allocated on the input's
device; a synchronized handle means the runtime's work is complete, so the
caller's stream may use them at once. Results whose size is known only
after negotiation (allgather, alltoall, reducescatter) lie on the device
and are copied into a tensor allocated there (kolo_result_copy). Output
and input always share a device: a CUDA tensor never gets a CPU output.

Gradients (as Horovod defines them):
  allreduce      the allreduce of the gradient, with the same op and scaling
  allgather      the average allreduce of the gradient, this rank's rows
  broadcast      the average allreduce of the gradient on the root, zero
                 elsewhere
  alltoall       the alltoall of the gradient with the received splits
  reducescatter  the allgather of the gradient times the set's size for
                 Sum (as is for Average), then times prescale and postscale
"""

import ctypes
import functools
import threading

import torch

from .. import _core, _lib
from .._core import Adasum, Average, Sum, global_process_set
from . import adasum_ops
from .compression import Compression, wire_for

_DTYPES = {
    torch.uint8: _lib.UINT8,
    torch.int8: _lib.INT8,
    torch.int16: _lib.INT16,
    torch.int32: _lib.INT32,
    torch.int64: _lib.INT64,
    torch.float16: _lib.FLOAT16,
    torch.bfloat16: _lib.BFLOAT16,
    torch.float32: _lib.FLOAT32,
    torch.float64: _lib.FLOAT64,
    torch.bool: _lib.BOOL,
}


_nccl = []  # [kolo_built("nccl")] once asked: the library's answer is fixed


def _cuda_usable(t, what):
    if not _nccl:
        _nccl.append(bool(_core.nccl_built()))
    if not _nccl[0]:
        raise ValueError(
            "%s: the tensor is on %s, and this libkolo (%s) was built without "
            "NCCL, which CUDA tensors need: build kolo with CUDA and NCCL "
            "(./configure --with-cuda --with-nccl), or move the tensor with "
            ".cpu()" % (what, t.device, _lib.path))


def _kdtype(t, what="kolo"):
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s takes torch tensors, not %s"
                        % (what, type(t).__name__))
    if t.layout != torch.strided:
        raise ValueError("%s: a %s tensor; kolo's collectives take dense "
                         "tensors (sparse gradients: DistributedOptimizer "
                         "allgathers them, or use sparse_allreduce_async)"
                         % (what, t.layout))
    if t.device.type == "cuda":
        _cuda_usable(t, what)
    elif t.device.type != "cpu":
        raise ValueError(
            "%s: the tensor is on %s; kolo.torch takes CPU and CUDA tensors: "
            "move it with .cpu() or .cuda()" % (what, t.device))
    kd = _DTYPES.get(t.dtype)
    if kd is None:
        raise TypeError("%s: kolo cannot reduce tensors of dtype %s (it takes "
                        "uint8, int8, int16, int32, int64, float16, bfloat16, "
                        "float32, float64 and bool)" % (what, t.dtype))
    return kd


_HOST = (_lib.DEVICE_HOST, 0, None)


def _cuda_index(device):
    """The ordinal of a CUDA torch.device (None: the current device)."""
    return (device.index if device.index is not None
            else torch.cuda.current_device())


def _place(t):
    """Where tensor t lives, as make_opts takes it: (device_type, device,
    stream). For a CUDA tensor the stream is the current stream of its
    device now, at enqueue: the stream on which the work producing t (and
    any contiguous() copy made here) was queued. Its cuda_stream is 0 for
    the default stream, which is the legacy default stream: NULL in
    kolo_opts_t.stream."""
    if t.device.type != "cuda":
        return _HOST
    index = _cuda_index(t.device)
    stream = torch.cuda.current_stream(index).cuda_stream
    return (_lib.DEVICE_CUDA, index, stream or None)


def _order_on(t):
    """For a CUDA tensor, what synchronize orders the result on: the
    current stream of its device at that moment (a callable giving the
    cudaStream_t, None for the legacy default stream); None for a CPU
    tensor. The host does not wait for the GPU (kolo_wait_on_stream)."""
    if t.device.type != "cuda":
        return None
    index = _cuda_index(t.device)
    return lambda: torch.cuda.current_stream(index).cuda_stream or None


def _one_device(tensors, what):
    """Horovod's grouped collectives take tensors of one device: a list
    that mixes devices is refused as horovod.torch refuses it (a
    RuntimeError: HorovodInternalError), at enqueue."""
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        return  # refused later, saying why
    first = tensors[0].device
    for t in tensors[1:]:
        if t.device != first:
            raise _core.KoloError(
                "%s: Tensors in list must be on same device (%s and %s)"
                % (what, first, t.device), _lib.ERR_INVALID_ARGUMENT)


def _same_device(a, b, what):
    if a.device != b.device:
        raise ValueError("%s: the output is on %s and the input on %s; they "
                         "must be on one device" % (what, b.device, a.device))


def _new_like(t, what):
    """An empty contiguous tensor like t, once t is known to be usable."""
    _kdtype(t, what)
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _contig(t):
    return t if t.is_contiguous() else t.contiguous()


def _shape_or_none(t):
    return tuple(t.shape) if 0 < t.dim() <= _lib.MAX_DIMS else None


def _copy_back(pairs):
    with torch.no_grad():
        for dst, src in pairs:
            if dst is not src:
                dst.copy_(src)
                if src.is_cuda:
                    # src (a contiguous copy made at enqueue, maybe on
                    # another stream) is freed after this: the caching
                    # allocator must not reuse it before the copy has read it
                    src.record_stream(torch.cuda.current_stream(src.device))


# ---- memory in flight -------------------------------------------------------
#
# From enqueue to completion the runtime reads and writes the tensors'
# memory by address. Meanwhile a program may give a tensor other memory:
# t.set_(...), t.data = ..., t.resize_(...) to more elements. What keeps
# that from freeing the memory under the runtime (a crash, or another
# tensor's data overwritten):
#
#  * Each operation holds a detached alias of every tensor it hands over
#    (_Held): the alias holds the tensor's storage, so set_() and .data =
#    cannot free it. The result goes to that memory; at synchronize an
#    in-place operation copies it into the tensor when the tensor has new
#    memory but the shape, dtype and device it was enqueued with, and
#    raises a RuntimeError naming the tensor when it has not (Horovod, which
#    also holds the tensor, writes into whatever memory it has when the
#    operation runs, and says nothing).
#  * Growing a storage reallocates it in place: its memory is freed,
#    whoever holds the storage. So Tensor.resize_ and Tensor.resize_as_
#    refuse, with a RuntimeError naming the operation, to grow a storage
#    that an operation in flight uses; resizing within the storage, and any
#    resize once the handle is synchronized, work as always. Growth that
#    bypasses these two methods (Tensor.storage().resize_(), an out=
#    argument of another size) is not seen; synchronize then says that the
#    memory moved under the operation, and raises.

_in_flight = {}  # storage address -> [operations using it, the first's name]
_in_flight_lock = threading.Lock()


def _storage_address(t):
    return t.data_ptr() - t.storage_offset() * t.element_size()


class _Held:
    """The memory of the tensors an operation hands to the runtime, held
    until its handle is synchronized (release)."""

    __slots__ = ("what", "aliases", "addresses", "storages")

    def __init__(self, what, tensors):
        self.what = what
        self.aliases = [t.detach() for t in tensors]
        self.addresses = [a.data_ptr() for a in self.aliases]
        # (no memory, nothing to guard: empty tensors all sit at 0)
        self.storages = [_storage_address(a) for a in self.aliases
                         if a.data_ptr()]
        with _in_flight_lock:
            for s in self.storages:
                entry = _in_flight.setdefault(s, [0, what])
                entry[0] += 1

    def release(self):
        with _in_flight_lock:
            for s in self.storages:
                entry = _in_flight.get(s)
                if entry is not None:
                    entry[0] -= 1
                    if entry[0] <= 0:
                        del _in_flight[s]
        self.storages = []
        self.aliases = []

    def check(self):
        """Raises if the memory of a held tensor was reallocated while the
        operation was in flight (by a path the resize guard does not see):
        the runtime then used memory that had been freed."""
        for a, address in zip(self.aliases, self.addresses):
            if a.data_ptr() != address:
                raise RuntimeError(
                    "%s: the memory of a tensor handed to it was reallocated "
                    "while it was in flight (Tensor.storage().resize_(), or "
                    "an out= argument of another size): the operation used "
                    "memory that had been freed, and its result is lost. "
                    "Synchronize the handle before resizing the tensor"
                    % self.what)


def _held(what, tensors, enqueue, results=False):
    """Holds the tensors' memory (_Held), then enqueues: enqueue(handles)
    appends the kolo handles to the list it is given. If enqueuing fails
    half-way, what was enqueued keeps the memory until it completes.
    Returns (held, handles)."""
    held = _Held(what, tensors)
    done = []
    try:
        enqueue(done)
    except Exception:
        if done:
            _core.register(done, held, None, results=results, what=what,
                           release=held.release)
        else:
            held.release()
        raise
    return held, done


def _describe(t):
    return "%s %s on %s" % (list(t.shape), str(t.dtype).replace("torch.", ""),
                            t.device)


def _write_back(what, items):
    """After an in-place operation: items are (tensor, result, (shape,
    dtype, device) of the tensor at enqueue), result being the held alias of
    what the runtime wrote (the tensor's own memory, or a contiguous copy of
    it). Copies the result into the tensor where it is not already there."""
    pairs = []
    for t, res, (shape, dtype, device) in items:
        if t.data_ptr() == res.data_ptr():
            continue  # in place, in the memory the tensor still has
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
            raise RuntimeError(
                "%s: the tensor was given other memory while the operation "
                "was in flight (set_() or .data =), and is now %s, "
                "not %s: the result, written to the memory it had, cannot be "
                "copied into it. Synchronize the handle before changing the "
                "tensor" % (what, _describe(t), "%s %s on %s" % (
                    list(shape), str(dtype).replace("torch.", ""), device)))
        pairs.append((t, res))
    _copy_back(pairs)


def _spec(t):
    return tuple(t.shape), t.dtype, t.device


def _resize_numel(args, kwargs):
    """The number of elements Tensor.resize_(*args, **kwargs) asks for, or
    None where the arguments are not sizes (torch will say so)."""
    sizes = args
    if len(args) == 1 and not isinstance(args[0], int):
        sizes = args[0]
    elif not args:
        sizes = kwargs.get("size", kwargs.get("sizes"))
    try:
        n = 1
        for d in sizes:
            n *= int(d)
        return n
    except (TypeError, ValueError):
        return None


def _resize_as_numel(args, kwargs):
    other = args[0] if args else kwargs.get("the_template",
                                            kwargs.get("other"))
    return other.numel() if isinstance(other, torch.Tensor) else None


def _storage_nbytes(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    return t.storage().nbytes()


def _in_flight_user(storage):
    """The name of an operation in flight that uses the storage at address
    `storage`, or None. The general path counts its storages in _in_flight;
    the fast path's operations (_InPlace) are found among the pending
    handles, so that enqueuing one costs no table update (this runs only
    when a storage is about to grow)."""
    with _in_flight_lock:
        entry = _in_flight.get(storage)
    if entry is not None:
        return entry[1]
    for p in list(_core._pending.values()):
        if type(p) is _InPlace:
            a = p.alias
            if a is not None and a.data_ptr() and \
                    _storage_address(a) == storage:
                return p.key
    return None


def _guard_resize(method, numel_of):
    """Wraps torch.Tensor.<method> to refuse growing a storage in flight."""
    orig = getattr(torch.Tensor, method)
    if getattr(orig, "_kolo_guarded", False):
        return

    @functools.wraps(orig)
    def guarded(self, *args, **kwargs):
        if _in_flight or _core._pending:
            n = numel_of(args, kwargs)
            if n is not None and (self.storage_offset() + n) * \
                    self.element_size() > _storage_nbytes(self):
                user = _in_flight_user(_storage_address(self))
                if user is not None:
                    raise RuntimeError(
                        "%s(): the tensor's memory is in use by kolo's %s, "
                        "in flight, and growing it to %d elements would "
                        "free that memory under the operation: synchronize "
                        "the handle first" % (method, user, n))
        return orig(self, *args, **kwargs)
    guarded._kolo_guarded = True
    setattr(torch.Tensor, method, guarded)


_guard_resize("resize_", _resize_numel)
_guard_resize("resize_as_", _resize_as_numel)


def _tensor_from_result(res, dtype, device=None):
    """A new tensor, on `device` (the input's; None: the CPU), holding a
    kolo_result_t's data (which the caller frees). The result must lie
    where the input does: a CUDA tensor never gets a CPU output."""
    cuda = device is not None and device.type == "cuda"
    if cuda:
        device = torch.device("cuda", _cuda_index(device))
    out = torch.empty(_core.result_shape(res), dtype=dtype, device=device)
    data, nbytes = _core.result_bytes(res)
    if not nbytes:
        return out
    expect = out.numel() * out.element_size()
    if nbytes != expect:
        raise _core.KoloError("the runtime returned %d bytes for an output "
                              "of %d" % (nbytes, expect), _lib.ERR_INTERNAL)
    if not cuda:
        if res.device_type != _lib.DEVICE_HOST:
            raise _core.KoloError(
                "the runtime returned the output of a CPU tensor on device "
                "type %d" % res.device_type, _lib.ERR_INTERNAL)
        ctypes.memmove(out.data_ptr(), data, nbytes)
        return out
    if res.device_type != _lib.DEVICE_CUDA or res.device != device.index:
        where = ("host memory" if res.device_type == _lib.DEVICE_HOST else
                 "device type %d, device %d" % (res.device_type, res.device))
        raise _core.KoloError("the runtime returned the output of a tensor "
                              "on %s in %s" % (device, where),
                              _lib.ERR_INTERNAL)
    # The caching allocator may have given `out` memory that kernels still
    # queued on the current stream read or write (a tensor freed just
    # before, on that stream), and kolo_result_copy is not ordered after
    # that stream's work: let that work finish first. The copy is finished
    # when kolo_result_copy returns, so the current stream may use `out`
    # at once.
    torch.cuda.current_stream(device).synchronize()
    _core.result_copy(res, out.data_ptr())
    return out


# ---- allreduce -------------------------------------------------------------


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


# ---- the fast path of an in-place allreduce of a host tensor ---------------
#
# What a training loop does most (DistributedOptimizer's hooks,
# allreduce_async_ of a gradient): an in-place allreduce of a contiguous CPU
# tensor. The general path above builds a kolo_opts_t, a shape array, two
# aliases and three closures per call; this one does the same checks with
# the least Python work: the kolo_opts_t (the runtime copies it, shape
# included, at enqueue) is made once per combination of options and shape
# and reused, so is the encoded name, one alias holds the memory, and one
# small object (_InPlace) finishes and releases the operation and is its
# own entry in the pending table. It updates no table of storages in
# flight: the resize guard finds it among the pending handles
# (_in_flight_user). The enqueue and the wait go through the extension
# module kolo._fastpath where it was built (bindings/python/kolo/
# _fastpath.c: a ctypes call costs as much as the runtime's own work for a
# small tensor), else through ctypes. Same names, same checks, same
# results, same errors: anything it does not handle (CUDA, non-contiguous
# tensors, Adasum, an unknown op or dtype, more than MAX_DIMS dimensions,
# a tensor that is not a plain strided tensor) goes the general way, which
# raises the errors.

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


class _InPlace:
    """An in-place allreduce of a host tensor in flight: holds an alias of
    the tensor (its memory), and is both the finish and the release of its
    _core handle."""

    # (handles, keep, results, what, finish and release: what _core's
    # pending table reads of an entry; this object is its own entry)
    __slots__ = ("key", "tensor", "alias", "address", "spec", "handles",
                 "keep", "stream")
    results = False

    def finish(self, _results):
        t, a = self.tensor, self.alias
        if a.data_ptr() != self.address:
            _Held.check(self)  # raises, naming the operation
        if t.data_ptr() != self.address:
            _write_back(self.key, [(t, a, self.spec)])
        return t

    # _Held.check reads these
    @property
    def what(self):
        return self.key

    @property
    def aliases(self):
        return [self.alias]

    @property
    def addresses(self):
        return [self.address]

    def release(self):
        # (no _in_flight count to undo: _in_flight_user finds this object
        # among the pending handles while it holds the alias)
        self.alias = None


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


# allreduce_async_ with every option at its default but the op, a named
# CPU tensor and kolo._fastpath built: the fast path above with less still
# (no options tuple, no checks of options left at their defaults): about
# 0.3 us less per call, a tenth of what a small allreduce costs. (op, shape, dtype) ->
# (kolo dtype, address of the kolo_opts_t, what keeps it alive)
_default_opts = {}
_pending = _core._pending
_next_handle = _core._next_handle


def allreduce_async_(tensor, average=None, name=None, op=None,
                     prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """Starts an in-place allreduce; synchronize(handle) returns `tensor`."""
    if (average is None and process_set is _GLOBAL and _fast is not None and
            type(name) is str and type(tensor) is torch.Tensor and
            type(prescale_factor) in _SCALARS and prescale_factor == 1 and
            type(postscale_factor) in _SCALARS and postscale_factor == 1):
        if op is None:
            op = Average
        shape = tensor.shape
        dtype = tensor.dtype
        okey = (op, shape, dtype)
        cached = _default_opts.get(okey)
        if (cached is None and type(op) is int and op in _FAST_OPS and
                dtype in _DTYPES and len(shape) <= _lib.MAX_DIMS):
            opts, keep = _core.make_opts(op, 1.0, 1.0, process_set, None, 1,
                                         False, shape or None, _HOST)
            cached = (_DTYPES[dtype], ctypes.addressof(opts), opts, keep)
            if len(_default_opts) >= _FAST_OPTS_MAX:
                _default_opts.clear()
            _default_opts[okey] = cached
        if (cached is not None and tensor.is_cpu and
                tensor.layout is _STRIDED and tensor.is_contiguous()):
            named = _fast_names.get(name)
            if named is None:
                named = _fast_name(name)
            return _enqueue_inplace(tensor, shape, dtype, named[0], named[1],
                                    cached[0], None, cached[1])
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


def _by_dtype_and_place(tensors, what):
    """Indices of tensors grouped by kolo dtype and place (CPU, or a CUDA
    device and its current stream), in order of appearance: a dict
    (kolo dtype, place) -> indices. Each group is one grouped call."""
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault((_kdtype(t, what), _place(t)), []).append(i)
    return groups


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


# ---- broadcast -------------------------------------------------------------


def _broadcast_async(tensor, output, root_rank, name, process_set):
    kd = _kdtype(tensor, "broadcast")
    if output is not tensor:
        _same_device(tensor, output, "broadcast")
    buf = _contig(output)
    if output is not tensor:
        with torch.no_grad():
            buf.copy_(tensor)
    opts, keep = _core.make_opts(process_set=process_set,
                                 shape=_shape_or_none(tensor),
                                 place=_place(buf))
    key = _core.op_key("broadcast", name, process_set)
    held, hs = _held(key, [buf], lambda done: done.append(
        _core.broadcast_async(key, buf.data_ptr(), buf.numel(), kd, root_rank,
                              opts)))
    back = [(output, held.aliases[0], _spec(output))]

    def finish(_r):
        held.check()
        _write_back(key, back)
        return output
    return _core.register(hs, (tensor, buf, output, keep, held), finish,
                          what=key, release=held.release,
                          stream=_order_on(buf))


def broadcast_async(tensor, root_rank, name=None,
                    process_set=global_process_set):
    """Starts a broadcast of root_rank's tensor into a new tensor (the input
    is not modified); synchronize(handle) returns it. root_rank is a global
    rank (hvd.rank() of the root), whatever the process set, as in Horovod;
    it must be a member of the set."""
    out = _new_like(tensor, "broadcast")
    return _broadcast_async(tensor, out, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None,
                     process_set=global_process_set):
    """Starts an in-place broadcast; synchronize(handle) returns `tensor`."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's and returns it."""
    return _core.synchronize(broadcast_async_(tensor, root_rank, name,
                                              process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return _core.synchronize(broadcast_async(tensor, root_rank, name,
                                                 process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        if _core.rank() != ctx.root_rank:  # root_rank is a global rank
            # Horovod multiplies by 0: -0.0 where the gradient is negative,
            # NaN where it is not finite, bit for bit.
            reduced.mul_(0)
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor on every rank of the process set, as a new tensor;
    differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


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


# ---- sparse ----------------------------------------------------------------


def sparse_allreduce_async(tensor, name, op=Average,
                           process_set=global_process_set):
    """Starts the allreduce of a sparse COO tensor, done as Horovod does it:
    an allgather of its indices and one of its values, in rank order, as
    they are (not coalesced: duplicate indices stay, the optimizer's
    coalesce() sums them), the values divided by the set's size for
    Average.

    Returns Horovod's handle: a function; handle() waits and returns the
    reduced sparse tensor (uncoalesced, the input's size, dtype and device).
    Calling it again returns the same tensor. synchronize(handle) and
    poll(handle) take it too (Horovod's synchronize returns None for it
    without waiting; kolo's waits and returns what handle() returns)."""
    op = _core.check_op(op)
    if op not in (Sum, Average):
        raise ValueError("the allreduce of a sparse tensor takes op=Sum or "
                         "op=Average, not %s" % _core.op_name(op))
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor "
                         "(layout torch.sparse_coo), not %s"
                         % (tensor.layout if isinstance(tensor, torch.Tensor)
                            else type(tensor).__name__))
    indices = tensor._indices().t().contiguous()  # nnz x sparse_dim
    values = tensor._values().contiguous()        # nnz x dense dims
    kd = _kdtype(values, "sparse allreduce")
    base = _core.op_key("sparse_allreduce", name, process_set)
    opts, _ = _core.make_opts(process_set=process_set, place=_place(values))

    def enqueue(hs):
        hs += _core.grouped_allgather_async([base + ".indices"],
                                            [indices.data_ptr()],
                                            [tuple(indices.shape)],
                                            _lib.INT64, opts)
        hs += _core.grouped_allgather_async([base + ".values"],
                                            [values.data_ptr()],
                                            [tuple(values.shape)], kd, opts)
    held, hs = _held(base, [indices, values], enqueue, results=True)
    size, vdtype, device = tensor.size(), values.dtype, values.device

    def finish(rs):
        held.check()
        idx = _tensor_from_result(rs[0], torch.int64, device)
        vals = _tensor_from_result(rs[1], vdtype, device)
        if op == Average:
            vals = vals / _core.set_size(process_set)
        return torch.sparse_coo_tensor(idx.t(), vals, size)
    return _sparse_handle(_core.register(
        hs, (tensor, indices, values, held), finish, results=True,
        what=base, release=held.release))


def _sparse_handle(h):
    """The handle of sparse_allreduce_async: a function, as Horovod's, that
    waits for the kolo handle h at its first call and returns the result
    (or raises the operation's error) at every call. Its attribute
    _kolo_sparse lets poll() and synchronize() recognize it."""
    state = []  # [result, error] once waited

    def handle():
        if not state:
            try:
                state[:] = [_core.synchronize(h), None]
            except Exception as e:
                state[:] = [None, e]
        if state[1] is not None:
            raise state[1]
        return state[0]
    handle._kolo_sparse = lambda: bool(state) or _core.poll(h)
    return handle


# ---- completion, barrier, join ---------------------------------------------


def poll(handle):
    """True when the operation of `handle` is done."""
    sparse = getattr(handle, "_kolo_sparse", None)
    if sparse is not None:
        return sparse()
    return _core.poll(handle)


def synchronize(handle):
    """Waits for the operation of `handle` (the GIL is released meanwhile)
    and returns its output. A failed operation raises HorovodInternalError
    (kolo.KoloError, a RuntimeError) with the runtime's message. The handle
    of sparse_allreduce_async is called: its result is returned."""
    if type(handle) is int:
        p = _pending.get(handle)
        if type(p) is _InPlace and _fast is not None:
            # an in-place allreduce of a host tensor: _core.synchronize
            # with less work (one kolo handle, no result, nothing to free);
            # a CUDA tensor's result is ordered on the current stream
            del _pending[handle]
            try:
                rc = (_fast.wait(p.handles[0]) if p.stream is None else
                      _lib.lib.kolo_wait_on_stream(p.handles[0], p.stream()))
                if rc != _OK:
                    raise _core.wait_failed(rc)
                t = p.tensor
                if p.alias.data_ptr() != p.address or (
                        t.data_ptr() != p.address):
                    return p.finish(None)
                return t
            finally:
                p.alias = None
    elif getattr(handle, "_kolo_sparse", None) is not None:
        return handle()
    return _core.synchronize(handle)


def _wait_all(handles, then=None, error=None):
    """Waits for every handle (then runs then()), even after one failed or
    after `error` (an enqueue that failed), so that nothing stays in
    flight; then raises the first error."""
    for h in handles:
        try:
            _core.synchronize(h)
        except Exception as e:
            if error is None:
                error = e
    if then is not None:
        try:
            then()
        except Exception as e:
            if error is None:
                error = e
    if error is not None:
        raise error


def join(device=-1):
    """For a rank that has run out of data: blocks until every rank has
    joined; meanwhile the allreduces of the others go on, this rank
    contributing zeros. Returns the rank that joined last. `device` is
    accepted for Horovod's signature: the runtime makes the zeros a joined
    rank contributes where each tensor lives, CPU or CUDA.

    With a ZeroRedundancyOptimizer, this rank owns blocks of the
    parameters that the others still update: it first stands in for their
    steps (zero gradients, the update of its blocks, the allgather; see
    kolo.torch.zero) until every rank has joined."""
    from .zero import join_sharded
    return join_sharded(_core.join)


def barrier(process_set=global_process_set):
    """Blocks until every rank of the process set has called barrier()."""
    _core.barrier(process_set)


__all__ = _core.COLLECTIVES + ["sparse_allreduce_async", "poll",
                               "synchronize", "join", "barrier"]
