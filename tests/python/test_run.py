"""kolo.run (horovod.run): a function on the ranks of a new job.

Not a rank itself: tests/multi/run-launchers.sh runs this file with plain
pytest (--noconftest: no kolo.init here), and each test starts its own job
of 2 ranks through kolorun. The functions below are at the top level of
this module, which the ranks import (kolo.run gives them this process's
sys.path).
"""

import os
import signal

import pytest

import kolo


def allreduce_rank(x, scale=1):
    import numpy as np
    kolo.init()
    total = kolo.allreduce(np.array([float(kolo.rank() + 1)]), op=kolo.Sum,
                           name="total")
    out = (kolo.rank(), kolo.size(), x * scale, float(total[0]))
    kolo.shutdown()
    return out


def fail_on(bad_rank):
    kolo.init()
    if kolo.rank() == bad_rank:
        raise ValueError("deliberate failure on rank %d" % bad_rank)
    kolo.barrier()  # the others wait here, and learn that the rank is gone
    kolo.shutdown()
    return kolo.rank()


def killed_on(bad_rank):
    if int(os.environ["KOLO_RANK"]) == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


def test_returns_each_rank_value_in_rank_order():
    results = kolo.run(allreduce_rank, args=(3,), kwargs={"scale": 2}, np=2)
    assert results == [(0, 2, 6, 3.0), (1, 2, 6, 3.0)]


def test_num_proc_as_horovod_run():
    assert kolo.run(allreduce_rank, args=(1,), num_proc=2) == [
        (0, 2, 1, 3.0), (1, 2, 1, 3.0)]


def test_exception_raised_in_caller_naming_the_rank():
    with pytest.raises(kolo.RunError) as info:
        kolo.run(fail_on, args=(1,), np=2)
    e = info.value
    assert e.rank == 1
    assert isinstance(e, RuntimeError)  # as horovod.run's RuntimeError
    assert str(e).startswith("rank 1 of 2 raised ValueError: deliberate "
                             "failure on rank 1")
    assert isinstance(e.__cause__, ValueError)
    assert "raise ValueError" in e.traceback
    assert "Traceback on rank 1" in str(e)


def test_rank_killed_without_result():
    with pytest.raises(RuntimeError) as info:
        kolo.run(killed_on, args=(0,), np=2)
    assert not isinstance(info.value, kolo.RunError)
    assert "rank 0 ended without a result" in str(info.value)
    assert "killed by signal 9" in str(info.value)


def test_refusals():
    with pytest.raises(ValueError, match="elastic"):
        kolo.run(allreduce_rank, args=(1,), np=2, min_np=1)
    with pytest.raises(ValueError, match="only allow one"):
        kolo.run(allreduce_rank, args=(1,), use_gloo=True, use_mpi=True)
    with pytest.raises(ValueError, match="num_proc"):
        kolo.run(allreduce_rank, args=(1,), num_proc=2, np=3)


def test_unpicklable_function_refused_before_any_rank_starts():
    try:
        import cloudpickle  # noqa: F401
        pytest.skip("cloudpickle carries lambdas: nothing to refuse")
    except ImportError:
        pass
    with pytest.raises(TypeError, match="cannot pickle"):
        kolo.run(lambda: 1, np=2)
