"""How a ZeroRedundancyOptimizer lays the parameters out: buckets of one
group, dtype and device, each split in n equal blocks (rank r owns block
r of every bucket), the parameters made views of their bucket, the hooks
on their gradient accumulators; and the checks that every rank laid out
the same parameters alike and starts from the same values, and that they
are still views of their buckets (zero.py's docstring tells the whole
step)."""

import weakref

import torch

from .. import _core
from ._objects import allgather_object
from .compression import Compression


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


class _Layout:
    """ZeroRedundancyOptimizer's layout, mixed into it: reads and sets
    _kolo_buckets, _kolo_slot, _kolo_grad_accs; reads _kolo_n, _kolo_rank,
    _kolo_cap, _kolo_compression, _kolo_names, _kolo_included, _kolo_id,
    process_set."""

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
