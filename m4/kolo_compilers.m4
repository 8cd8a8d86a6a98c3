# kolo_compilers.m4 -- make sure the compilers speak the languages kolo is
# written in.
#
# KOLO_PROG_CC_C11
#   $CC must compile and link C11 as the runtime uses it: _Static_assert,
#   alignas, _Thread_local and <stdatomic.h>. When it does not do so by
#   default, -std=gnu11 is added to CC. No C11 compiler: configure fails.
#
# KOLO_PROG_CXX_CXX17
#   $CXX must compile C++17 (the Gloo shim). When it does not do so by
#   default, -std=gnu++17 is added to CXX. Sets kolo_cxx17 to yes or no;
#   "no" only rules Gloo out (see ops/gloo/configure.m4).
#
# Both run before LT_INIT, so that libtool records the final CC and CXX.
# Substitutes nothing new (CC and CXX are substituted by AC_PROG_CC/CXX).

m4_define([_KOLO_C11_PROGRAM],
[AC_LANG_PROGRAM([[
#if !defined __STDC_VERSION__ || __STDC_VERSION__ < 201112L
# error "this is not C11"
#endif
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
_Static_assert (sizeof (uint64_t) == 8, "uint64_t has 8 bytes");
static _Thread_local int kolo_tls;
static atomic_uint_fast64_t kolo_counter;
struct kolo_line { alignas (64) unsigned char bytes[64]; };
]], [[
  kolo_tls = 1;
  atomic_fetch_add_explicit (&kolo_counter, 1, memory_order_relaxed);
  return (int) alignof (struct kolo_line) - 64 + kolo_tls - 1;
]])])

m4_define([_KOLO_CXX17_PROGRAM],
[AC_LANG_PROGRAM([[
#if __cplusplus < 201703L
# error "this is not C++17"
#endif
#include <memory>
#include <optional>
#include <string_view>
]], [[
  std::optional<std::string_view> name = std::string_view ("kolo");
  auto buffer = std::make_unique<float[]> (4);
  if constexpr (sizeof (float) == 4)
    buffer[0] = 1.0f;
  return name->size () == 4 && buffer[0] == 1.0f ? 0 : 1;
]])])

AC_DEFUN([KOLO_PROG_CC_C11],
[AC_REQUIRE([AC_PROG_CC])
AC_LANG_PUSH([C])
AC_MSG_CHECKING([whether $CC compiles C11])
AC_LINK_IFELSE([_KOLO_C11_PROGRAM], [kolo_c11=yes], [kolo_c11=no])
AS_IF([test "x$kolo_c11" = xno],
  [kolo_save_CC=$CC
   CC="$CC -std=gnu11"
   AC_LINK_IFELSE([_KOLO_C11_PROGRAM],
     [kolo_c11="yes, with -std=gnu11"],
     [CC=$kolo_save_CC])])
AC_MSG_RESULT([$kolo_c11])
AC_LANG_POP([C])
AS_IF([test "x$kolo_c11" = xno],
  [AC_MSG_ERROR([kolo is written in C11 (atomics, thread-local storage, alignas), and $CC does not compile it, not even with -std=gnu11. Set CC to a C11 compiler, e.g. CC=gcc.])])])

AC_DEFUN([KOLO_PROG_CXX_CXX17],
[AC_REQUIRE([AC_PROG_CXX])
AC_LANG_PUSH([C++])
kolo_cxx17_how=
AC_MSG_CHECKING([whether $CXX compiles C++17])
AC_LINK_IFELSE([_KOLO_CXX17_PROGRAM], [kolo_cxx17=yes], [kolo_cxx17=no])
AS_IF([test "x$kolo_cxx17" = xno],
  [kolo_save_CXX=$CXX
   CXX="$CXX -std=gnu++17"
   AC_LINK_IFELSE([_KOLO_CXX17_PROGRAM],
     [kolo_cxx17=yes
      kolo_cxx17_how=", with -std=gnu++17"],
     [CXX=$kolo_save_CXX])])
AC_MSG_RESULT([$kolo_cxx17$kolo_cxx17_how])
AC_LANG_POP([C++])])
