# kolo_cuda.m4 -- find the CUDA toolkit (GPU tensors) and its compiler nvcc.
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
