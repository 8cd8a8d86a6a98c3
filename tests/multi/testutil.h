/*
 * testutil.h — scaffolding shared by the multi-rank test programs
 * (tests/multi/test-allreduce.c, test-collectives.c, test-failures.c and
 * tests/timeline/test-timeline.c, tests/gpu/test-gpu.c). Header only: static inline functions,
 * a few file-scope statics and macros.
 *
 * It offers:
 *   TU_FAIL_HERE(fmt, ...)   prints "rank R: FAIL FILE:LINE: <message>"
 *   CHECK(cond, fmt, ...)    TU_FAIL_HERE and failures++ when cond is false
 *                            (only where the program has not defined its
 *                            own CHECK before including this header)
 *   TU_MUST(call, PREFIX, ...) runs call; unless it returns KOLO_OK, prints
 *                            PREFIX (a printf format and its arguments)
 *                            followed by "<call> failed: <rc> <last error>"
 *                            and exits 1. Each program defines its own MUST
 *                            with its own prefix.
 *   mix(x), rnd(), rng_state, shuffle(a, n)
 *                            splitmix64, a per-process generator on it and a
 *                            Fisher-Yates shuffle driven by rnd()
 *   h2f(h), bf2f(b)          float16 and bfloat16 bits to double, exact,
 *                            independent of the library's conversions
 *   tu_get(dtype, buf, i)    element i of buf as a double (bool: the raw
 *                            byte, so that a result other than 0 or 1 shows)
 *   now()                    CLOCK_MONOTONIC seconds
 *   env_double(name, dflt)   $name as a number, dflt when unset or empty
 *   tu_watchdog(rank, mode, what, seconds), tu_on_alarm
 *                            alarm(seconds); when it fires, tu_on_alarm
 *                            (install it for SIGALRM) writes "rank R: FAIL
 *                            MODE: hung for more than S s in: WHAT" and
 *                            _exit(1)s
 *
 * CHECK, TU_FAIL_HERE and TU_MUST use the including program's `rank`, and
 * CHECK its `failures` counter, by name: declare them before using these.
 */
#ifndef KOLO_TESTS_MULTI_TESTUTIL_H
#define KOLO_TESTS_MULTI_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo.h"

/* ---- checks --------------------------------------------------------------- */

#define TU_FAIL_HERE(...)                                                     \
    do {                                                                      \
        fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__);  \
        fprintf(stderr, __VA_ARGS__);                                         \
        fprintf(stderr, "\n");                                                \
    } while (0)

#ifndef CHECK
#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            TU_FAIL_HERE(__VA_ARGS__);                                        \
            failures++;                                                       \
        }                                                                     \
    } while (0)
#endif

/* prefix: a string literal format; its arguments follow. One fprintf, so
 * that the line is written at once. */
#define TU_MUST(call, prefix, ...)                                            \
    do {                                                                      \
        int rc_ = (call);                                                     \
        if (rc_ != KOLO_OK) {                                                 \
            fprintf(stderr, prefix "%s failed: %d %s\n", __VA_ARGS__, #call,  \
                    rc_, kolo_last_error());                                  \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

/* ---- deterministic data --------------------------------------------------- */

/* splitmix64: a small, well-mixed generator every rank can reproduce. */
static inline uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A per-process generator (orders, timings); seed it by setting rng_state. */
static uint64_t rng_state;
static inline uint64_t rnd(void) { return rng_state = mix(rng_state); }

static inline void shuffle(int *a, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1)), tmp = a[i];
        a[i] = a[j];
        a[j] = tmp;
    }
}

/* float16 bits to double, written here, independent of the library. Every
 * float16 value is exact in float and double. */
static inline double h2f(uint16_t h)
{
    int e = (h >> 10) & 0x1f, frac = h & 0x3ff;
    double v;
    if (e == 0)
        v = ldexp((double)frac, -24);
    else if (e == 31)
        v = frac ? NAN : INFINITY;
    else
        v = ldexp(1.0 + (double)frac / 1024.0, e - 15);
    return (h & 0x8000) ? -v : v;
}

/* bfloat16 bits to double: the upper half of a float. */
static inline double bf2f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline double tu_get(kolo_dtype_t d, const void *buf, int64_t i)
{
    switch (d) {
    case KOLO_UINT8: return ((const uint8_t *)buf)[i];
    case KOLO_INT8: return ((const int8_t *)buf)[i];
    case KOLO_UINT16: return ((const uint16_t *)buf)[i];
    case KOLO_INT16: return ((const int16_t *)buf)[i];
    case KOLO_INT32: return ((const int32_t *)buf)[i];
    case KOLO_INT64: return (double)((const int64_t *)buf)[i];
    case KOLO_FLOAT16: return h2f(((const uint16_t *)buf)[i]);
    case KOLO_BFLOAT16: return bf2f(((const uint16_t *)buf)[i]);
    case KOLO_FLOAT32: return ((const float *)buf)[i];
    case KOLO_FLOAT64: return ((const double *)buf)[i];
    case KOLO_BOOL: return ((const uint8_t *)buf)[i];
    default: abort();
    }
}

/* ---- time and environment ------------------------------------------------- */

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline double env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

/* ---- watchdog: a hang becomes a FAIL line naming the phase ---------------- */

static char tu_watchdog_msg[256];
static size_t tu_watchdog_len;

/* The SIGALRM handler: signal(SIGALRM, tu_on_alarm). */
static inline void tu_on_alarm(int sig)
{
    (void)sig;
    if (write(2, tu_watchdog_msg, tu_watchdog_len) < 0) {
        /* nothing more to do */
    }
    _exit(1);
}

/* Starts a phase that must end within `seconds`. */
static inline void tu_watchdog(int rank_, const char *mode_, const char *what,
                               unsigned seconds)
{
    int n = snprintf(tu_watchdog_msg, sizeof(tu_watchdog_msg),
                     "rank %d: FAIL %s: hung for more than %u s in: %s\n",
                     rank_, mode_, seconds, what);
    tu_watchdog_len = n > 0 && (size_t)n < sizeof(tu_watchdog_msg)
                          ? (size_t)n : sizeof(tu_watchdog_msg) - 1;
    alarm(seconds);
}

#endif /* KOLO_TESTS_MULTI_TESTUTIL_H */
