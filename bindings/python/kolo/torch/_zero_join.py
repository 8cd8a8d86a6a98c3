"""The rounds of a ZeroRedundancyOptimizer that let a rank that has run
out of data (hvd.join()) stand in for its share of the others' steps.

A rank owns blocks of the parameters that only it updates: when it has
joined, the others still need its reduce-scatter, its update and its
allgather at every step. So every step of a rank that trains begins with
a round flag, an allreduce (Max) of one entry per rank, 1 where the rank
trains; a joined rank sends zeros and learns from it whether anyone still
trains. Where some rank has joined, the ranks that train announce what
they do next (unscale and check for GradScaler, clip, step, skip) in
another small allreduce, and the joined rank follows with its blocks.
The optimizer registers with _joined.py, which runs its stand-in beside
the runtime's join."""

import torch

from .. import _core
from ._completion import _wait_all


class _JoinRounds:
    """ZeroRedundancyOptimizer's rounds, mixed into it: reads the buckets
    and the hyper-parameters of param_groups, sets _kolo_round and
    _kolo_everyone; calls the optimizer's _kolo_reduce, _kolo_clip,
    _kolo_gather and the wrapped optimizer's step."""

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
        _wait_all([b.handle for b in self._kolo_buckets])
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

    # ---- what _joined.py asks of a registered object ---------------------

    def _kolo_joining(self):
        """True where this optimizer has a part to play while this rank is
        joined: it is shared with other ranks, in a process set that is
        still registered (removing a set is collective, so every rank
        leaves its optimizers out alike)."""
        return (self._kolo_included and self._kolo_n > 1 and
                _registered(self))

    def _kolo_stand_in_all(self):
        """Stands in for this rank's share of the steps the others take,
        until every rank of the set has joined."""
        if self._kolo_fired:
            raise ValueError("join() while backward passes are pending "
                             "on a ZeroRedundancyOptimizer: call step() "
                             "first")
        while self._kolo_stand_in():
            pass
        self._kolo_everyone = True


def _registered(opt):
    """The optimizer's process set is still registered (a removed set's
    optimizers cannot take part in a join: removal is collective, so every
    rank leaves them out alike)."""
    try:
        return _core.set_size(opt.process_set) > 0
    except Exception:
        return False
