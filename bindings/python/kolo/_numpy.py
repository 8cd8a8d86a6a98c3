"""Collectives on NumPy arrays (the `kolo` package's own API).

Every collective comes in a blocking form that returns a new array
(allreduce, ...), an in-place form where it makes sense (allreduce_,
broadcast_), and asynchronous forms (..._async, ..._async_) that return a
handle for poll() and synchronize(). Arrays are passed to the runtime by
address: inputs that are not C-contiguous are copied once, in-place
operations need C-contiguous writable arrays.
"""

import ctypes
import pickle

import numpy as np

from . import _adasum, _core, _lib
from ._core import Adasum, Average, Sum, global_process_set

_DTYPES = {
    np.dtype(np.uint8): _lib.UINT8,
    np.dtype(np.int8): _lib.INT8,
    np.dtype(np.uint16): _lib.UINT16,
    np.dtype(np.int16): _lib.INT16,
    np.dtype(np.int32): _lib.INT32,
    np.dtype(np.int64): _lib.INT64,
    np.dtype(np.float16): _lib.FLOAT16,
    np.dtype(np.float32): _lib.FLOAT32,
    np.dtype(np.float64): _lib.FLOAT64,
    np.dtype(np.bool_): _lib.BOOL,
}

_WIRE = {None: None, "float16": _lib.FLOAT16, "bfloat16": _lib.BFLOAT16,
         "float32": None}


def _kdtype(a):
    kd = _DTYPES.get(a.dtype.newbyteorder("=")) if a.dtype.isnative else None
    if kd is None:
        raise TypeError("kolo cannot reduce arrays of dtype %s (it takes "
                        "uint8, int8, uint16, int16, int32, int64, float16, "
                        "float32, float64 and bool, in native byte order)"
                        % a.dtype)
    return kd


def _input(array):
    """A C-contiguous ndarray over the same memory when possible."""
    a = np.asarray(array)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    _kdtype(a)
    return a


def _inplace(array, what):
    if not isinstance(array, np.ndarray):
        raise TypeError("%s works in place: it needs an ndarray, not %s"
                        % (what, type(array).__name__))
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("%s works in place: the array must be C-contiguous "
                         "and writeable" % what)
    _kdtype(array)
    return array


def _wire(wire_dtype, a):
    if wire_dtype not in _WIRE:
        raise ValueError("wire_dtype must be None, 'float16' or 'bfloat16'")
    w = _WIRE[wire_dtype]
    if w is not None and a.dtype != np.float32:
        raise ValueError("wire_dtype %s compresses float32 arrays, not %s"
                         % (wire_dtype, a.dtype))
    return w


def _from_result(res, dtype):
    out = np.empty(_core.result_shape(res), dtype=dtype)
    data, nbytes = _core.result_bytes(res)
    if nbytes:
        if nbytes != out.nbytes:
            raise _core.KoloError("the runtime returned %d bytes for an output "
                                  "of %d" % (nbytes, out.nbytes),
                                  _lib.ERR_INTERNAL)
        ctypes.memmove(out.ctypes.data, data, nbytes)
    return out


# ---- allreduce -------------------------------------------------------------



def _blocking(async_fn, doc=None):
    """The blocking form of an _async collective: the same arguments, and
    synchronize()'s result."""
    def call(*args, **kwargs):
        return _core.synchronize(async_fn(*args, **kwargs))
    call.__name__ = call.__qualname__ = async_fn.__name__.replace("_async",
                                                                  "")
    call.__doc__ = doc or "%s, waited for: returns what synchronize() " \
        "returns." % async_fn.__name__
    return call

def _allreduce_async(a, out, name, op, prescale_factor, postscale_factor,
                     process_set, wire_dtype, prefix="allreduce"):
    if op == Adasum:
        key = _core.op_key(prefix, name, process_set)
        return _adasum_async([a], [out], [key], key, prescale_factor,
                             postscale_factor, process_set, wire_dtype, True)
    op = _core.check_op(op)
    opts, keep = _core.make_opts(op, prescale_factor, postscale_factor,
                                 process_set, _wire(wire_dtype, a))
    key = _core.op_key(prefix, name, process_set)
    kh = _core.allreduce_async(key, a.ctypes.data, out.ctypes.data, a.size,
                               _kdtype(a), opts)
    return _core.register([kh], (a, out), lambda _r: out, what=key)


def allreduce_async(array, op=Average, name=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set,
                    wire_dtype=None):
    """Starts an allreduce of `array` (not modified) into a new array;
    synchronize(handle) returns it. op: Average (default), Sum, Min, Max,
    Product. wire_dtype 'float16'/'bfloat16' compresses float32 data on the
    wire. Ranks must use the same name (or issue unnamed operations in the
    same order)."""
    a = _input(array)
    out = np.empty_like(a)
    return _allreduce_async(a, out, name, op, prescale_factor,
                            postscale_factor, process_set, wire_dtype)


allreduce = _blocking(
    allreduce_async, """The allreduce of `array` over the ranks of the
    process set, as a new array (the input is not modified).""")


def allreduce_async_(array, op=Average, name=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set,
                     wire_dtype=None):
    """Starts an in-place allreduce; synchronize(handle) returns `array`."""
    a = _inplace(array, "allreduce_async_")
    return _allreduce_async(a, a, name, op, prescale_factor, postscale_factor,
                            process_set, wire_dtype)


allreduce_ = _blocking(allreduce_async_,
                       """Allreduces `array` in place and returns it.""")


def _grouped_allreduce_async(arrays, outs, name, op, prescale_factor,
                             postscale_factor, process_set):
    if not arrays:
        raise ValueError("grouped_allreduce: the list of arrays is empty")
    base = _core.op_key("grouped_allreduce", name, process_set)
    keys = ["%s.%d" % (base, i) for i in range(len(arrays))]
    if op == Adasum:
        return _adasum_async(arrays, outs, keys, base, prescale_factor,
                             postscale_factor, process_set, None, False)
    op = _core.check_op(op)
    dtypes = {_kdtype(a) for a in arrays}
    if len(dtypes) != 1:
        raise TypeError("grouped_allreduce: the arrays of one group must share "
                        "one dtype, got %s" % sorted({str(a.dtype) for a in arrays}))
    opts, _ = _core.make_opts(op, prescale_factor, postscale_factor,
                              process_set)
    hs = _core.grouped_allreduce_async(
        keys, [a.ctypes.data for a in arrays], [o.ctypes.data for o in outs],
        [a.size for a in arrays], dtypes.pop(), opts)
    return _core.register(hs, (arrays, outs), lambda _r: list(outs),
                          what=base)


def grouped_allreduce_async(arrays, op=Average, name=None, prescale_factor=1.0,
                            postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts one group of allreduces (negotiated and reduced together);
    synchronize(handle) returns the list of new arrays."""
    ins = [_input(a) for a in arrays]
    outs = [np.empty_like(a) for a in ins]
    return _grouped_allreduce_async(ins, outs, name, op, prescale_factor,
                                    postscale_factor, process_set)


grouped_allreduce = _blocking(grouped_allreduce_async)


def grouped_allreduce_async_(arrays, op=Average, name=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    ins = [_inplace(a, "grouped_allreduce_async_") for a in arrays]
    return _grouped_allreduce_async(ins, ins, name, op, prescale_factor,
                                    postscale_factor, process_set)


grouped_allreduce_ = _blocking(grouped_allreduce_async_)


def _adasum_async(arrays, outs, keys, what, prescale_factor,
                  postscale_factor, process_set, wire_dtype, single):
    """op=Adasum (kolo/_adasum.py): each array is copied at enqueue and
    allgathered; synchronize() combines the rows and writes the outputs."""
    if wire_dtype is not None:
        raise ValueError("%s: op=Adasum takes no wire_dtype" % what)
    hosts = [np.array(a, copy=True, order="C") for a in arrays]
    kds = []
    for h in hosts:
        kd = _kdtype(h)
        _adasum.check_dtype(kd, what, str(h.dtype))
        kds.append(kd)
    pre, post = float(prescale_factor), float(postscale_factor)
    hs, order = _adasum.enqueue_by_dtype(
        keys, [h.ctypes.data for h in hosts], [h.shape for h in hosts], kds,
        process_set, hosts, what)

    def finish(rs):
        for i, res in zip(order, rs):
            r = _adasum.reduce(res, kds[i], hosts[i].size, pre, post)
            outs[i][...] = r.reshape(hosts[i].shape)
        return outs[0] if single else list(outs)
    return _core.register(hs, (arrays, outs, hosts), finish, results=True,
                          what=what)


# ---- broadcast -------------------------------------------------------------


def _broadcast_async(a, root_rank, name, process_set):
    opts, keep = _core.make_opts(process_set=process_set, shape=a.shape)
    key = _core.op_key("broadcast", name, process_set)
    kh = _core.broadcast_async(key, a.ctypes.data, a.size, _kdtype(a),
                               root_rank, opts)
    return _core.register([kh], a, lambda _r: a, what=key)


def broadcast_async(array, root_rank, name=None,
                    process_set=global_process_set):
    """Starts a broadcast from root_rank into a new array (the input is not
    modified); synchronize(handle) returns it. root_rank is a global rank
    (kolo.rank() of the root) whatever the process set, as in Horovod; it
    must be a member of the set."""
    a = np.array(array, copy=True, order="C")
    _kdtype(a)
    return _broadcast_async(a, root_rank, name, process_set)


broadcast = _blocking(
    broadcast_async, """root_rank's array, on every rank of the process set
    (a new array).""")


def broadcast_async_(array, root_rank, name=None,
                     process_set=global_process_set):
    return _broadcast_async(_inplace(array, "broadcast_async_"), root_rank,
                            name, process_set)


broadcast_ = _blocking(
    broadcast_async_, """Overwrites `array` with root_rank's and returns
    it.""")


# ---- allgather -------------------------------------------------------------


def _rows(a, what):
    if a.ndim == 0:
        raise ValueError("%s needs an array of at least one dimension (its "
                         "first dimension is the one concatenated)" % what)


def _rows_async(coll, start, a, name, process_set, opts):
    """One array's allgather or reducescatter (coll), started by `start`
    (the grouped function of _core) as a group of one; its handle gives
    the result as an array of a's dtype."""
    key = _core.op_key(coll, name, process_set)
    hs = start([key], [a.ctypes.data], [a.shape], _kdtype(a), opts)
    dt = a.dtype
    return _core.register(hs, a, lambda r: _from_result(r[0], dt),
                          results=True, what=key)


def allgather_async(array, name=None, process_set=global_process_set):
    """Starts an allgather: the ranks' arrays concatenated along the first
    dimension (which may differ between ranks), in rank order."""
    a = _input(array)
    _rows(a, "allgather")
    opts, _ = _core.make_opts(process_set=process_set)
    return _rows_async("allgather", _core.grouped_allgather_async, a, name,
                       process_set, opts)


allgather = _blocking(allgather_async)


def _grouped_inputs(arrays, coll):
    """The arrays of a grouped allgather or reducescatter, checked: each of
    at least one dimension, all of one dtype; (inputs, kolo dtype)."""
    ins = [_input(a) for a in arrays]
    if not ins:
        raise ValueError("grouped_%s: the list of arrays is empty" % coll)
    for a in ins:
        _rows(a, coll)
    dtypes = {_kdtype(a) for a in ins}
    if len(dtypes) != 1:
        raise TypeError("grouped_%s: the arrays of one group must share one "
                        "dtype" % coll)
    return ins, dtypes.pop()


def grouped_allgather_async(arrays, name=None, process_set=global_process_set):
    ins, kd = _grouped_inputs(arrays, "allgather")
    base = _core.op_key("grouped_allgather", name, process_set)
    keys = ["%s.%d" % (base, i) for i in range(len(ins))]
    opts, _ = _core.make_opts(process_set=process_set)
    hs = _core.grouped_allgather_async(keys, [a.ctypes.data for a in ins],
                                       [a.shape for a in ins], kd, opts)
    dt = ins[0].dtype
    return _core.register(hs, ins, lambda rs: [_from_result(r, dt) for r in rs],
                          results=True, what=base)


grouped_allgather = _blocking(grouped_allgather_async)


# ---- alltoall --------------------------------------------------------------


def alltoall_async(array, splits=None, name=None,
                   process_set=global_process_set):
    """Starts an alltoall: splits[j] rows of `array` go to rank j (None:
    the first dimension split evenly). synchronize(handle) returns
    (output, received_splits)."""
    a = _input(array)
    _rows(a, "alltoall")
    if splits is not None:
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    opts, _ = _core.make_opts(process_set=process_set)
    key = _core.op_key("alltoall", name, process_set)
    kh = _core.alltoall_async(key, a.ctypes.data, a.shape, _kdtype(a), splits,
                              opts)
    dt = a.dtype

    def finish(rs):
        return (_from_result(rs[0], dt),
                np.array(_core.result_splits(rs[0]), dtype=np.int32))
    return _core.register([kh], (a, splits), finish, results=True, what=key)


def alltoall(array, splits=None, name=None, process_set=global_process_set):
    """Rows of `array` scattered to the ranks (splits[j] rows to rank j),
    and what every rank sent here, concatenated in rank order. Returns the
    output array, or (output, received_splits) when splits are given (as
    kolo.torch and Horovod do)."""
    out, rsplits = _core.synchronize(alltoall_async(array, splits, name,
                                                    process_set))
    return out if splits is None else (out, rsplits)


# ---- reducescatter ---------------------------------------------------------


def _check_rs_op(op):
    op = _core.check_op(op)
    if op not in (Sum, Average):
        raise ValueError("reducescatter takes op=Sum or op=Average, not %s"
                         % _core.op_name(op))
    return op


def reducescatter_async(array, op=Average, name=None,
                        process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reducescatter: the arrays of all ranks (same shape) reduced,
    and the first dimension of the result split as evenly as possible (rank
    r of n gets shape[0] // n rows, plus one if r < shape[0] % n)."""
    a = _input(array)
    _rows(a, "reducescatter")
    opts, _ = _core.make_opts(_check_rs_op(op), prescale_factor,
                              postscale_factor, process_set)
    return _rows_async("reducescatter", _core.grouped_reducescatter_async,
                       a, name, process_set, opts)


reducescatter = _blocking(reducescatter_async)


def grouped_reducescatter_async(arrays, op=Average, name=None,
                                process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    ins, kd = _grouped_inputs(arrays, "reducescatter")
    opts, _ = _core.make_opts(_check_rs_op(op), prescale_factor,
                              postscale_factor, process_set)
    base = _core.op_key("grouped_reducescatter", name, process_set)
    keys = ["%s.%d" % (base, i) for i in range(len(ins))]
    hs = _core.grouped_reducescatter_async(
        keys, [a.ctypes.data for a in ins], [a.shape for a in ins], kd, opts)
    dt = ins[0].dtype
    return _core.register(hs, ins, lambda rs: [_from_result(r, dt) for r in rs],
                          results=True, what=base)


grouped_reducescatter = _blocking(grouped_reducescatter_async)


# ---- objects ---------------------------------------------------------------


def broadcast_object(obj, root_rank=0, name=None,
                     process_set=global_process_set):
    """root_rank's `obj` (pickled), on every rank of the process set."""
    key = name or "broadcast_object"
    is_root = _core.rank() == root_rank  # a global rank
    payload = pickle.dumps(obj) if is_root else b""
    n = np.array([len(payload)], dtype=np.int64)
    broadcast_(n, root_rank, key + ".size", process_set)
    buf = (np.frombuffer(payload, dtype=np.uint8).copy() if is_root
           else np.empty(int(n[0]), dtype=np.uint8))
    broadcast_(buf, root_rank, key + ".data", process_set)
    return obj if is_root else pickle.loads(buf.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every rank's `obj` (pickled), in rank order."""
    key = name or "allgather_object"
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    opts, _ = _core.make_opts(process_set=process_set)
    hs = _core.grouped_allgather_async(["allgather." + key], [data.ctypes.data],
                                       [data.shape], _lib.UINT8, opts)

    def finish(rs):
        out = _from_result(rs[0], np.uint8)
        objs, off = [], 0
        for n in _core.result_splits(rs[0]):
            objs.append(pickle.loads(out[off:off + n].tobytes()))
            off += n
        return objs
    return _core.synchronize(_core.register(hs, data, finish, results=True,
                                            what=key))


__all__ = _core.COLLECTIVES + ["broadcast_object", "allgather_object"]
