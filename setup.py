"""setup.py — `pip install .` and `pip wheel .` for kolo.

kolo is C, built by its own ./configure and make; this file is the bridge
pip needs, nothing more. A build:

1. copies the source tree into a private folder (build/native/src): the
   files git tracks in a clone, the whole tree of a release tarball. The
   tree itself may be configured and built in place (./configure && make,
   as the README does), and automake cannot build a second configuration
   beside that one; the copy also keeps pip's build out of the user's.
2. runs ./autogen.sh there when there is no ./configure (a clone: that
   needs autoconf, automake and libtool), then ./configure with
   PYTHON=<the Python running pip> and the flags the build variables ask
   for (below), then make of what the package needs. A configure that
   fails stops pip with configure's own message.
3. puts into the package, beside the Python sources of kolo (and
   kolo.torch): kolo/_native/ with libkolo.so.0, kolorun, kolo-timeline,
   kolo-bench
   and the extension module _fastpath.so (built where Python's headers are
   installed: python3-dev), and kolo/_build_config.py saying so. kolo finds
   its library there without KOLO_LIBRARY (kolo/_lib.py), kolo.run its
   kolorun, and kolorun --check-build both.
4. installs the commands `kolorun`, `kolo-timeline` and `kolo-bench` into the
   environment's bin (console scripts of _kolo_commands.py, which run the
   programs in kolo/_native/).

`pip uninstall kolo` removes all of it: every file is in the wheel's
record. The wheel holds machine code: it installs on machines of the same
kind (same OS, same Python, the same libraries libkolo links: Gloo, MPI,
CUDA and NCCL where it was built with them), without a compiler.

Build variables. What ./configure finds is built. Horovod's build
variables choose otherwise, with Horovod's meaning, and so do their twins
named KOLO_* (KOLO_WITHOUT_MPI=1, ...); where both are set and differ the
KOLO_* one is used, as at run time:

  HOROVOD_WITH_GLOO=1, HOROVOD_WITH_MPI=1   require the backend
                                            (configure --with-gloo/--with-mpi)
  HOROVOD_WITHOUT_GLOO=1, HOROVOD_WITHOUT_MPI=1   leave it out (--without-*)
  HOROVOD_GPU_OPERATIONS=NCCL (or HOROVOD_GPU_ALLREDUCE, _ALLGATHER,
    _BROADCAST, _ALLTOALL, _REDUCESCATTER=NCCL)   require CUDA tensors on
                                            NCCL (CUDA, nvcc and NCCL)
  HOROVOD_GPU=CUDA                          accepted (the only kind kolo has)
  HOROVOD_CUDA_HOME=DIR                     --with-cuda=DIR
  HOROVOD_NCCL_HOME=DIR                     --with-nccl=DIR
  HOROVOD_NCCL_INCLUDE=DIR, HOROVOD_NCCL_LIB=DIR   --with-nccl-include/-lib
  HOROVOD_BUILD_CUDA_CC_LIST=75,80,...      the GPU architectures of the
                                            kernels (NVCCFLAGS)
  HOROVOD_BUILD_ARCH_FLAGS=FLAGS            added to CFLAGS and CXXFLAGS
  HOROVOD_DEBUG=1                           -O0 -g
  HOROVOD_WITH_PYTORCH=1                    require torch in this Python
  HOROVOD_WITHOUT_PYTORCH=1                 leave kolo.torch out

kolo stops the build, saying why, where it cannot do what a variable asks:
GPU operations on MPI (HOROVOD_GPU_OPERATIONS=MPI: kolo carries CUDA
tensors on NCCL only), ROCm, TensorFlow or MXNet. Variables that only
steer Horovod's CMake (HOROVOD_CMAKE, HOROVOD_NCCL_LINK, ...) are noted as
having no effect.
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
PYSRC = os.path.join("bindings", "python")


class BuildError(SystemExit):
    """Stops pip with one message (setuptools prints it; pip shows it)."""

    def __init__(self, text):
        super().__init__("kolo: " + text)


def version():
    """AC_INIT's version in configure.ac: the one place it is written."""
    with open(os.path.join(HERE, "configure.ac")) as f:
        m = re.search(r"AC_INIT\(\[kolo\],\s*\[([^\]]+)\]", f.read())
    if m is None:
        raise BuildError("configure.ac has no AC_INIT([kolo], [VERSION])")
    return m.group(1)


# ---- build variables --------------------------------------------------------

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")
GPU_OPS = ("GPU_OPERATIONS", "GPU_ALLREDUCE", "GPU_ALLGATHER",
           "GPU_BROADCAST", "GPU_ALLTOALL", "GPU_REDUCESCATTER")
# Horovod's build variables that steer nothing in kolo's build.
NO_EFFECT = {
    "CMAKE": "kolo builds with ./configure and make",
    "NCCL_LINK": "kolo links NCCL as a shared library",
    "ALLOW_MIXED_GPU_IMPL": "kolo carries every GPU collective on NCCL",
    "CPU_OPERATIONS": "kolo builds every host backend it finds; "
                      "KOLO_CPU_OPERATIONS or HOROVOD_CPU_OPERATIONS "
                      "chooses at run time",
    "MPICXX_SHOW": "configure asks mpicc (or MPICC) for MPI's flags",
    "ROCM_HOME": "kolo builds for CUDA only",
    "WITHOUT_TENSORFLOW": "kolo has no TensorFlow binding",
    "WITHOUT_MXNET": "kolo has no MXNet binding",
}


class Variables:
    """The build variables of the environment: each read as KOLO_<NAME>,
    else HOROVOD_<NAME>; notes collects what the build should say."""

    def __init__(self, environ):
        self.environ = environ
        self.notes = []

    def get(self, name):
        """(value, the variable it came from), or (None, None)."""
        mine = self.environ.get("KOLO_" + name)
        theirs = self.environ.get("HOROVOD_" + name)
        if mine is not None and theirs is not None and mine != theirs:
            self.notes.append("KOLO_%s=%s and HOROVOD_%s=%s are both set and "
                              "differ: kolo uses KOLO_%s"
                              % (name, mine, name, theirs, name))
        if mine is not None:
            return mine, "KOLO_" + name
        if theirs is not None:
            return theirs, "HOROVOD_" + name
        return None, None

    def flag(self, name):
        """A {1} variable: True when set to 1 (or true, yes, on)."""
        value, var = self.get(name)
        if value is None or value.strip().lower() in FALSE:
            return False
        if value.strip().lower() in TRUE:
            return True
        raise BuildError("%s=%s: expected 1 (or 0, or unset)" % (var, value))

    def path(self, name):
        value, var = self.get(name)
        if not value:
            return None
        if not os.path.isdir(value):
            raise BuildError("%s=%s: there is no such directory" % (var, value))
        return os.path.abspath(value)


def with_without(v, name, args):
    """HOROVOD_WITH_<NAME> / HOROVOD_WITHOUT_<NAME> as --with-/--without-."""
    on, off = v.flag("WITH_" + name), v.flag("WITHOUT_" + name)
    if on and off:
        raise BuildError("both %s and %s are set to 1: choose one"
                         % (v.get("WITH_" + name)[1], v.get("WITHOUT_" + name)[1]))
    if on:
        args.append("--with-" + name.lower())
    if off:
        args.append("--without-" + name.lower())


def gpu_plan(v, args, env):
    """What the GPU variables ask: CUDA and NCCL's configure arguments, the
    architectures nvcc builds for; True where CUDA tensors are required."""
    gpu, var = v.get("GPU")
    if gpu and gpu.strip().upper() != "CUDA":
        raise BuildError("%s=%s: kolo builds GPU support for CUDA only "
                         "(unset it, or set it to CUDA)" % (var, gpu))
    need_gpu = False
    for name in GPU_OPS:
        value, var = v.get(name)
        if not value:
            continue
        if value.strip().upper() == "NCCL":
            need_gpu = True
        elif value.strip().upper() == "MPI":
            raise BuildError("%s=MPI: kolo carries CUDA tensors on NCCL only "
                             "(no CUDA-aware MPI path); set it to NCCL, or "
                             "unset it" % var)
        else:
            raise BuildError("%s=%s: expected NCCL" % (var, value))
    cuda = v.path("CUDA_HOME")
    nccl = v.path("NCCL_HOME")
    nccl_inc, nccl_lib = v.path("NCCL_INCLUDE"), v.path("NCCL_LIB")
    if cuda:
        args.append("--with-cuda=" + cuda)
    elif need_gpu:
        args.append("--with-cuda")
    if nccl:
        args.append("--with-nccl=" + nccl)
    elif need_gpu or nccl_inc or nccl_lib:
        args.append("--with-nccl")
    if nccl_inc:
        args.append("--with-nccl-include=" + nccl_inc)
    if nccl_lib:
        args.append("--with-nccl-lib=" + nccl_lib)
    cuda_archs(v, env)
    return need_gpu


def cuda_archs(v, env):
    """HOROVOD_BUILD_CUDA_CC_LIST as nvcc's -gencode flags (NVCCFLAGS)."""
    ccs, var = v.get("BUILD_CUDA_CC_LIST")
    if not ccs:
        return
    try:
        nums = [int(c) for c in ccs.replace(" ", "").split(",") if c]
    except ValueError:
        nums = []
    if not nums:
        raise BuildError("%s=%s: expected compute capabilities such as "
                         "75,80,90" % (var, ccs))
    # machine code for each, and PTX of the newest for later GPUs
    env["NVCCFLAGS"] = " ".join(
        ["-O3"] + ["-gencode arch=compute_%d,code=sm_%d" % (c, c)
                   for c in nums] +
        ["-gencode arch=compute_%d,code=compute_%d"
         % (max(nums), max(nums))])


def compiler_flags(v, environ, env):
    """HOROVOD_DEBUG and HOROVOD_BUILD_ARCH_FLAGS, added to CFLAGS and
    CXXFLAGS."""
    flags = []
    if v.flag("DEBUG"):
        flags.append("-O0 -g")
    arch, _ = v.get("BUILD_ARCH_FLAGS")
    if arch:
        flags.append(arch)
    if flags:
        for name in ("CFLAGS", "CXXFLAGS"):
            base = environ.get(name, "" if v.flag("DEBUG") else "-O2 -g")
            env[name] = " ".join([base] + flags).strip()


def frameworks(v):
    """(torch required, kolo.torch installed); the frameworks kolo has no
    binding for refused, and the variables that steer nothing noted."""
    torch_on, torch_off = v.flag("WITH_PYTORCH"), v.flag("WITHOUT_PYTORCH")
    if torch_on and torch_off:
        raise BuildError("both %s and %s are set to 1: choose one"
                         % (v.get("WITH_PYTORCH")[1], v.get("WITHOUT_PYTORCH")[1]))
    for name, shown in (("TENSORFLOW", "TensorFlow"), ("MXNET", "MXNet")):
        if v.flag("WITH_" + name):
            _, var = v.get("WITH_" + name)
            raise BuildError("%s=1: kolo has no %s binding (it has "
                             "PyTorch's, kolo.torch, and NumPy's, kolo)"
                             % (var, shown))
    for name, why in NO_EFFECT.items():
        value, var = v.get(name)
        if value:
            v.notes.append("%s=%s has no effect: %s" % (var, value, why))
    return torch_on, not torch_off


def configure_plan(environ):
    """What the build variables ask of ./configure: (arguments, variables
    for its environment, whether CUDA tensors are required, whether
    kolo.torch is installed, notes)."""
    v = Variables(environ)
    args, env = [], {}
    with_without(v, "GLOO", args)
    with_without(v, "MPI", args)
    need_gpu = gpu_plan(v, args, env)
    compiler_flags(v, environ, env)
    torch = frameworks(v)
    return args, env, need_gpu, torch, v.notes


# ---- the native build ---------------------------------------------------------


def run(cmd, cwd, log, env=None, what=None):
    """Runs cmd in cwd, its output appended to log; on failure stops the
    build with the lines that say why."""
    with open(log, "a") as out:
        out.write("\n$ %s\n" % " ".join(cmd))
        out.flush()
        rc = subprocess.call(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                             env=env)
    if rc == 0:
        return
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    errors = [ln for ln in lines if "error:" in ln or "Error " in ln]
    shown = errors[-12:] or lines[-25:]
    raise BuildError("%s failed (exit %d):\n  %s\n(the whole output: %s)"
                     % (what or cmd[0], rc, "\n  ".join(shown), log))


def copy_tree(src, dest):
    """The source files of src into dest (see the essay, step 1)."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    files = None
    if os.path.isdir(os.path.join(src, ".git")) and shutil.which("git"):
        out = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached",
                              "--others", "--exclude-standard"],
                             stdout=subprocess.PIPE, check=False)
        if out.returncode == 0:
            files = [f for f in out.stdout.decode().split("\0") if f]
    if files is None:
        def skip(folder, names):
            # pip's and setuptools' folders, and the sanitizer builds
            # (.ci/run's build-asan, build-tsan): not build-aux
            top = os.path.abspath(folder) == os.path.abspath(src)
            return [n for n in names
                    if (top and (n in ("build", "dist") or
                                 (n.startswith("build-") and n != "build-aux")))
                    or n.endswith(".egg-info") or n == "__pycache__"]
        shutil.copytree(src, dest, symlinks=True, ignore=skip)
        return
    for f in files:
        s = os.path.join(src, f)
        if not os.path.lexists(s):
            continue  # deleted in the working tree
        d = os.path.join(dest, f)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copy2(s, d, follow_symlinks=False)


def native_build(build_temp, environ):
    """Configures and makes kolo in a copy of the tree; returns (the copy,
    whether kolo.torch goes in, notes)."""
    args, env_add, need_gpu, (need_torch, want_torch), notes = \
        configure_plan(environ)
    for note in notes:
        print("kolo: " + note, file=sys.stderr)
    if need_torch:
        probe = subprocess.run([sys.executable, "-c", "import torch"],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
        if probe.returncode != 0:
            raise BuildError("WITH_PYTORCH=1 was asked for, but %s cannot "
                             "import torch:\n%s"
                             % (sys.executable,
                                probe.stdout.decode(errors="replace")[-800:]))
    top = os.path.abspath(os.path.join(build_temp, "native"))
    src = os.path.join(top, "src")
    log = os.path.join(top, "build.log")
    os.makedirs(top, exist_ok=True)
    open(log, "w").close()
    copy_tree(HERE, src)
    env = dict(environ)
    env.update(env_add)
    if os.path.exists(os.path.join(src, "config.status")):
        # a configured tarball tree: back to the tarball's state
        run(["make", "distclean"], src, log, env, "make distclean")
    if not os.path.exists(os.path.join(src, "configure")):
        missing = [p for p in ("autoreconf", "automake", "libtoolize")
                   if shutil.which(p) is None]
        if missing:
            raise BuildError(
                "this is a clone without ./configure, and making it needs "
                "autoconf, automake and libtool (%s not found): apt-get "
                "install autoconf automake libtool pkg-config, or pip "
                "install the release tarball (make dist)" % ", ".join(missing))
        run(["sh", "./autogen.sh"], src, log, env, "./autogen.sh")
    run(["sh", "./configure", "--prefix=" + sys.prefix,
         "PYTHON=" + sys.executable] + args, src, log, env,
        "./configure " + " ".join(args))
    with open(os.path.join(src, "config.h")) as f:
        have_gpu = "#define KOLO_HAVE_GPU 1" in f.read()
    if need_gpu and not have_gpu:
        with open(log, errors="replace") as f:
            summary = [ln.strip() for ln in f
                       if re.match(r"\s+(CUDA|nvcc|NCCL|GPU tensors):", ln)]
        raise BuildError("GPU operations on NCCL were asked for, but "
                         "./configure cannot build them:\n  %s"
                         % "\n  ".join(summary))
    targets = ["libkolo.la", "kolorun", "kolo-bench",
               "bindings/python/kolo/_build_config.py"]
    with open(os.path.join(src, "Makefile")) as f:
        if re.search(r"^kolopyext_LTLIBRARIES = _fastpath\.la", f.read(), re.M):
            targets.append("_fastpath.la")
    jobs = str(max(1, min(os.cpu_count() or 1, 16)))
    run(["make", "-j" + jobs] + targets, src, log, env, "make")
    return src, want_torch


def fill_package(src, pkg):
    """Puts the native build into the built package kolo (pkg)."""
    native = os.path.join(pkg, "_native")
    if os.path.exists(native):
        shutil.rmtree(native)
    os.makedirs(native)
    lib = os.path.realpath(os.path.join(src, ".libs", "libkolo.so.0"))
    shutil.copy2(lib, os.path.join(native, "libkolo.so.0"))
    shutil.copy2(os.path.join(src, "kolorun"), native)
    shutil.copy2(os.path.join(src, "tools", "kolo-timeline"), native)
    # (libtool's real program, not its wrapper script: the command sets
    # LD_LIBRARY_PATH to _native for libkolo.so.0)
    shutil.copy2(os.path.join(src, ".libs", "kolo-bench"), native)
    fast = os.path.join(src, ".libs", "_fastpath.so")
    if os.path.exists(fast):
        shutil.copy2(fast, native)
    # make's _build_config.py, with the library and programs in _native
    # (LIBDIR and BINDIR empty: kolo/_lib.py and kolo/run.py look there
    # first) instead of configure's prefix
    with open(os.path.join(src, PYSRC, "kolo", "_build_config.py")) as f:
        text = f.read()
    text = re.sub(r'^LIBDIR = .*$', 'LIBDIR = ""  # pip: kolo/_native', text,
                  flags=re.M)
    text = re.sub(r'^BINDIR = .*$', 'BINDIR = ""  # pip: kolo/_native', text,
                  flags=re.M)
    with open(os.path.join(pkg, "_build_config.py"), "w") as f:
        f.write(text)


class BuildWithNative(build_py):
    """build_py, then the native build into the package."""

    def run(self):
        build_temp = self.get_finalized_command("build").build_temp
        src, want_torch = native_build(build_temp, os.environ)
        if not want_torch:
            self.packages = [p for p in self.packages
                             if not p.startswith("kolo.torch")]
            torch_dir = os.path.join(self.build_lib, "kolo", "torch")
            if os.path.exists(torch_dir):
                shutil.rmtree(torch_dir)
        super().run()
        fill_package(src, os.path.join(self.build_lib, "kolo"))


class NativeDistribution(Distribution):
    """Machine code inside: a platform wheel, installed as such."""

    def has_ext_modules(self):
        return True


PACKAGES = ["kolo", "kolo.torch", "kolo.torch.elastic"]

setup(
    name="kolo",
    version=version(),
    description="A runtime for data-parallel distributed training, in the "
                "spirit of Horovod (kolo, kolo.torch, kolorun)",
    python_requires=">=3.7",
    package_dir={"": PYSRC},
    packages=PACKAGES,
    py_modules=["_kolo_commands"],
    entry_points={"console_scripts": [
        "kolorun = _kolo_commands:kolorun",
        "kolo-timeline = _kolo_commands:kolo_timeline",
        "kolo-bench = _kolo_commands:kolo_bench",
    ]},
    cmdclass={"build_py": BuildWithNative},
    distclass=NativeDistribution,
    zip_safe=False,
)
