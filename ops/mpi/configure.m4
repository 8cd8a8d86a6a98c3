# ops/mpi/configure.m4 -- find MPI, kolo's second host (CPU) backend.
# Included by configure.ac (m4_include), which calls KOLO_CHECK_MPI.
#
# KOLO_CHECK_MPI
#   --with-mpi            require MPI
#   --with-mpi=PREFIX     require the MPI installed under PREFIX
#   --without-mpi         do not build the MPI backend
#   [default: use MPI when it is found]
#   Asked for but unusable: configure fails.
#
# Where the flags come from, first that applies:
#   1. the compiler wrapper MPICC (default: mpicc, from PREFIX/bin when a
#      PREFIX is given, else from PATH), if it is Open MPI's:
#      `mpicc --showme:compile` and `mpicc --showme:link`;
#   2. without a PREFIX: pkg-config ompi-c, then pkg-config mpich;
#   3. with a PREFIX: -IPREFIX/include and -LPREFIX/lib* -lmpi;
#   4. otherwise plain -lmpi.
# The flags must then compile and link a C program calling MPI_Init and
# MPI_Allreduce.
#
# Substitutes MPI_CFLAGS and MPI_LIBS (and the precious variable MPICC);
# AM_CONDITIONAL HAVE_MPI; defines KOLO_HAVE_MPI. Sets kolo_have_mpi
# (yes/no) and kolo_mpi_summary.

m4_define([_KOLO_MPI_PROGRAM],
[AC_LANG_PROGRAM([[
#include <mpi.h>
]], [[
  int in = 1, out = 0;
  MPI_Init (0, 0);
  MPI_Allreduce (&in, &out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize ();
  return out == 1 ? 0 : 1;
]])])

AC_DEFUN([KOLO_CHECK_MPI],
[AC_REQUIRE([PKG_PROG_PKG_CONFIG])
AC_ARG_WITH([mpi],
  [AS_HELP_STRING([--with-mpi@<:@=PREFIX@:>@],
    [build the MPI host backend, with the MPI under PREFIX or found through mpicc/pkg-config; --without-mpi leaves it out @<:@default=auto@:>@])],
  [], [with_mpi=auto])
AC_ARG_VAR([MPICC], [MPI C compiler wrapper asked for MPI's flags (Open MPI: --showme)])
kolo_have_mpi=no
kolo_mpi_why=
MPI_CFLAGS=
MPI_LIBS=
AS_CASE([$with_mpi],
  [no], [],
  [yes|auto], [kolo_mpi_prefix=],
  [kolo_mpi_prefix=$with_mpi])
AS_IF([test "x$with_mpi" != xno],
  [AS_IF([test -n "$kolo_mpi_prefix" && test ! -d "$kolo_mpi_prefix"],
     [kolo_mpi_why="there is no directory $kolo_mpi_prefix"],
     [AS_IF([test -n "$kolo_mpi_prefix"],
        [AC_PATH_PROG([MPICC], [mpicc], [], [$kolo_mpi_prefix/bin])],
        [AC_PATH_PROG([MPICC], [mpicc])])
      kolo_mpi_how=
      AS_IF([test -n "$MPICC" && $MPICC --showme:compile >/dev/null 2>&1],
        [MPI_CFLAGS=`$MPICC --showme:compile`
         MPI_LIBS=`$MPICC --showme:link`
         kolo_mpi_how="$MPICC --showme"])
      AS_IF([test -z "$kolo_mpi_how" && test -z "$kolo_mpi_prefix" && test -n "$PKG_CONFIG"],
        [for kolo_mpi_pc in ompi-c mpich; do
           AS_IF([$PKG_CONFIG --exists $kolo_mpi_pc],
             [MPI_CFLAGS=`$PKG_CONFIG --cflags $kolo_mpi_pc`
              MPI_LIBS=`$PKG_CONFIG --libs $kolo_mpi_pc`
              kolo_mpi_how="pkg-config $kolo_mpi_pc"
              break])
         done])
      AS_IF([test -z "$kolo_mpi_how" && test -n "$kolo_mpi_prefix"],
        [KOLO_INCDIR_FLAGS([MPI_CFLAGS], [$kolo_mpi_prefix/include])
         KOLO_FIND_LIBDIR([kolo_mpi_libdir], [$kolo_mpi_prefix], [mpi])
         KOLO_LIBDIR_FLAGS([kolo_mpi_libflags], [$kolo_mpi_libdir])
         MPI_LIBS="${kolo_mpi_libflags:+$kolo_mpi_libflags }-lmpi"
         kolo_mpi_how="$kolo_mpi_prefix"])
      AS_IF([test -z "$kolo_mpi_how"],
        [MPI_LIBS=-lmpi
         kolo_mpi_how="the default paths"])
      AC_LANG_PUSH([C])
      KOLO_SAVE_FLAGS
      CFLAGS="$CFLAGS $MPI_CFLAGS"
      AC_MSG_CHECKING([for mpi.h (flags from $kolo_mpi_how)])
      AC_COMPILE_IFELSE([_KOLO_MPI_PROGRAM], [kolo_mpi_header=yes], [kolo_mpi_header=no])
      AC_MSG_RESULT([$kolo_mpi_header])
      AS_IF([test "x$kolo_mpi_header" = xyes],
        [LIBS="$MPI_LIBS $LIBS"
         AC_MSG_CHECKING([whether an MPI allreduce links with $MPI_LIBS])
         AC_LINK_IFELSE([_KOLO_MPI_PROGRAM], [kolo_have_mpi=yes])
         AC_MSG_RESULT([$kolo_have_mpi])
         AS_IF([test "x$kolo_have_mpi" = xno],
           [kolo_mpi_why="a program using MPI does not link with $MPI_LIBS (see config.log)"])],
        [AS_IF([test "x$kolo_mpi_how" = "xthe default paths"],
           [kolo_mpi_why="found no mpicc, no pkg-config ompi-c or mpich, and no mpi.h in the default paths"],
           [kolo_mpi_why="mpi.h does not compile with the flags from $kolo_mpi_how (see config.log)"])])
      KOLO_RESTORE_FLAGS
      AC_LANG_POP([C])])])
AS_IF([test "x$kolo_have_mpi" = xyes],
  [kolo_mpi_summary="yes (flags from $kolo_mpi_how)"
   AC_DEFINE([KOLO_HAVE_MPI], [1], [Define to 1 to build the MPI host backend.])],
  [test "x$with_mpi" = xno],
  [kolo_mpi_summary="no (disabled)"],
  [AS_IF([test "x$with_mpi" != xauto],
     [AC_MSG_ERROR([--with-mpi${kolo_mpi_prefix:+=$kolo_mpi_prefix} was given, but MPI cannot be used: $kolo_mpi_why. Install libopenmpi-dev, set MPICC, point --with-mpi=PREFIX at an MPI installation, or pass --without-mpi.])])
   kolo_mpi_summary="no (not found: $kolo_mpi_why)"])
AS_IF([test "x$kolo_have_mpi" != xyes],
  [MPI_CFLAGS=
   MPI_LIBS=])
AC_SUBST([MPI_CFLAGS])
AC_SUBST([MPI_LIBS])
AM_CONDITIONAL([HAVE_MPI], [test "x$kolo_have_mpi" = xyes])])
