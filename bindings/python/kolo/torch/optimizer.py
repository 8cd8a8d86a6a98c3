"""DistributedOptimizer: Horovod's wrapper around a torch optimizer.

How a gradient travels:

 * A hook on each parameter's gradient accumulator fires as soon as
   autograd has written p.grad, and enqueues the allreduce of that gradient
   at once, so communication overlaps the rest of the backward pass.
 * backward_passes_per_step = N: the runtime accumulates host gradients
   (kolo_opts_t .backward_passes; CUDA gradients are left to autograd's
   accumulation in p.grad and allreduced at their last pass). Passes
   1..N-1 hand the gradient to the runtime, which adds it to a private
   accumulator and completes at once; the hook then clears p.grad so that
   the next pass starts from nothing. Pass N writes
   the sum (or, with average_aggregated_gradients=True, the mean) into
   p.grad and allreduces it in place. As in Horovod, the passes are summed
   by default: divide the loss by N to average them.
 * step() (or synchronize()) waits for the allreduces, then applies the
   wrapped optimizer's update.

Gradients that do not fit that path are accumulated in p.grad by autograd
and communicated when their last pass (or step) comes: explicit `groups`
(reduced together as one grouped allreduce), sparse gradients (allgathered
as indices and values unless sparse_as_dense), and every gradient when a
pre-allreduce hook is registered (the hook sees all local gradients, so
communication waits for the end of the backward pass).

Parameters without a gradient. As in Horovod, every parameter of the
optimizer is communicated at every step: a rank that lacks a parameter's
gradient contributes zeros (whatever .grad holds, zeros where it is None),
so nobody waits forever, and a parameter that got no gradient on any rank
ends the step with a zero gradient, which weight decay and momentum still
act on, exactly as in a Horovod run. A synchronize() on a rank that produced
no gradient at all since the last step is an error.
"""

import contextlib
import warnings

import torch

from .. import _core, _lib
from .._core import Average, Sum, Adasum, global_process_set
from . import adasum
from ._allreduce import _allreduce_async
from ._completion import synchronize
from ._inflight import _held, _write_back
from ._sparse import sparse_allreduce_async
from ._tensors import _by_dtype_and_place, _contig, _order_on, _spec
from .compression import Compression, wire_for
from .optimizer_base import (TOO_MANY_PASSES, ZERO_GRAD_PENDING, Wrapper,
                             forget_pending, wrap)

_WIRE = object()  # marks a gradient compressed on the wire by the runtime


class _Distributed(Wrapper):
    """Mixed into a subclass of the wrapped optimizer's class."""

    # ---- set-up ------------------------------------------------------------

    def _kolo_setup(self, named_parameters, compression,
                    backward_passes_per_step, op, gradient_predivide_factor,
                    groups, sparse_as_dense, process_set,
                    average_aggregated_gradients, pre_allreduce_hooks,
                    post_allreduce_hooks):
        op = _core.check_op(op)
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with "
                             "op != Average")
        self._kolo_compression = compression
        self._kolo_op = op
        self._kolo_predivide = float(gradient_predivide_factor)
        self._kolo_sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self._kolo_average_passes = bool(average_aggregated_gradients)
        self._kolo_pre_hooks = list(pre_allreduce_hooks or [])
        self._kolo_post_hooks = list(post_allreduce_hooks or [])
        self.backward_passes_per_step = self._kolo_check_passes(
            backward_passes_per_step)

        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            # Horovod's names: the parameter's group and its place there,
            # the same on every rank that built the optimizer the same way.
            named_parameters = [
                ("allreduce.noname.%d.%d" % (i, j), p)
                for i, g in enumerate(self.param_groups)
                for j, p in enumerate(g["params"])]
        named_parameters = list(named_parameters)
        self._kolo_names = self._kolo_name_parameters(named_parameters,
                                                      all_params)
        # Horovod's attribute, which programs read: parameter -> its name.
        self._parameter_names = {p: name for name, p in
                                 sorted(named_parameters, key=lambda x: x[0])}
        # Parameters that get gradients, in a fixed order (the same on
        # every rank: the optimizer's order).
        self._kolo_params = self._kolo_trained(all_params)
        self._kolo_index = {id(p): i for i, p in enumerate(self._kolo_params)}
        self._kolo_groups = self._kolo_make_groups(groups)
        self._kolo_group_of = {}
        for gi, members in enumerate(self._kolo_groups):
            for p in members:
                self._kolo_group_of[id(p)] = gi

        self._kolo_passes = {}    # id(p) -> hook calls since the last sync
        self._kolo_sparse_ids = set()  # id(p) of sparse gradients seen
        self._kolo_handles = {}   # id(p) or ("group", gi) -> pending entry
        self._kolo_fired = False  # a hook fired since the last synchronize
        self._synchronized = False
        self._should_synchronize = True
        self._kolo_grad_accs = []
        self._kolo_included = process_set.included()
        if self._kolo_included:
            self._kolo_register_hooks()

    def _kolo_make_groups(self, groups):
        if groups is None or (isinstance(groups, int) and groups == 0):
            return []
        params = self._kolo_params
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups must be a non-negative integer or a "
                                 "list of lists of parameters")
            n = min(groups, len(params))
            if n == 0:
                return []
            size, extra = divmod(len(params), n)
            out, start = [], 0
            for i in range(n):
                end = start + size + (1 if i < extra else 0)
                out.append(params[start:end])
                start = end
            return [g for g in out if len(g) > 1]
        out, seen = [], set()
        for g in groups:
            members = []
            for p in g:
                if not isinstance(p, torch.Tensor) or id(p) not in \
                        self._kolo_index:
                    raise ValueError("groups must list parameters of this "
                                     "optimizer that require gradients")
                if id(p) in seen:
                    raise ValueError("a parameter appears in more than one "
                                     "group (%s)" % self._kolo_names[id(p)])
                seen.add(id(p))
                members.append(p)
            members.sort(key=lambda p: self._kolo_index[id(p)])
            if len(members) > 1:
                out.append(members)
        return out

    # ---- the hooks ---------------------------------------------------------

    def _kolo_key(self, p):
        return "allreduce." + self._kolo_names[id(p)]

    def _kolo_on_grad(self, p):
        pid = id(p)
        n = self._kolo_passes.get(pid, 0) + 1
        if n > self.backward_passes_per_step or pid in self._kolo_handles:
            raise AssertionError(TOO_MANY_PASSES)
        self._kolo_passes[pid] = n
        self._kolo_fired = True
        if p.grad is not None and p.grad.is_sparse:
            self._kolo_sparse_ids.add(pid)
        if p.grad is None or self._kolo_pre_hooks:
            return  # deferred: synchronize() communicates
        last = n == self.backward_passes_per_step
        gi = self._kolo_group_of.get(pid)
        if p.grad.is_sparse and not self._kolo_sparse_as_dense:
            if last:  # allgathered alone, even in a group
                self._kolo_enqueue_sparse(p)
            if gi is None:
                return
        if gi is not None:
            if last and all(self._kolo_passes.get(id(q), 0) ==
                            self.backward_passes_per_step
                            for q in self._kolo_groups[gi]):
                self._kolo_enqueue_group(gi)
            return
        if p.grad.is_cuda and self.backward_passes_per_step > 1:
            # The runtime accumulates in host memory only: a CUDA gradient
            # is accumulated by autograd in p.grad, on its device, and
            # allreduced at its last pass.
            if last:
                self._kolo_enqueue_pass(p, p.grad, True, in_runtime=False)
            return
        self._kolo_enqueue_pass(p, p.grad, last)

    def _kolo_scales(self, runtime_average=False):
        pre, post = 1.0, 1.0
        if self._kolo_op == Average and self._kolo_predivide != 1.0:
            pre, post = 1.0 / self._kolo_predivide, self._kolo_predivide
        if (not runtime_average and self._kolo_average_passes and
                self.backward_passes_per_step > 1):
            pre /= self.backward_passes_per_step
        return pre, post

    def _kolo_enqueue_pass(self, p, grad, last, in_runtime=True):
        """One pass of a gradient (see the module's docstring). `grad` is
        this pass's gradient, accumulated by the runtime; with in_runtime
        False it is the sum of every pass that autograd kept in p.grad
        (CUDA gradients), allreduced as it is."""
        if grad.is_sparse:
            grad = grad.to_dense()  # sparse_as_dense: p.grad stays sparse
        n = self.backward_passes_per_step if in_runtime else 1
        wire = wire_for(self._kolo_compression, grad)
        if wire is None:
            tensor, cctx = self._kolo_compression.compress(grad)
        else:
            tensor, cctx = grad, _WIRE
        pre, post = self._kolo_scales(runtime_average=in_runtime)
        h = _allreduce_async(
            tensor, tensor, None, self._kolo_op, pre, post, self.process_set,
            wire, passes=n, average_passes=self._kolo_average_passes,
            key=self._kolo_key(p))
        if not last:
            synchronize(h)  # completed at once: nothing was sent
            p.grad = None         # the runtime holds the sum so far
            return
        self._kolo_handles[id(p)] = ("dense", h, p, cctx, grad)

    def _kolo_enqueue_group(self, gi):
        members = []
        for p in self._kolo_groups[gi]:
            if p.grad.is_sparse and not self._kolo_sparse_as_dense:
                if id(p) not in self._kolo_handles:
                    self._kolo_enqueue_sparse(p)  # allgathered alone
            else:
                members.append(p)
        if not members:
            return
        # A sparse gradient travels as a dense copy, and the result is made
        # sparse again in p.grad (_kolo_set_grad), as Horovod does.
        grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad
                 for p in members]
        comp = self._kolo_compression
        wires = [wire_for(comp, g) for g in grads]
        pre, post = self._kolo_scales()
        if all(w is not None for w in wires):
            tensors, cctxs, wire = grads, [_WIRE] * len(grads), wires[0]
        else:
            pairs = [comp.compress(g) for g in grads]
            tensors, cctxs, wire = [t for t, _ in pairs], [c for _, c in
                                                           pairs], None
        # A group is keyed by its first member's name; each member keeps
        # its own name, as for single gradients.
        keys = [self._kolo_key(p) for p in members]
        h = self._kolo_grouped_async(tensors, keys, pre, post, wire)
        self._kolo_handles[("group", gi)] = ("group", h, members, cctxs, grads)

    def _kolo_grouped_async(self, tensors, keys, pre, post, wire):
        # _allreduce._grouped_allreduce_async names members base.i; the
        # optimizer wants each member's own name, so it calls the core.
        groups = _by_dtype_and_place(tensors, "DistributedOptimizer")
        ins = [_contig(t) for t in tensors]

        def enqueue(handles):
            for (kd, place), idx in groups.items():
                opts, _ = _core.make_opts(
                    self._kolo_op, pre, post, self.process_set,
                    wire if kd == _lib.FLOAT32 else None,
                    place=place)
                handles += _core.grouped_allreduce_async(
                    [keys[i] for i in idx], [ins[i].data_ptr() for i in idx],
                    [ins[i].data_ptr() for i in idx],
                    [ins[i].numel() for i in idx], kd, opts)
        # The memory stays the runtime's until synchronized, whatever
        # happens to the gradients meanwhile (_inflight.py).
        held, handles = _held(keys[0], ins, enqueue)
        back = [(t, a, _spec(t)) for t, a in zip(tensors, held.aliases)]

        def finish(_r):
            held.check()
            _write_back(keys[0], back)
            return tensors
        return _core.register(handles, (tensors, ins, held), finish,
                              what=keys[0], release=held.release,
                              stream=_order_on(tensors[0]))

    def _kolo_enqueue_sparse(self, p):
        grad = p.grad
        pre, post = self._kolo_scales()
        if pre * post != 1.0:
            grad = grad * (pre * post)
        op = self._kolo_op
        if op not in (Sum, Average):
            raise ValueError("sparse gradient of '%s': op %s; sparse "
                             "gradients are reduced with Sum or Average (or "
                             "pass sparse_as_dense=True)"
                             % (self._kolo_names[id(p)], _core.op_name(op)))
        h = sparse_allreduce_async(grad, self._kolo_names[id(p)], op,
                                   self.process_set)
        self._kolo_handles[id(p)] = ("sparse", h, p, None, None)

    # ---- synchronize -------------------------------------------------------

    def _kolo_presence(self):
        """Which parameters are communicated this step: all of them, as in
        Horovod, which gives a parameter without a gradient a zero one and
        allreduces it (so weight decay and momentum still move it, as a
        Horovod user's results show)."""
        params = self._kolo_params
        fired = [self._kolo_passes.get(id(p), 0) > 0 for p in params]
        if params and not any(fired):
            self._kolo_drain()
            raise ValueError(
                "No gradients provided for any parameter: none of the %d "
                "parameters of the optimizer got a gradient on rank %d since "
                "the last step (was loss.backward() called?)"
                % (len(params), _core.rank()))
        return [True] * len(params)

    def synchronize(self):
        """Waits for the allreduce of every gradient and writes the results
        into the parameters' .grad (step() calls it unless inside
        skip_synchronize())."""
        if not self._kolo_included:
            self._synchronized = True
            return
        if not self._kolo_fired and self._synchronized:
            return  # nothing new since the last synchronize
        try:
            self._kolo_synchronize()
        finally:
            self._kolo_passes.clear()
            self._kolo_handles.clear()
            self._kolo_fired = False
        self._synchronized = True

    def _kolo_synchronize(self):
        present = self._kolo_presence()
        n = self.backward_passes_per_step
        live = [p for p, f in zip(self._kolo_params, present) if f]
        # Parameters without a gradient on this rank contribute zeros (or
        # whatever .grad holds), as in Horovod.
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self._kolo_pre_hooks:
            for hook in self._kolo_pre_hooks:
                hook(live)
        for p in live:
            pid = id(p)
            if pid in self._kolo_handles:
                continue
            if p.grad.is_sparse:
                self._kolo_sparse_ids.add(pid)
                if not self._kolo_sparse_as_dense:
                    self._kolo_enqueue_sparse(p)  # even in a group
                    continue
            gi = self._kolo_group_of.get(pid)
            if gi is not None:
                if ("group", gi) not in self._kolo_handles:
                    members = [q for q in self._kolo_groups[gi] if
                               present[self._kolo_index[id(q)]]]
                    if members:
                        self._kolo_enqueue_group_of(gi, members)
                continue
            if self._kolo_pre_hooks:
                self._kolo_enqueue_deferred(p)
                continue
            # Runtime accumulation cut short: complete the group of passes
            # with zeros (the runtime holds the passes so far).
            done = self._kolo_passes.get(pid, 0)
            first = p.grad if done == 0 else None
            for i in range(n - done):
                last = i == n - done - 1
                g = first if (i == 0 and first is not None) else \
                    torch.zeros_like(p)
                if last:
                    p.grad = g
                self._kolo_enqueue_pass(p, g, last)
        self._kolo_finish_all()
        for hook in self._kolo_post_hooks:
            hook(live)

    def _kolo_enqueue_group_of(self, gi, members):
        saved = self._kolo_groups[gi]
        self._kolo_groups[gi] = members
        try:
            self._kolo_enqueue_group(gi)
        finally:
            self._kolo_groups[gi] = saved

    def _kolo_enqueue_deferred(self, p):
        """Deferred mode: autograd accumulated the passes in p.grad."""
        grad = p.grad
        if grad.is_sparse:
            grad = grad.to_dense()  # sparse_as_dense: p.grad stays sparse
        wire = wire_for(self._kolo_compression, grad)
        if wire is None:
            tensor, cctx = self._kolo_compression.compress(grad)
        else:
            tensor, cctx = grad, _WIRE
        pre, post = self._kolo_scales()
        h = _allreduce_async(tensor, tensor, None, self._kolo_op, pre, post,
                             self.process_set, wire, key=self._kolo_key(p))
        self._kolo_handles[id(p)] = ("dense", h, p, cctx, grad)

    def _kolo_set_grad(self, p, out):
        g = p.grad
        if g is out:
            return
        if out.is_sparse or id(p) in self._kolo_sparse_ids:
            # As Horovod: a sparse gradient stays sparse (with
            # sparse_as_dense it was reduced as a dense copy: the result is
            # made sparse again), and its tensor gets the result in place.
            if not out.is_sparse:
                out = out.to_sparse()
            if g is not None and g.is_sparse:
                g.zero_().add_(out)
            else:
                p.grad = out
            return
        if (g is not None and not g.is_sparse and not out.is_sparse and
                g.dtype == out.dtype and g.shape == out.shape):
            g.set_(out)
        else:
            p.grad = out

    def _kolo_finish_all(self):
        error = None
        for entry in list(self._kolo_handles.values()):
            kind, h, target, cctx, grad = entry
            try:
                out = synchronize(h)
            except Exception as e:  # wait for the others before raising
                if error is None:
                    error = e
                continue
            if error is not None:
                continue
            comp = self._kolo_compression
            if kind == "dense":
                # cctx is None on the wire path (nothing to decompress)
                self._kolo_set_grad(target, out if cctx is _WIRE
                                    else comp.decompress(out, cctx))
            elif kind == "sparse":
                self._kolo_set_grad(target, out)
            else:  # group
                for p, o, c in zip(target, out, cctx):
                    self._kolo_set_grad(p, o if c is _WIRE
                                        else comp.decompress(o, c))
        if error is not None:
            raise error

    def _kolo_drain(self):
        for entry in list(self._kolo_handles.values()):
            try:
                synchronize(entry[1])
            except Exception:
                pass

    # ---- the optimizer's interface -----------------------------------------

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this context does not synchronize: for code that
        calls synchronize() itself (to clip gradients, say) before step()."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without "
                    "optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training "
                    "slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._kolo_handles or any(self._kolo_passes.values()):
            raise AssertionError(ZERO_GRAD_PENDING)
        return super().zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """The wrapped optimizer's, after forgetting, as Horovod's does, the
        gradients of this step: allreduces in flight and the backward
        passes counted (so that an elastic restore after a failure in the
        middle of a step starts the next step afresh). The runtime's own
        accumulation of passes before the last one is dropped by the
        shutdown that follows a restore in elastic.run."""
        forget_pending([e[1] for e in self._kolo_handles.values()])
        self._kolo_handles.clear()
        self._kolo_passes.clear()
        self._kolo_fired = False
        self._synchronized = False
        self._should_synchronize = True
        return super().load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        """Changes backward_passes_per_step between steps."""
        passes = self._kolo_check_passes(passes)
        if any(self._kolo_passes.values()):
            raise ValueError("set_backward_passes_per_step: %d backward "
                             "passes are pending; call step() or "
                             "synchronize() first"
                             % max(self._kolo_passes.values()))
        self.backward_passes_per_step = passes

    def register_pre_allreduce_hook(self, hook):
        """hook(params) runs in synchronize() before any gradient is
        allreduced, with the parameters that have a gradient (their .grad
        are this rank's local gradients, accumulated over the passes); it may
        modify them in place (clip_grad_norm_hook clips by global norm).
        With a pre-allreduce hook, communication starts after the backward
        pass instead of overlapping it."""
        if any(self._kolo_passes.values()):
            raise ValueError("register hooks between steps, not while "
                             "backward passes are pending")
        self._kolo_pre_hooks.append(hook)
        return hook

    def register_post_allreduce_hook(self, hook):
        """hook(params) runs in synchronize() after every gradient has been
        allreduced and written to .grad, before the optimizer's update."""
        self._kolo_post_hooks.append(hook)
        return hook


def DistributedOptimizer(optimizer, named_parameters=None,
                         compression=Compression.none,
                         backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, num_groups=0,
                         groups=None, sparse_as_dense=False,
                         process_set=global_process_set, *,
                         average_aggregated_gradients=False,
                         pre_allreduce_hooks=None, post_allreduce_hooks=None):
    """Wraps a torch optimizer so that gradients are allreduced over the
    ranks of the process set before each update (Horovod's
    DistributedOptimizer; the returned object is an instance of a subclass
    of the optimizer's class and shares its state and parameter groups).

    named_parameters: (name, parameter) pairs (model.named_parameters()),
      used to name the allreduces; names must be unique.
    compression: Compression.none, Compression.fp16 (float32 gradients are
      compressed on the wire by the runtime).
    backward_passes_per_step: backward passes accumulated locally before
      one allreduce (summed, as in Horovod; average_aggregated_gradients=True
      averages them).
    op: Average (default), Sum, Min, Max, Product, or Adasum (Horovod's
      delta optimizer: each rank applies the update locally and the
      changes of the parameters are combined; kolo/torch/adasum.py).
    gradient_predivide_factor: with op=Average, gradients are divided by
      this before the sum and by size/factor after it.
    groups / num_groups: an int (that many groups of consecutive
      parameters) or a list of lists of parameters, each list allreduced as
      one group once all its gradients are ready.
    sparse_as_dense: reduce sparse gradients as dense copies, the result
      made sparse again (else they are allgathered as indices and values);
      p.grad stays sparse either way, as in Horovod.
    process_set: the ranks the gradients are reduced among.
    pre_allreduce_hooks / post_allreduce_hooks (kolo): callables hook(params)
      run before the allreduce (e.g. clip_grad_norm_hook) and after it.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("DistributedOptimizer wraps a torch.optim.Optimizer, "
                        "not %s" % type(optimizer).__name__)
    if isinstance(optimizer, Wrapper):
        raise ValueError("this optimizer is a DistributedOptimizer already")
    if groups is None and num_groups:
        warnings.warn("num_groups is deprecated; use groups",
                      DeprecationWarning, stacklevel=2)
        groups = num_groups
    if op == Adasum:
        # Horovod's _DistributedAdasumOptimizer: kolo/torch/adasum.py
        if gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor not supported with "
                             "op != Average")
        if pre_allreduce_hooks or post_allreduce_hooks:
            raise ValueError("op=Adasum allreduces the change of the "
                             "parameters, not gradients: it takes no "
                             "pre_allreduce_hooks or post_allreduce_hooks")
        if _core.set_size(process_set) > 1:
            return adasum.distributed_optimizer(
                optimizer, named_parameters, compression,
                backward_passes_per_step, process_set,
                average_aggregated_gradients)
        op = Sum  # one rank: the gradient as it is (Horovod does the same)
    dist = wrap(optimizer, _Distributed)
    dist._kolo_setup(named_parameters, compression, backward_passes_per_step,
                     op, gradient_predivide_factor, groups, sparse_as_dense,
                     process_set, average_aggregated_gradients,
                     pre_allreduce_hooks, post_allreduce_hooks)
    return dist


def clip_grad_norm_hook(max_norm, norm_type=2.0):
    """A pre-allreduce hook that clips this rank's gradients by their global
    norm before they are allreduced (to keep the maths of one replica)."""
    def hook(params):
        torch.nn.utils.clip_grad_norm_(
            [p for p in params if p.grad is not None], max_norm, norm_type)
    return hook
