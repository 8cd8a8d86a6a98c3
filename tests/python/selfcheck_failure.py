"""A deliberately failing suite, run by run-pytest.sh to check the test
harness itself: when one rank fails in the middle of a test, while the
others wait for it in a collective, the job must end (with a failure)
instead of hanging. Not collected by `pytest tests/python`."""

import numpy as np

import kolo


def test_one_rank_fails_mid_test(rank, size):
    if rank == size - 1:
        assert False, "deliberate failure on rank %d" % rank
    kolo.allreduce(np.ones(1), name="selfcheck.never")  # waits for it


def test_not_reached(rank, size):
    kolo.barrier()
