"""The commands `pip install` puts on the environment's PATH: kolorun,
kolo-timeline and kolo-bench. Each runs the program of that name that the package keeps in
kolo/_native/ (see setup.py), in place of this process: same arguments,
same exit status, same signals.

A module of its own beside the package, so that starting kolorun does not
import kolo (which loads libkolo and NumPy). kolorun --check-build asks a
Python what it can import: this one, the environment's, unless KOLO_PYTHON
says otherwise.
"""

import importlib.util
import os
import sys


def _native(name):
    spec = importlib.util.find_spec("kolo")
    places = list(spec.submodule_search_locations or []) if spec else []
    for place in places:
        path = os.path.join(place, "_native", name)
        if os.path.exists(path):
            return path
    sys.exit("%s: kolo's %s is not in this installation (looked in %s): "
             "reinstall kolo (pip install)"
             % (name, name, ", ".join(os.path.join(p, "_native")
                                     for p in places) or "no kolo package"))


def kolorun():
    path = _native("kolorun")
    os.environ.setdefault("KOLO_PYTHON", sys.executable)
    os.execv(path, ["kolorun"] + sys.argv[1:])


def kolo_bench():
    path = _native("kolo-bench")
    # It links libkolo.so.0, which is beside it.
    here = os.path.dirname(path)
    old = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = here + (":" + old if old else "")
    os.execv(path, ["kolo-bench"] + sys.argv[1:])


def kolo_timeline():
    path = _native("kolo-timeline")
    os.execv(sys.executable, [sys.executable, path] + sys.argv[1:])
