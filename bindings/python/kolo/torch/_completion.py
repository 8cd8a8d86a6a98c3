"""Completing what was enqueued: poll and synchronize a handle, wait for
several, and the collectives that only wait (barrier, join)."""

from .. import _core, _lib
from .._core import global_process_set
from . import _joined
from ._fast_allreduce import _OK, _fast, _pending
from ._inflight import _InPlace


def poll(handle):
    """True when the operation of `handle` is done."""
    sparse = getattr(handle, "_kolo_sparse", None)
    if sparse is not None:
        return sparse()
    return _core.poll(handle)


def synchronize(handle):
    """Waits for the operation of `handle` (the GIL is released meanwhile)
    and returns its output. A failed operation raises HorovodInternalError
    (kolo.KoloError, a RuntimeError) with the runtime's message. The handle
    of sparse_allreduce_async is called: its result is returned."""
    if type(handle) is int:
        p = _pending.get(handle)
        if type(p) is _InPlace and _fast is not None:
            # an in-place allreduce of a host tensor: _core.synchronize
            # with less work (one kolo handle, no result, nothing to free);
            # a CUDA tensor's result is ordered on the current stream
            del _pending[handle]
            try:
                rc = (_fast.wait(p.handles[0]) if p.stream is None else
                      _lib.lib.kolo_wait_on_stream(p.handles[0], p.stream()))
                if rc != _OK:
                    raise _core.wait_failed(rc)
                t = p.tensor
                if p.alias.data_ptr() != p.address or (
                        t.data_ptr() != p.address):
                    return p.finish(None)
                return t
            finally:
                p.alias = None
    elif getattr(handle, "_kolo_sparse", None) is not None:
        return handle()
    return _core.synchronize(handle)


def _wait_all(handles, then=None, error=None):
    """Waits for every handle (then runs then()), even after one failed or
    after `error` (an enqueue that failed), so that nothing stays in
    flight; then raises the first error."""
    for h in handles:
        try:
            _core.synchronize(h)
        except Exception as e:
            if error is None:
                error = e
    if then is not None:
        try:
            then()
        except Exception as e:
            if error is None:
                error = e
    if error is not None:
        raise error


def join(device=-1):
    """For a rank that has run out of data: blocks until every rank has
    joined; meanwhile the allreduces of the others go on, this rank
    contributing zeros. Returns the rank that joined last. `device` is
    accepted for Horovod's signature: the runtime makes the zeros a joined
    rank contributes where each tensor lives, CPU or CUDA.

    With a ZeroRedundancyOptimizer, this rank owns blocks of the
    parameters that the others still update: meanwhile it stands in for
    their steps (zero gradients, the update of its blocks, the allgather;
    see kolo.torch.zero and _joined.py) until every rank has joined."""
    return _joined.join(_core.join)


def barrier(process_set=global_process_set):
    """Blocks until every rank of the process set has called barrier()."""
    _core.barrier(process_set)
