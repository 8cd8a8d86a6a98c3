# ops/shm/configure.m4 -- the shared-memory backend (ranks of one host),
# and with it the hierarchical one (ops/hier, shm inside a host). Included
# by configure.ac (m4_include), which calls KOLO_CHECK_SHM.
#
# KOLO_CHECK_SHM
#   --enable-shm (default: auto) builds ops/shm when the system has POSIX
#   shared memory (shm_open, in libc or librt), Linux futexes, pidfd_open
#   and abstract Unix sockets: a link test of all of them. Defines
#   KOLO_HAVE_SHM, sets the conditional HAVE_SHM, substitutes SHM_LIBS and
#   sets kolo_shm_summary. --enable-shm=yes fails when they are missing.

AC_DEFUN([KOLO_CHECK_SHM],
[AC_ARG_ENABLE([shm],
  [AS_HELP_STRING([--enable-shm],
    [shared-memory backend for ranks of one host (default: auto)])],
  [], [enable_shm=auto])
kolo_have_shm=no
SHM_LIBS=
kolo_shm_summary="no (--disable-shm)"
AS_IF([test "x$enable_shm" != xno], [
  kolo_save_LIBS=$LIBS
  AC_SEARCH_LIBS([shm_open], [rt], [], [])
  AC_MSG_CHECKING([for futexes, pidfd_open and shm_open])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
]], [[
  int fd = shm_open ("/kolo-configure", O_RDONLY, 0);
  long r = syscall (SYS_futex, (void *) 0, FUTEX_WAKE, 1, NULL, NULL, 0);
  long p = syscall (SYS_pidfd_open, getpid (), 0);
  return fd + (int) r + (int) p;
]])],
    [kolo_have_shm=yes
     AS_IF([test "x$LIBS" != "x$kolo_save_LIBS"], [SHM_LIBS=-lrt])
     kolo_shm_summary="yes (POSIX shared memory, futexes)"],
    [kolo_shm_summary="no (shm_open, futexes or pidfd_open missing)"])
  AC_MSG_RESULT([$kolo_have_shm])
  LIBS=$kolo_save_LIBS
  AS_IF([test "x$enable_shm" = xyes && test "x$kolo_have_shm" != xyes],
    [AC_MSG_ERROR([--enable-shm was given, but $kolo_shm_summary])])
])
AS_IF([test "x$kolo_have_shm" = xyes],
  [AC_DEFINE([KOLO_HAVE_SHM], [1], [Define to 1 to build the shared-memory backend.])])
AM_CONDITIONAL([HAVE_SHM], [test "x$kolo_have_shm" = xyes])
AC_SUBST([SHM_LIBS])
])
