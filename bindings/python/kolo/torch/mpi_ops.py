"""The collectives of kolo.torch on torch tensors (CPU and CUDA), with
Horovod's names, arguments and results, and their autograd functions.

Tensors reach the runtime by address (tensor.data_ptr()): the runtime reads
the input and writes the output in place, and the binding keeps the memory
of every tensor it handed over alive until its handle is synchronized, even
if the program gives the tensor other memory meanwhile (see "Memory in
flight" below). A tensor that is not contiguous is copied once into a
contiguous buffer (and, for the in-place forms, copied back when the handle
is synchronized).

CUDA tensors (kolo built with NCCL) go the same way, with their place in
kolo_opts_t: device_type KOLO_DEVICE_CUDA, the device's ordinal, and the
current stream of that device when the operation is enqueued (the stream
on which the program, and this binding's contiguous() copies, queued the
work producing the input: the runtime's stream waits for it through an
event, so enqueuing never blocks). Outputs are allocated on the input's
device; a synchronized handle means the runtime's work is complete, so the
caller's stream may use them at once. Results whose size is known only
after negotiation (allgather, alltoall, reducescatter) lie on the device
and are copied into a tensor allocated there (kolo_result_copy). Output
and input always share a device: a CUDA tensor never gets a CPU output.

Gradients (as Horovod defines them):
  allreduce      the allreduce of the gradient, with the same op and scaling
  allgather      the average allreduce of the gradient, this rank's rows
  broadcast      the average allreduce of the gradient on the root, zero
                 elsewhere
  alltoall       the alltoall of the gradient with the received splits
  reducescatter  the allgather of the gradient times the set's size for
                 Sum (as is for Average), then times prescale and postscale

Each idea has its file; this module is Horovod's face on them (its name,
horovod.torch.mpi_ops, is one programs import):

  _tensors.py        a tensor as the runtime sees it (dtype, place, results)
  _inflight.py       memory in flight: held aliases, write-back, resize guard
  _fast_allreduce.py the fast path of an in-place allreduce
  _allreduce.py      allreduce, grouped_allreduce
  _gathers.py        allgather, alltoall, reducescatter
  _broadcast.py      broadcast
  _sparse.py         the allreduce of a sparse tensor
  _completion.py     poll, synchronize, barrier, join
"""

from .. import _core
# (the ops and the global set, as horovod.torch.mpi_ops has them)
from .._core import Adasum, Average, Sum, global_process_set  # noqa: F401
from ._allreduce import (  # noqa: F401
    _allreduce_async, allreduce, allreduce_,
    allreduce_async, allreduce_async_, grouped_allreduce,
    grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_)
from ._broadcast import (  # noqa: F401
    broadcast, broadcast_, broadcast_async, broadcast_async_)
from ._completion import barrier, join, poll, synchronize  # noqa: F401
from ._gathers import (  # noqa: F401
    allgather, allgather_async, alltoall, alltoall_async, grouped_allgather,
    grouped_allgather_async, grouped_reducescatter,
    grouped_reducescatter_async, reducescatter, reducescatter_async)
from ._sparse import sparse_allreduce_async  # noqa: F401
from .compression import Compression  # noqa: F401

__all__ = _core.COLLECTIVES + ["sparse_allreduce_async", "poll",
                               "synchronize", "join", "barrier"]
