# kolo_pthread.m4 -- POSIX threads (every rank runs a background thread).
#
# KOLO_CHECK_PTHREAD
#   Links a program that starts and joins a thread, first with -pthread,
#   then with plain -lpthread. Neither works: configure fails.
#   Substitutes PTHREAD_CFLAGS (for compiling) and PTHREAD_LIBS (for
#   linking); with GCC and Clang both are "-pthread".

m4_define([_KOLO_PTHREAD_PROGRAM],
[AC_LANG_PROGRAM([[
#include <pthread.h>
#include <stddef.h>
static void *kolo_worker (void *arg) { return arg; }
]], [[
  pthread_t thread;
  void *out = NULL;
  pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
  if (pthread_create (&thread, NULL, kolo_worker, &mutex) != 0)
    return 1;
  pthread_join (thread, &out);
  pthread_mutex_lock (&mutex);
  pthread_cond_signal (&cond);
  pthread_mutex_unlock (&mutex);
  return out == &mutex ? 0 : 1;
]])])

AC_DEFUN([KOLO_CHECK_PTHREAD],
[AC_LANG_PUSH([C])
PTHREAD_CFLAGS=
PTHREAD_LIBS=
kolo_pthread=no
KOLO_SAVE_FLAGS
AC_MSG_CHECKING([whether threads work with -pthread])
CFLAGS="$CFLAGS -pthread"
LIBS="-pthread $LIBS"
AC_LINK_IFELSE([_KOLO_PTHREAD_PROGRAM],
  [kolo_pthread=yes
   PTHREAD_CFLAGS=-pthread
   PTHREAD_LIBS=-pthread])
AC_MSG_RESULT([$kolo_pthread])
KOLO_RESTORE_FLAGS
AS_IF([test "x$kolo_pthread" = xno],
  [AC_MSG_CHECKING([whether threads work with -lpthread])
   LIBS="-lpthread $LIBS"
   AC_LINK_IFELSE([_KOLO_PTHREAD_PROGRAM],
     [kolo_pthread=yes
      PTHREAD_LIBS=-lpthread])
   AC_MSG_RESULT([$kolo_pthread])
   KOLO_RESTORE_FLAGS])
AC_LANG_POP([C])
AS_IF([test "x$kolo_pthread" = xno],
  [AC_MSG_ERROR([cannot build threaded programs with -pthread or -lpthread; kolo needs POSIX threads])])
AC_SUBST([PTHREAD_CFLAGS])
AC_SUBST([PTHREAD_LIBS])])
