"""Shutting down: the first rank to shut down stops the job, pending work
fails on the other ranks with a clear error, and kolo can start again.
(Its own file: it stops and restarts kolo.)"""

import time

import numpy as np
import pytest

import kolo


def test_shutdown_fails_pending_work_everywhere_then_restart(rank, size):
    kolo.barrier()
    if rank == 0:
        time.sleep(0.1)  # the others have enqueued by now
        kolo.shutdown()
        assert not kolo.is_initialized()
        with pytest.raises(ValueError, match="not been initialized"):
            kolo.allreduce(np.ones(2))
        with pytest.raises(ValueError, match="not been initialized"):
            kolo.rank()
    else:
        h = kolo.allreduce_async(np.ones(2), name="never")
        with pytest.raises(kolo.KoloError, match="rank 0") as e:
            kolo.synchronize(h)
        assert e.value.code == kolo._lib.ERR_SHUTDOWN
        assert isinstance(e.value, RuntimeError)
        kolo.shutdown()
    kolo.shutdown()  # a second shutdown is harmless
    kolo.init()
    assert kolo.rank() == rank and kolo.size() == size
    got = kolo.allreduce(np.full(2, 1.0), op=kolo.Sum)
    np.testing.assert_array_equal(got, np.full(2, float(size)))


def test_after_restart(rank, size):
    torch = pytest.importorskip("torch")
    import kolo.torch as hvd
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size
