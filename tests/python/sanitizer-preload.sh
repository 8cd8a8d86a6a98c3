# sanitizer-preload.sh — sourced by the scripts that run Python against a
# build's libkolo (run-pytest.sh, run-bench.sh, run-launchers.sh).
#
# kolo_python_preload LIB: a sanitizer build of LIB (--enable-sanitizers)
# needs the sanitizer's runtime loaded first in the (uninstrumented)
# interpreter: exports LD_PRELOAD (and ASAN_OPTIONS without leak checking:
# the interpreter leaks by design) and returns 0. Returns 1 with the reason
# in $kolo_preload_why where Python cannot load LIB at all: a
# ThreadSanitizer build, or a sanitizer runtime the compiler cannot find.
# shellcheck shell=bash disable=SC2034
kolo_python_preload() {
    local lib=$1 undef san so preload=
    kolo_preload_why=
    undef=$(nm -D --undefined-only "$lib" 2>/dev/null)
    case $undef in
    *__tsan_*)
        kolo_preload_why="$lib is built with ThreadSanitizer, which an uninstrumented Python cannot load"
        return 1 ;;
    esac
    for san in asan ubsan; do
        case $undef in
        *__${san}_*)
            so=$(${CC:-gcc} -print-file-name=lib$san.so 2>/dev/null)
            if [ ! -f "$so" ]; then
                kolo_preload_why="$lib needs lib$san.so, and ${CC:-gcc} does not know where it is"
                return 1
            fi
            preload="$preload${preload:+ }$so" ;;
        esac
    done
    if [ -n "$preload" ]; then
        echo "NOTE: sanitizer build: LD_PRELOAD=$preload (leak checking off: the interpreter leaks by design)"
        export LD_PRELOAD="$preload${LD_PRELOAD:+ $LD_PRELOAD}"
        export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    fi
    return 0
}
