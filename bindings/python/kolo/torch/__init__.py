"""kolo.torch: the horovod.torch API on kolo.

A script written for Horovod runs by changing `import horovod.torch as hvd`
into `import kolo.torch as hvd`, and is started with
`kolorun -np N python3 train.py`.

CPU and CUDA tensors are served alike (CUDA tensors need a libkolo built
with NCCL: nccl_built()); outputs are on the input's device.
start_timeline/stop_timeline control the timeline at run time, like
KOLO_TIMELINE before the job (rank 0 writes it, as Horovod's coordinator).
Horovod's submodules import by the same names: kolo.torch.mpi_ops,
.compression, .optimizer, .functions, .sync_batch_norm, and .elastic
(hvd.elastic.run, TorchState, ElasticSampler: elastic training).
"""

from .._core import (  # noqa: F401
    Sum, Average, Min, Max, Product, Adasum,
    KoloError, KoloValueError, HostsUpdatedInterrupt,
    ProcessSet, global_process_set, add_process_set, remove_process_set,
    add_process_sets_from_groups,
    init, shutdown, is_initialized, rank, size, local_rank, local_size,
    cross_rank, cross_size, is_homogeneous,
    gloo_built, mpi_built, nccl_built, cuda_built, rocm_built, ddl_built,
    ccl_built, gloo_enabled, mpi_enabled, nccl_enabled, mpi_threads_supported,
    start_timeline, stop_timeline,
)
from .compression import Compression  # noqa: F401
from .mpi_ops import (  # noqa: F401
    allreduce, allreduce_, allreduce_async, allreduce_async_,
    grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_,
    allgather, allgather_async, grouped_allgather, grouped_allgather_async,
    broadcast, broadcast_, broadcast_async, broadcast_async_,
    alltoall, alltoall_async,
    reducescatter, reducescatter_async, grouped_reducescatter,
    grouped_reducescatter_async,
    sparse_allreduce_async,
    poll, synchronize, join, barrier,
)
from .optimizer import DistributedOptimizer, clip_grad_norm_hook  # noqa: F401
from .functions import (  # noqa: F401
    broadcast_parameters, broadcast_optimizer_state, broadcast_object,
    allgather_object, allreduce_gradients, clip_by_global_norm,
)
from .mixed_precision import GradScaler, DynamicLossScaler  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401

# Horovod's name for a failed collective (horovod.common.exceptions), and
# kolo's own spelling of it.
HorovodInternalError = KoloError
KoloInternalError = KoloError

from . import elastic  # noqa: E402,F401  (hvd.elastic, as in Horovod)

__all__ = [
    "Sum", "Average", "Min", "Max", "Product", "Adasum", "KoloError",
    "KoloValueError", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "add_process_sets_from_groups", "init",
    "shutdown", "is_initialized", "rank", "size", "local_rank",
    "local_size", "cross_rank", "cross_size", "is_homogeneous",
    "gloo_built", "mpi_built", "nccl_built", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built", "gloo_enabled", "mpi_enabled", "nccl_enabled",
    "mpi_threads_supported", "start_timeline", "stop_timeline",
    "Compression", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async",
    "sparse_allreduce_async", "poll", "synchronize", "join", "barrier",
    "DistributedOptimizer", "clip_grad_norm_hook", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "allreduce_gradients", "clip_by_global_norm", "GradScaler",
    "DynamicLossScaler", "HorovodInternalError", "KoloInternalError",
    "HostsUpdatedInterrupt", "SyncBatchNorm", "elastic"
]
