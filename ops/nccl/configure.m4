# ops/nccl/configure.m4 -- GPU tensors: find the CUDA toolkit and its
# compiler nvcc (KOLO_CHECK_CUDA), then NCCL (KOLO_CHECK_NCCL). Included by
# configure.ac (m4_include), which calls both, CUDA first, and builds GPU
# tensors (KOLO_HAVE_GPU) when CUDA, nvcc and NCCL are all there.
#
# ---------------------------------------------------------------- CUDA
#
# KOLO_CHECK_CUDA
#   --with-cuda           require CUDA from /usr/local/cuda
#   --with-cuda=PREFIX    require CUDA from PREFIX
#   --without-cuda        build without GPU support
#   [default: use /usr/local/cuda when it works]
#   Asked for but unusable: configure fails.
#
# CUDA is found when PREFIX/include/cuda_runtime.h compiles and a C program
# calling cudaGetDeviceCount links against libcudart (from PREFIX/lib64 or
# PREFIX/lib). Linking needs no GPU and no driver: nothing is run.
# nvcc is looked for in PREFIX/bin only (or taken from NVCC), and must
# compile a tiny kernel; without it CUDA code in C still builds, but the
# .cu kernels cannot.
#
# Substitutes CUDA_CPPFLAGS (-IPREFIX/include), CUDA_LIBS (-LLIBDIR
# -Wl,-rpath,LIBDIR -lcudart, so that programs run without LD_LIBRARY_PATH),
# the precious variables NVCC and NVCCFLAGS; AM_CONDITIONALs HAVE_CUDA and
# HAVE_NVCC (false without CUDA); defines KOLO_HAVE_CUDA, and
# KOLO_HAVE_CUDA_KERNELS when nvcc works. Sets kolo_have_cuda,
# kolo_have_nvcc, kolo_cuda_prefix, kolo_cuda_summary, kolo_nvcc_summary.

m4_define([_KOLO_CUDA_PROGRAM],
[AC_LANG_PROGRAM([[
#include <stddef.h>
#include <cuda_runtime.h>
]], [[
  int count = 0;
  void *buffer = NULL;
  if (cudaGetDeviceCount (&count) != cudaSuccess)
    return 1;
  if (cudaMalloc (&buffer, 64) == cudaSuccess)
    cudaFree (buffer);
  return 0;
]])])

AC_DEFUN([KOLO_CHECK_CUDA],
[AC_ARG_WITH([cuda],
  [AS_HELP_STRING([--with-cuda@<:@=PREFIX@:>@],
    [build GPU support with the CUDA toolkit in PREFIX @<:@default=auto, in /usr/local/cuda@:>@])],
  [], [with_cuda=auto])
AC_ARG_VAR([NVCC], [CUDA compiler for the GPU kernels @<:@default=PREFIX/bin/nvcc@:>@])
AC_ARG_VAR([NVCCFLAGS], [flags for NVCC])
kolo_have_cuda=no
kolo_have_nvcc=no
kolo_cuda_why=
kolo_nvcc_summary="no (no CUDA)"
CUDA_CPPFLAGS=
CUDA_LIBS=
AS_CASE([$with_cuda],
  [no], [kolo_cuda_prefix=],
  [yes|auto], [kolo_cuda_prefix=/usr/local/cuda],
  [kolo_cuda_prefix=$with_cuda])
AS_IF([test "x$with_cuda" != xno],
  [AS_IF([test -f "$kolo_cuda_prefix/include/cuda_runtime.h"],
     [KOLO_INCDIR_FLAGS([CUDA_CPPFLAGS], [$kolo_cuda_prefix/include])],
     [kolo_cuda_why="there is no $kolo_cuda_prefix/include/cuda_runtime.h"])
   KOLO_FIND_LIBDIR([kolo_cuda_libdir], [$kolo_cuda_prefix], [cudart])
   AS_IF([test -z "$kolo_cuda_libdir"],
     [kolo_cuda_why="${kolo_cuda_why:+$kolo_cuda_why, and }there is no libcudart in $kolo_cuda_prefix/lib64 or $kolo_cuda_prefix/lib"])
   AS_IF([test -z "$kolo_cuda_why"],
     [KOLO_LIBDIR_FLAGS([kolo_cuda_libflags], [$kolo_cuda_libdir])
      CUDA_LIBS="${kolo_cuda_libflags:+$kolo_cuda_libflags }-lcudart"
      AC_LANG_PUSH([C])
      KOLO_SAVE_FLAGS
      CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
      LIBS="$CUDA_LIBS $LIBS"
      AC_MSG_CHECKING([whether a CUDA runtime program links with $CUDA_LIBS])
      AC_LINK_IFELSE([_KOLO_CUDA_PROGRAM], [kolo_have_cuda=yes],
        [kolo_cuda_why="a program using cuda_runtime.h does not compile or link with $CUDA_CPPFLAGS $CUDA_LIBS (see config.log)"])
      AC_MSG_RESULT([$kolo_have_cuda])
      AS_IF([test "x$kolo_have_cuda" = xyes],
        [AC_COMPUTE_INT([kolo_cudart_version], [CUDART_VERSION],
           [[#include <cuda_runtime_api.h>]], [kolo_cudart_version=])])
      KOLO_RESTORE_FLAGS
      AC_LANG_POP([C])])])
AS_IF([test "x$kolo_have_cuda" = xyes],
  [AS_IF([test -n "$kolo_cudart_version"],
     [kolo_cuda_version="`expr $kolo_cudart_version / 1000`.`expr $kolo_cudart_version % 1000 / 10`, "],
     [kolo_cuda_version=])
   kolo_cuda_summary="yes (${kolo_cuda_version}$kolo_cuda_prefix, $CUDA_LIBS)"
   AC_DEFINE([KOLO_HAVE_CUDA], [1], [Define to 1 to build GPU (CUDA) support.])
   AC_PATH_PROG([NVCC], [nvcc], [], [$kolo_cuda_prefix/bin])
   AS_IF([test -z "$NVCC"],
     [kolo_nvcc_summary="no (no nvcc in $kolo_cuda_prefix/bin: the CUDA kernels cannot be built)"],
     [AC_MSG_CHECKING([whether $NVCC compiles a kernel])
      cat > conftest.cu <<_KOLO_EOF
__global__ void kolo_scale (float *x, float a) { x@<:@threadIdx.x@:>@ *= a; }
_KOLO_EOF
      AS_IF([$NVCC $NVCCFLAGS -c conftest.cu -o conftest.$OBJEXT >&AS_MESSAGE_LOG_FD 2>&1],
        [kolo_have_nvcc=yes
         kolo_nvcc_summary="yes ($NVCC)"
         AC_DEFINE([KOLO_HAVE_CUDA_KERNELS], [1], [Define to 1 when the CUDA kernels (.cu, built by nvcc) are part of the build.])],
        [kolo_nvcc_summary="no ($NVCC cannot compile a kernel, see config.log: the CUDA kernels cannot be built)"])
      rm -f conftest.cu conftest.$OBJEXT
      AC_MSG_RESULT([$kolo_have_nvcc])])],
  [test "x$with_cuda" = xno],
  [kolo_cuda_summary="no (disabled)"],
  [AS_IF([test "x$with_cuda" != xauto],
     [AS_IF([test "x$with_cuda" = xyes], [kolo_cuda_opt=--with-cuda], [kolo_cuda_opt=--with-cuda=$with_cuda])
     AC_MSG_ERROR([$kolo_cuda_opt was given, but CUDA cannot be used: $kolo_cuda_why. Point --with-cuda=PREFIX at a CUDA toolkit, or pass --without-cuda.])])
   kolo_cuda_summary="no (not found: $kolo_cuda_why)"])
AS_IF([test "x$kolo_have_cuda" != xyes],
  [CUDA_CPPFLAGS=
   CUDA_LIBS=])
AC_SUBST([CUDA_CPPFLAGS])
AC_SUBST([CUDA_LIBS])
AM_CONDITIONAL([HAVE_CUDA], [test "x$kolo_have_cuda" = xyes])
AM_CONDITIONAL([HAVE_NVCC], [test "x$kolo_have_nvcc" = xyes])])

# ---------------------------------------------------------------- NCCL
#
# Needs CUDA: call KOLO_CHECK_CUDA first.
#
# KOLO_CHECK_NCCL
#   --with-nccl           require NCCL (from the CUDA prefix or the system)
#   --with-nccl=PREFIX    require NCCL from PREFIX
#   --without-nccl        build without NCCL
#   --with-nccl-include=DIR, --with-nccl-lib=DIR
#                         nccl.h, libnccl there (NCCL not under one
#                         prefix: Horovod's HOROVOD_NCCL_INCLUDE and
#                         HOROVOD_NCCL_LIB); each implies --with-nccl
#   [default: use NCCL when it is found and CUDA is there]
#   Asked for without CUDA, or asked for but unusable: configure fails.
#
# Without a PREFIX, looks in the CUDA prefix (/usr/local/cuda: nccl.h in
# include/, libnccl in lib64/ or lib/), then in /usr and /usr/local. NCCL
# is found when a C program calling ncclGetVersion and ncclCommInitRank
# links with the NCCL and CUDA flags.
#
# Substitutes NCCL_CPPFLAGS and NCCL_LIBS (-LLIBDIR -Wl,-rpath,LIBDIR
# -lnccl; use them together with CUDA_CPPFLAGS and CUDA_LIBS);
# AM_CONDITIONAL HAVE_NCCL; defines KOLO_HAVE_NCCL. Sets kolo_have_nccl
# and kolo_nccl_summary.

m4_define([_KOLO_NCCL_PROGRAM],
[AC_LANG_PROGRAM([[
#include <nccl.h>
]], [[
  int version = 0;
  ncclUniqueId id;
  ncclComm_t comm;
  if (ncclGetVersion (&version) != ncclSuccess)
    return 1;
  if (ncclGetUniqueId (&id) != ncclSuccess)
    return 1;
  return ncclCommInitRank (&comm, 1, id, 0) == ncclSuccess ? 0 : 1;
]])])

AC_DEFUN([KOLO_CHECK_NCCL],
[AC_REQUIRE([KOLO_CHECK_CUDA])
AC_ARG_WITH([nccl],
  [AS_HELP_STRING([--with-nccl@<:@=PREFIX@:>@],
    [build the NCCL GPU backend (needs CUDA), with NCCL from PREFIX, else the CUDA prefix or the system @<:@default=auto@:>@])],
  [], [with_nccl=auto])
AC_ARG_WITH([nccl-include],
  [AS_HELP_STRING([--with-nccl-include=DIR],
    [nccl.h is in DIR (where NCCL is not under one prefix; implies --with-nccl)])],
  [], [with_nccl_include=])
AC_ARG_WITH([nccl-lib],
  [AS_HELP_STRING([--with-nccl-lib=DIR],
    [libnccl is in DIR (implies --with-nccl)])],
  [], [with_nccl_lib=])
AS_IF([test -n "$with_nccl_include$with_nccl_lib" && test "x$with_nccl" = xauto],
  [with_nccl=yes])
kolo_have_nccl=no
kolo_nccl_why=
NCCL_CPPFLAGS=
NCCL_LIBS=
AS_CASE([$with_nccl],
  [no|yes|auto], [kolo_nccl_prefix=],
  [kolo_nccl_prefix=$with_nccl])
AS_IF([test "x$with_nccl" != xno && test "x$kolo_have_cuda" != xyes],
  [AS_IF([test "x$with_nccl" != xauto],
     [AC_MSG_ERROR([--with-nccl${kolo_nccl_prefix:+=$kolo_nccl_prefix} was given, but NCCL needs CUDA, and there is none (CUDA: $kolo_cuda_summary). Give --with-cuda=PREFIX too, or pass --without-nccl.])])
   kolo_nccl_why="needs CUDA"],
  [test "x$with_nccl" != xno],
  [AS_IF([test -n "$kolo_nccl_prefix"],
     [kolo_nccl_places=$kolo_nccl_prefix],
     [kolo_nccl_places="$kolo_cuda_prefix /usr /usr/local"])
   kolo_nccl_where=
   for kolo_nccl_place in $kolo_nccl_places; do
     kolo_nccl_incdir=${with_nccl_include:-$kolo_nccl_place/include}
     AS_IF([test -f "$kolo_nccl_incdir/nccl.h"],
       [AS_IF([test -n "$with_nccl_lib"],
          [AS_IF([test -f "$with_nccl_lib/libnccl.so" || test -f "$with_nccl_lib/libnccl.a"],
             [kolo_nccl_libdir=$with_nccl_lib], [kolo_nccl_libdir=])],
          [KOLO_FIND_LIBDIR([kolo_nccl_libdir], [$kolo_nccl_place], [nccl])])
        AS_IF([test -n "$kolo_nccl_libdir"],
          [kolo_nccl_where=$kolo_nccl_place
           break])])
   done
   AS_IF([test -z "$kolo_nccl_where"],
     [AS_IF([test -n "$with_nccl_include$with_nccl_lib"],
        [kolo_nccl_why="no nccl.h in ${with_nccl_include:-the include folder} with libnccl in ${with_nccl_lib:-the lib folder} of $kolo_nccl_places"],
        [kolo_nccl_why="no include/nccl.h with a libnccl beside it in $kolo_nccl_places"])],
     [KOLO_INCDIR_FLAGS([NCCL_CPPFLAGS], [$kolo_nccl_incdir])
      KOLO_LIBDIR_FLAGS([kolo_nccl_libflags], [$kolo_nccl_libdir])
      NCCL_LIBS="${kolo_nccl_libflags:+$kolo_nccl_libflags }-lnccl"
      AC_LANG_PUSH([C])
      KOLO_SAVE_FLAGS
      CPPFLAGS="$CPPFLAGS $NCCL_CPPFLAGS $CUDA_CPPFLAGS"
      LIBS="$NCCL_LIBS $CUDA_LIBS $LIBS"
      AC_MSG_CHECKING([whether an NCCL program links with $NCCL_LIBS])
      AC_LINK_IFELSE([_KOLO_NCCL_PROGRAM], [kolo_have_nccl=yes],
        [kolo_nccl_why="a program using nccl.h does not compile or link with $NCCL_CPPFLAGS $NCCL_LIBS (see config.log)"])
      AC_MSG_RESULT([$kolo_have_nccl])
      AS_IF([test "x$kolo_have_nccl" = xyes],
        [AC_COMPUTE_INT([kolo_nccl_major], [NCCL_MAJOR], [[#include <nccl.h>]], [kolo_nccl_major=])
         AC_COMPUTE_INT([kolo_nccl_minor], [NCCL_MINOR], [[#include <nccl.h>]], [kolo_nccl_minor=])
         AC_COMPUTE_INT([kolo_nccl_patch], [NCCL_PATCH], [[#include <nccl.h>]], [kolo_nccl_patch=])])
      KOLO_RESTORE_FLAGS
      AC_LANG_POP([C])])])
KOLO_NCCL_VERSION_CODE=0
AS_IF([test "x$kolo_have_nccl" = xyes],
  [AS_IF([test -n "$kolo_nccl_major$kolo_nccl_minor$kolo_nccl_patch"],
     [kolo_nccl_version="$kolo_nccl_major.$kolo_nccl_minor.$kolo_nccl_patch, "
      KOLO_NCCL_VERSION_CODE=`expr $kolo_nccl_major \* 10000 + $kolo_nccl_minor \* 100 + $kolo_nccl_patch`],
     [kolo_nccl_version=])
   kolo_nccl_summary="yes (${kolo_nccl_version}$kolo_nccl_where, $NCCL_LIBS)"
   AC_DEFINE([KOLO_HAVE_NCCL], [1], [Define to 1 to build the NCCL GPU backend.])],
  [test "x$with_nccl" = xno],
  [kolo_nccl_summary="no (disabled)"],
  [AS_IF([test "x$with_nccl" != xauto],
     [AC_MSG_ERROR([--with-nccl${kolo_nccl_prefix:+=$kolo_nccl_prefix} was given, but NCCL cannot be used: $kolo_nccl_why. Point --with-nccl=PREFIX at an NCCL installation, or pass --without-nccl.])])
   kolo_nccl_summary="no ($kolo_nccl_why)"])
AS_IF([test "x$kolo_have_nccl" != xyes],
  [NCCL_CPPFLAGS=
   NCCL_LIBS=])
AC_SUBST([NCCL_CPPFLAGS])
dnl NCCL_VERSION_CODE of the nccl.h kolo is built against (0: none), which
dnl kolo_built("nccl") returns, for the Python tests (kolo/_build_config.py).
AC_SUBST([KOLO_NCCL_VERSION_CODE])
AC_SUBST([NCCL_LIBS])
AM_CONDITIONAL([HAVE_NCCL], [test "x$kolo_have_nccl" = xyes])])
