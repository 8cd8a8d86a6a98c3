# kolo_sanitizers.m4 -- optional sanitizer builds.
#
# KOLO_ENABLE_SANITIZERS
#   --enable-sanitizers=LIST  comma-separated: address, undefined, leak,
#                             thread (thread excludes address and leak);
#                             --enable-sanitizers alone = address,undefined
#   [default: none]
#   The compilers must accept and link the flags, else configure fails.
#   Substitutes SANITIZER_CFLAGS ("-fsanitize=LIST -fno-omit-frame-pointer",
#   for C and C++ compiles) and SANITIZER_LDFLAGS ("-fsanitize=LIST", for
#   every link); both are empty by default. Sets kolo_sanitizers_summary.

AC_DEFUN([KOLO_ENABLE_SANITIZERS],
[AC_ARG_ENABLE([sanitizers],
  [AS_HELP_STRING([--enable-sanitizers@<:@=LIST@:>@],
    [build with the comma-separated sanitizers in LIST (address, undefined, leak, thread); without LIST: address,undefined @<:@default=none@:>@])],
  [], [enable_sanitizers=no])
AS_CASE([$enable_sanitizers],
  [no|none|""], [kolo_sanitizers=],
  [yes], [kolo_sanitizers=address,undefined],
  [kolo_sanitizers=$enable_sanitizers])
SANITIZER_CFLAGS=
SANITIZER_LDFLAGS=
AS_IF([test -n "$kolo_sanitizers"],
  [kolo_san_address=no
   kolo_san_leak=no
   kolo_san_thread=no
   kolo_save_IFS=$IFS
   IFS=,
   for kolo_san in $kolo_sanitizers; do
     IFS=$kolo_save_IFS
     AS_CASE([$kolo_san],
       [address], [kolo_san_address=yes],
       [leak], [kolo_san_leak=yes],
       [thread], [kolo_san_thread=yes],
       [undefined], [],
       [AC_MSG_ERROR([unknown sanitizer '$kolo_san' in --enable-sanitizers=$enable_sanitizers (known: address, undefined, leak, thread)])])
   done
   IFS=$kolo_save_IFS
   AS_IF([test "x$kolo_san_thread" = xyes && test "x$kolo_san_address$kolo_san_leak" != xnono],
     [AC_MSG_ERROR([--enable-sanitizers: thread cannot be combined with address or leak])])
   kolo_san_flags="-fsanitize=$kolo_sanitizers -fno-omit-frame-pointer"
   KOLO_CC_FLAG_IFELSE([$kolo_san_flags], [],
     [AC_MSG_ERROR([$CC cannot build with $kolo_san_flags (is the sanitizer runtime, e.g. libasan/libubsan/libtsan, installed?)])])
   AS_IF([test "x$kolo_cxx17" = xyes],
     [KOLO_CXX_FLAG_IFELSE([$kolo_san_flags], [],
       [AC_MSG_ERROR([$CXX cannot build with $kolo_san_flags])])])
   SANITIZER_CFLAGS=$kolo_san_flags
   SANITIZER_LDFLAGS="-fsanitize=$kolo_sanitizers"])
kolo_sanitizers_summary=${kolo_sanitizers:-none}
AC_SUBST([SANITIZER_CFLAGS])
AC_SUBST([SANITIZER_LDFLAGS])])
