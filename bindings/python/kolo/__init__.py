"""kolo: data-parallel distributed training, in the spirit of Horovod.

This package is the NumPy API; kolo.torch mirrors horovod.torch, and
kolo.run(func, np=N) runs a function on the ranks of a new job, as
horovod.run does; kolo.elastic (run, State, ObjectState) is elastic
training.

    import numpy as np, kolo
    kolo.init()                               # every rank (run under kolorun)
    g = np.ones(4, np.float32) * kolo.rank()
    avg = kolo.allreduce(g, name="g")          # op=kolo.Average by default
    h = kolo.allreduce_async_(g, op=kolo.Sum)  # in place, returns at once
    kolo.synchronize(h)                        # blocks (the GIL is released)
    kolo.shutdown()

The runtime reads and writes the arrays' own memory; the binding keeps
every array it handed to the runtime alive until its handle is
synchronized. A failed collective raises kolo.KoloError (a RuntimeError)
with the runtime's message; a call refused at once (a bad argument, a name
already in flight) raises kolo.KoloValueError (a ValueError).
"""

from ._lib import path as library_path  # noqa: F401
from ._core import (  # noqa: F401
    Sum, Average, Min, Max, Product, Adasum,
    KoloError, KoloValueError, HostsUpdatedInterrupt,
    ProcessSet, global_process_set, add_process_set, remove_process_set,
    add_process_sets_from_groups,
    init, shutdown, is_initialized, rank, size, local_rank, local_size,
    cross_rank, cross_size, is_homogeneous,
    gloo_built, mpi_built, nccl_built, cuda_built, rocm_built, ddl_built,
    ccl_built, gloo_enabled, mpi_enabled, nccl_enabled, mpi_threads_supported,
    start_timeline, stop_timeline,
    barrier, join, poll, synchronize,
)

from .run import run, RunError  # noqa: F401  (horovod.run)
from . import elastic  # noqa: F401  (kolo.elastic.run, State, ObjectState)

__version__ = "0.1.0"

__all__ = [
    "library_path", "Sum", "Average", "Min", "Max", "Product", "Adasum",
    "KoloError", "KoloValueError", "HostsUpdatedInterrupt", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "add_process_sets_from_groups",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
    "local_size", "cross_rank", "cross_size", "is_homogeneous",
    "gloo_built", "mpi_built", "nccl_built", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built", "gloo_enabled", "mpi_enabled", "nccl_enabled",
    "mpi_threads_supported", "start_timeline", "stop_timeline", "barrier",
    "join", "poll", "synchronize", "run", "RunError", "elastic"
]

try:
    import numpy as _np  # noqa: F401
except ImportError:  # kolo.torch works without the NumPy API
    _np = None

if _np is not None:
    from ._numpy import (  # noqa: F401
        allreduce, allreduce_, allreduce_async, allreduce_async_,
        grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
        grouped_allreduce_async_,
        allgather, allgather_async, grouped_allgather, grouped_allgather_async,
        broadcast, broadcast_, broadcast_async, broadcast_async_,
        alltoall, alltoall_async,
        reducescatter, reducescatter_async, grouped_reducescatter,
        grouped_reducescatter_async,
        broadcast_object, allgather_object,
    )
    __all__ += [
        "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
        "grouped_allreduce", "grouped_allreduce_",
        "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
        "allgather_async", "grouped_allgather", "grouped_allgather_async",
        "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
        "alltoall", "alltoall_async", "reducescatter",
        "reducescatter_async", "grouped_reducescatter",
        "grouped_reducescatter_async", "broadcast_object",
        "allgather_object"
    ]
