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
"""

import contextlib
import itertools
import threading
import weakref

import torch

from .. import _core
from .._core import Average, Sum, global_process_set
from . import mpi_ops
from .compression import Compression
from .functions import allgather_object, broadcast_object
from .optimizer_base import TOO_MANY_PASSES, ZERO_GRAD_PENDING, Wrapper

_instances = itertools.count()
_live = weakref.WeakValueDictionary()  # instance number -> optimizer

NOT_CONSOLIDATED = (
    "ZeroRedundancyOptimizer.state_dict(): the state of every parameter is "
    "held by rank %d only after consolidate_state_dict(to=%d) on every rank "
    "(this rank is %d%s)")


class _Bucket:
    """Parameters of one group, dtype and device, flattened: `flat` holds
    their values (n blocks of `block` elements), `grad` their gradients
    (in the wire dtype), `mine` is this rank's block of `flat`."""

    def __init__(self, index, group, dtype, device):
        self.index = index
        self.group = group
        self.dtype = dtype
        self.device = device
        self.params = []   # (param, offset, numel), in backward order
        self.total = 0
        self.block = 0
        self.flat = self.grad = self.mine = self.mine_grad = None
        self.wire_grad32 = None  # float32 copy of a float16 block
        self.filled = 0
        self.handle = None


def _elementwise_check(optimizer_class):
    if not (isinstance(optimizer_class, type) and
            issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError("ZeroRedundancyOptimizer: optimizer_class must be a "
                        "torch.optim.Optimizer subclass (torch.optim.Adam, "
                        "say), not %r" % (optimizer_class,))
    if issubclass(optimizer_class, (torch.optim.LBFGS, torch.optim.SparseAdam)):
        raise ValueError(
            "ZeroRedundancyOptimizer cannot shard %s: each rank updates a "
            "block of the parameters, which needs an optimizer that updates "
            "every element from that element's gradient and state alone "
            "(SGD, Adam, AdamW, Adagrad, RMSprop, ...); LBFGS needs the "
            "whole parameters, SparseAdam sparse gradients"
            % optimizer_class.__name__)


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
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
        _live[self._kolo_id] = self

    # ---- layout ------------------------------------------------------------

    def _kolo_layout(self, gi):
        """Lays out group gi's parameters in buckets; returns the local
        group (this rank's blocks, the group's hyper-parameters)."""
        group = self.param_groups[gi]
        trained = [p for p in group["params"] if p.requires_grad]
        for p in trained:
            if id(p) in self._kolo_slot:
                raise ValueError("parameter '%s' is in two parameter groups"
                                 % self._kolo_names[id(p)])
            if p.is_sparse:
                raise ValueError("ZeroRedundancyOptimizer: parameter '%s' is "
                                 "sparse" % self._kolo_names[id(p)])
        open_ = {}
        made = []
        for p in reversed(trained):
            key = (p.dtype, p.device)
            b = open_.get(key)
            nbytes = p.numel() * p.element_size()
            if b is not None and b.params and \
                    (b.total * p.element_size()) + nbytes > self._kolo_cap:
                b = None
            if b is None:
                b = _Bucket(len(self._kolo_buckets) + len(made), gi, p.dtype,
                            p.device)
                open_[key] = b
                made.append(b)
            b.params.append((p, b.total, p.numel()))
            b.total += p.numel()
        for b in made:
            self._kolo_make_bucket(b)
            self._kolo_buckets.append(b)
        if self._kolo_included:
            self._kolo_hook(trained)
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [b.mine for b in made]
        return local

    def _kolo_make_bucket(self, b):
        n = self._kolo_n
        b.block = -(-b.total // n) if b.total else 1
        size = b.block * n
        b.flat = torch.zeros(size, dtype=b.dtype, device=b.device)
        wire = b.dtype
        comp = self._kolo_compression
        if comp not in (Compression.none, Compression.fp16, Compression.bf16):
            raise ValueError("ZeroRedundancyOptimizer: compression must be "
                             "Compression.none, Compression.fp16 or "
                             "Compression.bf16")
        if comp is not Compression.none and b.dtype == torch.float32:
            # float32 gradients reduced in 16 bits; updates in float32
            wire = (torch.float16 if comp is Compression.fp16
                    else torch.bfloat16)
        b.grad = torch.zeros(size, dtype=wire, device=b.device)
        lo, hi = self._kolo_rank * b.block, (self._kolo_rank + 1) * b.block
        b.mine = b.flat[lo:hi]
        b.mine_grad = b.grad[lo:hi]
        if wire != b.dtype:
            b.wire_grad32 = torch.zeros(b.block, dtype=b.dtype,
                                        device=b.device)
        with torch.no_grad():
            for p, off, k in b.params:
                view = b.flat[off:off + k]
                view.copy_(p.detach().reshape(-1))
                p.data = view.view_as(p)
                self._kolo_slot[id(p)] = (b, off, k)

    def _kolo_hook(self, params):
        with torch.enable_grad():
            for p in params:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._kolo_make_hook(p))
                self._kolo_grad_accs.append(acc)

    def _kolo_make_hook(self, p):
        # A weak reference: no cycle through the accumulators' hooks, so an
        # optimizer the program drops is gone at once, on every rank alike
        # (hvd.join() stands in for the live ones), and its hooks do
        # nothing afterwards.
        me = weakref.ref(self)

        def hook(*_ignored):
            opt = me()
            if opt is not None:
                opt._kolo_on_grad(p)
        return hook

    def _kolo_describe(self):
        return [(gi, [(self._kolo_names[id(p)], tuple(p.shape),
                       str(p.dtype), p.device.type) for p in g["params"]
                      if p.requires_grad])
                for gi, g in enumerate(self.param_groups)]

    def _kolo_check_layout(self, first_group):
        """The ranks must shard the same parameters the same way: every
        rank compares its description with every other's, and all raise
        the same error naming the first difference."""
        if not self._kolo_included or self._kolo_n == 1:
            return
        if _core.elastic():
            # A worker added to a running elastic job builds its optimizer
            # alone; the layouts are compared when the state is rebuilt
            # (TorchState's sync), and the model comes from rank 0.
            self._kolo_checked = True
            return
        mine = self._kolo_describe()[first_group:]
        all_ = allgather_object(
            mine, "zero%d.layout.%d" % (self._kolo_id, first_group),
            self.process_set)
        ranks = self.process_set.ranks
        for r, other in enumerate(all_):
            if _shapes(other) == _shapes(all_[0]):
                continue
            raise ValueError(
                "ZeroRedundancyOptimizer: the ranks do not have the same "
                "parameters: %s" % _first_difference(ranks[0], all_[0],
                                                     ranks[r], other))

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
        kd = mpi_ops._kdtype(t, "ZeroRedundancyOptimizer")
        place = mpi_ops._place(t)
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
                              stream=mpi_ops._order_on(t))

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
            mpi_ops._wait_all(handles, self._kolo_end_round)
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

    # ---- rounds: what lets a rank that ran out of data (hvd.join) stand in

    def _kolo_allreduce(self, what, t, op):
        """An allreduce of the optimizer's own in place (every rank of the
        set takes part, a joined one too: while_joined)."""
        opts, _ = _core.make_opts(op, process_set=self.process_set)
        opts.while_joined = 1
        key = "zero%d.%s" % (self._kolo_id, what)
        h = _core.allreduce_async(key, t.data_ptr(), t.data_ptr(), t.numel(),
                                  mpi_ops._kdtype(t, key), opts)
        return _core.register([h], (t,), None, what=key)

    def _kolo_flag(self, what, values):
        t = torch.tensor(values, dtype=torch.float64)
        return t, self._kolo_allreduce(what, t, _core.Max)

    def _kolo_start_round(self):
        """Every step of a rank that trains begins with a round flag, an
        allreduce (Max) of one entry per rank, 1 where the rank trains: a
        rank that has joined sends zeros and learns from it whether anyone
        still trains, and so whether to stand in for this step. It is
        negotiated with the first bucket."""
        if self._kolo_round is None and self._kolo_n > 1:
            v = [0.0] * self._kolo_n
            v[self._kolo_rank] = 1.0
            self._kolo_round = self._kolo_flag("round", v)

    def _kolo_end_round(self):
        if self._kolo_round is None:
            self._kolo_start_round()
            if self._kolo_round is None:
                return
        (t, h), self._kolo_round = self._kolo_round, None
        _core.synchronize(h)
        self._kolo_everyone = all(x > 0 for x in t.tolist())

    def _kolo_hyper_slots(self):
        """(group, key) of every numeric hyper-parameter (a number or a
        tuple of numbers), in a fixed order: what a rank that stands in
        takes from the others (their learning rate)."""
        def numeric(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool)
        for g in self.param_groups:
            for k in sorted(g):
                v = g[k]
                if k != "params" and (numeric(v) or (
                        isinstance(v, (tuple, list)) and v and
                        all(numeric(x) for x in v))):
                    yield g, k

    def _kolo_hyper_values(self):
        out = []
        for g, k in self._kolo_hyper_slots():
            v = g[k]
            out.extend(float(x) for x in (v if isinstance(v, (tuple, list))
                                          else [v]))
        return out

    def _kolo_set_hyper_values(self, values):
        it = iter(values)
        for g, k in list(self._kolo_hyper_slots()):
            v = g[k]
            if isinstance(v, (tuple, list)):
                g[k] = type(v)(type(x)(next(it)) for x in v)
            else:
                g[k] = type(v)(next(it))

    # What the ranks that train announce in a round where some rank has
    # joined (the joined rank follows, doing its part of each).
    _INF, _CLIP, _STEP, _SKIP = 1.0, 2.0, 3.0, 4.0

    def _kolo_announce(self, code, x=0.0, y=0.0, joined=False):
        """An allreduce (Max) of [code, x, y, hyper-parameters...]: the
        ranks that train send what they do next; a joined rank sends -inf
        everywhere and gets it."""
        hyper = self._kolo_hyper_values()
        if joined:
            v = [float("-inf")] * (3 + len(hyper))
        else:
            v = [code, float(x), float(y)] + hyper
        t, h = self._kolo_flag("announce", v)
        _core.synchronize(h)
        return t.tolist()

    def _kolo_partial(self):
        return self._kolo_n > 1 and not self._kolo_everyone

    def _kolo_agree_inf(self, found_inf, agree, inv_scale):
        """GradScaler's decision, made after it unscaled this rank's blocks
        by inv_scale: where a rank has joined, it unscales and checks its
        blocks too, and the ranks agree over the round's flags; otherwise
        with the scaler's own allreduce `agree`."""
        if not self._kolo_partial():
            return agree(found_inf)
        self._kolo_announce(self._INF, inv_scale)
        t, h = self._kolo_flag("inf", [1.0 if found_inf else 0.0])
        _core.synchronize(h)
        return t.tolist()[0] > 0

    def _kolo_stand_in(self):
        """One round of a rank that has joined: returns False when every
        rank of the set has joined, else takes part in the step of the
        ranks that train: zeros for gradients, then what they announce
        (unscaling and checking its blocks for GradScaler, clipping them,
        the update of its blocks with their hyper-parameters and the
        allgather, or nothing for a skipped step)."""
        t, h = self._kolo_flag("round", [0.0] * self._kolo_n)
        _core.synchronize(h)
        if not any(x > 0 for x in t.tolist()):
            return False  # every rank has joined
        self._kolo_everyone = False
        for b in self._kolo_buckets:
            b.grad.zero_()
            self._kolo_reduce(b)
        mpi_ops._wait_all([b.handle for b in self._kolo_buckets])
        for b in self._kolo_buckets:
            b.handle = None
        self._kolo_set_block_grads()
        while True:
            got = self._kolo_announce(0, joined=True)
            code = got[0]
            if code == self._INF:
                grads = self._kolo_block_grads()
                with torch.no_grad():
                    for g in grads:
                        g.mul_(got[1])
                bad = any(not bool(torch.isfinite(g).all()) for g in grads)
                t, h = self._kolo_flag("inf", [1.0 if bad else 0.0])
                _core.synchronize(h)
            elif code == self._CLIP:
                self._kolo_clip(got[1], got[2])
            elif code == self._STEP:
                self._kolo_set_hyper_values(got[3:])
                break
            else:
                for b in self._kolo_buckets:
                    b.mine.grad = None
                return True  # the others skipped the step (GradScaler)
        self._kolo_push_hyper()
        self.optim.step()
        for b in self._kolo_buckets:
            b.mine.grad = None
        self._kolo_gather()
        return True

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
        mpi_ops._wait_all([self._kolo_enqueue("ag", b, _core.allgather_into_async,
                                      b.mine, b.flat)
                   for b in self._kolo_buckets])

    def _kolo_check_views(self):
        """The parameters must still be views of their buckets: a model
        moved or converted after the optimizer was built (model.to(),
        .half(), p.data = ...) would silently stop being updated."""
        for b in self._kolo_buckets:
            base = b.flat.data_ptr()
            esize = b.flat.element_size()
            for p, off, _ in b.params:
                if p.data_ptr() != base + off * esize or p.dtype != b.dtype:
                    raise RuntimeError(
                        "ZeroRedundancyOptimizer: parameter '%s' was moved or "
                        "replaced after the optimizer was built (model.to(), "
                        ".half(), an assignment to .data): the optimizer "
                        "updates the memory it laid out; build it after "
                        "moving or converting the model"
                        % self._kolo_names[id(p)])

    def _kolo_check_values(self):
        """Before the first update: the parameters must be the same on
        every rank (each rank updates its blocks from its own values), so
        the ranks compare a checksum of every bucket."""
        self._kolo_checked = True
        if self._kolo_n == 1:
            return
        sums = []
        for b in self._kolo_buckets:
            raw = b.flat.detach()
            if raw.element_size() == 8:
                raw = raw.view(torch.int64)
                sums.append(int((raw & 0xffffffff).sum()) +
                            int((raw >> 32).sum()) * 7)
            elif raw.element_size() == 4:
                sums.append(int(raw.view(torch.int32).to(torch.int64).sum()))
            elif raw.element_size() == 2:
                sums.append(int(raw.view(torch.int16).to(torch.int64).sum()))
            else:
                sums.append(int(raw.view(torch.uint8).to(torch.int64).sum()))
        all_ = allgather_object(sums, name="zero%d.values" % self._kolo_id,
                                process_set=self.process_set)
        ranks = self.process_set.ranks
        for r, other in enumerate(all_):
            diff = [i for i, (a, c) in enumerate(zip(all_[0], other))
                    if a != c]
            if diff:
                b = self._kolo_buckets[diff[0]]
                names = [self._kolo_names[id(p)] for p, _, _ in b.params]
                raise ValueError(
                    "ZeroRedundancyOptimizer: the parameters differ between "
                    "rank %d and rank %d at the first step (%s%s); each rank "
                    "updates its share from its own values, so they must "
                    "start the same: call kolo.torch.broadcast_parameters("
                    "model.state_dict(), root_rank=0) before training"
                    % (ranks[0], ranks[r], ", ".join(names[:4]),
                       ", ..." if len(names) > 4 else ""))

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

    # ---- state -------------------------------------------------------------

    def _kolo_index(self):
        """Every parameter of the groups -> its index in a state dict (the
        numbering of torch.optim.Optimizer.state_dict)."""
        out, i = {}, 0
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) not in out:
                    out[id(p)] = i
                    i += 1
        return out

    def consolidate_state_dict(self, to=0):
        """Gathers the state of every parameter on rank `to` (a global
        rank, as Horovod's root_rank; every rank of the set calls it), where
        state_dict() then returns it in the format of the wrapped
        optimizer's own state_dict(): the same as a DistributedOptimizer's
        or a single process's, loadable into either or into a
        ZeroRedundancyOptimizer of any number of ranks."""
        ranks = self.process_set.ranks
        if self._kolo_included and to not in ranks:
            raise ValueError("consolidate_state_dict(to=%d): rank %d is not "
                             "in the process set %s" % (to, to, ranks))
        local = self.optim.state_dict()
        index = self._kolo_index()
        me = _core.rank() == to
        state = {}
        for b in self._kolo_buckets:
            # The local index of b's block: buckets in order, as built.
            bstate = local["state"].get(self._kolo_local_index(b), {})
            keys = sorted(bstate)
            full = {}
            for key in keys:
                v = bstate[key]
                if torch.is_tensor(v) and v.dim() == 1 and \
                        v.numel() == b.block and self._kolo_n > 1:
                    out = torch.empty(b.block * self._kolo_n, dtype=v.dtype,
                                      device=v.device)
                    v = v.contiguous()
                    opts, _ = _core.make_opts(process_set=self.process_set,
                                              place=mpi_ops._place(v))
                    h = _core.allgather_into_async(
                        "zero%d.state.%d.%s" % (self._kolo_id, b.index, key),
                        v.data_ptr(), out.data_ptr(), b.block,
                        mpi_ops._kdtype(v, "consolidate_state_dict"), opts)
                    _core.synchronize(_core.register([h], (v, out), None))
                    full[key] = out
                else:
                    full[key] = v
            if me:
                for p, off, k in b.params:
                    st = {}
                    for key, v in full.items():
                        if torch.is_tensor(v) and v.dim() == 1 and \
                                v.numel() == b.block * self._kolo_n:
                            st[key] = v[off:off + k].clone().view_as(p)
                        elif torch.is_tensor(v):
                            st[key] = v.clone()
                        else:
                            st[key] = v
                    if st:
                        state[index[id(p)]] = st
        if not me:
            self._kolo_consolidated = (to, None)
            return
        groups = []
        for g, lg in zip(self.param_groups, local["param_groups"]):
            d = {k: v for k, v in lg.items() if k != "params"}
            d["params"] = [index[id(p)] for p in g["params"]]
            groups.append(d)
        self._kolo_consolidated = (to, {"state": state,
                                        "param_groups": groups})

    def _kolo_broadcast_state(self, root_rank):
        """broadcast_optimizer_state: root_rank's hyper-parameters and the
        state of every parameter, on every rank of the set."""
        if not self._kolo_included:
            return
        self.consolidate_state_dict(to=root_rank)
        sd = self.state_dict() if _core.rank() == root_rank else None
        sd = broadcast_object(sd, root_rank, "zero%d.broadcast" %
                              self._kolo_id, self.process_set)
        self.load_state_dict(sd)

    def _kolo_local_index(self, b):
        i = 0
        for lg_index, lg in enumerate(self.optim.param_groups):
            for t in lg["params"]:
                if t is b.mine:
                    return i
                i += 1
        raise AssertionError("bucket %d has no block in the optimizer"
                             % b.index)

    def state_dict(self):
        """The state of every parameter, on the rank that
        consolidate_state_dict(to) named; an error elsewhere (as torch's
        ZeroRedundancyOptimizer)."""
        c = self._kolo_consolidated
        if c is None or c[1] is None:
            to = 0 if c is None else c[0]
            raise RuntimeError(NOT_CONSOLIDATED % (
                to, to, _core.rank(),
                "" if c is None else
                ", which consolidated on rank %d" % c[0]))
        return c[1]

    def load_state_dict(self, state_dict):
        """Loads a full state dict (consolidated by a ZeroRedundancyOptimizer
        of any number of ranks, or the state_dict() of the plain optimizer
        or a DistributedOptimizer) on every rank: each keeps the state of
        its blocks, and the hyper-parameters of every group."""
        self._kolo_drain()
        self._kolo_reset()
        self._synchronized = False
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has %d parameter groups, the "
                             "optimizer %d" % (len(groups),
                                               len(self.param_groups)))
        index = self._kolo_index()
        by_index = {}
        for g, sg in zip(self.param_groups, groups):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError("loaded state dict contains a parameter "
                                 "group that doesn't match the size of "
                                 "optimizer's group")
            for p, i in zip(g["params"], sg["params"]):
                by_index[index[id(p)]] = i
        full_state = state_dict["state"]
        local_state = {}
        for b in self._kolo_buckets:
            lo, hi = self._kolo_rank * b.block, (self._kolo_rank + 1) * b.block
            block = {}
            states = []
            for p, off, k in b.params:
                st = full_state.get(by_index[index[id(p)]])
                if st is None:
                    st = full_state.get(str(by_index[index[id(p)]]))
                if st:
                    states.append((p, off, k, st))
            per_element = _per_element_keys(states)
            for p, off, k, st in states:
                a, z = max(off, lo), min(off + k, hi)
                for key, v in st.items():
                    if key in per_element:
                        t = block.get(key)
                        if t is None:
                            t = block[key] = torch.zeros(
                                b.block, dtype=v.dtype, device=b.device)
                        if a < z:
                            t[a - lo:z - lo].copy_(
                                v.reshape(-1)[a - off:z - off])
                    elif key not in block:
                        block[key] = v.clone() if torch.is_tensor(v) else v
            if block:
                local_state[self._kolo_local_index(b)] = block
        local_groups = []
        i = 0
        for sg, lg in zip(groups, self.optim.param_groups):
            d = {k: v for k, v in sg.items() if k != "params"}
            d["params"] = list(range(i, i + len(lg["params"])))
            i += len(lg["params"])
            local_groups.append(d)
        self.optim.load_state_dict({"state": local_state,
                                    "param_groups": local_groups})
        self._kolo_pull_hyper()

    # ---- elastic training (TorchState: kolo/torch/elastic/state.py) ------

    def _kolo_block_state(self):
        """bucket index -> (per-element state of this rank's block: {key:
        tensor}, the rest: {key: value})."""
        local = self.optim.state_dict()["state"]
        out = {}
        for b in self._kolo_buckets:
            st = local.get(self._kolo_local_index(b), {})
            elem, rest = {}, {}
            for k, v in st.items():
                if torch.is_tensor(v) and v.dim() == 1 and \
                        v.numel() == b.block:
                    elem[k] = v.detach().clone()
                else:
                    rest[k] = v.clone() if torch.is_tensor(v) else v
            out[b.index] = (elem, rest)
        return out

    def _kolo_snapshot(self, exchange):
        """A commit: a copy of this rank's blocks' state, and (exchange:
        a collective every rank makes) of its partner's (_partner_offset:
        the same local rank on the next host), so that the
        state committed survives the loss of any one rank."""
        if not self._kolo_included:
            return
        self._kolo_drain()
        own = self._kolo_block_state()
        succ = None
        n, r = self._kolo_n, self._kolo_rank
        partner = _partner_offset(self.process_set, n)
        if exchange and n > 1:
            succ = {}
            for b in self._kolo_buckets:
                elem = own[b.index][0]
                got = {}
                for k in sorted(elem):
                    v = elem[k]
                    rows = v.reshape(-1, 1)
                    splits = [0] * n
                    splits[(r - partner) % n] = b.block
                    h = mpi_ops.alltoall_async(
                        rows, splits, name="zero%d.commit.%d.%s" % (
                            self._kolo_id, b.index, k),
                        process_set=self.process_set)
                    out, _ = _core.synchronize(h)
                    got[k] = out.reshape(-1)
                succ[b.index] = got
        self._kolo_snap = {"n": n, "rank": r, "own": own, "succ": succ,
                           "committed": exchange, "partner": partner,
                           "totals": [b.total for b in self._kolo_buckets]}
        self._kolo_need_state = False

    def _kolo_relayout(self):
        """After the job re-formed with another number of ranks (or this
        worker another rank): buckets, blocks and the wrapped optimizer
        laid out anew (the parameters keep their values; the state comes
        back with _kolo_rebuild_state)."""
        self._kolo_drain()
        self._kolo_reset()
        self._synchronized = False
        self._kolo_n = _core.set_size(self.process_set)
        self._kolo_rank = _core.set_rank(self.process_set)
        self._kolo_everyone = True
        self._kolo_checked = True  # the model is synchronized by the state
        for b in self._kolo_buckets:
            self._kolo_make_bucket(b)
        self._kolo_push_hyper()
        groups = []
        for gi, g in enumerate(self.optim.param_groups):
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = [b.mine for b in self._kolo_buckets
                           if b.group == gi]
            groups.append(d)
        self.optim = self.optimizer_class(groups, **self._kolo_defaults)
        self._kolo_need_state = True

    def _kolo_rebuild_state(self):
        """Every rank of the new job (a collective): the committed state of
        every block, gathered from the ranks that hold it (each kept its
        own and its partner's at the last commit), laid out in this job's
        blocks; the hyper-parameters are rank 0's now (as
        broadcast_optimizer_state from rank 0 would give)."""
        self._kolo_drain()
        snap = getattr(self, "_kolo_snap", None)
        meta = None
        if snap is not None:
            meta = {"n": snap["n"], "rank": snap["rank"],
                    "committed": snap["committed"],
                    "totals": snap["totals"],
                    "keys": {i: sorted(e) for i, (e, _) in
                             snap["own"].items()},
                    "rest": {i: r for i, (_, r) in snap["own"].items()}}
        hyper = [{k: v for k, v in g.items() if k != "params"}
                 for g in self.param_groups]
        every = allgather_object((meta, hyper),
                                 name="zero%d.rebuild" % self._kolo_id,
                                 process_set=self.process_set)
        hyper0 = every[0][1]
        for g, h in zip(self.param_groups, hyper0):
            g.update(h)
        metas = [m for m, _ in every if m is not None]
        # Committed snapshots win; a worker's first (taken when its state
        # was made, before any commit) counts only where none was
        # committed (the job's first start, maybe from a checkpoint).
        if any(m["committed"] for m in metas):
            metas = [m for m in metas if m["committed"]]
        local = {}
        if metas:
            old_n = metas[0]["n"]
            if any(m["n"] != old_n for m in metas):
                raise RuntimeError(
                    "ZeroRedundancyOptimizer: the workers' committed states "
                    "come from jobs of different sizes (%s)"
                    % sorted({m["n"] for m in metas}))
            totals = metas[0]["totals"]
            keys = metas[0]["keys"]
            for b in self._kolo_buckets:
                if b.total != totals[b.index]:
                    raise RuntimeError(
                        "ZeroRedundancyOptimizer: bucket %d holds %d elements "
                        "here and %d in the committed state"
                        % (b.index, b.total, totals[b.index]))
                old_block = -(-b.total // old_n) if b.total else 1
                elem = {}
                for k in keys.get(b.index, []):
                    elem[k] = self._kolo_gather_committed(
                        b, k, old_n, old_block, snap, metas[0]["committed"])
                rest = metas[0]["rest"].get(b.index, {})
                st = dict(rest)
                lo = self._kolo_rank * b.block
                for k, full in elem.items():
                    t = torch.zeros(b.block, dtype=full.dtype,
                                    device=b.device)
                    z = min(lo + b.block, b.total)
                    if lo < z:
                        t[:z - lo].copy_(full[lo:z])
                    st[k] = t
                if st:
                    local[self._kolo_local_index(b)] = st
        groups, i = [], 0
        for g, lg in zip(self.param_groups, self.optim.param_groups):
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(i, i + len(lg["params"])))
            i += len(lg["params"])
            groups.append(d)
        self.optim.load_state_dict({"state": local, "param_groups": groups})
        self._kolo_pull_hyper()
        self._kolo_need_state = False
        # the state now laid out is committed: the snapshot follows it
        self._kolo_snapshot(exchange=True)

    def _kolo_gather_committed(self, b, key, old_n, old_block, snap,
                               committed):
        """Bucket b's per-element state `key` as committed, all of it: each
        rank adds the old blocks it holds and says which (an allreduce of
        both); a block held twice is the same twice, so the sum divided by
        the count is exact."""
        values = torch.zeros(old_n * old_block, dtype=torch.float64)
        have = torch.zeros(old_n, dtype=torch.float64)
        dtype = None
        if snap is not None and snap["n"] == old_n and \
                snap["committed"] == committed:
            blocks = [(snap["rank"], snap["own"].get(b.index, ({}, {}))[0])]
            if snap["succ"] is not None:
                blocks.append(((snap["rank"] + snap["partner"]) % old_n,
                               snap["succ"].get(b.index, {})))
            for r, held in blocks:
                v = held.get(key)
                if v is None:
                    continue
                dtype = v.dtype
                values[r * old_block:(r + 1) * old_block] += \
                    v.double().cpu()
                have[r] += 1
        both = torch.cat([values, have])
        mpi_ops.allreduce_(both, op=Sum,
                           name="zero%d.rebuild.%d.%s" % (self._kolo_id,
                                                          b.index, key),
                           process_set=self.process_set)
        values, have = both[:-old_n], both[-old_n:]
        lost = [r for r in range(old_n) if have[r] == 0]
        if lost:
            raise RuntimeError(
                "ZeroRedundancyOptimizer: the committed optimizer state of "
                "the blocks of the job's former rank(s) %s is lost (each "
                "rank's block is kept by it and by the rank with the same "
                "local rank on the host before it; both are gone): restart "
                "from a checkpoint"
                % ", ".join(str(r) for r in lost))
        counts = have.repeat_interleave(old_block)
        full = (values / counts)[:b.total]
        like = dtype or b.dtype
        return full.to(dtype=like, device=b.device)

    def __repr__(self):
        return "ZeroRedundancyOptimizer(%s, %d ranks, %d buckets)" % (
            self.optimizer_class.__name__, self._kolo_n,
            len(self._kolo_buckets))


def join_sharded(runtime_join):
    """hvd.join() on a rank that has sharded optimizers: the rank joins in
    the runtime (the others' allreduces get its zeros) and, at the same
    time, each of its sharded optimizers stands in for the steps the others
    still take (one thread each: the others may step them in any order),
    until every rank has joined. Returns runtime_join()'s answer."""
    active = [o for _, o in sorted(_live.items())
              if o._kolo_included and o._kolo_n > 1 and _registered(o)]
    if not active:
        return runtime_join()
    out, errors = {}, []

    def joined():
        try:
            out["last"] = runtime_join()
        except BaseException as e:  # noqa: B902 (re-raised below)
            errors.append(e)

    def stand_in(o):
        try:
            if o._kolo_fired:
                raise ValueError("join() while backward passes are pending "
                                 "on a ZeroRedundancyOptimizer: call step() "
                                 "first")
            while o._kolo_stand_in():
                pass
            o._kolo_everyone = True
        except BaseException as e:  # noqa: B902
            errors.append(e)

    threads = [threading.Thread(target=joined, daemon=True)]
    threads += [threading.Thread(target=stand_in, args=(o,), daemon=True)
                for o in active]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out["last"]


def _partner_offset(process_set, n):
    """Which rank keeps a copy of rank r's share at a commit: r - k, k being
    the number of ranks per host when every host has as many and there are
    several hosts (so the copy is on another host: a host lost whole loses
    nothing), else 1."""
    if process_set.ranks != list(range(_core.size())):
        return 1
    local = _core.local_size()
    if 1 <= local < n and n % local == 0 and _core.is_homogeneous():
        return local
    return 1


def _registered(opt):
    """The optimizer's process set is still registered (a removed set's
    optimizers cannot take part in a join: removal is collective, so every
    rank leaves them out alike)."""
    try:
        return _core.set_size(opt.process_set) > 0
    except Exception:
        return False




def _per_element_keys(states):
    """The state keys that hold one value per element of the parameter
    (exp_avg, momentum_buffer...), as opposed to one per parameter (step):
    a tensor shaped like its parameter, judged on parameters of at least
    one dimension; for 0-dimensional parameters alone, every key but
    "step"."""
    keys, seen_shaped = set(), False
    for p, _, _, st in states:
        if p.dim() == 0:
            continue
        seen_shaped = True
        for key, v in st.items():
            if torch.is_tensor(v) and v.shape == p.shape:
                keys.add(key)
    if not seen_shaped:
        for p, _, _, st in states:
            for key, v in st.items():
                if torch.is_tensor(v) and v.shape == p.shape and \
                        key != "step":
                    keys.add(key)
    return keys


def _shapes(described):
    return [(gi, [x[1:] for x in ps]) for gi, ps in described]


def _first_difference(ra, a, rb, b):
    if len(a) != len(b):
        return "rank %d has %d parameter groups, rank %d has %d" % (
            ra, len(a), rb, len(b))
    for (gi, pa), (_, pb) in zip(a, b):
        if len(pa) != len(pb):
            return ("group %d: rank %d has %d parameters that require "
                    "gradients, rank %d has %d" % (gi, ra, len(pa), rb,
                                                   len(pb)))
        for x, y in zip(pa, pb):
            if x[1:] != y[1:]:
                return ("group %d: parameter '%s' is %s %s on rank %d, "
                        "parameter '%s' is %s %s on rank %d"
                        % (gi, x[0], x[2], list(x[1]), ra, y[0], y[2],
                           list(y[1]), rb))
    return "(no difference found)"

