"""One rank of a kolo.run job: `python -m kolo._run_task DIR`.

Reads the call kolo.run pickled into DIR/call.pkl, runs it, and pickles
the outcome into DIR/result.RANK: the return value, or the exception with
its traceback and the time it was raised (kolo.run names the rank whose
exception came first). A rank that raised exits with status 1, so that
kolorun stops the others, as it does for any failing rank.
"""

import os
import pickle
import sys
import time
import traceback


def _rank():
    # kolorun's variable; under kolorun --mpi, MPI's launcher's.
    for var in ("KOLO_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                "HOROVOD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _import_main(path):
    """The caller's script under the name __mp_main__, standing in for
    __main__ (multiprocessing's spawn does the same), so that its functions
    unpickle."""
    import importlib
    import runpy
    import types
    run_module = importlib.import_module("kolo.run")  # kolo.run is the function
    run_module._importing_main = True
    try:
        namespace = runpy.run_path(path, run_name="__mp_main__")
    finally:
        run_module._importing_main = False
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(namespace)
    module.__file__ = path
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _write(work, rank, outcome):
    try:
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        if outcome["ok"]:
            outcome = {"ok": False, "exception": None, "time": time.time(),
                       "what": "a return value that cannot be pickled "
                               "(%s: %s)" % (type(e).__name__, e),
                       "traceback": ""}
        else:
            outcome = dict(outcome, exception=None)
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    path = os.path.join(work, "result.%d" % rank)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def main(work):
    rank = _rank()
    with open(os.path.join(work, "call.pkl"), "rb") as f:
        call = pickle.load(f)
    for p in reversed(call["sys_path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        os.chdir(call["cwd"])
    except OSError:
        pass
    try:
        if call["main_path"]:
            _import_main(call["main_path"])
        func, args, kwargs = pickle.loads(call["payload"])
        value = func(*args, **kwargs)
        outcome = {"ok": True, "value": value}
    except SystemExit as e:
        if e.code in (None, 0):
            outcome = {"ok": True, "value": None}
        else:
            outcome = {"ok": False, "exception": e, "time": time.time(),
                       "what": "SystemExit(%r)" % (e.code,),
                       "traceback": traceback.format_exc()}
    except BaseException as e:
        outcome = {"ok": False, "exception": e, "time": time.time(),
                   "what": "%s: %s" % (type(e).__name__, e),
                   "traceback": traceback.format_exc()}
    _write(work, rank, outcome)
    if not outcome["ok"]:
        sys.stderr.write("kolo.run: rank %d raised %s\n%s" % (
            rank, outcome["what"], outcome["traceback"]))
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
