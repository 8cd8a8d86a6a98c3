"""A torch tensor as kolo's runtime sees it: its kolo dtype, its place
(the CPU, or a CUDA device and the stream its producer was queued on),
the checks every collective makes before it hands a tensor over, and the
tensor made of a result the runtime returns (kolo_result_t).

Every other file of kolo.torch that enqueues work stands on this one; it
imports nothing of kolo.torch.
"""

import ctypes

import torch

from .. import _core, _lib


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


def _describe(t):
    return "%s %s on %s" % (list(t.shape), str(t.dtype).replace("torch.", ""),
                            t.device)


def _spec(t):
    return tuple(t.shape), t.dtype, t.device


def _by_dtype_and_place(tensors, what):
    """Indices of tensors grouped by kolo dtype and place (CPU, or a CUDA
    device and its current stream), in order of appearance: a dict
    (kolo dtype, place) -> indices. Each group is one grouped call."""
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault((_kdtype(t, what), _place(t)), []).append(i)
    return groups


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
