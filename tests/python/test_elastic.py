"""Elastic training, the Python side (kolo.elastic, kolo.torch.elastic):
everything that runs for real without kolorun's elastic mode.

 * ElasticSampler: after k batches recorded, any number of ranks partitions
   exactly the rest of the epoch; the order of seed + epoch; state_dict.
 * ObjectState and TorchState: save, restore and sync of plain values, of a
   real model, optimizer, sampler and LR scheduler.
 * run(): the order of the recovery (restore, shutdown, init, reset
   callbacks, sync, call again) after a failed collective and after
   HostsUpdatedInterrupt, with the real shutdown() and init() of this job.
 * check_host_updates(): rank 0's kolo_hosts_updated() decides for every
   rank. The function's answer is monkeypatched: kolorun's elastic mode,
   which makes it non-zero, is not used by these tests.
"""

import math
import random

import numpy as np
import pytest

import kolo
from kolo import _core, _lib

torch = pytest.importorskip("torch")
import kolo.torch as hvd  # noqa: E402
from kolo.torch.elastic import sampler as sampler_mod  # noqa: E402


def _gather(obj):
    return kolo.allgather_object(obj, name="test_elastic.gather")


def _order(n, seed, epoch, shuffle=True):
    order = list(range(n))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    return order


# ---- API --------------------------------------------------------------------


def test_api():
    for name in ("run", "State", "ObjectState", "TorchState",
                 "ElasticSampler"):
        assert hasattr(hvd.elastic, name), name
    for name in ("run", "State", "ObjectState"):
        assert hasattr(kolo.elastic, name), name
    assert hvd.elastic.State is kolo.elastic.State
    assert issubclass(hvd.elastic.TorchState, kolo.elastic.State)
    assert hvd.HostsUpdatedInterrupt is kolo.HostsUpdatedInterrupt
    assert hvd.HorovodInternalError is kolo.KoloError
    assert kolo.HostsUpdatedInterrupt().skip_sync is False
    assert kolo.HostsUpdatedInterrupt(True).skip_sync is True
    # not an elastic job (kolorun without --min-np)
    assert _core.elastic() is False
    assert _core.hosts_updated() == 0
    assert _core.elastic_generation() == 0


# ---- ElasticSampler ---------------------------------------------------------


class _Ranks:
    """Makes the sampler see another job: `size` ranks, this one `rank`."""

    def __init__(self, monkeypatch):
        self.mp = monkeypatch

    def __call__(self, r, n):
        self.mp.setattr(sampler_mod, "rank", lambda: r)
        self.mp.setattr(sampler_mod, "size", lambda: n)


def _partition(state, dataset, n, ranks, shuffle=True, seed=0):
    """Every rank's iteration at n ranks after load_state_dict(state)."""
    lists = []
    for r in range(n):
        ranks(r, n)
        s = hvd.elastic.ElasticSampler(dataset, shuffle=shuffle, seed=seed)
        s.load_state_dict(state)
        lists.append(list(s))
        assert len(s) == len(lists[-1])
    return lists


def _check_covers(lists, tail, n):
    """The n lists partition `tail`: each index of it once, plus the padding
    (repeats of its head) that makes the lists equally long."""
    total = int(math.ceil(len(tail) / n)) * n if tail else 0
    flat = [i for lst in lists for i in lst]
    assert len(flat) == total
    assert all(len(lst) == total // n for lst in lists)
    assert set(flat) == set(tail)
    pad = total - len(tail)
    counts = {}
    for i in flat:
        counts[i] = counts.get(i, 0) + 1
    assert sorted(i for i, c in counts.items() for _ in range(c - 1)) == \
        sorted(tail[:pad])


@pytest.mark.parametrize("shuffle", [True, False])
def test_sampler_partitions_the_unprocessed_tail(rank, size, monkeypatch,
                                                 shuffle):
    n_data, b, k = 203, 4, 5
    dataset = list(range(n_data))
    s = hvd.elastic.ElasticSampler(dataset, shuffle=shuffle, seed=7)
    assert s.num_replicas == size and s.rank == rank
    mine = list(s)
    assert len(s) == len(mine) == int(math.ceil(n_data / size))
    done = []
    for batch in range(k):
        done += mine[batch * b:(batch + 1) * b]
        s.record_batch(batch, b)
    # the ranks processed exactly the first k*b*size of the epoch's order
    everyone = [i for lst in _gather(done) for i in lst]
    order = _order(n_data, 7, 0, shuffle)
    assert sorted(everyone) == sorted(order[:k * b * size])
    assert len(set(everyone)) == len(everyone)
    state = s.state_dict()
    assert state == {"epoch": 0, "processed_num": k * b * size}
    tail = order[k * b * size:]
    ranks = _Ranks(monkeypatch)
    for n in range(1, 7):  # any new number of ranks
        lists = _partition(state, dataset, n, ranks, shuffle, seed=7)
        _check_covers(lists, tail, n)
        # and again after k2 more batches at n ranks
        k2 = min(3, len(tail) // (b * n))  # batches without the padding
        assert k2 >= 1
        state2 = dict(state, processed_num=state["processed_num"] + k2 * b * n)
        processed = [i for lst in lists for i in lst[:k2 * b]]
        assert sorted(processed) == sorted(tail[:k2 * b * n])
        for m in (1, 2, 5):
            _check_covers(_partition(state2, dataset, m, ranks, shuffle,
                                     seed=7), tail[k2 * b * n:], m)
    # record_batch counts batches of the job's size at the time
    ranks(0, 3)
    s3 = hvd.elastic.ElasticSampler(dataset, shuffle=shuffle, seed=7)
    s3.load_state_dict(state)
    s3.record_batch(0, b)
    assert s3.processed_num == state["processed_num"] + 3 * b


def test_sampler_fewer_samples_left_than_ranks(monkeypatch):
    ranks = _Ranks(monkeypatch)
    dataset = list(range(10))
    state = {"epoch": 2, "processed_num": 9}
    lists = _partition(state, dataset, 4, ranks)
    assert lists == [[_order(10, 0, 2)[9]]] * 4
    assert _partition({"epoch": 2, "processed_num": 12}, dataset, 3,
                      ranks) == [[], [], []]


def test_sampler_order_is_seed_plus_epoch(rank, size):
    dataset = list(range(50))
    s = hvd.elastic.ElasticSampler(dataset, seed=3)
    first = list(s)
    assert _gather(s.remaining_indices) == [_order(50, 3, 0)] * size
    assert s.remaining_indices != list(range(50))
    mine = _gather(first)
    _check_covers(mine, _order(50, 3, 0), size)
    # the same epoch again: the same order
    assert list(hvd.elastic.ElasticSampler(dataset, seed=3)) == first
    s.record_batch(0, 5)
    s.set_epoch(1)
    assert s.processed_num == 0
    assert s.remaining_indices == _order(50, 3, 1) != _order(50, 3, 0)
    # seed 4, epoch 0 is seed 3, epoch 1 (Horovod's seed + epoch)
    assert hvd.elastic.ElasticSampler(dataset, seed=4).remaining_indices == \
        s.remaining_indices
    unshuffled = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    assert unshuffled.remaining_indices == list(range(50))
    padded = list(range(50)) + list(range(50))[:len(unshuffled) * size - 50]
    assert list(unshuffled) == padded[rank::size]


def test_sampler_state_dict_round_trip(rank, size):
    dataset = list(range(37))
    s = hvd.elastic.ElasticSampler(dataset, seed=11)
    s.set_epoch(4)
    list(s)
    s.record_batch(0, 2)
    s.record_batch(1, 2)
    t = hvd.elastic.ElasticSampler(dataset, seed=11)
    assert t.state_dict() == {"epoch": 0, "processed_num": 0}
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == {"epoch": 4, "processed_num": 4 * size}
    tail = _order(37, 11, 4)[4 * size:]
    assert t.remaining_indices == tail
    padded = tail + tail[:len(t) * size - len(tail)]
    assert list(t) == padded[rank::size]


def test_sampler_get_and_record_indices(rank, size):
    dataset = list(range(40))
    s = hvd.elastic.ElasticSampler(dataset, seed=1)
    mine = list(s)
    assert s.get_indices(0, 3) == mine[:3]
    assert s.get_indices(1, 3) == mine[3:6]
    s.record_indices(s.get_indices(0, 3))
    assert s.processed_num == 3 * size
    with pytest.raises(ValueError, match="order"):
        s.record_indices(s.get_indices(2, 3))  # batch 1 comes first
    s.record_indices(s.get_indices(1, 3))
    t = hvd.elastic.ElasticSampler(dataset, seed=1)
    list(t)
    t.record_batch(0, 3)
    t.record_batch(1, 3)
    assert t.state_dict() == s.state_dict()


# ---- ObjectState ------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["numpy", "torch"])
def test_object_state_save_restore_sync(rank, size, flavour):
    cls = kolo.elastic.ObjectState if flavour == "numpy" \
        else hvd.elastic.ObjectState
    state = cls(epoch=0, batch=0, history=[])
    assert (state.epoch, state.batch, state.history) == (0, 0, [])
    state.epoch, state.batch = 10 + rank, 5
    state.save()
    state.epoch, state.batch, state.extra = 99, 98, "not tracked"
    state.restore()
    assert (state.epoch, state.batch) == (10 + rank, 5)
    state.epoch = 50 + rank  # current, not saved: sync ignores it
    state.sync()
    assert (state.epoch, state.batch) == (10, 5)  # rank 0's last save
    assert _gather((state.epoch, state.batch)) == [(10, 5)] * size
    state.extra = rank
    state.save()
    state.sync()
    assert state.extra == rank  # added after construction: not state


def test_object_state_explicit_broadcast():
    calls = []

    def bcast(obj):
        calls.append(obj)
        return kolo.broadcast_object(obj, 0, name="test_elastic.bcast")
    state = kolo.elastic.ObjectState(bcast, kolo.rank, a=1)
    state.sync()
    assert calls == [{"a": 1}]
    empty = kolo.elastic.ObjectState(bcast, kolo.rank)
    empty.sync()  # nothing to broadcast
    assert calls == [{"a": 1}]


# ---- TorchState -------------------------------------------------------------


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2))


def _step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 4, generator=g)
    y = torch.randn(16, 2, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def _snapshot(model, opt):
    w = {k: v.clone() for k, v in model.state_dict().items()}
    o = {i: {k: (v.clone() if torch.is_tensor(v) else v)
             for k, v in st.items()}
         for i, st in opt.state_dict()["state"].items()}
    return w, o, [dict((k, v) for k, v in g.items() if k != "params")
                  for g in opt.state_dict()["param_groups"]]


def _same(a, b):
    wa, oa, ga = a
    wb, ob, gb = b
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert oa.keys() == ob.keys()
    for i in oa:
        assert oa[i].keys() == ob[i].keys()
        for k in oa[i]:
            if torch.is_tensor(oa[i][k]):
                assert torch.equal(oa[i][k], ob[i][k]), (i, k)
            else:
                assert oa[i][k] == ob[i][k], (i, k)
    assert ga == gb


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_torch_state_commit_restore(rank, size, kind):
    model = _model(1)
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                           weight_decay=0.01) if kind == "sgd" else \
        torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.01)
    opt = hvd.DistributedOptimizer(base,
                                   named_parameters=model.named_parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sampler = hvd.elastic.ElasticSampler(list(range(30)))
    state = hvd.elastic.TorchState(model, opt, sampler=sampler,
                                   scheduler=sched, batch=0)
    assert state.model is model and state.optimizer is opt
    assert state.sampler is sampler and state.scheduler is sched
    _step(model, opt, 1)
    sched.step()
    sampler.record_batch(0, 2)
    state.batch = 1
    state.commit()
    committed = _snapshot(model, opt)
    lr = opt.param_groups[0]["lr"]
    for i in range(2):  # restore twice: the snapshot is not the live state
        for s in range(3):
            _step(model, opt, 10 + s)
            sched.step()
            sampler.record_batch(1 + s, 2)
            state.batch += 1
        assert opt.param_groups[0]["lr"] != lr
        state.restore()
        _same(_snapshot(model, opt), committed)
        assert sched.state_dict()["last_epoch"] == 1
        assert sched.get_last_lr() == [lr]
        assert sampler.state_dict() == {"epoch": 0, "processed_num": 2 * size}
        assert state.batch == 1
    # training goes on from the restored state, on every rank alike
    _step(model, opt, 20)
    got = _gather(_snapshot(model, opt)[0]["0.weight"].tolist())
    assert all(g == got[0] for g in got)


def test_torch_state_assigning_a_handled_value_saves_it():
    model = _model(1)
    state = hvd.elastic.TorchState(model, None, epoch=0)
    other = _model(2)
    state.model = other
    assert state.model is other
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    saved = {k: v.clone() for k, v in other.state_dict().items()}
    state.save()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    state.restore()
    for k, v in other.state_dict().items():
        assert torch.equal(v, saved[k])
    assert state.optimizer is None  # None is a plain attribute, as Horovod's


def test_torch_state_sync_makes_every_rank_rank_0s(rank, size):
    model = _model(100 + rank)  # different weights on every rank
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(30)))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler,
                                   scheduler=sched, epoch=rank)
    _step(model, opt, 3)  # the allreduce averages: momentum is the same
    with torch.no_grad():
        for p in model.parameters():
            opt.state[p]["momentum_buffer"].fill_(float(rank))
    for _ in range(rank):
        sched.step()
    sampler.record_batch(0, rank + 1)
    state.sync()
    mine = _snapshot(model, opt)
    everyone = _gather((
        {k: v.tolist() for k, v in mine[0].items()},
        {i: {k: (v.tolist() if torch.is_tensor(v) else v)
             for k, v in st.items()} for i, st in mine[1].items()},
        mine[2], sampler.state_dict(), sched.state_dict()["last_epoch"],
        state.epoch))
    assert all(e == everyone[0] for e in everyone)
    assert everyone[0][3] == {"epoch": 0, "processed_num": size}
    assert everyone[0][2][0]["lr"] == pytest.approx(0.1)
    assert everyone[0][5] == 0


def test_torch_state_sync_new_worker_without_optimizer_state(rank, size):
    """A worker that just joined has an optimizer without state: its step
    of zero gradients (which weight decay turns into a change of the
    weights) must not survive the sync: every rank ends with rank 0's
    weights and optimizer state."""
    model = _model(5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9,
                          weight_decay=0.5)
    if rank == 0:
        _step(model, opt, 1)  # rank 0 trained; the others just started
    state = hvd.elastic.TorchState(model, opt)
    state.sync()
    got = _gather(({k: v.tolist() for k, v in model.state_dict().items()},
                   {i: st["momentum_buffer"].tolist()
                    for i, st in opt.state_dict()["state"].items()}))
    assert all(g == got[0] for g in got)


# ---- DistributedOptimizer.load_state_dict -----------------------------------


def test_optimizer_load_state_dict_forgets_the_step(rank, size):
    model = _model(1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), backward_passes_per_step=2)
    saved = opt.state_dict()
    x = torch.ones(3, 4)
    model(x).sum().backward()  # pass 1 of 2
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.load_state_dict(saved)
    opt.zero_grad()  # no pass pending any more
    # a whole step afterwards: passes counted from 0
    model(x).sum().backward()
    model(x).sum().backward()
    opt.step()
    # with allreduces in flight (one pass per step)
    opt.set_backward_passes_per_step(1)
    opt.zero_grad()
    model(x).sum().backward()
    assert opt._kolo_handles
    opt.load_state_dict(saved)
    assert not opt._kolo_handles and not opt._synchronized
    assert _core.pending_count() == 0  # waited on: the names are free again
    opt.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    model(x).sum().backward()
    opt.step()  # the same names enqueued again
    assert all(not torch.equal(a, p) for a, p in zip(before,
                                                     model.parameters()))


def test_adasum_optimizer_load_state_dict_forgets_the_step(rank, size):
    if size < 2:
        pytest.skip("Adasum's own optimizer needs 2 ranks")
    model = _model(1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), op=hvd.Adasum)
    saved = opt.state_dict()
    x = torch.ones(3, 4)
    model(x).sum().backward()
    assert opt._kolo_handles
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.load_state_dict(saved)
    assert not opt._kolo_handles
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


# ---- check_host_updates -----------------------------------------------------


@pytest.mark.parametrize("update,raised,skip", [
    (0, False, None), (1, True, True), (2, True, False), (3, True, False)])
def test_check_host_updates(rank, size, monkeypatch, update, raised, skip):
    """kolo_hosts_updated() is monkeypatched (kolorun's elastic mode is not
    used here): rank 0 answers `update`, the others the opposite, and rank
    0's answer decides on every rank."""
    other = 0 if update else 2
    monkeypatch.setattr(_core, "hosts_updated",
                        lambda: update if rank == 0 else other)
    state = hvd.elastic.ObjectState(step=0)
    state.step = 5
    if not raised:
        state.commit()
    else:
        with pytest.raises(kolo.HostsUpdatedInterrupt) as e:
            state.commit()
        assert e.value.skip_sync is skip
    assert state._saved_state == {"step": 5}  # saved before the check
    state.restore()
    assert state.step == 5


def test_check_host_updates_error(rank, monkeypatch):
    monkeypatch.setattr(_core, "hosts_updated",
                        lambda: _lib.ERR_BACKEND if rank == 0 else 0)
    state = kolo.elastic.ObjectState(step=0)
    with pytest.raises(kolo.KoloError, match="membership") as e:
        state.check_host_updates()
    assert e.value.code == _lib.ERR_BACKEND


# ---- run() ------------------------------------------------------------------


class _Recorder(kolo.elastic.ObjectState):
    def __init__(self, log, **kwargs):
        self._log = log
        super().__init__(**kwargs)

    def save(self):
        self._log.append("save")
        super().save()

    def restore(self):
        self._log.append("restore")
        super().restore()

    def sync(self):
        self._log.append("sync")
        super().sync()

    def reset(self):
        self._log.append("reset")


def _record_lifecycle(monkeypatch, log):
    real_shutdown, real_init = _core.shutdown, _core.init

    def shutdown():
        log.append("shutdown")
        real_shutdown()

    def init(*args, **kwargs):
        log.append("init")
        real_init(*args, **kwargs)
    monkeypatch.setattr(_core, "shutdown", shutdown)
    monkeypatch.setattr(_core, "init", init)


def _job_works(rank, size):
    assert kolo.is_initialized()
    assert (kolo.rank(), kolo.size()) == (rank, size)
    got = kolo.allreduce(np.ones(2), op=kolo.Sum, name="test_elastic.after")
    np.testing.assert_array_equal(got, np.full(2, float(size)))


def test_run_after_a_failed_collective(rank, size, monkeypatch):
    log = []
    _record_lifecycle(monkeypatch, log)
    state = _Recorder(log, step=0)
    state.register_reset_callbacks([lambda: log.append("callback 1"),
                                    lambda: log.append("callback 2")])

    @kolo.elastic.run
    def train(state, arg, kw=None):
        log.append("func")
        if len([x for x in log if x == "func"]) == 1:
            state.step = 1
            state.commit()
            state.step = 2  # lost: the failure restores the commit
            raise kolo.KoloError("a collective failed (simulated)",
                                 _lib.ERR_RANK_LOST)
        return state.step, arg, kw

    assert train(state, "a", kw="b") == (1, "a", "b")
    assert log == ["sync", "func", "save", "restore", "shutdown", "init",
                   "reset", "callback 1", "callback 2", "sync", "func"]
    _job_works(rank, size)


def test_run_after_a_real_failure(rank, size, monkeypatch):
    """Rank 0 shuts kolo down in the middle of the function: the others'
    allreduce fails for real (HorovodInternalError), rank 0 raises one, and
    every rank recovers the committed state in a job formed again."""
    seen = []
    calls = []
    state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state):
        calls.append(state.step)
        if len(calls) == 1:
            state.step = 7
            state.commit()
            state.step = 8
            kolo.barrier()
            if rank == 0:
                import time
                time.sleep(0.2)  # the others are waiting in the allreduce
                kolo.shutdown()
                raise hvd.HorovodInternalError("rank 0 stopped")
            try:
                hvd.allreduce(torch.ones(1), name="test_elastic.doomed")
            except hvd.HorovodInternalError as e:
                seen.append(e.code)
                raise
            raise AssertionError("the allreduce did not fail")
        return hvd.allreduce(torch.tensor([float(state.step)]), op=hvd.Sum,
                             name="test_elastic.recovered").item()

    assert train(state) == 7 * size
    assert calls == [0, 7]
    if rank != 0:
        assert seen == [_lib.ERR_SHUTDOWN]
    _job_works(rank, size)


@pytest.mark.parametrize("skip_sync", [False, True])
def test_run_after_hosts_updated(rank, size, monkeypatch, skip_sync):
    log = []
    _record_lifecycle(monkeypatch, log)
    state = _Recorder(log, step=0)
    state.register_reset_callbacks([lambda: log.append("callback")])

    @kolo.elastic.run
    def train(state):
        log.append("func")
        if log.count("func") == 1:
            state.step = 3
            state.save()
            state.step = 4  # kept: an interrupt restores nothing
            raise kolo.HostsUpdatedInterrupt(skip_sync)
        return state.step

    got = train(state)
    expected = ["sync", "func", "save", "shutdown", "init", "reset",
                "callback"] + ([] if skip_sync else ["sync"]) + ["func"]
    assert log == expected
    # after a sync, rank 0's last saved value; without, the live one
    assert got == (4 if skip_sync else 3)
    _job_works(rank, size)


def test_run_commit_interrupt_through_check_host_updates(rank, size,
                                                         monkeypatch):
    answers = [2]  # rank 0 sees an addition once
    monkeypatch.setattr(_core, "hosts_updated",
                        lambda: answers.pop() if answers and rank == 0 else 0)
    calls = []

    @kolo.elastic.run
    def train(state):
        calls.append(state.batch)
        while state.batch < 3:
            state.batch += 1
            state.commit()
        return state.batch

    assert train(kolo.elastic.ObjectState(batch=0)) == 3
    assert calls == [0, 1]  # interrupted at the first commit, resumed there
    _job_works(rank, size)


def test_run_other_exceptions_propagate(rank, size):
    log = []
    state = _Recorder(log, step=0)

    @kolo.elastic.run
    def train(state):
        raise KeyError("the user's own")

    with pytest.raises(KeyError):
        train(state)
    assert log == ["sync"]
    _job_works(rank, size)


def test_run_init_retried_on_membership(rank, size, monkeypatch):
    """init() that fails with KOLO_ERR_MEMBERSHIP (a newer generation came
    while joining) is retried; KOLO_ERR_REMOVED ends the loop."""
    membership = _lib.ERR_MEMBERSHIP if _lib.ERR_MEMBERSHIP is not None \
        else -1000
    removed = _lib.ERR_REMOVED if _lib.ERR_REMOVED is not None else -1001
    monkeypatch.setattr(_lib, "ERR_MEMBERSHIP", membership)
    real_init = _core.init
    fails = [membership, membership]
    tries = []

    def init(*args, **kwargs):
        tries.append(1)
        if fails:
            raise kolo.KoloError("the job's membership changed", fails.pop())
        real_init(*args, **kwargs)
    monkeypatch.setattr(_core, "init", init)

    @kolo.elastic.run
    def train(state):
        if not tries:
            raise kolo.HostsUpdatedInterrupt(False)
        return len(tries)

    assert train(kolo.elastic.ObjectState(x=0)) == 3
    _job_works(rank, size)

    fails[:] = [removed]
    tries.clear()
    with pytest.raises(kolo.KoloError) as e:
        train(kolo.elastic.ObjectState(x=0))
    assert e.value.code == removed and len(tries) == 1
    assert not kolo.is_initialized()
    real_init()
    _job_works(rank, size)
