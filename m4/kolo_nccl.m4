# kolo_nccl.m4 -- find NCCL, the GPU backend. Needs CUDA (kolo_cuda.m4).
#
# KOLO_CHECK_NCCL
#   --with-nccl           require NCCL (from the CUDA prefix or the system)
#   --with-nccl=PREFIX    require NCCL from PREFIX
#   --without-nccl        build without NCCL
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
     AS_IF([test -f "$kolo_nccl_place/include/nccl.h"],
       [KOLO_FIND_LIBDIR([kolo_nccl_libdir], [$kolo_nccl_place], [nccl])
        AS_IF([test -n "$kolo_nccl_libdir"],
          [kolo_nccl_where=$kolo_nccl_place
           break])])
   done
   AS_IF([test -z "$kolo_nccl_where"],
     [kolo_nccl_why="no include/nccl.h with a libnccl beside it in $kolo_nccl_places"],
     [KOLO_INCDIR_FLAGS([NCCL_CPPFLAGS], [$kolo_nccl_where/include])
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
AS_IF([test "x$kolo_have_nccl" = xyes],
  [AS_IF([test -n "$kolo_nccl_major$kolo_nccl_minor$kolo_nccl_patch"],
     [kolo_nccl_version="$kolo_nccl_major.$kolo_nccl_minor.$kolo_nccl_patch, "],
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
AC_SUBST([NCCL_LIBS])
AM_CONDITIONAL([HAVE_NCCL], [test "x$kolo_have_nccl" = xyes])])
