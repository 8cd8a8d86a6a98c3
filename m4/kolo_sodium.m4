# kolo_sodium.m4 -- find libsodium, the cryptography behind the job's
# secret (runtime/auth.c: HMAC-SHA256, SHA-256, random bytes).
#
# KOLO_CHECK_SODIUM
#   libsodium >= 1.0.16 through pkg-config (Debian: libsodium-dev); kolo
#   does not build without it, and configure says how to get it.
#
# Substitutes SODIUM_CFLAGS and SODIUM_LIBS; sets kolo_sodium_summary.

AC_DEFUN([KOLO_CHECK_SODIUM],
[AC_REQUIRE([PKG_PROG_PKG_CONFIG])
PKG_CHECK_MODULES([SODIUM], [libsodium >= 1.0.16], [],
  [AC_MSG_ERROR([kolo needs libsodium (>= 1.0.16) for the job's secret: every connection of a job proves it with HMAC-SHA256.
    pkg-config says: $SODIUM_PKG_ERRORS
On Debian or Ubuntu: apt-get install libsodium-dev (or point PKG_CONFIG_PATH at a libsodium.pc).])])
kolo_sodium_summary="yes ($($PKG_CONFIG --modversion libsodium))"
])
