"""Broadcasting model and optimizer state, and Python objects (from
_objects.py); the explicit allreduce of a custom training loop's
gradients."""

import warnings

import torch

from .. import _core
from .._core import global_process_set
from ._allreduce import grouped_allreduce
from ._broadcast import broadcast_async_
from ._completion import _wait_all
from ._objects import allgather_object, broadcast_object  # noqa: F401
from .compression import Compression
from .optimizer import _Distributed
from .zero import ZeroRedundancyOptimizer


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites, in place, every tensor of `params` with root_rank's:
    `params` is a dict (model.state_dict()), a list of (name, tensor)
    pairs (list(model.named_parameters())) or, as in Horovod, a list of
    tensors (list(model.parameters()), named in call order like unnamed
    operations). Every rank must pass the same names. Entries that are not
    tensors are left alone."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [x if isinstance(x, tuple) else (None, x) for x in params]
        if any(len(x) != 2 for x in items):
            raise ValueError("broadcast_parameters takes a dict, a list of "
                             "(name, tensor) pairs or a list of tensors")
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    error = None
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            continue
        try:
            handles.append(broadcast_async_(
                p.data if isinstance(p, torch.nn.Parameter) else p,
                root_rank, None if name is None else "parameters." + str(name),
                process_set))
        except Exception as e:
            error = e
            break
    # wait for what was enqueued, even after an error
    _wait_all(handles, error=error)


class _TensorSlot:
    """Stands for a tensor in a broadcast state dict. device is "cpu" or
    "cuda": the root's CUDA device number means nothing on another rank."""
    __slots__ = ("index", "shape", "dtype", "device")

    def __init__(self, index, shape, dtype, device):
        self.index, self.shape, self.dtype = index, shape, dtype
        self.device = device


def _walk(obj, leaf):
    """obj rebuilt through its dicts, lists and tuples, leaf(x) in place of
    everything else."""
    if isinstance(obj, dict):
        return {k: _walk(v, leaf) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_walk(v, leaf) for v in obj)
    return leaf(obj)


def _strip(obj, tensors):
    """obj with each tensor replaced by a _TensorSlot (the tensor appended
    to tensors)."""
    def slot(x):
        if not isinstance(x, torch.Tensor):
            return x
        tensors.append(x)
        return _TensorSlot(len(tensors) - 1, tuple(x.shape),
                           str(x.dtype).replace("torch.", ""), x.device.type)
    return _walk(obj, slot)


def _fill(obj, tensors):
    """_strip undone: each _TensorSlot replaced by its tensor."""
    return _walk(obj, lambda x: tensors[x.index]
                 if isinstance(x, _TensorSlot) else x)


def broadcast_optimizer_state(optimizer, root_rank,
                              process_set=global_process_set):
    """Makes every rank's optimizer state (hyper-parameters of the parameter
    groups, and per-parameter state such as momentum buffers and step
    counts) a copy of root_rank's (a global rank). The optimizers must have
    been built the same way on every rank.

    As Horovod does, a rank whose optimizer has no state yet first creates
    it (_create_state): every parameter that requires a gradient gets a
    zero gradient, and the optimizer takes one step. That step counts (an
    Adam step counter is 1 after it) and moves the parameters where the
    update of a zero gradient is not zero (weight decay); the gradients are
    left zero. An optimizer that has no state even then (stateless) is left
    as it is, hyper-parameters included.

    A ZeroRedundancyOptimizer (whose state is sharded) gets root_rank's
    hyper-parameters and the consolidated state of every parameter,
    re-sharded, without taking a step; it communicates in its own process
    set, which must hold root_rank."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        # Sharded: root_rank's view of the state is the consolidated one.
        optimizer._kolo_broadcast_state(root_rank)
        return
    if not optimizer.state_dict()["state"]:
        _create_state(optimizer)
    is_root = _core.rank() == root_rank  # a global rank, as in Horovod
    tensors = []
    skeleton = _strip(optimizer.state_dict(), tensors) if is_root else None
    skeleton = broadcast_object(skeleton, root_rank,
                                "optimizer_state.skeleton", process_set)
    if not skeleton["state"]:
        return  # stateless: Horovod broadcasts nothing either
    if not is_root:
        slots = []  # (slot, index of the parameter whose state it is)
        _collect_slots(skeleton, slots)
        slots.sort(key=lambda s: s[0].index)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        tensors = [torch.empty(s.shape, dtype=getattr(torch, s.dtype),
                               device=_slot_device(s, owner, params))
                   for s, owner in slots]
    else:
        tensors = [t.detach().contiguous() for t in tensors]
    handles = [broadcast_async_(t, root_rank, "optimizer_state.%d" % i,
                                process_set)
               for i, t in enumerate(tensors)]
    for h in handles:
        _core.synchronize(h)
    if not is_root:
        optimizer.load_state_dict(_fill(skeleton, tensors))


def _create_state(optimizer):
    """Creates the state of an optimizer that has none yet, as Horovod's
    broadcast_optimizer_state does: a zero gradient (sparse for SparseAdam)
    for every parameter that requires one, then one step of the optimizer
    itself; a DistributedOptimizer takes the step of the optimizer it wraps,
    which communicates nothing."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.data.new_zeros(p.size())
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    if isinstance(optimizer, _Distributed):
        super(_Distributed, optimizer).step()
    else:
        optimizer.step()


def _collect_slots(obj, out, owner=None, top=True):
    """Every _TensorSlot of a skeleton, with the index of the parameter it
    belongs to (the key in state_dict()["state"]) or None."""
    if isinstance(obj, _TensorSlot):
        out.append((obj, owner))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if top and k == "state" and isinstance(v, dict):
                for pid, st in v.items():
                    _collect_slots(st, out, pid, False)
            else:
                _collect_slots(v, out, owner, False)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, out, owner, False)


def _slot_device(slot, owner, params):
    """Where this rank receives a broadcast state tensor: on the CPU when
    the root's is there; when the root's is on CUDA, on this rank's own
    device for it: that of the parameter it belongs to (state_dict numbers
    the parameters in param_groups order), else of the first CUDA
    parameter, else the current CUDA device."""
    if slot.device != "cuda":
        return torch.device("cpu")
    if isinstance(owner, int) and 0 <= owner < len(params) and \
            params[owner].device.type == "cuda":
        return params[owner].device
    for p in params:
        if p.device.type == "cuda":
            return p.device
    return torch.device("cuda", torch.cuda.current_device())


# ---- explicit gradient allreduce (a custom training loop) ------------------


def clip_by_global_norm(grads, max_norm):
    """Scales the tensors of `grads` in place so that their global L2 norm
    is at most max_norm; returns the norm before clipping."""
    grads = [g for g in grads if g is not None]
    if not grads:
        return 0.0
    norm = float(torch.norm(torch.stack([g.detach().double().norm()
                                         for g in grads])))
    if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-12))
    return norm


def allreduce_gradients(grads, names=None, op=_core.Average,
                        compression=None, pre_hooks=(), post_hooks=(),
                        process_set=global_process_set):
    """Allreduces a list of gradients explicitly, for a training loop that
    computes them itself (torch.autograd.grad(..., allow_unused=True)) and
    applies them itself: the counterpart of the explicit allreduce of a
    custom training loop.

    None entries (parameters the loss does not reach) keep their place and
    are skipped with a warning; a list with no gradient at all is an error.
    Every rank must have its None entries in the same places. The other
    gradients are allreduced as one group.

    pre_hooks run, in order, on the list of this rank's (non-None) gradients
    before the allreduce, and post_hooks on the reduced ones after it; a hook
    that returns a list replaces the gradients with it (any other return
    value is ignored: the hook modified the tensors in place). For example
    pre_hooks=[lambda g: clip_by_global_norm(g, 1.0)] clips each rank's
    gradients by their global norm before they are reduced.

    Returns the list of reduced gradients, None where the input was None."""
    grads = list(grads)
    if names is None:
        names = ["gradient.%d" % i for i in range(len(grads))]
    names = list(names)
    if len(names) != len(grads):
        raise ValueError("allreduce_gradients: %d names for %d gradients"
                         % (len(names), len(grads)))
    missing = [n for n, g in zip(names, grads) if g is None]
    live = [i for i, g in enumerate(grads) if g is not None]
    if not live:
        raise ValueError("No gradients provided for any of the %d variables "
                         "(%s)" % (len(grads), ", ".join(names)))
    if missing:
        warnings.warn("allreduce_gradients: no gradient for %s: skipped"
                      % ", ".join(missing), stacklevel=2)
    work = [grads[i] for i in live]
    for hook in pre_hooks:
        out = hook(work)
        if isinstance(out, (list, tuple)):
            work = list(out)
    reduced = grouped_allreduce(
        work, name="allreduce_gradients." + names[live[0]], op=op,
        compression=compression or Compression.none, process_set=process_set)
    for hook in post_hooks:
        out = hook(reduced)
        if isinstance(out, (list, tuple)):
            reduced = list(out)
    result = [None] * len(grads)
    for i, g in zip(live, reduced):
        result[i] = g
    return result
