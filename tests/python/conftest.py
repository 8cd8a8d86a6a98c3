"""pytest set-up for the multi-rank Python tests.

Each pytest process is one rank of a kolorun job (tests/python/run-pytest.sh
starts them). Every rank collects the same tests and runs them in the same
order: a test's collectives meet those of the same test on the other ranks.

 * Before each test the ranks check that they are at the same test (an
   allgather of the test's id): ranks out of step fail at once instead of
   waiting for each other.
 * When a test fails on one rank, that rank shuts kolo down (which fails
   whatever the other ranks are waiting for, instead of leaving them
   blocked) and stops after the test; the other ranks then fail fast and
   stop too. kolorun ends the job when a rank exits with a failure.
 * With KOLO_PYTEST_RESULTS=DIR every rank writes DIR/rank<R>.txt, one line
   "<outcome> <test id>" per test, for the driver's count.
"""

import os
import zlib

import pytest

import kolo

try:
    import torch
except ImportError:
    torch = None

_state = {"stopped": False, "results": None}


def pytest_configure(config):
    kolo.init()
    if torch is not None:
        torch.set_num_threads(1)
    out = os.environ.get("KOLO_PYTEST_RESULTS")
    if out:
        _state["results"] = open(
            os.path.join(out, "rank%d.txt" % kolo.rank()), "a", buffering=1)


def pytest_unconfigure(config):
    if _state["results"] is not None:
        _state["results"].close()
    if kolo.is_initialized() and not _state["stopped"]:
        try:
            kolo.barrier()  # nobody shuts the job down under a peer's feet
        except Exception:
            pass
        kolo.shutdown()


@pytest.fixture(autouse=True)
def _ranks_in_step(request):
    if _state["stopped"] or not kolo.is_initialized():
        pytest.fail("kolo was stopped after an earlier failure (here or on "
                    "another rank)")
    tag = zlib.crc32(request.node.nodeid.encode())
    tags = kolo.allgather_object(tag, name="pytest.in_step")
    if len(set(tags)) != 1:
        pytest.fail("the ranks are not at the same test (rank %d: %s); did a "
                    "test skip on some ranks only?"
                    % (kolo.rank(), request.node.nodeid))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and not _state["stopped"]:
        _state["stopped"] = True
        item.session.shouldstop = (
            "rank %d failed %s: stopping this rank and the job"
            % (kolo.rank(), item.nodeid))
        try:
            kolo.shutdown()
        except Exception:
            pass


def pytest_runtest_logreport(report):
    f = _state["results"]
    if f is None:
        return
    if report.when == "call" or (report.when == "setup" and
                                 not report.passed):
        f.write("%s %s\n" % (report.outcome, report.nodeid))
    elif report.when == "teardown" and report.failed:
        f.write("failed %s\n" % report.nodeid)


# ---- helpers for the tests -------------------------------------------------


@pytest.fixture
def rank():
    return kolo.rank()


@pytest.fixture
def size():
    return kolo.size()
