# kolo_warnings.m4 -- warning and symbol-visibility flags.
#
# KOLO_ENABLE_WERROR
#   --enable-werror   warnings are errors (CI passes it) [default: no]
#   Substitutes WARN_CFLAGS and WARN_CXXFLAGS: "-Wall -Wextra", plus
#   "-Werror" with --enable-werror (each flag only if the compiler takes it).
#
# KOLO_CHECK_VISIBILITY
#   Substitutes VISIBILITY_CFLAGS and VISIBILITY_CXXFLAGS: -fvisibility=hidden
#   when the compiler supports it (empty otherwise), so that libkolo exports
#   only what kolo.h marks as public.

AC_DEFUN([KOLO_ENABLE_WERROR],
[AC_ARG_ENABLE([werror],
  [AS_HELP_STRING([--enable-werror],
    [treat compiler warnings as errors (CI builds use this) @<:@default=no@:>@])],
  [], [enable_werror=no])
kolo_warn_flags="-Wall -Wextra"
AS_CASE([$enable_werror],
  [yes], [kolo_warn_flags="$kolo_warn_flags -Werror"],
  [no], [],
  [AC_MSG_ERROR([bad value '$enable_werror' for --enable-werror (use yes or no)])])
WARN_CFLAGS=
WARN_CXXFLAGS=
for kolo_flag in $kolo_warn_flags; do
  KOLO_CC_FLAG_IFELSE([$kolo_flag],
    [WARN_CFLAGS="${WARN_CFLAGS:+$WARN_CFLAGS }$kolo_flag"],
    [AS_IF([test "x$kolo_flag" = x-Werror],
      [AC_MSG_ERROR([--enable-werror was given, but $CC does not accept -Werror])])])
  KOLO_CXX_FLAG_IFELSE([$kolo_flag],
    [WARN_CXXFLAGS="${WARN_CXXFLAGS:+$WARN_CXXFLAGS }$kolo_flag"])
done
AC_SUBST([WARN_CFLAGS])
AC_SUBST([WARN_CXXFLAGS])])

AC_DEFUN([KOLO_CHECK_VISIBILITY],
[VISIBILITY_CFLAGS=
VISIBILITY_CXXFLAGS=
KOLO_CC_FLAG_IFELSE([-fvisibility=hidden], [VISIBILITY_CFLAGS=-fvisibility=hidden])
KOLO_CXX_FLAG_IFELSE([-fvisibility=hidden], [VISIBILITY_CXXFLAGS=-fvisibility=hidden])
AC_SUBST([VISIBILITY_CFLAGS])
AC_SUBST([VISIBILITY_CXXFLAGS])])
