# ops/gloo/configure.m4 -- find Gloo, kolo's default host (CPU) backend.
# Included by configure.ac (m4_include), which calls KOLO_CHECK_GLOO.
#
# KOLO_CHECK_GLOO
#   --with-gloo           require Gloo from the system paths
#   --with-gloo=PREFIX    require Gloo from PREFIX/include, PREFIX/lib*
#   --without-gloo        do not build the Gloo backend
#   [default: use Gloo when it is found]
#   Asked for but unusable: configure fails.
#
# Gloo is C++: the check compiles and links a small C++17 program that uses
# gloo::rendezvous::FileStore, gloo::transport::tcp::CreateDevice and
# gloo::allreduce. With Debian's libgloo-dev (a shared /usr/lib/libgloo.so
# that itself depends on libhiredis and libibverbs) -lgloo is all it needs;
# "-lgloo -lhiredis -libverbs -pthread" is tried second, for a static
# libgloo.
#
# A second check: whether Gloo's TCP pair listens on a socket of its own
# and takes the first connection it accepts as its peer (Debian's
# 0.0~git20220518 snapshot: Pair::listen, Pair::handleListening). Then
# ops/gloo/gloo_ops.cc derives from that pair to screen what it accepts
# (a stranger's connection is dropped; see "Strangers" there) and
# KOLO_GLOO_PAIR_LISTENS is defined. Gloo's pair.h includes
# gloo/common/memory.h, which Debian does not install: the check, like the
# build, searches ops/gloo/compat after the system's directories.
#
# Substitutes GLOO_CPPFLAGS and GLOO_LIBS; AM_CONDITIONAL HAVE_GLOO;
# defines KOLO_HAVE_GLOO. Sets kolo_have_gloo (yes/no), kolo_gloo_summary.

m4_define([_KOLO_GLOO_PROGRAM],
[AC_LANG_PROGRAM([[
#include <cstddef>
#include <memory>
#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
static void kolo_sum (void *out, const void *a, const void *b, size_t n)
{
  float *o = static_cast<float *> (out);
  const float *x = static_cast<const float *> (a);
  const float *y = static_cast<const float *> (b);
  for (size_t i = 0; i < n; i++)
    o[i] = x[i] + y[i];
}
]], [[
  gloo::transport::tcp::attr attr;
  attr.hostname = "localhost";
  auto device = gloo::transport::tcp::CreateDevice (attr);
  gloo::rendezvous::FileStore store ("/tmp");
  auto context = std::make_shared<gloo::rendezvous::Context> (0, 1);
  context->connectFullMesh (store, device);
  float value = 1.0f;
  gloo::AllreduceOptions options (context);
  options.setOutput (&value, 1);
  options.setReduceFunction (kolo_sum);
  gloo::allreduce (options);
]])])

m4_define([_KOLO_GLOO_PAIR_PROGRAM],
[AC_LANG_PROGRAM([[
#include <chrono>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/pair.h>
struct kolo_probe : gloo::transport::tcp::Pair {
  kolo_probe (gloo::transport::tcp::Context *c, gloo::transport::tcp::Device *d)
    : gloo::transport::tcp::Pair (c, d, 1, std::chrono::milliseconds (1)) {}
  void handleEvents (int events) override
  {
    if (state_ == LISTENING && fd_ >= 0)
      handleListening ();
    else
      gloo::transport::tcp::Pair::handleEvents (events);
    handleConnected ();
    signalException (std::string ("x"));
    (void) context_->rank;
    (void) rank_;
  }
};
]], [[
  kolo_probe *p = nullptr;
  (void) p;
]])])

AC_DEFUN([KOLO_CHECK_GLOO],
[AC_REQUIRE([KOLO_PROG_CXX_CXX17])
AC_REQUIRE([KOLO_CHECK_PTHREAD])
AC_ARG_WITH([gloo],
  [AS_HELP_STRING([--with-gloo@<:@=PREFIX@:>@],
    [build the Gloo host backend (the default backend), with Gloo from PREFIX or the system paths; --without-gloo leaves it out @<:@default=auto@:>@])],
  [], [with_gloo=auto])
kolo_have_gloo=no
kolo_gloo_why=
kolo_gloo_pair_listens=no
GLOO_CPPFLAGS=
GLOO_LIBS=
AS_CASE([$with_gloo],
  [no], [],
  [yes|auto], [kolo_gloo_prefix=],
  [kolo_gloo_prefix=$with_gloo])
AS_IF([test "x$with_gloo" != xno],
  [kolo_gloo_libflags=
   AS_IF([test "x$kolo_cxx17" != xyes],
     [kolo_gloo_why="$CXX does not compile C++17"],
     [test -n "$kolo_gloo_prefix"],
     [AS_IF([test -f "$kolo_gloo_prefix/include/gloo/allreduce.h"],
        [KOLO_INCDIR_FLAGS([GLOO_CPPFLAGS], [$kolo_gloo_prefix/include])],
        [kolo_gloo_why="there is no $kolo_gloo_prefix/include/gloo/allreduce.h"])
      KOLO_FIND_LIBDIR([kolo_gloo_libdir], [$kolo_gloo_prefix], [gloo])
      AS_IF([test -z "$kolo_gloo_libdir"],
        [kolo_gloo_why="${kolo_gloo_why:+$kolo_gloo_why, and }there is no libgloo in $kolo_gloo_prefix/lib64 or $kolo_gloo_prefix/lib"])
      KOLO_LIBDIR_FLAGS([kolo_gloo_libflags], [$kolo_gloo_libdir])])
   AS_IF([test -z "$kolo_gloo_why"],
     [AC_LANG_PUSH([C++])
      KOLO_SAVE_FLAGS
      CPPFLAGS="$CPPFLAGS $GLOO_CPPFLAGS"
      AC_MSG_CHECKING([for the Gloo headers])
      AC_COMPILE_IFELSE([_KOLO_GLOO_PROGRAM], [kolo_gloo_headers=yes], [kolo_gloo_headers=no])
      AC_MSG_RESULT([$kolo_gloo_headers])
      AS_IF([test "x$kolo_gloo_headers" = xyes],
        [for kolo_gloo_extra in "" "-lhiredis -libverbs $PTHREAD_LIBS"; do
           kolo_gloo_try="${kolo_gloo_libflags:+$kolo_gloo_libflags }-lgloo${kolo_gloo_extra:+ $kolo_gloo_extra}"
           AC_MSG_CHECKING([whether a Gloo allreduce links with $kolo_gloo_try])
           LIBS="$kolo_gloo_try $kolo_save_LIBS"
           AC_LINK_IFELSE([_KOLO_GLOO_PROGRAM], [kolo_have_gloo=yes])
           AC_MSG_RESULT([$kolo_have_gloo])
           AS_IF([test "x$kolo_have_gloo" = xyes],
             [GLOO_LIBS=$kolo_gloo_try
              break])
         done
         AS_IF([test "x$kolo_have_gloo" = xno],
           [kolo_gloo_why="a program using Gloo does not link with -lgloo (see config.log)"])
         AC_MSG_CHECKING([whether Gloo's TCP pair listens on its own socket])
         CPPFLAGS="$CPPFLAGS -idirafter $srcdir/ops/gloo/compat"
         AC_COMPILE_IFELSE([_KOLO_GLOO_PAIR_PROGRAM],
           [kolo_gloo_pair_listens=yes], [kolo_gloo_pair_listens=no])
         AC_MSG_RESULT([$kolo_gloo_pair_listens])],
        [kolo_gloo_why="the Gloo headers do not compile (see config.log)"])
      KOLO_RESTORE_FLAGS
      AC_LANG_POP([C++])])])
AS_IF([test "x$kolo_have_gloo" = xyes],
  [KOLO_HEADER_DIR([kolo_gloo_incdir], [gloo/allreduce.h], [$CXX -E -x c++ $CPPFLAGS $GLOO_CPPFLAGS])
   kolo_gloo_summary="yes (${kolo_gloo_incdir:-system headers}, $GLOO_LIBS)"
   AC_DEFINE([KOLO_HAVE_GLOO], [1], [Define to 1 to build the Gloo host backend.])
   AS_IF([test "x$kolo_gloo_pair_listens" = xyes],
     [AC_DEFINE([KOLO_GLOO_PAIR_LISTENS], [1],
        [Define to 1 when Gloo's TCP pair listens on its own socket (kolo then screens what it accepts).])
      kolo_gloo_summary="$kolo_gloo_summary, strangers' connections screened"],
     [kolo_gloo_summary="$kolo_gloo_summary, strangers' connections not screened (this Gloo's TCP pair is not the one kolo knows)"])],
  [test "x$with_gloo" = xno],
  [GLOO_CPPFLAGS=
   kolo_gloo_summary="no (disabled)"],
  [GLOO_CPPFLAGS=
   AS_IF([test "x$with_gloo" != xauto],
     [AC_MSG_ERROR([--with-gloo${kolo_gloo_prefix:+=$kolo_gloo_prefix} was given, but Gloo cannot be used: $kolo_gloo_why. Install libgloo-dev, point --with-gloo=PREFIX at a Gloo installation, or pass --without-gloo.])])
   kolo_gloo_summary="no (not found: $kolo_gloo_why)"])
AC_SUBST([GLOO_CPPFLAGS])
AC_SUBST([GLOO_LIBS])
AM_CONDITIONAL([HAVE_GLOO], [test "x$kolo_have_gloo" = xyes])])
