"""What a Horovod script asks of horovod.torch besides the collectives:
what the build has (nccl_built's version), which controller the launch
gave (gloo_enabled / mpi_enabled), the submodules and exception names it
imports, and the timeline it starts and stops at run time."""

import json
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import kolo.torch as hvd  # noqa: E402


def _nccl_header_version():
    """NCCL_VERSION_CODE of the nccl.h libkolo was compiled against, as
    configure read it (kolo/_build_config.py), or None when not known: a
    machine may hold other nccl.h files (another NCCL under
    /usr/local/cuda), and Horovod's nccl_built() is the version it was
    compiled against, not the library loaded at run time."""
    try:
        from kolo import _build_config
    except ImportError:
        return None
    return getattr(_build_config, "NCCL_VERSION_CODE", 0) or None


def test_nccl_built_is_the_version_code():
    v = hvd.nccl_built()
    assert isinstance(v, int)
    if not hvd.cuda_built():
        assert v == 0
        return
    # major * 10000 + minor * 100 + patch, NCCL 2.x (Horovod compares the
    # value with 2700 and the like).
    assert v >= 20000, v
    header = _nccl_header_version()
    if header is not None:
        assert v == header


def test_gloo_and_mpi_enabled_follow_the_launch():
    under_mpi = "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ
    assert hvd.mpi_enabled() is under_mpi or hvd.mpi_enabled() == under_mpi
    assert hvd.gloo_enabled() == (not under_mpi)
    assert isinstance(hvd.gloo_enabled(), bool)


def test_horovod_submodules_import_by_name():
    import importlib
    for name in ("mpi_ops", "compression", "optimizer", "functions",
                 "sync_batch_norm"):
        importlib.import_module("kolo.torch." + name)
    from kolo.torch.mpi_ops import allreduce_async_, synchronize  # noqa: F401
    from kolo.torch.compression import Compression  # noqa: F401
    from kolo.torch.optimizer import DistributedOptimizer  # noqa: F401
    from kolo.torch.functions import broadcast_parameters  # noqa: F401


def test_exception_names():
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert hvd.HorovodInternalError is hvd.KoloInternalError
    e = hvd.HostsUpdatedInterrupt(skip_sync=True)
    assert isinstance(e, RuntimeError) and e.skip_sync is True
    assert hvd.HostsUpdatedInterrupt().skip_sync is False


def _shared_dir():
    """A temporary directory made by rank 0, the same path on every rank."""
    d = tempfile.mkdtemp(prefix="kolo-tl-") if hvd.rank() == 0 else None
    return hvd.broadcast_object(d, root_rank=0)


def test_start_stop_timeline_rank0_writes_it(rank, size):
    d = _shared_dir()
    path = os.path.join(d, "timeline.json")
    hvd.start_timeline(path, mark_cycles=True)
    for i in range(3):
        hvd.allreduce(torch.ones(4), name="tl.%d" % i)
    hvd.stop_timeline()
    hvd.stop_timeline()  # stopping a stopped timeline is harmless
    hvd.barrier()
    if rank == 0:
        with open(path) as f:
            events = json.load(f)
        names = {e.get("args", {}).get("name") for e in events}
        assert any(str(n).endswith("tl.0") for n in names), sorted(map(str, names))[:20]
        assert any(e.get("name") == "CYCLE_START" for e in events)
        # Only rank 0 wrote: no per-rank files beside it.
        assert sorted(os.listdir(d)) == ["timeline.json"]
    hvd.barrier()
    if rank == 0:
        os.unlink(path)
        os.rmdir(d)


def test_start_timeline_refuses_an_empty_path():
    with pytest.raises(ValueError, match="must not be empty"):
        hvd.start_timeline("")
