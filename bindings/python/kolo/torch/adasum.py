"""DistributedOptimizer(op=Adasum), Horovod's _DistributedAdasumOptimizer:
one kind of distributed optimizer (optimizer.py's factory picks it), whose
changes of the parameters travel through the Adasum allreduce of
adasum_ops.py.

DistributedOptimizer(op=Adasum) does what Horovod's does (horovod/torch/
optimizer.py, _DistributedAdasumOptimizer):

 * When the last of backward_passes_per_step backward passes has produced a
   parameter's gradient (a hook on its gradient accumulator), the wrapped
   optimizer's update is applied to that parameter alone, locally, with
   this rank's gradient; the change of the parameter (delta) is Adasum-
   allreduced, asynchronously. Gradients are never allreduced, and the
   optimizer's state (momentum, Adam's moments) evolves on each rank from
   its own gradients, as in Horovod.
 * step() does the same for the parameters whose hook has not fired
   (Horovod's "missing" parameters: their .grad as it is; a .grad of None
   is skipped by the optimizer, so their delta is zero), waits for every
   delta, and sets each parameter to its value before the local update
   plus the combined delta. step(closure) calls closure() first.
 * At construction every parameter that requires a gradient gets a zero
   .grad (Horovod does the same); synchronize() does nothing;
   skip_synchronize() raises AssertionError when entered; zero_grad()
   between a backward pass and step() raises AssertionError; more backward
   passes than backward_passes_per_step before step() raise AssertionError.
 * One difference: Horovod leaves the delta in the parameter from the hook
   until step() (it allreduces the parameter's own memory); kolo restores
   the parameter's value after the local update, so between backward() and
   step() the model still holds its weights.
 * On one rank (a process set of one), as in Horovod, the optimizer is the
   plain DistributedOptimizer: the gradient is used as it is.
 * groups and sparse_as_dense are ignored, as Horovod ignores them with
   Adasum (what travels is the change of each parameter, dense);
   gradient_predivide_factor, allreduce hooks and GradScaler are refused.

Like Horovod's example (examples/pytorch/pytorch_mnist.py --use-adasum),
do not scale the learning rate by the number of ranks with Adasum. Horovod
on GPUs with NCCL sums the gradients of a node and applies Adasum between
nodes only (adasum_gpu_operations.cc), which is why that example scales the
learning rate by local_size() for CUDA; kolo computes the same Adasum over
all ranks for CUDA tensors as for CPU ones, so keep the factor 1 there too.
"""

import contextlib

import torch

from .. import _core
from . import adasum_ops
from .optimizer_base import (TOO_MANY_PASSES, ZERO_GRAD_PENDING, Wrapper,
                             forget_pending, wrap)


class _DistributedAdasum(Wrapper):
    """Mixed into a subclass of the wrapped optimizer's class (see the
    module's docstring)."""

    def _kolo_adasum_setup(self, named_parameters, compression,
                           backward_passes_per_step, process_set,
                           average_aggregated_gradients):
        self._kolo_compression = compression
        self.process_set = process_set
        self._kolo_average_passes = bool(average_aggregated_gradients)
        self.backward_passes_per_step = self._kolo_check_passes(
            backward_passes_per_step)
        all_params = [p for g in self.param_groups for p in g["params"]]
        self._kolo_names = self._kolo_name_parameters(named_parameters,
                                                      all_params)
        self._kolo_params = self._kolo_trained(all_params)
        self._kolo_delay = {id(p): self.backward_passes_per_step
                            for p in self._kolo_params}
        self._kolo_handles = {}  # id(p) -> (handle or None, p, ctx)
        self._kolo_grad_accs = []
        self._kolo_included = process_set.included()
        if self._kolo_included:
            for p in self._kolo_params:
                p.grad = torch.zeros_like(p)
            self._kolo_register_hooks()

    def _kolo_on_grad(self, p):
        pid = id(p)
        entry = self._kolo_handles.get(pid)
        if entry is not None and entry[0] is not None and \
                self._kolo_delay[pid] <= 0:
            raise AssertionError(TOO_MANY_PASSES)
        self._kolo_delay[pid] -= 1
        if self._kolo_delay[pid] == 0:
            self._kolo_handles[pid] = self._kolo_local_step(p)
        else:
            self._kolo_handles[pid] = (None, p, None)

    def _kolo_local_step(self, p):
        """Applies the wrapped optimizer's update to p alone, restores p,
        and enqueues the Adasum allreduce of the change."""
        n = self.backward_passes_per_step
        if self._kolo_average_passes and n > 1 and p.grad is not None:
            p.grad.div_(n)
        stashed = []
        for group in self.param_groups:
            stashed.append(group["params"])
            group["params"] = [p] if any(p is q for q in group["params"]) \
                else []
        try:
            with torch.no_grad():
                before = p.detach().clone()
                super(_DistributedAdasum, self).step()
                delta = p.detach() - before
                p.copy_(before)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        compressed, ctx = self._kolo_compression.compress(delta)
        key = "allreduce." + self._kolo_names[id(p)]
        h = adasum_ops.allreduce_async([compressed], [compressed], [key], key,
                                       process_set=self.process_set,
                                       single=True)
        return (h, p, ctx)

    def synchronize(self):
        """Does nothing, as in Horovod: with Adasum the update is applied
        in step()."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when "
                             "using Adasum optimizer.")
        yield  # pragma: no cover (a generator, as Horovod's)

    def step(self, closure=None):
        if not self._kolo_included:
            return super(_DistributedAdasum, self).step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p in self._kolo_params:
            entry = self._kolo_handles.get(id(p))
            if entry is None or entry[0] is None:
                # no gradient on this rank since the last step, or fewer
                # passes than backward_passes_per_step: update it now
                self._kolo_handles[id(p)] = self._kolo_local_step(p)
        try:
            for pid, (h, p, ctx) in list(self._kolo_handles.items()):
                out = _core.synchronize(h)
                delta = self._kolo_compression.decompress(out, ctx)
                with torch.no_grad():
                    p.add_(delta.to(p.dtype))
                self._kolo_delay[pid] = self.backward_passes_per_step
        finally:
            self._kolo_handles.clear()
            for pid in self._kolo_delay:
                self._kolo_delay[pid] = self.backward_passes_per_step
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._kolo_handles:
            raise AssertionError(ZERO_GRAD_PENDING)
        return super(_DistributedAdasum, self).zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """The wrapped optimizer's, after forgetting the changes in flight
        and the backward passes counted (as DistributedOptimizer's)."""
        forget_pending([e[0] for e in self._kolo_handles.values()])
        self._kolo_handles.clear()
        for pid in self._kolo_delay:
            self._kolo_delay[pid] = self.backward_passes_per_step
        return super(_DistributedAdasum, self).load_state_dict(*args,
                                                               **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = self._kolo_check_passes(passes)
        for pid in self._kolo_delay:
            self._kolo_delay[pid] = self.backward_passes_per_step


def distributed_optimizer(optimizer, named_parameters, compression,
                          backward_passes_per_step, process_set,
                          average_aggregated_gradients):
    """DistributedOptimizer(op=Adasum) on a process set of more than one
    rank: an instance of a subclass of the optimizer's class sharing its
    state and parameter groups."""
    dist = wrap(optimizer, _DistributedAdasum)
    dist._kolo_adasum_setup(named_parameters, compression,
                            backward_passes_per_step, process_set,
                            average_aggregated_gradients)
    return dist
