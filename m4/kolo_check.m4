# kolo_check.m4 -- find Check, the C unit-test framework (Debian: check).
#
# KOLO_CHECK_LIBCHECK
#   --with-check      require Check
#   --without-check   do not build the unit tests
#   [default: use Check when pkg-config finds check >= 0.9.10]
#   Without Check, `make check` cannot build or run the unit tests: that
#   is said in the summary, and is an error only with --with-check.
#
# Substitutes CHECK_CFLAGS and CHECK_LIBS (from PKG_CHECK_MODULES; on Debian
# "-pthread -lcheck_pic -lrt -lm -lsubunit"); AM_CONDITIONAL HAVE_CHECK.
# Sets kolo_have_check and kolo_check_summary.

AC_DEFUN([KOLO_CHECK_LIBCHECK],
[AC_REQUIRE([PKG_PROG_PKG_CONFIG])
AC_ARG_WITH([check],
  [AS_HELP_STRING([--with-check],
    [require the Check unit-test framework (check >= 0.9.10) for make check; --without-check skips the unit tests @<:@default=auto@:>@])],
  [], [with_check=auto])
kolo_have_check=no
AS_CASE([$with_check],
  [yes|no|auto], [],
  [AC_MSG_ERROR([bad value '$with_check' for --with-check (use yes or no; to use a Check elsewhere, set PKG_CONFIG_PATH)])])
AS_IF([test "x$with_check" != xno],
  [PKG_CHECK_MODULES([CHECK], [check >= 0.9.10],
     [kolo_have_check=yes],
     [kolo_have_check=no
      kolo_check_why="pkg-config finds no check >= 0.9.10"])
   AS_IF([test "x$kolo_have_check" = xyes],
     [AC_LANG_PUSH([C])
      KOLO_SAVE_FLAGS
      CFLAGS="$CFLAGS $CHECK_CFLAGS"
      LIBS="$CHECK_LIBS $LIBS"
      AC_MSG_CHECKING([whether a Check test suite links])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <check.h>]],
                       [[Suite *suite = suite_create ("kolo");
                         SRunner *runner = srunner_create (suite);
                         srunner_free (runner);]])],
        [],
        [kolo_have_check=no
         kolo_check_why="check.h does not compile or link with $CHECK_CFLAGS $CHECK_LIBS (see config.log)"])
      AC_MSG_RESULT([$kolo_have_check])
      KOLO_RESTORE_FLAGS
      AC_LANG_POP([C])])])
AS_IF([test "x$kolo_have_check" = xyes],
  [kolo_check_version=`$PKG_CONFIG --modversion check 2>/dev/null`
   kolo_check_summary="yes (check $kolo_check_version)"],
  [test "x$with_check" = xno],
  [kolo_check_summary="no (disabled: make check runs no unit tests)"],
  [AS_IF([test "x$with_check" = xyes],
     [AC_MSG_ERROR([--with-check was given, but $kolo_check_why. Install Check (Debian: check) or pass --without-check.])])
   kolo_check_summary="no ($kolo_check_why: make check cannot run the unit tests)"])
AS_IF([test "x$kolo_have_check" != xyes],
  [CHECK_CFLAGS=
   CHECK_LIBS=])
AC_SUBST([CHECK_CFLAGS])
AC_SUBST([CHECK_LIBS])
AM_CONDITIONAL([HAVE_CHECK], [test "x$kolo_have_check" = xyes])])
