# kolo_util.m4 -- small helpers used by the other kolo_*.m4 files and by the
# backends' ops/*/configure.m4.
#
# Finds nothing and substitutes nothing by itself. It provides:
#
#   KOLO_SAVE_FLAGS, KOLO_RESTORE_FLAGS
#       save CPPFLAGS, CFLAGS, CXXFLAGS, LDFLAGS and LIBS before a test,
#       and put them back afterwards (not nestable).
#   KOLO_CC_FLAG_IFELSE(FLAGS, [IF-ACCEPTED], [IF-REFUSED])
#   KOLO_CXX_FLAG_IFELSE(FLAGS, [IF-ACCEPTED], [IF-REFUSED])
#       can $CC (or $CXX) compile and link an empty program with FLAGS?
#       -Werror is added for the test, so a flag the compiler only warns
#       about counts as refused.
#   KOLO_FIND_LIBDIR(VARIABLE, PREFIX, NAME)
#       set VARIABLE to the first of PREFIX/lib64, PREFIX/lib,
#       PREFIX/lib/<multiarch>, PREFIX/targets/*/lib that holds libNAME.so
#       or libNAME.a; empty when none does.
#   KOLO_LIBDIR_FLAGS(VARIABLE, DIR)
#       set VARIABLE to "-LDIR -Wl,-rpath,DIR", or to nothing when DIR is
#       one of the directories the linker searches anyway.
#   KOLO_INCDIR_FLAGS(VARIABLE, DIR)
#       set VARIABLE to "-IDIR", or to nothing for /usr/include and
#       /usr/local/include (adding those with -I breaks #include_next).
#   KOLO_HEADER_DIR(VARIABLE, HEADER, PREPROCESSOR-COMMAND)
#       set VARIABLE to the directory in which PREPROCESSOR-COMMAND finds
#       HEADER (used by the configure summary); empty when unknown.
#       (The "@%:@" below is autoconf's quadrigraph for "#": a bare "#"
#       would start an m4 comment when the macro is expanded.)

AC_DEFUN([KOLO_SAVE_FLAGS],
[kolo_save_CPPFLAGS=$CPPFLAGS
kolo_save_CFLAGS=$CFLAGS
kolo_save_CXXFLAGS=$CXXFLAGS
kolo_save_LDFLAGS=$LDFLAGS
kolo_save_LIBS=$LIBS])

AC_DEFUN([KOLO_RESTORE_FLAGS],
[CPPFLAGS=$kolo_save_CPPFLAGS
CFLAGS=$kolo_save_CFLAGS
CXXFLAGS=$kolo_save_CXXFLAGS
LDFLAGS=$kolo_save_LDFLAGS
LIBS=$kolo_save_LIBS])

AC_DEFUN([KOLO_CC_FLAG_IFELSE],
[AC_MSG_CHECKING([whether $CC accepts $1])
AC_LANG_PUSH([C])
KOLO_SAVE_FLAGS
CFLAGS="$CFLAGS -Werror $1"
AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])], [kolo_flag_ok=yes], [kolo_flag_ok=no])
KOLO_RESTORE_FLAGS
AC_LANG_POP([C])
AC_MSG_RESULT([$kolo_flag_ok])
AS_IF([test "x$kolo_flag_ok" = xyes], [$2], [$3])])

AC_DEFUN([KOLO_CXX_FLAG_IFELSE],
[AC_MSG_CHECKING([whether $CXX accepts $1])
AC_LANG_PUSH([C++])
KOLO_SAVE_FLAGS
CXXFLAGS="$CXXFLAGS -Werror $1"
AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])], [kolo_flag_ok=yes], [kolo_flag_ok=no])
KOLO_RESTORE_FLAGS
AC_LANG_POP([C++])
AC_MSG_RESULT([$kolo_flag_ok])
AS_IF([test "x$kolo_flag_ok" = xyes], [$2], [$3])])

# The Debian-style multiarch directory name (x86_64-linux-gnu), if any.
AC_DEFUN([_KOLO_MULTIARCH],
[AC_REQUIRE([AC_PROG_CC])
kolo_multiarch=`$CC -print-multiarch 2>/dev/null`])

AC_DEFUN([KOLO_FIND_LIBDIR],
[AC_REQUIRE([_KOLO_MULTIARCH])
$1=
kolo_dirs="$2/lib64 $2/lib"
AS_IF([test -n "$kolo_multiarch"], [kolo_dirs="$kolo_dirs $2/lib/$kolo_multiarch"])
for kolo_dir in $kolo_dirs "$2"/targets/*/lib; do
  AS_IF([test -f "$kolo_dir/lib$3.so" || test -f "$kolo_dir/lib$3.a"],
        [$1=$kolo_dir
         break])
done])

AC_DEFUN([KOLO_LIBDIR_FLAGS],
[AC_REQUIRE([_KOLO_MULTIARCH])
AS_CASE([$2],
  [""|/lib|/lib64|/usr/lib|/usr/lib64|/lib/$kolo_multiarch|/usr/lib/$kolo_multiarch],
    [$1=],
  [$1="-L$2 -Wl,-rpath,$2"])])

AC_DEFUN([KOLO_INCDIR_FLAGS],
[AS_CASE([$2],
  [""|/usr/include|/usr/local/include], [$1=],
  [$1="-I$2"])])

AC_DEFUN([KOLO_HEADER_DIR],
[$1=`echo '@%:@include <$2>' | $3 - 2>/dev/null | sed -n 's|^@%:@.* "\(.*\)/$2".*|\1|p' | sed 1q`])
