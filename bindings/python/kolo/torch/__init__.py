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
ZeroRedundancyOptimizer (kolo's own, kolo.torch.zero) shards the optimizer's
state over the ranks where DistributedOptimizer copies it.
"""

from .._core import *  # noqa: F401,F403  (the API kolo shares)
from .._core import __all__ as _shared_all
from .._core import KoloError  # noqa: F401
from .compression import Compression  # noqa: F401
from .mpi_ops import *  # noqa: F401,F403  (the collectives on tensors)
from .mpi_ops import __all__ as _mpi_ops_all
from .optimizer import DistributedOptimizer, clip_grad_norm_hook  # noqa: F401
from .functions import (  # noqa: F401
    broadcast_parameters, broadcast_optimizer_state, broadcast_object,
    allgather_object, allreduce_gradients, clip_by_global_norm,
)
from .mixed_precision import GradScaler, DynamicLossScaler  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401
from .zero import ZeroRedundancyOptimizer  # noqa: F401

# Horovod's name for a failed collective (horovod.common.exceptions), and
# kolo's own spelling of it.
HorovodInternalError = KoloError
KoloInternalError = KoloError

from . import elastic  # noqa: E402,F401  (hvd.elastic, as in Horovod)

__all__ = _shared_all + _mpi_ops_all + [
    "Compression", "DistributedOptimizer", "clip_grad_norm_hook",
    "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "allreduce_gradients",
    "clip_by_global_norm", "GradScaler", "DynamicLossScaler",
    "HorovodInternalError", "KoloInternalError", "SyncBatchNorm",
    "ZeroRedundancyOptimizer", "elastic"
]
