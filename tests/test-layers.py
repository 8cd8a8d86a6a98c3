#!/usr/bin/env python3
"""test-layers.py — the code's layers, as the tree writes them down, hold.

1. kolo.torch: bindings/python/kolo/torch/__init__.py lists the package's
   files from the top down (its LAYERS section); every file of the package
   is listed, and each imports (at the top of the file or inside a
   function alike) only files listed below it.
2. C and C++ (runtime/, ops/, tools/, bindings/): no circle of modules,
   a module being a source file with the header of the same name beside
   it; module A uses module B when a file of A includes B's header. A
   circle would make two modules that cannot be read, built or tested
   apart.

Prints a line per check and "N passed, N failed"; exits 1 on a failure.
Usage: tests/test-layers.py [SRCDIR]   (default: KOLO_TOP_SRCDIR, or the
tree this file is in)
"""

import os
import re
import sys

top = (sys.argv[1] if len(sys.argv) > 1 else
       os.environ.get("KOLO_TOP_SRCDIR") or
       os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
passed = failed = 0


def report(ok, what, why=""):
    global passed, failed
    if ok:
        passed += 1
        print("PASS %s" % what)
    else:
        failed += 1
        print("FAIL %s: %s" % (what, why))


def torch_layers():
    pkg = os.path.join(top, "bindings", "python", "kolo", "torch")
    with open(os.path.join(pkg, "__init__.py")) as f:
        init = f.read()
    if "LAYERS" not in init:
        report(False, "kolo.torch: __init__.py lists its layers",
               "no LAYERS section")
        return
    order = re.findall(r"^  (\S+\.py|\w+/) ", init.split("LAYERS", 1)[1],
                       re.M)
    files = sorted(n for n in os.listdir(pkg) if n.endswith(".py"))
    pos = {name: i for i, name in enumerate(order)}
    missing = [n for n in files if n not in pos]
    report(not missing, "kolo.torch: every file is in __init__.py's LAYERS",
           "not listed: " + ", ".join(missing))
    wrong = []
    for name in files:
        with open(os.path.join(pkg, name)) as f:
            src = f.read()
        used = set(re.findall(r"^\s*from \.(\w+) import", src, re.M))
        for names in re.findall(r"^\s*from \. import ([\w, ]+)", src, re.M):
            used |= {n.strip() for n in names.split(",")}
        for u in sorted(used):
            target = u + ".py" if u + ".py" in pos else u + "/"
            if name in pos and pos.get(target, -1) <= pos[name]:
                wrong.append("%s imports %s" % (name, target))
    report(not wrong, "kolo.torch: each file imports only files below it",
           "; ".join(wrong))


def c_modules():
    """module (path without extension) -> the modules it uses."""
    files = []
    for d in ("runtime", "ops", "tools", "bindings"):
        for root, _, names in os.walk(os.path.join(top, d)):
            files += [os.path.join(root, n) for n in names
                      if n.endswith((".c", ".h", ".cc", ".cu"))]
    headers = {}
    for p in files:
        if p.endswith(".h"):
            headers.setdefault(os.path.basename(p), []).append(p)
    uses = {}
    for p in files:
        me = os.path.splitext(p)[0]
        with open(p, errors="replace") as f:
            inc = re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), re.M)
        for h in inc:
            here = os.path.normpath(os.path.join(os.path.dirname(p), h))
            found = ([here] if here in files else
                     [c for c in headers.get(os.path.basename(h), [])
                      if c.endswith(h)])
            for c in found[:1]:
                other = os.path.splitext(c)[0]
                if other != me:
                    uses.setdefault(me, set()).add(other)
    return uses


def circles(uses):
    """The strongly connected parts of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in uses.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in list(uses):
        if v not in index:
            visit(v)
    return out


def c_layers():
    found = circles(c_modules())
    report(not found, "C: no circle of modules that include each other",
           "; ".join(" <-> ".join(os.path.relpath(m, top) for m in c)
                     for c in found))


torch_layers()
c_layers()
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
