"""op=Adasum on torch tensors: the allreduce that allreduce(...,
op=Adasum) and the Adasum optimizer (adasum.py) enqueue.

The reduction itself (what it computes, in which order, at a size that is
not a power of two, and what it costs) is kolo/_adasum.py: every rank
allgathers the tensors and computes the same pairwise tree in float64.

Tensors: float16, bfloat16, float32, float64, on the CPU or a CUDA device.
At enqueue each tensor is copied into host memory (a CUDA tensor after the
work queued on its current stream: the copy waits for it), in its own dtype
(or, with Compression.fp16 / bf16 on a float32 tensor, in that wire
dtype); the result is written into the output, on its device, when the
handle is synchronized. The copy keeps the operation's input whatever the
program does with the tensor after enqueuing. Names are those of the same
allreduce with another op ("allreduce.<name>", "grouped_allreduce.<name>.i"),
so a rank asking for Adasum where another asks for Sum fails on both,
naming the tensor.
"""

import torch

from .. import _adasum, _core, _lib
from .._core import global_process_set

_KDTYPES = {torch.float16: _lib.FLOAT16, torch.bfloat16: _lib.BFLOAT16,
            torch.float32: _lib.FLOAT32, torch.float64: _lib.FLOAT64}
_WIRE = {_lib.FLOAT16: torch.float16, _lib.BFLOAT16: torch.bfloat16}


def _check(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s takes torch tensors, not %s"
                        % (what, type(t).__name__))
    if t.layout != torch.strided:
        raise ValueError("%s: op=Adasum takes dense tensors, not %s"
                         % (what, t.layout))
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError("%s: the tensor is on %s; kolo.torch takes CPU and "
                         "CUDA tensors" % (what, t.device))
    kd = _KDTYPES.get(t.dtype)
    _adasum.check_dtype(kd, what, str(t.dtype).replace("torch.", ""))
    return kd


def allreduce_async(tensors, outputs, keys, what, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set,
                    wire=None, single=False):
    """Enqueues the Adasum allreduce of tensors[i] into outputs[i] (which
    may be tensors[i]: in place) under the runtime names keys[i]; returns a
    handle whose synchronize() returns the list of outputs (single: the one
    output). wire: a kolo dtype (FLOAT16, BFLOAT16) float32 tensors travel
    and are combined in."""
    tensors, outputs = list(tensors), list(outputs)
    kds = []
    for t, o in zip(tensors, outputs):
        kds.append(_check(t, what))
        if o is not t and (o.shape != t.shape or o.dtype != t.dtype or
                           o.device != t.device):
            raise ValueError("%s: the output must have the input's shape, "
                             "dtype and device" % what)
    pre, post = float(prescale_factor), float(postscale_factor)
    hosts, sent = [], []
    with torch.no_grad():
        for t, kd in zip(tensors, kds):
            w = wire if (wire is not None and kd == _lib.FLOAT32) else None
            dtype = _WIRE[w] if w is not None else t.dtype
            hosts.append(t.detach().to("cpu", dtype=dtype, copy=True)
                         .contiguous())
            sent.append(w if w is not None else kd)
    specs = [(tuple(o.shape), o.dtype, o.device) for o in outputs]
    handles, order = _adasum.enqueue_by_dtype(
        keys, [h.data_ptr() for h in hosts], [h.shape for h in hosts], sent,
        process_set, hosts, what)

    def finish(rs):
        results = [None] * len(tensors)
        for i, res in zip(order, rs):
            out = _adasum.reduce(res, sent[i], hosts[i].numel(), pre, post)
            r = torch.from_numpy(out)
            if sent[i] != kds[i]:  # combined in the wire dtype
                r = r.to(_WIRE[sent[i]])
            results[i] = r
        with torch.no_grad():
            for o, r, (shape, dtype, device) in zip(outputs, results, specs):
                if (tuple(o.shape), o.dtype, o.device) != (shape, dtype,
                                                           device):
                    raise RuntimeError(
                        "%s: the output tensor was changed while the "
                        "operation was in flight (it is now %s %s on %s, "
                        "not %s %s on %s): the result cannot be written "
                        "into it" % (what, list(o.shape), o.dtype, o.device,
                                     list(shape), dtype, device))
                o.copy_(r.view(shape))
        return outputs[0] if single else outputs
    return _core.register(handles, (tensors, outputs, hosts), finish,
                          results=True, what=what)
