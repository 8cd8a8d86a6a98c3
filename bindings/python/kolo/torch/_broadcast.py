"""broadcast on torch tensors: root_rank's tensor on every rank of the
process set, in place or into a new tensor, and its autograd function."""

import torch

from .. import _core
from .._core import Average, global_process_set
from ._allreduce import allreduce
from ._inflight import _held, _write_back
from ._tensors import (_contig, _kdtype, _new_like, _order_on, _place,
                       _same_device, _shape_or_none, _spec)


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
