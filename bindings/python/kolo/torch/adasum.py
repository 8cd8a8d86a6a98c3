"""op=Adasum in kolo.torch: the allreduce of torch tensors, and
DistributedOptimizer(op=Adasum), Horovod's _DistributedAdasumOptimizer.

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
    groups = {}
    for i, kd in enumerate(sent):
        groups.setdefault(kd, []).append(i)
    order, handles = [], []
    try:
        for kd, idx in groups.items():
            handles += _adasum.enqueue([keys[i] for i in idx],
                                       [hosts[i].data_ptr() for i in idx],
                                       [hosts[i].shape for i in idx], kd,
                                       process_set)
            order += idx
    except Exception:
        if handles:  # what was enqueued must still complete
            _core.register(handles, hosts, None, results=True, what=what)
        raise

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


# ---- DistributedOptimizer(op=Adasum) ---------------------------------------

_TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before "
    "call to step(). Increase backward_passes_per_step to accumulate "
    "gradients locally.")

_ZERO_GRAD_PENDING = (
    "optimizer.zero_grad() was called after loss.backward() but before "
    "optimizer.step() or optimizer.synchronize(). This is prohibited as it "
    "can cause a race condition.")


class _DistributedAdasum:
    """Mixed into a subclass of the wrapped optimizer's class (see the
    module's docstring)."""

    def _kolo_adasum_setup(self, named_parameters, compression,
                           backward_passes_per_step, process_set,
                           average_aggregated_gradients):
        from .optimizer import _Distributed
        self._kolo_compression = compression
        self.process_set = process_set
        self._kolo_average_passes = bool(average_aggregated_gradients)
        self.backward_passes_per_step = _Distributed._kolo_check_passes(
            backward_passes_per_step)
        all_params = [p for g in self.param_groups for p in g["params"]]
        self._kolo_names = _Distributed._kolo_name_parameters(
            self, named_parameters, all_params)
        self._kolo_params, seen = [], set()
        for p in all_params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._kolo_params.append(p)
        self._kolo_delay = {id(p): self.backward_passes_per_step
                            for p in self._kolo_params}
        self._kolo_handles = {}  # id(p) -> (handle or None, p, ctx)
        self._kolo_grad_accs = []
        self._kolo_included = process_set.included()
        if self._kolo_included:
            with torch.enable_grad():
                for p in self._kolo_params:
                    p.grad = torch.zeros_like(p)
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    acc.register_hook(self._kolo_make_hook(p))
                    self._kolo_grad_accs.append(acc)

    def _kolo_make_hook(self, p):
        def hook(*_ignored):
            self._kolo_on_grad(p)
        return hook

    def _kolo_on_grad(self, p):
        pid = id(p)
        entry = self._kolo_handles.get(pid)
        if entry is not None and entry[0] is not None and \
                self._kolo_delay[pid] <= 0:
            raise AssertionError(_TOO_MANY_PASSES)
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
        h = allreduce_async([compressed], [compressed], [key], key,
                            process_set=self.process_set, single=True)
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
            raise AssertionError(_ZERO_GRAD_PENDING)
        return super(_DistributedAdasum, self).zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """The wrapped optimizer's, after forgetting the changes in flight
        and the backward passes counted (as DistributedOptimizer's)."""
        from .optimizer import _forget_pending
        _forget_pending([e[0] for e in self._kolo_handles.values()])
        self._kolo_handles.clear()
        for pid in self._kolo_delay:
            self._kolo_delay[pid] = self.backward_passes_per_step
        return super(_DistributedAdasum, self).load_state_dict(*args,
                                                               **kwargs)

    def set_backward_passes_per_step(self, passes):
        from .optimizer import _Distributed
        self.backward_passes_per_step = _Distributed._kolo_check_passes(passes)
        for pid in self._kolo_delay:
            self._kolo_delay[pid] = self.backward_passes_per_step


def distributed_optimizer(optimizer, named_parameters, compression,
                          backward_passes_per_step, process_set,
                          average_aggregated_gradients):
    """DistributedOptimizer(op=Adasum) on a process set of more than one
    rank: an instance of a subclass of the optimizer's class sharing its
    state and parameter groups."""
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedAdasum, base),
               {"__module__": base.__module__})
    dist = cls.__new__(cls)
    dist.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                          if not (callable(v) and hasattr(base, k))})
    dist._kolo_adasum_setup(named_parameters, compression,
                            backward_passes_per_step, process_set,
                            average_aggregated_gradients)
    return dist
