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

LAYERS

One idea per file, from the top down. Each file imports only files
listed below it, and kolo's own core (kolo._core, kolo._lib, kolo._adasum)
lies below them all:

  __init__.py         this face: the names horovod.torch has
  elastic/            hvd.elastic: TorchState, ElasticSampler, run
  functions.py        broadcast_parameters, broadcast_optimizer_state,
                      allreduce_gradients (Horovod's module)
  mixed_precision.py  GradScaler: loss scaling the ranks agree on
  zero.py             ZeroRedundancyOptimizer: backward, synchronize, step
  _zero_layout.py     its buckets, views and hooks; that the ranks agree
  _zero_state.py      its state dict: consolidate, load, broadcast
  _zero_elastic.py    its commits and re-layout in elastic training
  _zero_join.py       its rounds that let a joined rank stand in
  optimizer.py        DistributedOptimizer (the gradients' allreduce)
  adasum.py           DistributedOptimizer(op=Adasum)
  optimizer_base.py   what every distributed optimizer shares
  sync_batch_norm.py  SyncBatchNorm
  _objects.py         broadcast_object, allgather_object
  mpi_ops.py          the collectives under Horovod's module name: a face
                      on the files below
  _broadcast.py       broadcast
  _gathers.py         allgather, alltoall, reducescatter
  _allreduce.py       allreduce, grouped_allreduce (+ op=Adasum)
  _completion.py      poll, synchronize, barrier, join
  _sparse.py          the allreduce of a sparse tensor
  _fast_allreduce.py  the fast path of an in-place allreduce
  _inflight.py        memory in flight: held aliases, write-back, resize
                      guard
  _tensors.py         a tensor as the runtime sees it: dtype, place,
                      results
  adasum_ops.py       the Adasum allreduce on tensors
  compression.py      Compression (Horovod's module)
  _joined.py          what stands in for a joined rank: a registry that
                      join() and the sharded optimizer both sit on

The four _zero_* files are mixins of ZeroRedundancyOptimizer: each holds
one part of the class, and the class in zero.py is made of them.
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
