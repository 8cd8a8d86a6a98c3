# kolo_python.m4 -- the Python interpreter for the bindings and their tests.
#
# KOLO_CHECK_PYTHON
#   PYTHON (precious variable) defaults to /usr/bin/python3, else python3
#   from PATH. Nothing here is fatal: it only reports whether the
#   interpreter runs and can `import numpy` and `import torch`.
#
# Substitutes PYTHON (empty when no interpreter was found);
# AM_CONDITIONALs HAVE_PYTHON, HAVE_NUMPY, HAVE_TORCH. Sets
# kolo_have_python, kolo_have_numpy, kolo_have_torch, kolo_python_summary.
#
# KOLO_PYTHON_HEADERS
#   After KOLO_CHECK_PYTHON: whether the interpreter's C headers are there
#   (Debian: python3-dev), to build the optional extension module
#   kolo/_fastpath (bindings/python/kolo/_fastpath.c). Not fatal: without
#   it the bindings make the same calls through ctypes. Substitutes
#   PYTHON_CPPFLAGS; AM_CONDITIONAL HAVE_PYTHON_HEADERS; sets
#   kolo_python_ext_summary.

# _KOLO_PYTHON_MODULE(MODULE, VARIABLE): VARIABLE=yes when $PYTHON can
# import MODULE; the module's version goes to kolo_VARIABLE_version.
m4_define([_KOLO_PYTHON_MODULE],
[AC_MSG_CHECKING([whether $PYTHON can import $1])
kolo_$2_version=`$PYTHON -c 'import $1; print($1.__version__)' 2>&AS_MESSAGE_LOG_FD | sed -n '$p'`
AS_IF([test -n "$kolo_$2_version"], [kolo_have_$2=yes], [kolo_have_$2=no])
AC_MSG_RESULT([$kolo_have_$2${kolo_$2_version:+ ($kolo_$2_version)}])])

AC_DEFUN([KOLO_CHECK_PYTHON],
[AC_ARG_VAR([PYTHON], [Python interpreter for the bindings and their tests @<:@default=/usr/bin/python3@:>@])
AS_IF([test -z "$PYTHON"],
  [AS_IF([test -x /usr/bin/python3],
     [PYTHON=/usr/bin/python3],
     [AC_PATH_PROG([PYTHON], [python3])])])
kolo_have_python=no
kolo_have_numpy=no
kolo_have_torch=no
AS_IF([test -n "$PYTHON"],
  [AC_MSG_CHECKING([whether $PYTHON runs])
   kolo_python_version=`$PYTHON -c 'import platform; print(platform.python_version())' 2>&AS_MESSAGE_LOG_FD`
   AS_IF([test -n "$kolo_python_version"], [kolo_have_python=yes])
   AC_MSG_RESULT([$kolo_have_python${kolo_python_version:+ ($kolo_python_version)}])])
AS_IF([test "x$kolo_have_python" = xyes],
  [_KOLO_PYTHON_MODULE([numpy], [numpy])
   _KOLO_PYTHON_MODULE([torch], [torch])
   kolo_python_summary="$PYTHON $kolo_python_version (numpy: $kolo_have_numpy${kolo_numpy_version:+ $kolo_numpy_version}, torch: $kolo_have_torch${kolo_torch_version:+ $kolo_torch_version})"],
  [test -n "$PYTHON"],
  [kolo_python_summary="no ($PYTHON does not run: no Python bindings tests)"
   PYTHON=],
  [kolo_python_summary="no (no python3 found: no Python bindings tests)"])
AM_CONDITIONAL([HAVE_PYTHON], [test "x$kolo_have_python" = xyes])
AM_CONDITIONAL([HAVE_NUMPY], [test "x$kolo_have_numpy" = xyes])
AM_CONDITIONAL([HAVE_TORCH], [test "x$kolo_have_torch" = xyes])])

# KOLO_PYTHON_SITEDIR -- after AM_PATH_PYTHON: where `make install` puts the
# Python package. Debian's /usr/bin/python3 searches
# PREFIX/lib/python3.X/dist-packages for prefix /usr/local and
# /usr/lib/python3/dist-packages for prefix /usr, not the site-packages
# directory that AM_PATH_PYTHON derives; when one of the interpreter's own
# site directories lies under the prefix, pythondir becomes that one
# (written with ${prefix}, so `make install prefix=...` still works).
# Other prefixes keep AM_PATH_PYTHON's choice (then set PYTHONPATH).
AC_DEFUN([KOLO_PYTHON_SITEDIR],
[AS_IF([test "x$kolo_have_python" = xyes],
  [kolo_py_prefix=$prefix
   test "x$kolo_py_prefix" = xNONE && kolo_py_prefix=$ac_default_prefix
   kolo_py_sitedir=`$PYTHON -c '
import site, sys
lib = sys.argv[[1]].rstrip("/") + "/lib/"
dirs = [[d for d in site.getsitepackages() if d.startswith(lib)]]
print(dirs[[0]][[len(lib):]] if dirs else "")' "$kolo_py_prefix" 2>&AS_MESSAGE_LOG_FD`
   AS_IF([test -n "$kolo_py_sitedir"],
     [pythondir="\${prefix}/lib/$kolo_py_sitedir"])
   AC_MSG_CHECKING([where make install puts the Python package])
   AC_MSG_RESULT([$pythondir])])])

AC_DEFUN([KOLO_PYTHON_HEADERS],
[kolo_have_python_headers=no
PYTHON_CPPFLAGS=
kolo_python_ext_summary="no (not built without Python)"
AS_IF([test "x$kolo_have_python" = xyes],
  [kolo_py_include=`$PYTHON -c 'import sysconfig; print(sysconfig.get_paths()[["include"]])' 2>&AS_MESSAGE_LOG_FD`
   AC_MSG_CHECKING([for Python.h of $PYTHON])
   AS_IF([test -n "$kolo_py_include" && test -f "$kolo_py_include/Python.h"],
     [kolo_save_CPPFLAGS=$CPPFLAGS
      CPPFLAGS="$CPPFLAGS -I$kolo_py_include"
      AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#define PY_SSIZE_T_CLEAN
#include <Python.h>]], [[return PyLong_AsLongLong(NULL) == 0;]])],
        [kolo_have_python_headers=yes
         PYTHON_CPPFLAGS="-I$kolo_py_include"])
      CPPFLAGS=$kolo_save_CPPFLAGS])
   AC_MSG_RESULT([$kolo_have_python_headers${PYTHON_CPPFLAGS:+ ($kolo_py_include)}])
   AS_IF([test "x$kolo_have_python_headers" = xyes],
     [kolo_python_ext_summary="yes (kolo/_fastpath: kolo.torch's hot path without ctypes)"],
     [kolo_python_ext_summary="no (no Python.h: apt-get install python3-dev; kolo.torch calls through ctypes)"])])
AC_SUBST([PYTHON_CPPFLAGS])
AM_CONDITIONAL([HAVE_PYTHON_HEADERS], [test "x$kolo_have_python_headers" = xyes])])
