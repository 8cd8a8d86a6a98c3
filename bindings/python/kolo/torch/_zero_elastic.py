"""A ZeroRedundancyOptimizer in elastic training (TorchState:
kolo/torch/elastic/state.py): a commit keeps a copy of this rank's blocks'
state and of its partner's, so that the state committed survives the loss
of any one host; after the job re-forms with another number of ranks, the
optimizer is laid out anew and every rank rebuilds its blocks' state from
the copies the ranks hold."""

import torch

from .. import _core
from .._core import Sum
from ._allreduce import allreduce_
from ._gathers import alltoall_async
from ._objects import allgather_object


class _ElasticState:
    """ZeroRedundancyOptimizer's commits and re-layout, mixed into it:
    reads and sets _kolo_snap, _kolo_n, _kolo_rank, _kolo_need_state and
    the wrapped optimizer (.optim); calls _kolo_make_bucket (the layout)
    and _kolo_local_index (the state dict)."""

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
                    h = alltoall_async(
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
        allreduce_(both, op=Sum,
                   name="zero%d.rebuild.%d.%s" % (self._kolo_id, b.index,
                                                  key),
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
