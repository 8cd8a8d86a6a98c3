"""The allreduce of a sparse COO tensor, as Horovod does it: an allgather
of its indices and one of its values, and Horovod's handle for it (a
function)."""

import torch

from .. import _core, _lib
from .._core import Average, Sum, global_process_set
from ._inflight import _held
from ._tensors import _kdtype, _place, _tensor_from_result


def sparse_allreduce_async(tensor, name, op=Average,
                           process_set=global_process_set):
    """Starts the allreduce of a sparse COO tensor, done as Horovod does it:
    an allgather of its indices and one of its values, in rank order, as
    they are (not coalesced: duplicate indices stay, the optimizer's
    coalesce() sums them), the values divided by the set's size for
    Average.

    Returns Horovod's handle: a function; handle() waits and returns the
    reduced sparse tensor (uncoalesced, the input's size, dtype and device).
    Calling it again returns the same tensor. synchronize(handle) and
    poll(handle) take it too (Horovod's synchronize returns None for it
    without waiting; kolo's waits and returns what handle() returns)."""
    op = _core.check_op(op)
    if op not in (Sum, Average):
        raise ValueError("the allreduce of a sparse tensor takes op=Sum or "
                         "op=Average, not %s" % _core.op_name(op))
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor "
                         "(layout torch.sparse_coo), not %s"
                         % (tensor.layout if isinstance(tensor, torch.Tensor)
                            else type(tensor).__name__))
    indices = tensor._indices().t().contiguous()  # nnz x sparse_dim
    values = tensor._values().contiguous()        # nnz x dense dims
    kd = _kdtype(values, "sparse allreduce")
    base = _core.op_key("sparse_allreduce", name, process_set)
    opts, _ = _core.make_opts(process_set=process_set, place=_place(values))

    def enqueue(hs):
        hs += _core.grouped_allgather_async([base + ".indices"],
                                            [indices.data_ptr()],
                                            [tuple(indices.shape)],
                                            _lib.INT64, opts)
        hs += _core.grouped_allgather_async([base + ".values"],
                                            [values.data_ptr()],
                                            [tuple(values.shape)], kd, opts)
    held, hs = _held(base, [indices, values], enqueue, results=True)
    size, vdtype, device = tensor.size(), values.dtype, values.device

    def finish(rs):
        held.check()
        idx = _tensor_from_result(rs[0], torch.int64, device)
        vals = _tensor_from_result(rs[1], vdtype, device)
        if op == Average:
            vals = vals / _core.set_size(process_set)
        return torch.sparse_coo_tensor(idx.t(), vals, size)
    return _sparse_handle(_core.register(
        hs, (tensor, indices, values, held), finish, results=True,
        what=base, release=held.release))


def _sparse_handle(h):
    """The handle of sparse_allreduce_async: a function, as Horovod's, that
    waits for the kolo handle h at its first call and returns the result
    (or raises the operation's error) at every call. Its attribute
    _kolo_sparse lets poll() and synchronize() recognize it."""
    state = []  # [result, error] once waited

    def handle():
        if not state:
            try:
                state[:] = [_core.synchronize(h), None]
            except Exception as e:
                state[:] = [None, e]
        if state[1] is not None:
            raise state[1]
        return state[0]
    handle._kolo_sparse = lambda: bool(state) or _core.poll(h)
    return handle
