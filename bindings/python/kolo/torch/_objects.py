"""Python objects between ranks: broadcast_object and allgather_object
(pickled, with cloudpickle where it is installed, so that closures and
lambdas travel too), over the collectives on uint8 tensors."""

import ctypes
import io
import pickle

import torch

from .. import _core, _lib
from .._core import global_process_set
from ._broadcast import broadcast_
from ._tensors import _tensor_from_result

try:  # closures and lambdas travel too when cloudpickle is there
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle


def _bytes_of(t):
    """The bytes of a contiguous uint8 CPU tensor (without NumPy)."""
    return ctypes.string_at(t.data_ptr(), t.numel()) if t.numel() else b""


def _dumps(obj):
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return buf.getvalue()


def broadcast_object(obj, root_rank=0, name=None,
                     process_set=global_process_set):
    """root_rank's `obj` (any picklable object) on every rank of the set."""
    key = name or "broadcast_object"
    is_root = _core.rank() == root_rank  # a global rank, as in Horovod
    payload = _dumps(obj) if is_root else b""
    n = torch.tensor([len(payload)], dtype=torch.int64)
    broadcast_(n, root_rank, key + ".size", process_set)
    if is_root:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) \
            if payload else torch.empty(0, dtype=torch.uint8)
    else:
        data = torch.empty(int(n.item()), dtype=torch.uint8)
    broadcast_(data, root_rank, key + ".data", process_set)
    if is_root:
        return obj
    return pickle.loads(_bytes_of(data))


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every rank's `obj` (picklable), in rank order."""
    key = name or "allgather_object"
    payload = _dumps(obj)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    opts, _ = _core.make_opts(process_set=process_set)
    hs = _core.grouped_allgather_async(["allgather." + key], [data.data_ptr()],
                                       [tuple(data.shape)], _lib.UINT8, opts)

    def finish(rs):
        out = _tensor_from_result(rs[0], torch.uint8)
        raw = _bytes_of(out)
        objs, off = [], 0
        for n in _core.result_splits(rs[0]):
            objs.append(pickle.loads(raw[off:off + n]))
            off += n
        return objs
    return _core.synchronize(_core.register(hs, data, finish, results=True,
                                            what=key))
