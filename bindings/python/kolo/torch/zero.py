"""ZeroRedundancyOptimizer: the optimizer's state sharded over the ranks
(ZeRO stage 2: gradients and optimizer state sharded, parameters whole).

Horovod gives every rank all of the optimizer's state; here each rank of
the process set keeps the state of a 1/n share of every parameter and
updates only that share, so a model whose optimizer state does not fit in
one rank's memory can still be trained.

How a step goes:

 * Layout. The parameters that require gradients are laid out, group by
   group and in the reverse of the optimizer's order (the order in which
   backward produces their gradients), in buckets of about bucket_cap_mb
   of one dtype and device. A bucket's elements are split in n equal
   blocks (the last padded with zeros): rank r owns block r of every
   bucket. So every rank owns 1/n of the bytes, whatever the parameters'
   sizes, and a parameter may be cut between two ranks.
 * The parameters become views of their bucket (param.data is re-pointed
   at construction; their values are kept). The wrapped optimizer, `.optim`,
   is built by this class on this rank's blocks: one 1-D tensor per bucket,
   a view of the bucket, in a parameter group with the hyper-parameters of
   the parameters' group. Elementwise optimizers (every torch.optim
   optimizer except LBFGS and SparseAdam, which are refused) compute on a
   block exactly what they compute on the whole parameters.
 * Backward. A hook on each parameter's gradient accumulator copies the
   gradient into the bucket's gradient buffer at its last backward pass and
   frees p.grad; when every parameter of a bucket has its gradient, the
   bucket is reduce-scattered (kolo_reducescatter_into_async) through the
   background thread while backward goes on: each rank receives the
   averaged gradient of its block only, in place in the buffer.
 * step(): waits for the reduce-scatters, runs the wrapped optimizer on the
   blocks, then allgathers every bucket in place (kolo_allgather_into_async),
   which writes every rank's updated block into the parameters. Every
   element is computed by one rank and copied to the others: the
   parameters are bit for bit the same on every rank after every step.

After step() the parameters' .grad are None: the averaged gradients exist
only as blocks. Clip with opt.clip_grad_norm_(max_norm) (the global norm,
computed over the blocks and allreduced), not torch.nn.utils'.

The class is laid out one idea per file, mixed into it: _zero_layout.py
(buckets, views, hooks, the checks that the ranks agree), _zero_join.py
(the rounds that let a joined rank stand in), _zero_state.py (the state
dict) and _zero_elastic.py (commits and re-layout for elastic training);
the backward pass, synchronize and step are here.
"""

import contextlib
import itertools

import torch

from .. import _core
from .._core import Average, Sum, global_process_set
from . import _joined
from ._completion import _wait_all
from ._tensors import _kdtype, _order_on, _place
from ._zero_elastic import _ElasticState
from ._zero_join import _JoinRounds
from ._zero_layout import _Layout
from ._zero_state import NOT_CONSOLIDATED, _StateDict  # noqa: F401
from .compression import Compression
from .optimizer_base import TOO_MANY_PASSES, ZERO_GRAD_PENDING, Wrapper

_instances = itertools.count()


def _elementwise_check(optimizer_class):
    if not (isinstance(optimizer_class, type) and
            issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError("ZeroRedundancyOptimizer: optimizer_class must be a "
                        "torch.optim.Optimizer subclass (torch.optim.Adam, "
                        "say), not %r" % (optimizer_class,))
    if issubclass(optimizer_class,
                  (torch.optim.LBFGS, torch.optim.SparseAdam)):
        raise ValueError(
            "ZeroRedundancyOptimizer cannot shard %s: each rank updates a "
            "block of the parameters, which needs an optimizer that updates "
            "every element from that element's gradient and state alone "
            "(SGD, Adam, AdamW, Adagrad, RMSprop, ...); LBFGS needs the "
            "whole parameters, SparseAdam sparse gradients"
            % optimizer_class.__name__)


class ZeroRedundancyOptimizer(_Layout, _JoinRounds, _StateDict,
                              _ElasticState, torch.optim.Optimizer):
    """Wraps optimizer_class so that each rank of process_set keeps and
    updates 1/n of the optimizer's state, with gradients reduce-scattered
    during backward and parameters allgathered after the update (see the
    module's docstring). Used in place of DistributedOptimizer (it reduces
    the gradients itself: no DDP):

        opt = hvd.ZeroRedundancyOptimizer(model.parameters(),
                                          torch.optim.Adam, lr=1e-3)

    params: parameters or parameter groups, as for any torch optimizer.
    optimizer_class: the torch.optim class to shard; **defaults are its
      arguments (lr=..., betas=..., weight_decay=...).
    process_set: the ranks that share the state.
    named_parameters: (name, parameter) pairs, for messages.
    compression: Compression.fp16 (bf16) reduces float32 gradients as
      float16 (bfloat16).
    backward_passes_per_step, op (Average or Sum),
      gradient_predivide_factor, average_aggregated_gradients: as for
      DistributedOptimizer.
    bucket_cap_mb: the size of a bucket (25 MB by default, as DDP).
    parameters_as_bucket_view: accepted for torch's signature; kolo always
      makes the parameters views of their buckets.
    """

    def __init__(self, params, optimizer_class, process_set=global_process_set,
                 *, named_parameters=None, compression=Compression.none,
                 backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0,
                 average_aggregated_gradients=False, bucket_cap_mb=25,
                 parameters_as_bucket_view=True, overlap_with_ddp=False,
                 process_group=None, **defaults):
        _elementwise_check(optimizer_class)
        if process_group is not None:
            raise ValueError("ZeroRedundancyOptimizer: kolo takes "
                             "process_set= (a kolo ProcessSet), not "
                             "torch.distributed's process_group")
        if overlap_with_ddp:
            raise ValueError("ZeroRedundancyOptimizer: overlap_with_ddp is "
                             "torch's coupling with DDP; kolo's overlaps "
                             "the gradients' reduction with backward by "
                             "itself, without DDP")
        op = _core.check_op(op)
        if op not in (Average, Sum):
            raise ValueError("ZeroRedundancyOptimizer reduces gradients with "
                             "Average or Sum, not %s" % _core.op_name(op))
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with "
                             "op != Average")
        if not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise ValueError("bucket_cap_mb must be a positive number, not %r"
                             % (bucket_cap_mb,))
        self._kolo_ready = False
        super().__init__(params, defaults)
        self.optimizer_class = optimizer_class
        self._kolo_defaults = dict(defaults)
        self.process_set = process_set
        self._kolo_id = next(_instances)
        self._kolo_op = op
        self._kolo_compression = compression
        self._kolo_predivide = float(gradient_predivide_factor)
        self._kolo_average_passes = bool(average_aggregated_gradients)
        self._kolo_cap = int(bucket_cap_mb * 1024 * 1024)
        self.backward_passes_per_step = Wrapper._kolo_check_passes(
            backward_passes_per_step)
        self._kolo_included = process_set.included()
        self._kolo_n = _core.set_size(process_set) if self._kolo_included \
            else 1
        self._kolo_rank = _core.set_rank(process_set) if \
            self._kolo_included else 0
        self._kolo_buckets = []
        self._kolo_slot = {}      # id(p) -> (bucket, offset, numel)
        self._kolo_passes = {}    # id(p) -> hook calls since the last step
        self._kolo_fired = False
        self._synchronized = False
        self._should_synchronize = True
        self._kolo_checked = False
        self._kolo_consolidated = None  # (to, state dict) after consolidate
        self._kolo_grad_accs = []
        self._kolo_round = None    # handle of this step's round flag
        self._kolo_everyone = True  # every rank of the set trained in it
        self._kolo_need_state = False  # re-laid out, state not rebuilt
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            named_parameters = [("param.%d.%d" % (i, j), p)
                                for i, g in enumerate(self.param_groups)
                                for j, p in enumerate(g["params"])]
        self._kolo_names = Wrapper._kolo_name_parameters(
            self, named_parameters, all_params)
        self.optim = None
        local_groups = []
        for gi in range(len(self.param_groups)):
            local_groups.append(self._kolo_layout(gi))
        self._kolo_check_layout(0)
        self.optim = optimizer_class(local_groups, **defaults)
        self._kolo_pull_hyper()
        self._kolo_ready = True
        _joined.register(self._kolo_id, self)

    # ---- backward ----------------------------------------------------------

    def _kolo_on_grad(self, p):
        pid = id(p)
        n = self._kolo_passes.get(pid, 0) + 1
        if n > self.backward_passes_per_step:
            raise AssertionError(TOO_MANY_PASSES)
        self._kolo_passes[pid] = n
        if not self._kolo_fired:
            if self._kolo_need_state:
                # re-formed without a sync (elastic, skip_sync): every
                # rank re-laid out, and rebuilds the committed state before
                # its first bucket
                self._kolo_rebuild_state()
            self._kolo_start_round()
        self._kolo_fired = True
        if p.grad is not None and p.grad.is_sparse:
            raise ValueError(
                "ZeroRedundancyOptimizer: parameter '%s' has a sparse "
                "gradient; sharding needs dense gradients (build the "
                "embedding with sparse=False, or use DistributedOptimizer)"
                % self._kolo_names[pid])
        if n == self.backward_passes_per_step:
            self._kolo_fill(p)

    def _kolo_fill(self, p):
        """Copies p's gradient (zeros without one) into its bucket, frees
        p.grad, and starts the bucket's reduction once it is full."""
        b, off, k = self._kolo_slot[id(p)]
        with torch.no_grad():
            view = b.grad[off:off + k]
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad.reshape(-1))
        p.grad = None
        b.filled += 1
        if b.filled == len(b.params):
            self._kolo_reduce(b)

    def _kolo_scales(self):
        pre, post = 1.0, 1.0
        if self._kolo_op == Average and self._kolo_predivide != 1.0:
            pre, post = 1.0 / self._kolo_predivide, self._kolo_predivide
        if self._kolo_average_passes and self.backward_passes_per_step > 1:
            pre /= self.backward_passes_per_step
        return pre, post

    def _kolo_enqueue(self, what, b, fn, src, dst):
        t = b.grad if what == "rs" else b.flat
        kd = _kdtype(t, "ZeroRedundancyOptimizer")
        place = _place(t)
        if what == "rs":
            pre, post = self._kolo_scales()
            opts, _ = _core.make_opts(self._kolo_op, pre, post,
                                      self.process_set, place=place)
        else:
            opts, _ = _core.make_opts(process_set=self.process_set,
                                      place=place)
        # A rank that has joined still takes part (hvd.join() below).
        opts.while_joined = 1
        name = "zero%d.%s.%d" % (self._kolo_id, what, b.index)
        h = fn(name, src.data_ptr(), dst.data_ptr(), b.block, kd, opts)
        return _core.register([h], (b,), None, what=name,
                              stream=_order_on(t))

    def _kolo_allreduce(self, what, t, op):
        """An allreduce of the optimizer's own in place (every rank of the
        set takes part, a joined one too: while_joined)."""
        opts, _ = _core.make_opts(op, process_set=self.process_set)
        opts.while_joined = 1
        key = "zero%d.%s" % (self._kolo_id, what)
        h = _core.allreduce_async(key, t.data_ptr(), t.data_ptr(), t.numel(),
                                  _kdtype(t, key), opts)
        return _core.register([h], (t,), None, what=key)

    def _kolo_reduce(self, b):
        b.handle = self._kolo_enqueue("rs", b, _core.reducescatter_into_async,
                                      b.grad, b.mine_grad)

    # ---- synchronize -------------------------------------------------------

    def synchronize(self):
        """Waits for the reduction of every bucket: afterwards each rank's
        blocks hold their averaged gradients (step() calls it unless inside
        skip_synchronize())."""
        if not self._kolo_included:
            self._synchronized = True
            return
        if not self._kolo_fired and self._synchronized:
            return
        self._kolo_check_views()
        if not self._kolo_fired:
            self._kolo_drain()
            raise ValueError(
                "No gradients provided for any parameter: none of the "
                "parameters of the ZeroRedundancyOptimizer got a gradient on "
                "rank %d since the last step (was loss.backward() called?)"
                % _core.rank())
        try:
            for b in self._kolo_buckets:
                if b.handle is None:
                    # What backward did not fill: the passes so far, or
                    # zeros (a parameter without a gradient on this rank
                    # contributes zeros, as with DistributedOptimizer).
                    for p, _, _ in b.params:
                        if self._kolo_passes.get(id(p), 0) < \
                                self.backward_passes_per_step:
                            self._kolo_fill(p)
            handles = [b.handle for b in self._kolo_buckets]
            for b in self._kolo_buckets:
                b.handle = None
            # every bucket and the round's flag waited for, even after an
            # error (then the first is raised)
            _wait_all(handles, self._kolo_end_round)
            self._kolo_set_block_grads()
        finally:
            self._kolo_reset()
        self._synchronized = True

    def _kolo_set_block_grads(self):
        """The reduced gradient blocks become the blocks' .grad (a float32
        copy of a 16-bit wire)."""
        for b in self._kolo_buckets:
            if b.wire_grad32 is not None:
                b.wire_grad32.copy_(b.mine_grad)
                b.mine.grad = b.wire_grad32
            else:
                b.mine.grad = b.mine_grad

    def _kolo_reset(self):
        self._kolo_passes.clear()
        self._kolo_fired = False
        for b in self._kolo_buckets:
            b.filled = 0

    def _kolo_drain(self):
        handles = [b.handle for b in self._kolo_buckets]
        handles.append(self._kolo_round)
        self._kolo_round = None
        for b in self._kolo_buckets:
            b.handle = None
        for h in handles:
            if h is not None:
                try:
                    _core.synchronize(h)
                except Exception:
                    pass

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this context uses the gradients of an earlier
        synchronize() (to clip them, say) without waiting again."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _kolo_block_grads(self):
        """This rank's averaged gradient blocks (after synchronize)."""
        return [b.mine.grad for b in self._kolo_buckets
                if b.mine.grad is not None]

    def _kolo_skip_step(self):
        """A step that was skipped (GradScaler found Inf/NaN): the
        gradients are consumed, the parameters stay."""
        if self._kolo_partial():
            self._kolo_announce(self._SKIP)
        self._synchronized = False
        for b in self._kolo_buckets:
            b.mine.grad = None

    def clip_grad_norm_(self, max_norm, norm_type=2.0,
                        error_if_nonfinite=False):
        """Clips the averaged gradients by their global norm, as
        torch.nn.utils.clip_grad_norm_ would clip the whole gradients (the
        norm is computed over this rank's blocks and combined with the
        other ranks'); synchronizes first if needed. Returns the norm
        before clipping (a tensor). Call it between backward and step()."""
        if self._kolo_fired or not self._synchronized:
            self.synchronize()
        if self._kolo_partial():
            self._kolo_announce(self._CLIP, max_norm, norm_type)
        return self._kolo_clip(max_norm, norm_type, error_if_nonfinite)

    def _kolo_clip(self, max_norm, norm_type, error_if_nonfinite=False):
        norm_type = float(norm_type)
        grads = self._kolo_block_grads()
        dev = grads[0].device if grads else torch.device("cpu")
        if norm_type == float("inf"):
            local = max([float(g.detach().abs().max()) for g in grads] +
                        [0.0])
            op = _core.Max
        else:
            local = sum(float(torch.sum(g.detach().double().abs() **
                                        norm_type)) for g in grads)
            op = Sum
        total = local
        if self._kolo_included and self._kolo_n > 1:
            t = torch.tensor([local], dtype=torch.float64)
            _core.synchronize(self._kolo_allreduce("clip", t, op))
            total = float(t.item())
        if norm_type != float("inf"):
            total = total ** (1.0 / norm_type)
        norm = torch.tensor(total, dtype=grads[0].dtype if grads else
                            torch.float32, device=dev)
        if error_if_nonfinite and not torch.isfinite(norm):
            raise RuntimeError(
                "The total norm of order %s for gradients from the "
                "ZeroRedundancyOptimizer is non-finite, so it cannot be "
                "clipped" % norm_type)
        coef = float(max_norm) / (total + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
        return norm

    # ---- step --------------------------------------------------------------

    def _kolo_push_hyper(self):
        for g, lg in zip(self.param_groups, self.optim.param_groups):
            for k, v in g.items():
                if k != "params":
                    lg[k] = v

    def _kolo_pull_hyper(self):
        for g, lg in zip(self.param_groups, self.optim.param_groups):
            for k, v in lg.items():
                if k != "params":
                    g[k] = v

    def step(self, closure=None):
        """Synchronizes (unless inside skip_synchronize()), updates this
        rank's blocks with the wrapped optimizer, and allgathers the
        parameters. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._kolo_included:
            # Outside the process set: a local step on this rank's own
            # gradients (as DistributedOptimizer takes), laid out in the
            # buckets (one block: the whole bucket), zeros where a
            # parameter has none.
            with torch.no_grad():
                for b in self._kolo_buckets:
                    for p, off, k in b.params:
                        view = b.grad[off:off + k]
                        if p.grad is None:
                            view.zero_()
                        else:
                            view.copy_(p.grad.reshape(-1))
            self._kolo_set_block_grads()
            self._kolo_push_hyper()
            self.optim.step()
            self._kolo_pull_hyper()
            return loss
        if self._should_synchronize or not self._synchronized:
            self.synchronize()
        if self._kolo_partial():
            self._kolo_announce(self._STEP)  # the joined rank steps too
        elif not self._kolo_checked:
            self._kolo_check_values()
        self._kolo_push_hyper()
        self.optim.step()
        self._kolo_pull_hyper()
        self._synchronized = False
        for b in self._kolo_buckets:
            b.mine.grad = None
        self._kolo_gather()
        return loss

    def _kolo_gather(self):
        if self._kolo_n == 1:
            return
        _wait_all([self._kolo_enqueue("ag", b, _core.allgather_into_async,
                                      b.mine, b.flat)
                   for b in self._kolo_buckets])

    def zero_grad(self, set_to_none=True):
        if self._kolo_fired:
            raise AssertionError(ZERO_GRAD_PENDING)
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def set_backward_passes_per_step(self, passes):
        passes = Wrapper._kolo_check_passes(passes)
        if any(self._kolo_passes.values()):
            raise ValueError("set_backward_passes_per_step: backward passes "
                             "are pending; call step() or synchronize() "
                             "first")
        self.backward_passes_per_step = passes

    def add_param_group(self, param_group):
        """Adds a parameter group (on every rank, like the constructor):
        its parameters get buckets of their own, sharded like the others."""
        if not self._kolo_ready:
            return super().add_param_group(param_group)
        if self._kolo_fired:
            raise ValueError("add_param_group between steps, not while "
                             "backward passes are pending")
        super().add_param_group(param_group)
        gi = len(self.param_groups) - 1
        for j, p in enumerate(self.param_groups[gi]["params"]):
            self._kolo_names.setdefault(id(p), "param.%d.%d" % (gi, j))
        local = self._kolo_layout(gi)
        self._kolo_check_layout(gi)
        self.optim.add_param_group(local)
        self._kolo_pull_hyper()

    def __repr__(self):
        return "ZeroRedundancyOptimizer(%s, %d ranks, %d buckets)" % (
            self.optimizer_class.__name__, self._kolo_n,
            len(self._kolo_buckets))
