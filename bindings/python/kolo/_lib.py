"""The one place where Python meets libkolo: loading the library and
declaring the prototype of every function of kolo.h that the bindings use.

The library is found, in this order:
  1. the environment variable KOLO_LIBRARY (a path to libkolo.so);
  2. kolo/_native/libkolo.so.0, inside this package (where `pip install`
     puts it: setup.py);
  3. the libdir that `make` wrote into kolo/_build_config.py (the installed
     package knows where `make install` put the library);
  4. the dynamic loader's search path (`libkolo.so.0`, then `libkolo.so`).

ctypes.CDLL releases the GIL around every foreign call, so a Python thread
blocked in kolo_wait() lets the other Python threads run.

The hottest two calls (kolo.torch's in-place allreduce of a host tensor,
and kolo_wait) go through the optional extension module kolo._fastpath
when it was built (`fast` below; its essay says why), and through ctypes
otherwise.
"""

import ctypes
import os

# ---- constants of kolo.h ---------------------------------------------------

OK = 0
IN_PROGRESS = 1
ERR_INVALID_ARGUMENT = -1
ERR_NOT_INITIALIZED = -2
ERR_ALREADY_INITIALIZED = -3
ERR_SHUTDOWN = -4
ERR_MISMATCH = -5
ERR_BACKEND = -6
ERR_NO_MEMORY = -7
ERR_INVALID_HANDLE = -8
ERR_DUPLICATE_NAME = -9
ERR_CONFIG = -10
ERR_UNSUPPORTED = -11
ERR_RANK_LOST = -12
ERR_TIMEOUT = -13
ERR_INTERNAL = -14

STATUS_NAMES = {
    OK: "KOLO_OK", IN_PROGRESS: "KOLO_IN_PROGRESS",
    ERR_INVALID_ARGUMENT: "KOLO_ERR_INVALID_ARGUMENT",
    ERR_NOT_INITIALIZED: "KOLO_ERR_NOT_INITIALIZED",
    ERR_ALREADY_INITIALIZED: "KOLO_ERR_ALREADY_INITIALIZED",
    ERR_SHUTDOWN: "KOLO_ERR_SHUTDOWN", ERR_MISMATCH: "KOLO_ERR_MISMATCH",
    ERR_BACKEND: "KOLO_ERR_BACKEND", ERR_NO_MEMORY: "KOLO_ERR_NO_MEMORY",
    ERR_INVALID_HANDLE: "KOLO_ERR_INVALID_HANDLE",
    ERR_DUPLICATE_NAME: "KOLO_ERR_DUPLICATE_NAME",
    ERR_CONFIG: "KOLO_ERR_CONFIG", ERR_UNSUPPORTED: "KOLO_ERR_UNSUPPORTED",
    ERR_RANK_LOST: "KOLO_ERR_RANK_LOST", ERR_TIMEOUT: "KOLO_ERR_TIMEOUT",
    ERR_INTERNAL: "KOLO_ERR_INTERNAL",
}

# kolo_dtype_t (the numbering is part of the wire format)
UINT8, INT8, UINT16, INT16, INT32, INT64 = 0, 1, 2, 3, 4, 5
FLOAT16, BFLOAT16, FLOAT32, FLOAT64, BOOL = 6, 7, 8, 9, 10

# kolo_op_t
OP_SUM, OP_AVERAGE, OP_MIN, OP_MAX, OP_PRODUCT = 0, 1, 2, 3, 4

# where a tensor lives (kolo_opts_t.device_type, kolo_result_t.device_type)
DEVICE_HOST, DEVICE_CUDA = 0, 1

GLOBAL_PROCESS_SET = 0
MAX_DIMS = 8
MAX_NAME_LEN = 1024

handle_t = ctypes.c_int64


class Opts(ctypes.Structure):
    """kolo_opts_t."""
    _fields_ = [
        ("op", ctypes.c_int),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("process_set", ctypes.c_int),
        ("wire_dtype", ctypes.c_int),
        ("backward_passes", ctypes.c_int),
        ("average_passes", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("device_type", ctypes.c_int),
        ("device", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("while_joined", ctypes.c_int),
    ]


class Result(ctypes.Structure):
    """kolo_result_t."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("bytes", ctypes.c_size_t),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("nsplits", ctypes.c_int),
        ("splits", ctypes.POINTER(ctypes.c_int64)),
        ("device_type", ctypes.c_int),
        ("device", ctypes.c_int),
    ]


# ---- finding and loading the library -------------------------------------


def _candidates():
    env = os.environ.get("KOLO_LIBRARY")
    if env:
        return [env], True
    found = []
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "_native", "libkolo.so.0")
    if os.path.exists(packaged):
        found.append(packaged)
    try:
        # written by make; absent in a source tree
        from ._build_config import LIBDIR as libdir
        if libdir:
            found += [os.path.join(libdir, "libkolo.so.0"),
                      os.path.join(libdir, "libkolo.so")]
    except ImportError:
        pass
    found += ["libkolo.so.0", "libkolo.so"]
    return found, False


def _load():
    names, from_env = _candidates()
    errors = []
    for name in names:
        if os.path.sep in name and not os.path.exists(name):
            errors.append("%s: no such file" % name)
            continue
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            errors.append(str(e))
    where = ("KOLO_LIBRARY=%s" % names[0]) if from_env else ", ".join(names)
    raise ImportError(
        "kolo: cannot load libkolo (tried %s): %s. Build kolo "
        "(./configure && make) and set KOLO_LIBRARY to the path of "
        "libkolo.so (in a build tree: .libs/libkolo.so), or install it "
        "(pip install ., or make install)." % (where, "; ".join(errors)))


lib, path = _load()

_P = ctypes.c_void_p
_I = ctypes.c_int
_I64 = ctypes.c_int64
_S = ctypes.c_char_p
_PH = ctypes.POINTER(handle_t)
_PI64 = ctypes.POINTER(ctypes.c_int64)
_PI = ctypes.POINTER(ctypes.c_int)
_POPTS = ctypes.POINTER(Opts)

_PROTOTYPES = {
    "kolo_init": (_I, []),
    "kolo_shutdown": (_I, []),
    "kolo_shutdown_at_exit": (_I, [ctypes.c_char_p]),
    "kolo_is_initialized": (_I, []),
    "kolo_rank": (_I, []),
    "kolo_size": (_I, []),
    "kolo_local_rank": (_I, []),
    "kolo_local_size": (_I, []),
    "kolo_cross_rank": (_I, []),
    "kolo_cross_size": (_I, []),
    "kolo_opts_init": (None, [_POPTS]),
    "kolo_allreduce_async": (_I, [_S, _P, _P, _I64, _I, _I, _PH]),
    "kolo_allreduce_async_opts": (_I, [_S, _P, _P, _I64, _I, _POPTS, _PH]),
    "kolo_broadcast_async": (_I, [_S, _P, _I64, _I, _I, _POPTS, _PH]),
    "kolo_allgather_async": (_I, [_S, _P, _I, _PI64, _I, _POPTS, _PH]),
    "kolo_alltoall_async": (_I, [_S, _P, _I, _PI64, _I, _PI64, _POPTS, _PH]),
    "kolo_reducescatter_async": (_I, [_S, _P, _I, _PI64, _I, _POPTS, _PH]),
    "kolo_reducescatter_into_async": (_I, [_S, _P, _P, _I64, _I, _POPTS,
                                           _PH]),
    "kolo_allgather_into_async": (_I, [_S, _P, _P, _I64, _I, _POPTS, _PH]),
    "kolo_wait_result": (_I, [handle_t, ctypes.POINTER(Result)]),
    "kolo_result_free": (None, [ctypes.POINTER(Result)]),
    "kolo_result_copy": (_I, [ctypes.POINTER(Result), ctypes.c_void_p]),
    "kolo_grouped_allreduce_async": (
        _I, [_I, ctypes.POINTER(_S), ctypes.POINTER(_P), ctypes.POINTER(_P),
             _PI64, _I, _POPTS, _PH]),
    "kolo_grouped_allgather_async": (
        _I, [_I, ctypes.POINTER(_S), ctypes.POINTER(_P), _PI,
             ctypes.POINTER(_PI64), _I, _POPTS, _PH]),
    "kolo_grouped_reducescatter_async": (
        _I, [_I, ctypes.POINTER(_S), ctypes.POINTER(_P), _PI,
             ctypes.POINTER(_PI64), _I, _POPTS, _PH]),
    "kolo_barrier": (_I, [_I]),
    "kolo_join": (_I, [_PI]),
    "kolo_add_process_set": (_I, [_PI, _I, _PI]),
    "kolo_remove_process_set": (_I, [_I]),
    "kolo_add_process_sets_from_groups": (
        _I, [_I, ctypes.POINTER(_PI), _PI, _I, _PI]),
    "kolo_process_set_rank": (_I, [_I]),
    "kolo_process_set_size": (_I, [_I]),
    "kolo_poll": (_I, [handle_t]),
    "kolo_wait": (_I, [handle_t]),
    "kolo_wait_on_stream": (_I, [handle_t, ctypes.c_void_p]),
    "kolo_handle_error": (_S, [handle_t]),
    "kolo_built": (_I, [_S]),
    "kolo_start_timeline": (_I, [_S, _I]),
    "kolo_stop_timeline": (_I, []),
    "kolo_enabled": (_I, [_S]),
    "kolo_strerror": (_S, [_I]),
    "kolo_last_error": (_S, []),
    "kolo_dtype_size": (ctypes.c_size_t, [_I]),
    "kolo_dtype_name": (_S, [_I]),
    "kolo_op_name": (_S, [_I]),
    "kolo_elastic": (_I, []),
    "kolo_elastic_generation": (_I, []),
    "kolo_hosts_updated": (_I, []),
    "kolo_flight_stacks": (_I, [_I, _I]),
}

# Functions that a library older than the bindings may lack: declared when
# present; the bindings check `has(name)` before they use them.
# kolo_elastic, kolo_elastic_generation and kolo_hosts_updated came with
# elastic training (issue 21): kolo/_core.py answers 0 for them without it.
# kolo_flight_stacks came with the flight recorder (issue 52): without it
# the dumps carry no Python stacks.
_OPTIONAL = {"kolo_built", "kolo_enabled", "kolo_elastic",
             "kolo_elastic_generation", "kolo_hosts_updated",
             "kolo_flight_stacks"}


def _declare():
    missing = []
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if name not in _OPTIONAL:
                missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    if missing:
        raise ImportError("kolo: %s lacks %s: the library is older than these "
                          "bindings" % (path, ", ".join(sorted(missing))))


_declare()


def _load_fastpath():
    """The optional extension module kolo._fastpath (bindings/python/kolo/
    _fastpath.c), set up to call the library loaded above: (module, path),
    or (None, None) where it was not built. It is looked for beside that
    library (a build tree's .libs), then in this package (where `make
    install` puts it). One that is there but does not load is reported
    with a warning, and the bindings go on through ctypes."""
    import importlib.machinery
    import importlib.util
    places = []
    if os.path.sep in path:
        places.append(os.path.dirname(os.path.abspath(path)))
    places.append(os.path.dirname(os.path.abspath(__file__)))
    for where in places:
        candidate = os.path.join(where, "_fastpath.so")
        if not os.path.exists(candidate):
            continue
        try:
            loader = importlib.machinery.ExtensionFileLoader(
                "kolo._fastpath", candidate)
            spec = importlib.util.spec_from_file_location(
                "kolo._fastpath", candidate, loader=loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            module.setup(
                ctypes.cast(lib.kolo_allreduce_async_opts, ctypes.c_void_p).value,
                ctypes.cast(lib.kolo_wait, ctypes.c_void_p).value)
            return module, candidate
        except Exception as e:  # a broken build: say so, use ctypes
            import warnings
            warnings.warn("kolo: %s does not load (%s): kolo.torch calls "
                          "libkolo through ctypes, more slowly" % (candidate, e),
                          RuntimeWarning)
            return None, None
    return None, None


# kolo.torch's in-place allreduce and every wait go through it when present
fast, fast_path = _load_fastpath()


def has(name):
    """True when the loaded libkolo exports `name`."""
    return hasattr(lib, name)


def last_error():
    """kolo_last_error() of this thread, as str."""
    msg = lib.kolo_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def strerror(status):
    msg = lib.kolo_strerror(status)
    return msg.decode("utf-8", "replace") if msg else "unknown status"


def _status_named(text):
    """The KOLO_ERR_* status whose kolo_strerror() text contains `text`, or
    None when the loaded libkolo has no such status."""
    for status in range(-1, -129, -1):
        msg = lib.kolo_strerror(status)
        if msg and text in msg.decode("utf-8", "replace").lower():
            return status
    return None


# The statuses of elastic training (bindings/c/kolo.h, KOLO_STATUS_MAP:
# KOLO_ERR_MEMBERSHIP "the job's membership changed", KOLO_ERR_REMOVED
# "this worker was removed from the elastic job"). Their numbers are the
# library's: found by their text, so the bindings follow kolo.h; None with a
# libkolo that predates them (no operation can then fail with them).
ERR_MEMBERSHIP = _status_named("membership changed")
ERR_REMOVED = _status_named("removed from the elastic job")
for _code, _name in ((ERR_MEMBERSHIP, "KOLO_ERR_MEMBERSHIP"),
                     (ERR_REMOVED, "KOLO_ERR_REMOVED")):
    if _code is not None:
        STATUS_NAMES[_code] = _name
del _code, _name


def new_opts():
    """A kolo_opts_t with the library's defaults."""
    opts = Opts()
    lib.kolo_opts_init(ctypes.byref(opts))
    return opts
