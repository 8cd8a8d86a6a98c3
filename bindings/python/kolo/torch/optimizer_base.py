"""What every distributed optimizer of kolo.torch shares (optimizer.py's
gradient optimizer, adasum.py's Adasum optimizer): wrapping the program's
optimizer in a subclass of its class that shares its state, naming the
parameters, counting backward passes, the hooks on the gradient
accumulators, and forgetting the handles of an abandoned step.
"""

import torch

from ._completion import synchronize

TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before "
    "call to step(). Increase backward_passes_per_step to accumulate "
    "gradients locally.")

ZERO_GRAD_PENDING = (
    "optimizer.zero_grad() was called after loss.backward() but before "
    "optimizer.step() or optimizer.synchronize(). This is prohibited as it "
    "can cause a race condition.")


class Wrapper:
    """The part of a distributed optimizer's mixin that does not depend on
    what travels (gradients, or changes of the parameters). The mixin
    defines _kolo_on_grad(p), which the hooks call."""

    @staticmethod
    def _kolo_check_passes(n):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError("backward_passes_per_step must be an integer >= "
                             "1, not %r" % (n,))
        return n

    def _kolo_name_parameters(self, named_parameters, all_params):
        named = list(named_parameters)
        if any(not isinstance(x, tuple) or len(x) != 2 or
               not isinstance(x[0], str) for x in named):
            raise ValueError("named_parameters should be a sequence of tuples "
                             "(name, parameter), usually produced by "
                             "model.named_parameters().")
        counts = {}
        for name, _ in named:
            counts[name] = counts.get(name, 0) + 1
        dups = sorted(n for n, c in counts.items() if c > 1)
        if dups:
            raise ValueError("Parameter names in named_parameters must be "
                             "unique. Found duplicates: %s" % ", ".join(dups))
        names = {id(p): name for name, p in named}
        unnamed = [id(p) for p in all_params if id(p) not in names]
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more "
                             "model parameters were not named. Python object "
                             "ids: %s" % ", ".join(str(i) for i in unnamed))
        return names

    @staticmethod
    def _kolo_trained(all_params):
        """The parameters that get gradients, each once, in the optimizer's
        order (the same on every rank)."""
        out, seen = [], set()
        for p in all_params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def _kolo_register_hooks(self):
        with torch.enable_grad():
            for p in self._kolo_params:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._kolo_make_hook(p))
                self._kolo_grad_accs.append(acc)

    def _kolo_make_hook(self, p):
        def hook(*_ignored):
            self._kolo_on_grad(p)
        return hook


def wrap(optimizer, mixin):
    """An instance of a subclass of the optimizer's class with `mixin`
    first, sharing the optimizer's state and parameter groups (not yet set
    up: the caller does). Instance attributes that stand in for methods are
    left out (an LR scheduler made before wrapping puts a counting `step`
    on the instance, bound to the original object: it would bypass the
    distributed step)."""
    base = type(optimizer)
    cls = type(base.__name__, (mixin, base), {"__module__": base.__module__})
    dist = cls.__new__(cls)
    dist.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                          if not (callable(v) and hasattr(base, k))})
    return dist


def forget_pending(handles):
    """Waits for the handles of an abandoned step, ignoring their results
    and errors: the runtime holds a name in flight until its handle is
    waited on, so the next step could not enqueue the same gradients again
    (Horovod's runtime forgets a name once its operation is done, so there
    dropping the handles is enough). The wait is short: after a failure the
    runtime fails every pending operation; otherwise every rank enqueued
    the same gradients in the same backward pass."""
    for h in handles:
        if h is None:
            continue
        try:
            synchronize(h)
        except Exception:  # the step is abandoned: its errors with it
            pass
