"""What the NumPy and the PyTorch bindings share: life cycle, errors,
process sets, names, and the table of pending operations.

Buffers reach this module as raw addresses (an ndarray's .ctypes.data, a
tensor's .data_ptr()): the runtime reads and writes the caller's own memory.
Whoever enqueues registers, with the handle, every object whose memory the
runtime may still touch; the table keeps them alive until the handle is
waited on (synchronize) or kolo is shut down.
"""

import atexit
import faulthandler
import sys
import ctypes
import os
import signal
import itertools
import threading
import warnings

from . import _lib
from ._lib import lib

# ---- reduction ops ---------------------------------------------------------

Sum = _lib.OP_SUM
Average = _lib.OP_AVERAGE
Min = _lib.OP_MIN
Max = _lib.OP_MAX
Product = _lib.OP_PRODUCT
# Horovod's Adasum (a plain int constant, as Horovod's ops are): allreduce,
# grouped allreduce and DistributedOptimizer compute it in the bindings
# (kolo/_adasum.py); the runtime has no such op.
Adasum = 100

_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max",
             Product: "Product", Adasum: "Adasum"}


def check_op(op):
    """Returns op as a kolo_op_t value, or raises."""
    if op == Adasum:
        raise ValueError(
            "op=Adasum is an allreduce op (allreduce, grouped_allreduce, "
            "DistributedOptimizer); this operation takes Average or Sum")
    if op not in (Sum, Average, Min, Max, Product):
        raise ValueError("unknown reduction op %r (kolo offers Average, Sum, "
                         "Min, Max, Product)" % (op,))
    return int(op)


def op_name(op):
    return _OP_NAMES.get(op, repr(op))


def resolve_op(op, average, default=Average):
    """Horovod's deprecated `average` argument next to `op`."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide "
                         "only one of them.")
    if average is not None:
        warnings.warn("the `average` argument is deprecated; use op=Average "
                      "or op=Sum", DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return default if op is None else op


# ---- errors ----------------------------------------------------------------


class KoloError(RuntimeError):
    """A collective (or another runtime call) failed. str(e) is the runtime's
    message (kolo_last_error); .code is the KOLO_ERR_* status.

    kolo.torch exports it as HorovodInternalError too."""

    def __init__(self, message, code=_lib.ERR_INTERNAL):
        super().__init__(message)
        self.code = code
        self.status = _lib.STATUS_NAMES.get(code, str(code))


class KoloValueError(ValueError):
    """A call was refused at once, before anything was enqueued: an invalid
    argument, a name already in flight (KOLO_ERR_DUPLICATE_NAME), kolo not
    initialized. .code is the KOLO_ERR_* status."""

    def __init__(self, message, code=_lib.ERR_INVALID_ARGUMENT):
        super().__init__(message)
        self.code = code
        self.status = _lib.STATUS_NAMES.get(code, str(code))


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's exception of an elastic job whose hosts were added or
    removed: State.commit() or State.check_host_updates() raises it on every
    rank at once, the state committed, and elastic.run re-forms the job
    without restoring the state. skip_sync: whether the state may skip its
    synchronization after the job re-formed (True when workers were only
    removed: nothing failed and nobody joined, so every rank holds the same
    state)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts were updated")
        self.skip_sync = skip_sync


_NOT_INITIALIZED = ("kolo has not been initialized; call init() first "
                    "(kolo.init() or hvd.init())")


def _message(rc, what):
    # The runtime's messages name the tensor and the values; `what` only
    # stands in when there is no message.
    msg = _lib.last_error()
    if msg:
        return msg
    return "%s: %s" % (what, _lib.strerror(rc)) if what else _lib.strerror(rc)


def refused(rc, what=""):
    """The exception for a call that failed at once (enqueue time)."""
    if rc == _lib.ERR_NOT_INITIALIZED:
        return KoloValueError(_NOT_INITIALIZED, rc)
    if rc in (_lib.ERR_INVALID_ARGUMENT, _lib.ERR_DUPLICATE_NAME,
              _lib.ERR_UNSUPPORTED):
        return KoloValueError(_message(rc, what), rc)
    return KoloError(_message(rc, what), rc)


def failed(rc, what=""):
    """The exception for an operation that failed while it ran."""
    if rc == _lib.ERR_NOT_INITIALIZED:
        return KoloValueError(_NOT_INITIALIZED, rc)
    return KoloError(_message(rc, what), rc)


def check(rc, what=""):
    if rc != _lib.OK:
        raise refused(rc, what)


# ---- life cycle ------------------------------------------------------------

_lock = threading.RLock()
_atexit_registered = False
_stacks = None  # the flight recorder's stacks file, while faulthandler writes it


def _stacks_signal():
    """The signal faulthandler writes the stacks on: a real-time one of
    kolo's own, so that kolo never raises SIGUSR1 (which the program may
    handle itself) and a faulthandler the program registered stays as it
    was."""
    low = getattr(signal, "SIGRTMIN", 0)
    return low + 5 if low and low + 5 <= getattr(signal, "SIGRTMAX", 0) else 0


def _stacks_start():
    """The flight recorder's Python stacks (kolo.h, kolo_flight_stacks):
    where the recorder writes dumps (KOLO_FLIGHT_DIR), faulthandler writes
    every thread's stack to DIR/rank<R>.stacks when kolo raises its
    signal before each dump, and each dump carries what the file gained
    since the last one."""
    global _stacks
    folder = os.environ.get("KOLO_FLIGHT_DIR", "")
    sig = _stacks_signal()
    if _stacks is not None or not folder or not sig or \
            not _lib.has("kolo_flight_stacks"):
        return
    path = os.path.join(folder, "rank%d.stacks" % lib.kolo_rank())
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        f = open(path, "a+")
    except OSError:
        return  # the recorder says once that it cannot write there
    try:
        faulthandler.register(sig, file=f, all_threads=True, chain=False)
    except (RuntimeError, ValueError, OSError):
        _stacks_close(f)
        return
    if lib.kolo_flight_stacks(f.fileno(), sig) != _lib.OK:  # recorder off
        faulthandler.unregister(sig)
        _stacks_close(f)
        return
    _stacks = f


def _stacks_stop():
    global _stacks
    if _stacks is None:
        return
    lib.kolo_flight_stacks(-1, 0)
    faulthandler.unregister(_stacks_signal())
    _stacks_close(_stacks)
    _stacks = None


def _stacks_close(f):
    # A stacks file no dump asked for is not left behind.
    try:
        empty = os.fstat(f.fileno()).st_size == 0
        f.close()
        if empty:
            os.remove(f.name)
    except OSError:
        pass


def init(comm=None, process_sets=None):
    """Starts kolo on this rank (every rank must call it). A second call
    while kolo runs does nothing but add the process sets it names.

    comm: for compatibility with Horovod's signature; kolo takes the job
    from the environment kolorun sets, so only None is accepted.
    process_sets: ProcessSet objects (or lists of ranks) to add after
    start-up, in the same order on every rank; "dynamic" is accepted and
    ignored (kolo's process sets are always dynamic)."""
    global _atexit_registered
    if comm is not None:
        raise ValueError("kolo.init(comm=...) is not supported: kolo takes "
                         "the job from KOLO_RANK/KOLO_SIZE (set by kolorun)")
    with _lock:
        if not lib.kolo_is_initialized():
            rc = lib.kolo_init()
            if rc != _lib.OK and rc != _lib.ERR_ALREADY_INITIALIZED:
                raise KoloError(_message(rc, "kolo_init"), rc)
            _stacks_start()
            _drop_pending()
            _noname.clear()  # a new job: unnamed operations count afresh
            if not _atexit_registered:
                atexit.register(_atexit_shutdown)
                _atexit_registered = True
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            add_process_set(ps)


def shutdown():
    """Stops kolo on this rank. The first rank to shut down stops the job:
    operations pending anywhere fail with KOLO_ERR_SHUTDOWN."""
    _shutdown(lib.kolo_shutdown)


def _shutdown(stop):
    with _lock:
        if not lib.kolo_is_initialized():
            return
        _stacks_stop()
        rc = stop()
        _drop_pending()
        for ps in list(_registered_sets.values()):
            ps.process_set_id = None
        _registered_sets.clear()
        if rc != _lib.OK and rc != _lib.ERR_NOT_INITIALIZED:
            raise KoloError(_message(rc, "kolo_shutdown"), rc)


def _atexit_shutdown():
    # The program ends without having called shutdown(): the other ranks,
    # if still running, are told why (the uncaught exception, if any).
    exc = getattr(sys, "last_value", None)
    reason = None
    if exc is not None:
        reason = "an uncaught %s: %s" % (type(exc).__name__, exc)
        reason = reason.encode("utf-8", "replace")[:400]
    try:
        _shutdown(lambda: lib.kolo_shutdown_at_exit(reason))
    except Exception:  # the process is going away: nothing to report to
        pass


def is_initialized():
    return bool(lib.kolo_is_initialized())


def _query(fn):
    v = fn()
    if v < 0:
        raise KoloValueError(_NOT_INITIALIZED, _lib.ERR_NOT_INITIALIZED)
    return v


def _place_query(fn, doc):
    def query():
        return _query(fn)
    query.__doc__ = doc
    return query


rank = _place_query(lib.kolo_rank, "This rank in the job (0..size()-1).")
size = _place_query(lib.kolo_size, "The number of ranks in the job.")
local_rank = _place_query(lib.kolo_local_rank,
                          "This rank among the ranks of its host.")
local_size = _place_query(lib.kolo_local_size,
                          "The number of ranks on this host.")
cross_rank = _place_query(lib.kolo_cross_rank,
                          "The rank of this host among the hosts.")
cross_size = _place_query(lib.kolo_cross_size, "The number of hosts.")


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    return local_size() * cross_size() == size()


# ---- elastic training ------------------------------------------------------
# kolo_elastic, kolo_elastic_generation and kolo_hosts_updated (kolo.h);
# a libkolo without elastic training lacks them: 0 then, as in a job that is
# not elastic.


def elastic():
    """True in an elastic job (kolorun --min-np or
    --host-discovery-script: KOLO_ELASTIC=1). Callable before init()."""
    return bool(_lib.has("kolo_elastic") and lib.kolo_elastic())


def elastic_generation():
    """The generation of the elastic job this process joined (1, 2, ...);
    0 when kolo is not initialized or the job is not elastic."""
    if not _lib.has("kolo_elastic_generation"):
        return 0
    return int(lib.kolo_elastic_generation())


def hosts_updated():
    """This rank's own look at the job's membership (no collective): 0 when
    no newer generation was published than the one joined; else the OR of
    the updates since: 1 = workers removed only, 2 = added, 3 = both (or a
    failure). Negative (a KOLO_ERR_* status) when the store could not be
    read. 0 in a job that is not elastic."""
    if not _lib.has("kolo_hosts_updated"):
        return 0
    return int(lib.kolo_hosts_updated())


def _built(what):
    return bool(_lib.has("kolo_built") and lib.kolo_built(what.encode()))


def _enabled(what):
    return bool(_lib.has("kolo_enabled") and lib.kolo_enabled(what.encode()))


# Horovod's *_built() report what the library was compiled with: here each
# one is kolo_built(name) of the loaded libkolo, which knows "gloo", "mpi",
# "cuda" and "nccl" (and answers 0 for the others).


def gloo_built():
    """True when libkolo was built with the Gloo backend."""
    return _built("gloo")


def mpi_built():
    """True when libkolo was built with the MPI backend."""
    return _built("mpi")


def nccl_built():
    """NCCL's version code when libkolo was built with NCCL (the collectives
    of CUDA tensors), e.g. 22809 for NCCL 2.28.9, else 0: as Horovod's, so
    scripts that compare it with 2700 take the same branch."""
    if not _lib.has("kolo_built"):
        return 0
    return int(lib.kolo_built(b"nccl"))


def cuda_built():
    """True when libkolo was built with the CUDA runtime."""
    return _built("cuda")


def rocm_built():
    return _built("rocm")


def ddl_built():
    return _built("ddl")


def ccl_built():
    return _built("ccl")


def mpi_enabled():
    """True when MPI carries this job: started by mpirun (or kolorun
    --mpi), or an MPI backend in use; as Horovod's under mpirun."""
    return _enabled("mpi")


def gloo_enabled():
    """True when the job runs without MPI: kolo's own controller (shared
    memory, Gloo) plays the part of Horovod's Gloo mode, which is what
    `horovodrun --gloo` (and kolorun's way of starting ranks) gives a
    Horovod script. False before init, as Horovod's."""
    return is_initialized() and (_enabled("gloo") or not _enabled("mpi"))


def nccl_enabled():
    return _enabled("nccl")


def mpi_threads_supported():
    """kolo never calls MPI from the training threads."""
    return False


def _timeline_writer():
    """Whether this rank writes the timeline: rank 0, as Horovod's
    coordinator, or every rank with KOLO_TIMELINE_ALL_RANKS=1."""
    return rank() == 0 or os.environ.get("KOLO_TIMELINE_ALL_RANKS") == "1"


def start_timeline(file_path, mark_cycles=False):
    """Horovod's hvd.start_timeline: every rank calls it; rank 0 writes a
    Chrome-trace timeline of the job to file_path (replacing one being
    written; with KOLO_TIMELINE_ALL_RANKS=1 every rank writes its own,
    t.json as t.<rank>.json). mark_cycles adds a CYCLE_START marker per
    negotiation round. Horovod refuses it unless HOROVOD_TIMELINE=DYNAMIC
    was set before the job; kolo needs no such setting (KOLO_TIMELINE=
    DYNAMIC, or HOROVOD_TIMELINE=DYNAMIC, is accepted and starts none at
    init)."""
    if not file_path:
        raise ValueError("file_path must not be empty")
    if not is_initialized():
        raise ValueError("kolo has not been initialized; use hvd.init().")
    if not _timeline_writer():
        return
    path = str(file_path)
    if os.environ.get("KOLO_TIMELINE_ALL_RANKS") == "1":
        base, ext = os.path.splitext(path)
        path = ("%s.%d%s" % (base, rank(), ext) if ext == ".json"
                else "%s.%d" % (path, rank()))
    check(_lib.lib.kolo_start_timeline(path.encode(),
                                       1 if mark_cycles else 0),
          "start_timeline")


def stop_timeline():
    """Horovod's hvd.stop_timeline: writes what was recorded and closes the
    timeline file (nothing to do on ranks that write none)."""
    if not is_initialized():
        raise ValueError("kolo has not been initialized; use hvd.init().")
    if _timeline_writer():
        check(_lib.lib.kolo_stop_timeline(), "stop_timeline")


# ---- names -----------------------------------------------------------------

_noname = {}  # process set id -> counter of unnamed operations


def op_key(prefix, name, process_set=None):
    """The runtime name of an operation: "<prefix>.<name>", or an
    auto-generated "<prefix>.noname.<n>" where n counts the unnamed
    operations of the process set on this rank (".noname.s<id>.<n>" for a
    set other than the global one). As with Horovod, the ranks of a set must
    then issue their unnamed operations in the same order; ranks outside a
    set do not count its operations."""
    if name is None:
        sid = set_id(process_set)
        with _lock:
            n = _noname.get(sid, 0)
            _noname[sid] = n + 1
        if sid == _lib.GLOBAL_PROCESS_SET:
            return "%s.noname.%d" % (prefix, n)
        return "%s.noname.s%d.%d" % (prefix, sid, n)
    if not isinstance(name, str):
        raise TypeError("the name of an operation must be a str, not %s"
                        % type(name).__name__)
    return "%s.%s" % (prefix, name)


def encode(name):
    b = name.encode("utf-8")
    if not b:
        raise ValueError("the name of an operation cannot be empty")
    return b


# ---- process sets ----------------------------------------------------------

_registered_sets = {}  # id -> ProcessSet


class ProcessSet:
    """A subgroup of ranks whose collectives run among themselves.

    ProcessSet([0, 2]) names the ranks; add_process_set() (or
    init(process_sets=[...])) registers it on every rank, in the same order
    everywhere, and sets process_set_id. global_process_set is every rank."""

    def __init__(self, ranks):
        if ranks is None:
            self._ranks = None
        else:
            try:
                self._ranks = sorted(int(r) for r in ranks)
            except TypeError:
                raise ValueError("ProcessSet takes a list of ranks; kolo has "
                                 "no MPI communicators") from None
        self.process_set_id = None

    @property
    def ranks(self):
        if self._ranks is None:  # the global set
            return list(range(size()))
        return list(self._ranks)

    def _id(self):
        if self.process_set_id is None:
            raise ValueError("%s is not registered: call "
                             "add_process_set() on every rank first" % self)
        return self.process_set_id

    def size(self):
        """The number of ranks in the set (None when not registered)."""
        if self.process_set_id is None:
            return None
        n = lib.kolo_process_set_size(self.process_set_id)
        return n if n >= 0 else len(self.ranks)

    def rank(self):
        """This rank's rank in the set; None when not a member or not
        registered."""
        if self.process_set_id is None:
            return None
        r = lib.kolo_process_set_rank(self.process_set_id)
        return r if r >= 0 else None

    def included(self):
        """True when this rank belongs to the set."""
        if self._ranks is None:
            return True
        return rank() in self._ranks

    def __eq__(self, other):
        if not isinstance(other, ProcessSet):
            return NotImplemented
        if self.process_set_id is not None or other.process_set_id is not None:
            return self.process_set_id == other.process_set_id
        return self._ranks == other._ranks

    def __hash__(self):
        return hash((self.process_set_id, tuple(self._ranks or ())))

    def __repr__(self):
        if self._ranks is None:
            return "ProcessSet(global, process_set_id=0)"
        return "ProcessSet(ranks=%s, process_set_id=%s)" % (
            self._ranks, self.process_set_id)


global_process_set = ProcessSet(None)
global_process_set.process_set_id = _lib.GLOBAL_PROCESS_SET


def set_id(process_set):
    if process_set is None:
        return _lib.GLOBAL_PROCESS_SET
    if isinstance(process_set, ProcessSet):
        return process_set._id()
    if isinstance(process_set, int):
        return process_set
    raise TypeError("process_set must be a ProcessSet, not %s"
                    % type(process_set).__name__)


def set_size(process_set):
    if process_set is None or process_set is global_process_set:
        return size()
    n = lib.kolo_process_set_size(set_id(process_set))
    if n < 0:
        raise ValueError("%s is not a process set of this job" % (process_set,))
    return n


def set_rank(process_set):
    if process_set is None or process_set is global_process_set:
        return rank()
    return lib.kolo_process_set_rank(set_id(process_set))


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of global ranks) on
    this rank. Every rank of the job must make the same calls in the same
    order, ranks outside the set too. Returns the ProcessSet."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set._ranks is None:
        raise ValueError("the global process set is always registered")
    if process_set.process_set_id is not None:
        raise ValueError("%s is registered already" % (process_set,))
    ranks = process_set._ranks
    arr = (ctypes.c_int * len(ranks))(*ranks)
    out = ctypes.c_int(-1)
    check(lib.kolo_add_process_set(arr, len(ranks), ctypes.byref(out)),
          "add_process_set")
    process_set.process_set_id = out.value
    _registered_sets[out.value] = process_set
    return process_set


def remove_process_set(process_set):
    """Removes a registered process set on this rank (every rank calls it);
    its pending operations fail. Returns True if it was removed."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError("remove_process_set takes a ProcessSet")
    if process_set is global_process_set or process_set._ranks is None:
        raise ValueError("the global process set cannot be removed")
    if process_set.process_set_id is None:
        return False
    check(lib.kolo_remove_process_set(process_set.process_set_id),
          "remove_process_set")
    _registered_sets.pop(process_set.process_set_id, None)
    process_set.process_set_id = None
    return True


def add_process_sets_from_groups(groups, require_equal_size=True):
    """A group assignment, as for a TPU cross-replica sum: every rank of the
    job in exactly one group (and, with require_equal_size, all groups of one
    size); one process set per group, returned in order. A bad assignment
    raises ValueError naming the problem, and no set is created."""
    groups = [sorted(int(r) for r in g) for g in groups]
    n = len(groups)
    if n == 0:
        raise ValueError("add_process_sets_from_groups: no groups")
    arrays = [(ctypes.c_int * max(1, len(g)))(*g) for g in groups]
    ptrs = (ctypes.POINTER(ctypes.c_int) * n)(
        *[ctypes.cast(a, ctypes.POINTER(ctypes.c_int)) for a in arrays])
    sizes = (ctypes.c_int * n)(*[len(g) for g in groups])
    ids = (ctypes.c_int * n)()
    check(lib.kolo_add_process_sets_from_groups(
        n, ptrs, sizes, 1 if require_equal_size else 0, ids),
        "add_process_sets_from_groups")
    sets = []
    for g, i in zip(groups, ids):
        ps = ProcessSet(g)
        ps.process_set_id = i
        _registered_sets[i] = ps
        sets.append(ps)
    return sets


# ---- barrier and join ------------------------------------------------------


def barrier(process_set=global_process_set):
    """Blocks until every rank of the process set has called barrier()."""
    rc = lib.kolo_barrier(set_id(process_set))
    if rc != _lib.OK:
        raise failed(rc, "barrier")


def join():
    """For a rank out of data: blocks until every rank has joined, while the
    allreduces of the others go on (this rank contributes zeros). Returns
    the rank that joined last."""
    last = ctypes.c_int(-1)
    rc = lib.kolo_join(ctypes.byref(last))
    if rc != _lib.OK:
        raise failed(rc, "join")
    return last.value


# ---- pending operations ----------------------------------------------------


class _Pending:
    __slots__ = ("handles", "keep", "finish", "results", "what", "release",
                 "stream")

    def __init__(self, handles, keep, finish, results, what, release,
                 stream):
        self.handles = handles  # kolo handles
        self.keep = keep        # objects whose memory the runtime uses
        self.finish = finish    # callable(list of Result or None) -> output
        self.results = results  # True: the handles hand over a kolo_result_t
        self.what = what
        self.release = release  # callable(), once the runtime is done
        self.stream = stream    # callable() -> the stream to order on, or None


_pending = {}
_next_handle = itertools.count(1)


def register(handles, keep, finish, results=False, what="", release=None,
             stream=None):
    """Records enqueued kolo handles under one new Python handle. release,
    if given, is called once the runtime no longer uses the memory (the
    handle synchronized, or kolo shut down). stream, for tensors in device
    memory, is called at synchronize for the stream (a cudaStream_t as an
    int, None for the legacy default stream) on which the results are then
    ordered: the caller's current stream, as Horovod orders them."""
    h = next(_next_handle)
    _pending[h] = _Pending(list(handles), keep, finish, results, what,
                           release, stream)
    return h


def _drop_pending():
    """Forgets every pending handle (the runtime has stopped: none of them
    uses memory any more)."""
    pending = list(_pending.values())
    _pending.clear()
    for p in pending:
        if p.release is not None:
            p.release()


def _wait_one(kh, want_result, stream=None):
    """Waits for one kolo handle: (status, message, Result or None). With
    a stream (a callable), a device result is ordered on the stream it
    gives (kolo_wait_on_stream)."""
    if want_result:
        res = _lib.Result()
        rc = lib.kolo_wait_result(kh, ctypes.byref(res))
    else:
        res = None
        rc = (lib.kolo_wait(kh) if stream is None
              else lib.kolo_wait_on_stream(kh, stream()))
    msg = _lib.last_error() if rc != _lib.OK else ""
    return rc, msg, res


def release(handles):
    """Waits for kolo handles that completed at once (accumulation passes)."""
    for kh in handles:
        rc = lib.kolo_wait(kh)
        if rc != _lib.OK:
            raise failed(rc)


def poll(handle):
    """True when the operation is done (synchronize() will not block)."""
    p = _pending.get(handle)
    if p is None:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,))
    for kh in p.handles:
        rc = lib.kolo_poll(kh)
        if rc == _lib.IN_PROGRESS:
            return False
    return True


# kolo_wait, through kolo._fastpath where it was built (see _lib)
_wait = _lib.fast.wait if _lib.fast is not None else lib.kolo_wait
_OK = _lib.OK


def wait_failed(rc):
    """The exception for a kolo_wait that returned rc (not OK)."""
    if rc == _lib.ERR_NOT_INITIALIZED:
        return KoloValueError(_NOT_INITIALIZED, rc)
    return KoloError(_lib.last_error() or _lib.strerror(rc), rc)


def synchronize(handle):
    """Waits for the operation and returns its output (see the enqueuing
    function). Raises KoloError with the runtime's message if it failed."""
    p = _pending.pop(handle, None)
    if p is None:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,))
    handles = p.handles
    if len(handles) == 1 and not p.results:
        # one kolo handle and no kolo_result_t (an allreduce): the same as
        # below, with less work
        try:
            rc = (_wait(handles[0]) if p.stream is None
                  else lib.kolo_wait_on_stream(handles[0], p.stream()))
            if rc != _OK:
                raise wait_failed(rc)
            return p.finish([None]) if p.finish is not None else None
        finally:
            p.keep = None
            if p.release is not None:
                p.release()
    results = []
    error = None
    try:
        for kh in p.handles:
            rc, msg, res = _wait_one(kh, p.results, p.stream)
            results.append(res)
            if rc != _lib.OK and error is None:
                error = (rc, msg)
        if error is not None:
            rc, msg = error
            if rc == _lib.ERR_NOT_INITIALIZED:
                raise KoloValueError(_NOT_INITIALIZED, rc)
            raise KoloError(msg or _lib.strerror(rc), rc)
        return p.finish(results) if p.finish is not None else None
    finally:
        for res in results:
            if res is not None:
                lib.kolo_result_free(ctypes.byref(res))
        p.keep = None
        if p.release is not None:
            p.release()


def pending_count():
    return len(_pending)


def result_bytes(res):
    """The bytes of a kolo_result_t's data as a ctypes address and size."""
    return res.data, res.bytes


def result_copy(res, dst):
    """kolo_result_copy: the result's bytes into `dst`, an address where the
    data lives (host memory, or memory on the result's CUDA device; the copy
    is finished when this returns)."""
    rc = lib.kolo_result_copy(ctypes.byref(res), dst)
    if rc != _lib.OK:
        raise failed(rc, "kolo_result_copy")


def result_shape(res):
    return tuple(res.shape[i] for i in range(res.ndim))


def result_splits(res):
    return [res.splits[i] for i in range(res.nsplits)] if res.splits else []


# ---- enqueuing (framework-neutral: addresses, counts, kolo dtypes) ----------


def _shape_array(shape):
    shape = tuple(int(d) for d in shape)
    if len(shape) > _lib.MAX_DIMS:
        raise ValueError("a tensor of %d dimensions; kolo takes at most %d"
                         % (len(shape), _lib.MAX_DIMS))
    return (ctypes.c_int64 * max(1, len(shape)))(*shape), len(shape)


def make_opts(op=Sum, prescale=1.0, postscale=1.0, process_set=None,
              wire_dtype=None, backward_passes=1, average_passes=False,
              shape=None, place=None):
    """A kolo_opts_t, and an object to keep alive with it (the shape array).

    place: where the tensors live, (device_type, device, stream): None or
    DEVICE_HOST leave the defaults (host memory); DEVICE_CUDA sets the CUDA
    device ordinal and the cudaStream_t (an address, or None for the legacy
    default stream) on which the caller queued the work producing the
    input."""
    opts = _lib.new_opts()
    if place is not None and place[0] != _lib.DEVICE_HOST:
        opts.device_type = int(place[0])
        opts.device = int(place[1])
        opts.stream = place[2] or None
    opts.op = op
    opts.prescale = float(prescale)
    opts.postscale = float(postscale)
    opts.process_set = set_id(process_set)
    if wire_dtype is not None:
        opts.wire_dtype = wire_dtype
    opts.backward_passes = int(backward_passes)
    opts.average_passes = 1 if average_passes else 0
    keep = None
    if shape is not None and len(shape) > 0:
        arr, nd = _shape_array(shape)
        opts.ndim = nd
        opts.shape = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))
        keep = arr
    return opts, keep


def _enqueue_into(fn, what, key, inp, out, count, dtype, opts):
    """One tensor's collective from `inp` into `out` through the C call fn
    (kolo_allreduce_async_opts and its kin); its handle."""
    h = _lib.handle_t(0)
    check(fn(encode(key), inp, out, count, dtype, ctypes.byref(opts),
             ctypes.byref(h)),
          "%s of '%s'" % (what, key))
    return h.value


def allreduce_async(key, inp, out, count, dtype, opts):
    return _enqueue_into(lib.kolo_allreduce_async_opts, "allreduce", key,
                         inp, out, count, dtype, opts)


def grouped_allreduce_async(keys, inps, outs, counts, dtype, opts):
    n = len(keys)
    names = (ctypes.c_char_p * n)(*[encode(k) for k in keys])
    ins = (ctypes.c_void_p * n)(*inps)
    outs_ = (ctypes.c_void_p * n)(*outs)
    cnts = (ctypes.c_int64 * n)(*counts)
    hs = (_lib.handle_t * n)()
    check(lib.kolo_grouped_allreduce_async(n, names, ins, outs_, cnts, dtype,
                                           ctypes.byref(opts), hs),
          "grouped allreduce of '%s'" % keys[0])
    return list(hs)


def set_root(key, root_rank, process_set_id):
    """The rank within process set `process_set_id` of global rank
    root_rank. The bindings take root_rank as a global rank, as Horovod does
    (its broadcast compares root_rank with rank(), whatever the process
    set); kolo_broadcast_async takes the root's rank within the set, the
    index of that global rank among the set's ranks in increasing order (the
    order add_process_set hands them to the runtime). A root outside the set
    is refused, naming the set's global ranks."""
    root = int(root_rank)
    if process_set_id == _lib.GLOBAL_PROCESS_SET:
        return root  # the runtime names a root outside the job
    ps = _registered_sets.get(process_set_id)
    if ps is None:
        return root  # not a set of this job: the runtime says so
    ranks = ps.ranks
    if root not in ranks:
        raise KoloValueError(
            "broadcast of '%s': root rank %d is not a member of process set "
            "%d, whose ranks are %s; root_rank is a global rank (hvd.rank() "
            "of the root), as in Horovod"
            % (key, root, process_set_id, ", ".join(str(r) for r in ranks)))
    return ranks.index(root)


def broadcast_async(key, buf, count, dtype, root, opts):
    """Enqueues a broadcast from global rank `root` (see set_root)."""
    root = set_root(key, root, opts.process_set)
    h = _lib.handle_t(0)
    check(lib.kolo_broadcast_async(encode(key), buf, count, dtype, root,
                                   ctypes.byref(opts), ctypes.byref(h)),
          "broadcast of '%s'" % key)
    return h.value


def _grouped_shaped(fn, what, keys, inps, shapes, dtype, opts):
    n = len(keys)
    names = (ctypes.c_char_p * n)(*[encode(k) for k in keys])
    ins = (ctypes.c_void_p * n)(*inps)
    arrays = [_shape_array(s) for s in shapes]
    ndims = (ctypes.c_int * n)(*[nd for _, nd in arrays])
    sh = (ctypes.POINTER(ctypes.c_int64) * n)(
        *[ctypes.cast(a, ctypes.POINTER(ctypes.c_int64)) for a, _ in arrays])
    hs = (_lib.handle_t * n)()
    check(fn(n, names, ins, ndims, sh, dtype, ctypes.byref(opts), hs),
          "%s of '%s'" % (what, keys[0]))
    return list(hs)


def grouped_allgather_async(keys, inps, shapes, dtype, opts):
    return _grouped_shaped(lib.kolo_grouped_allgather_async, "allgather",
                           keys, inps, shapes, dtype, opts)


def grouped_reducescatter_async(keys, inps, shapes, dtype, opts):
    return _grouped_shaped(lib.kolo_grouped_reducescatter_async,
                           "reducescatter", keys, inps, shapes, dtype, opts)


def reducescatter_into_async(key, inp, out, count, dtype, opts):
    """kolo_reducescatter_into_async: `inp` holds count * set size
    elements, `out` receives this rank's block of the reduction."""
    return _enqueue_into(lib.kolo_reducescatter_into_async, "reducescatter",
                         key, inp, out, count, dtype, opts)


def allgather_into_async(key, inp, out, count, dtype, opts):
    """kolo_allgather_into_async: `count` elements of every rank into
    `out` in rank order (`inp` may be this rank's block of `out`)."""
    return _enqueue_into(lib.kolo_allgather_into_async, "allgather", key,
                         inp, out, count, dtype, opts)


def alltoall_async(key, inp, shape, dtype, splits, opts):
    arr, nd = _shape_array(shape)
    sp = None
    if splits is not None:
        splits = [int(s) for s in splits]
        sp = (ctypes.c_int64 * max(1, len(splits)))(*splits)
        n = set_size(None if opts.process_set == 0 else opts.process_set)
        if len(splits) != n:
            raise KoloValueError(
                "alltoall of '%s': %d splits for a process set of %d ranks "
                "(one split per rank)" % (key, len(splits), n))
    h = _lib.handle_t(0)
    check(lib.kolo_alltoall_async(encode(key), inp, nd, arr, dtype, sp,
                                  ctypes.byref(opts), ctypes.byref(h)),
          "alltoall of '%s'" % key)
    return h.value


# What kolo and kolo.torch both export from here (each package's __init__
# takes them with `from ._core import *`).
__all__ = [
    "Sum", "Average", "Min", "Max", "Product", "Adasum",
    "KoloError", "KoloValueError", "HostsUpdatedInterrupt",
    "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "add_process_sets_from_groups",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
    "local_size", "cross_rank", "cross_size", "is_homogeneous",
    "gloo_built", "mpi_built", "nccl_built", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built", "gloo_enabled", "mpi_enabled", "nccl_enabled",
    "mpi_threads_supported", "start_timeline", "stop_timeline",
]

# The collectives kolo (_numpy.py) and kolo.torch (mpi_ops.py) both offer,
# by the same names: each module's __all__ begins with them.
COLLECTIVES = [
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async",
]
