"""kolo.run: run a Python function on the ranks of a new job, as
horovod.run does.

    import kolo

    def train(lr):
        import kolo.torch as hvd
        hvd.init()
        ...
        return hvd.rank(), loss

    results = kolo.run(train, args=(0.1,), np=2)   # [(0, ...), (1, ...)]

How it works. The caller pickles the call (the function, args, kwargs)
into a private directory and runs `kolorun -np N ... python -m
kolo._run_task DIR`, exactly as kolorun starts any job (the same flags,
rendezvous, failure handling). Each rank unpickles the call, runs it,
and pickles its return value, or its exception with the traceback, into
DIR/result.RANK. When kolorun has ended, the caller returns the values in
rank order, or raises RunError naming the rank whose exception came first
(the others usually fail because of it), with that rank's traceback; the
rank's own exception is its __cause__.

What can be run. The call travels with pickle: the function must be one
that pickle names, a function defined at the top level of a module the
ranks can import (the caller's sys.path is given to them). A function of
the script that calls kolo.run (__main__) works too: each rank imports
the script under the name __mp_main__ first, as multiprocessing's spawn
does, so the script must start its work under `if __name__ ==
"__main__":`. Lambdas, nested functions and functions typed at the
interactive prompt cannot be pickled by name; where the cloudpickle
package is installed it is used and carries them by value (it is not
needed otherwise). Return values and exceptions must be picklable too (an
exception that is not is reported by its type, message and traceback).

Several hosts. DIR is made in the temporary directory when every rank
runs here; with `hosts` or `hostfile` naming other hosts, it is made in
the current directory, which kolorun's remote ranks change into: it must
then be on a file system every host shares (Horovod's driver serves the
call over HTTP instead).
"""

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading

__all__ = ["run", "RunError"]


class RunError(RuntimeError):
    """A rank of a kolo.run job raised. .rank is the rank, .exception its
    exception (None when it could not be pickled), .traceback its
    traceback as text."""

    def __init__(self, message, rank, exception, traceback_text):
        super().__init__(message)
        self.rank = rank
        self.exception = exception
        self.traceback = traceback_text


# Set by kolo._run_task while a rank imports the caller's script: a script
# that calls kolo.run without the __main__ guard would start jobs forever.
_importing_main = False


def _find_kolorun():
    """kolorun of this kolo: beside the library (pip's kolo/_native), or
    above it (a build tree's .libs), else where `make install` put it,
    else on PATH."""
    from ._lib import path as lib_path
    tried = []
    lib_dir = os.path.dirname(os.path.abspath(lib_path))
    if os.path.basename(lib_dir) == ".libs":
        tried.append(os.path.join(os.path.dirname(lib_dir), "kolorun"))
    elif os.path.basename(lib_dir) == "_native":
        tried.append(os.path.join(lib_dir, "kolorun"))
    try:
        from ._build_config import BINDIR as bindir
        if bindir and not bindir.startswith("@"):
            tried.append(os.path.join(bindir, "kolorun"))
    except ImportError:
        pass
    for path in tried:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("kolorun")
    if found:
        return found
    raise FileNotFoundError(
        "kolo.run needs kolorun, and found none (tried %s and PATH): build "
        "kolo, or install it (pip install ., or make install)" % (", ".join(tried) or "nothing"))


def _site_dirs():
    import site
    import sysconfig
    dirs = set(sysconfig.get_paths().get(k) for k in ("purelib", "platlib"))
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # some virtualenvs' old site.py
        pass
    return {os.path.abspath(d) for d in dirs if d}


def _pickler():
    try:
        import cloudpickle  # carries lambdas and nested functions by value
        return cloudpickle
    except ImportError:
        return pickle


def _local(host):
    import socket
    name = host.split(":")[0].strip("[]")
    if name in ("localhost", "127.0.0.1", "::1"):
        return True
    me = socket.gethostname()
    return name == me or name.split(".")[0] == me.split(".")[0]


def _hosts_all_local(hosts, hostfile):
    names = []
    if hosts:
        names = [h for h in hosts.split(",") if h]
    elif hostfile:
        with open(hostfile) as f:
            for line in f:
                line = line.split("#", 1)[0].split()
                if line:
                    names.append(line[0])
    return all(_local(h) for h in names)


def _forward(stream, out, keep):
    """Copies kolorun's output to `out` line by line (sys.stdout may be a
    notebook's), keeping kolorun's own lines for the error message."""
    for raw in iter(stream.readline, b""):
        text = raw.decode("utf-8", "replace")
        if keep is not None and text.startswith("kolorun: "):
            keep.append(text.rstrip("\n"))
        try:
            out.write(text)
            out.flush()
        except (OSError, ValueError):
            pass
    stream.close()


def run(func, args=(), kwargs=None, num_proc=None, min_num_proc=None,
        max_num_proc=None, slots=None, reset_limit=None, cooldown_range=None,
        hosts=None, hostfile=None, start_timeout=None, ssh_port=None,
        ssh_identity_file=None, disable_cache=None, output_filename=None,
        verbose=None, use_gloo=None, use_mpi=None, mpi_args=None,
        network_interface=None, executable=None, np=None, min_np=None,
        max_np=None):
    """Runs func(*args, **kwargs) on every rank of a new job and returns the
    list of the ranks' return values, in rank order (horovod.run).

    :param func: the function; pickle must name it (see the module's
        documentation: top level of an importable module, or of the
        calling script under an ``if __name__ == "__main__":`` guard).
    :param args, kwargs: its arguments (picklable).
    :param num_proc: number of ranks (``np`` is the same; default 1).
    :param hosts: ``"host1:2,host2:4"``, as kolorun -H.
    :param hostfile: a file of ``host slots=N`` lines, as kolorun --hostfile.
    :param start_timeout: seconds the ranks wait for each other at start.
    :param ssh_port, ssh_identity_file: for ranks on other hosts.
    :param disable_cache: accepted (kolorun keeps no cache).
    :param output_filename: also write each rank's output to
        DIR/rank.R/stdout and stderr.
    :param verbose: kolorun says what it does.
    :param use_gloo, use_mpi: kolorun --gloo (Gloo negotiates and reduces,
        as horovodrun --gloo) or --mpi (through mpirun, MPI does); neither:
        kolo's choice (shared memory on one host, Gloo across hosts).
    :param mpi_args: more arguments for mpirun (with use_mpi).
    :param network_interface: interfaces, comma-separated
        (kolorun --network-interfaces).
    :param executable: the ranks' Python (default: sys.executable).
    :param min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
        min_np, max_np: Horovod's elastic arguments; kolo.run refuses them.
    :raises RunError: a rank raised; it names the rank, and its exception
        is the RunError's __cause__.
    :raises RuntimeError: the job failed otherwise (a rank was killed, or
        kolorun could not start it); the message has kolorun's words.
    """
    if _importing_main:
        raise RuntimeError(
            "kolo.run was called while a rank imported the main script: "
            "start the script's work under `if __name__ == \"__main__\":`, "
            "so that the ranks can import its functions without running it")
    n = _ranks(num_proc, np, {
        "min_num_proc": min_num_proc, "max_num_proc": max_num_proc,
        "slots": slots, "reset_limit": reset_limit,
        "cooldown_range": cooldown_range, "min_np": min_np, "max_np": max_np})
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    call = _pack_call(func, args, {} if kwargs is None else kwargs)

    local = _hosts_all_local(hosts, hostfile)
    work = tempfile.mkdtemp(prefix="kolo-run-",
                            dir=None if local else os.getcwd())
    try:
        with open(os.path.join(work, "call.pkl"), "wb") as f:
            pickle.dump(call, f, protocol=pickle.HIGHEST_PROTOCOL)
        cmd = _kolorun_command(n, work, executable, {
            "hosts": hosts, "hostfile": hostfile,
            "start_timeout": start_timeout, "ssh_port": ssh_port,
            "ssh_identity_file": ssh_identity_file,
            "disable_cache": disable_cache,
            "output_filename": output_filename, "verbose": verbose,
            "use_gloo": use_gloo, "use_mpi": use_mpi, "mpi_args": mpi_args,
            "network_interface": network_interface})
        status, kolorun_lines = _run_kolorun(cmd, _ranks_env())
        return _collect(work, n, status, kolorun_lines)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ranks(num_proc, np, elastic):
    """The number of ranks, from num_proc or its twin np; Horovod's elastic
    arguments refused."""
    given = [k for k, v in elastic.items() if v is not None]
    if given:
        raise ValueError("kolo.run does not start elastic jobs (%s given); "
                         "give a fixed num_proc" % ", ".join(given))
    if num_proc is not None and np is not None and num_proc != np:
        raise ValueError("num_proc=%r and np=%r differ; give one"
                         % (num_proc, np))
    n = num_proc if num_proc is not None else np if np is not None else 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError("num_proc must be a positive int, not %r" % (n,))
    return n


def _pack_call(func, args, kwargs):
    """What the ranks need to make the call (see kolo._run_task): the
    pickled call, and where to import the caller's modules from."""
    pickler = _pickler()
    try:
        payload = pickler.dumps((func, tuple(args), dict(kwargs)),
                                protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(
            "kolo.run cannot pickle %r (%s): give a function defined at the "
            "top level of a module (lambdas and nested functions need the "
            "cloudpickle package), and picklable arguments"
            % (func, e)) from e
    main = sys.modules.get("__main__")
    main_path = getattr(main, "__file__", None)
    # Only a call that names the caller's script makes the ranks import it.
    if b"__main__" in payload and pickler is pickle:
        if not main_path or not os.path.exists(main_path):
            raise TypeError(
                "kolo.run cannot send %r to the ranks: it is defined in an "
                "interactive session (__main__ without a file), which the "
                "ranks cannot import; put it in a module (or install "
                "cloudpickle)" % (func,))
    else:
        main_path = None
    return {"payload": payload, "sys_path": list(sys.path),
            "main_path": os.path.abspath(main_path) if main_path else None,
            "cwd": os.getcwd()}


def _same(value):
    return value


# kolo.run's arguments that become kolorun's flags, in the order given:
# (argument, flag, how its value is written; None: a flag without a value,
# given when the argument is true).
_KOLORUN_FLAGS = (
    ("hosts", "-H", _same),
    ("hostfile", "--hostfile", _same),
    ("start_timeout", "--start-timeout", lambda v: str(int(v))),
    ("ssh_port", "--ssh-port", str),
    ("ssh_identity_file", "--ssh-identity-file", _same),
    ("disable_cache", "--disable-cache", None),
    ("output_filename", "--output-filename", _same),
    ("verbose", "--verbose", None),
    ("use_gloo", "--gloo", None),
    ("use_mpi", "--mpi", None),
    ("mpi_args", "--mpi-args", _same),
    ("network_interface", "--network-interfaces", _same),
)


def _kolorun_command(n, work, executable, options):
    """kolorun's command line: n ranks of `python -m kolo._run_task work`,
    with the flags `options` (kolo.run's arguments by name) ask for."""
    cmd = [_find_kolorun(), "-np", str(n), "--tag-output"]
    for name, flag, write in _KOLORUN_FLAGS:
        value = options[name]
        if write is None:
            if value:
                cmd += [flag]
        elif value is not None:
            cmd += [flag, write(value)]
    return cmd + ["--", executable or sys.executable, "-m", "kolo._run_task",
                  work]


def _ranks_env():
    """The ranks' environment: this one, with this kolo on their path."""
    env = dict(os.environ)
    # The ranks import kolo as this process did: from a source tree,
    # through PYTHONPATH (an installed kolo is on their path already).
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if here not in _site_dirs():
        env["PYTHONPATH"] = os.pathsep.join(
            [here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                      if p and p != here])
    from ._lib import path as lib_path
    env.setdefault("KOLO_LIBRARY", os.path.abspath(lib_path))
    return env


def _run_kolorun(cmd, env):
    """Runs kolorun to its end, its output copied to ours; its exit status
    and its own lines ("kolorun: ...") from its stderr."""
    kolorun_lines = []
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    threads = [
        threading.Thread(target=_forward,
                         args=(proc.stdout, sys.stdout, None),
                         daemon=True),
        threading.Thread(target=_forward,
                         args=(proc.stderr, sys.stderr, kolorun_lines),
                         daemon=True)]
    for t in threads:
        t.start()
    try:
        status = proc.wait()
    except BaseException:
        # Ctrl-C in the caller: kolorun stops the ranks.
        proc.terminate()
        proc.wait()
        raise
    for t in threads:
        t.join()
    return status, kolorun_lines


def _collect(work, n, status, kolorun_lines):
    results, errors, missing = [None] * n, [], []
    for rank in range(n):
        path = os.path.join(work, "result.%d" % rank)
        try:
            with open(path, "rb") as f:
                outcome = pickle.load(f)
        except FileNotFoundError:
            missing.append(rank)
            continue
        except Exception as e:  # a value that cannot be unpickled here
            outcome = {"ok": False, "exception": None, "time": 0,
                       "what": "its result cannot be unpickled: %s" % e,
                       "traceback": ""}
        if outcome["ok"]:
            results[rank] = outcome["value"]
        else:
            errors.append((outcome["time"], rank, outcome))
    said = "; ".join(kolorun_lines[-3:])
    if errors:
        errors.sort(key=lambda e: (e[0], e[1]))
        _, rank, outcome = errors[0]
        others = sorted(r for _, r, _ in errors[1:]) + missing
        message = "rank %d of %d raised %s%s" % (
            rank, n, outcome["what"],
            " (then rank%s %s failed too)" % (
                "s" if len(others) > 1 else "",
                ", ".join(str(r) for r in others)) if others else "")
        if outcome["traceback"]:
            message += "\n\nTraceback on rank %d:\n%s" % (
                rank, outcome["traceback"].rstrip())
        error = RunError(message, rank, outcome["exception"],
                         outcome["traceback"])
        if isinstance(outcome["exception"], BaseException):
            raise error from outcome["exception"]
        raise error
    if missing:
        raise RuntimeError(
            "kolo.run: rank%s %s ended without a result (kolorun exited with "
            "status %d%s)" % ("s" if len(missing) > 1 else "",
                              ", ".join(str(r) for r in missing), status,
                              ": " + said if said else ""))
    if status != 0:
        raise RuntimeError("kolo.run: every rank returned, but kolorun "
                           "exited with status %d%s" %
                           (status, ": " + said if said else ""))
    return results
