"""A ZeroRedundancyOptimizer's state dict: consolidated from every rank's
blocks on one rank in the format of the wrapped optimizer's own (loadable
into it, into a DistributedOptimizer, or into a ZeroRedundancyOptimizer of
any number of ranks), loaded back into this rank's blocks, and broadcast
(broadcast_optimizer_state)."""

import torch

from .. import _core
from ._objects import broadcast_object
from ._tensors import _kdtype, _place


NOT_CONSOLIDATED = (
    "ZeroRedundancyOptimizer.state_dict(): the state of every parameter is "
    "held by rank %d only after consolidate_state_dict(to=%d) on every rank "
    "(this rank is %d%s)")


class _StateDict:
    """ZeroRedundancyOptimizer's state dict, mixed into it: reads the
    buckets, param_groups and the wrapped optimizer (.optim); sets
    _kolo_consolidated."""

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
                                              place=_place(v))
                    h = _core.allgather_into_async(
                        "zero%d.state.%d.%s" % (self._kolo_id, b.index, key),
                        v.data_ptr(), out.data_ptr(), b.block,
                        _kdtype(v, "consolidate_state_dict"), opts)
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
