/*
 * test-collectives.c — multi-rank tests of every collective kolo.h declares
 * beyond the plain allreduce, run as real processes under kolorun
 * (tests/multi/run-collectives.sh runs every mode at 2, 3 and 4 ranks).
 *
 *   test-collectives allreduce-matrix  every dtype x op x count, with and
 *                                      without prescale/postscale
 *   test-collectives allreduce-sizes   one tensor at a time, at sizes
 *                                      around 64 KiB, in place and not
 *   test-collectives compression       float32 allreduce over a float16 /
 *                                      bfloat16 wire
 *   test-collectives broadcast         every root, several dtypes and counts
 *   test-collectives allgather         first dimension differs per rank
 *   test-collectives alltoall          random splits, NULL splits
 *   test-collectives reducescatter     uneven shares, SUM and AVERAGE
 *   test-collectives into              reducescatter and allgather into the
 *                                      caller's buffers (a ZeRO bucket)
 *   test-collectives grouped           grouped allreduce/allgather/
 *                                      reducescatter; a failing member
 *   test-collectives barrier           nobody leaves before the last arrives
 *   test-collectives join              uneven step counts, kolo_join
 *   test-collectives process-sets      overlapping sets, groups, removal
 *   test-collectives mismatch          every kind of disagreement
 *
 * Every rank generates every rank's data from a hash of (seed, rank, tensor,
 * step, element), so it computes the expected result itself, without the
 * library; the float16 / bfloat16 conversions are written here too. Values
 * are chosen so that results are exact wherever the documented semantics
 * allow; only averages of floating-point types are compared within one
 * rounding. Prints "PASS <mode> (<n> checks)" and exits 0, or prints what
 * differs and exits 1.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo.h"

static int rank, size;
static long failures, nchecks;

/* Defined before testutil.h, so that it keeps this one: unlike the other
 * programs' CHECK, it counts every check (for "PASS <mode> (<n> checks)")
 * and gives up after 40 failures. */
#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        nchecks++;                                                            \
        if (!(cond)) {                                                        \
            TU_FAIL_HERE(__VA_ARGS__);                                        \
            if (++failures >= 40) {                                           \
                fprintf(stderr, "rank %d: too many failures, giving up\n",   \
                        rank);                                                \
                exit(1);                                                      \
            }                                                                 \
        }                                                                     \
    } while (0)

#include "testutil.h"

#define MUST(call)                                                            \
    TU_MUST(call, "rank %d: %s:%d: ", rank, __FILE__, __LINE__)

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* One element of a tensor checked: counted, and when wrong, reported and
 * counted in `bad` too, by which the callers stop reporting a tensor after
 * its first few wrong elements. */
#define CHECK_ELEMENT(bad, ok, ...)                                           \
    do {                                                                      \
        nchecks++;                                                            \
        if (!(ok)) {                                                          \
            CHECK(0, __VA_ARGS__);                                            \
            (bad)++;                                                          \
        }                                                                     \
    } while (0)

/* ---- deterministic data ------------------------------------------------ */

/* mix (splitmix64) is in testutil.h. */

/* A hash of five numbers: the value of (seed, rank, tensor, step, index). */
static uint64_t hv(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e)
{
    return mix(mix(mix(mix(mix(a) ^ b) ^ c) ^ d) ^ e);
}

/* The per-rank generator for orders and timings (rng_state, rnd) and
 * shuffle are in testutil.h. */

static int *identity(int n)
{
    int *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++)
        a[i] = i;
    return a;
}

/* ---- float16 / bfloat16, written here, independent of the library ------ */

/* h2f (float16 to double) is in testutil.h. */

/* Values the tests use are exactly representable; anything else is a bug
 * in the test, not in the library. */
static uint16_t f2h_exact(double v)
{
    double a = fabs(v);
    uint16_t sign = signbit(v) ? 0x8000 : 0, h;

    if (a == 0)
        h = sign;
    else if (a < ldexp(1, -14))
        h = (uint16_t)(sign | (uint16_t)ldexp(a, 24));
    else {
        int e;
        double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
        int E = e + 14;          /* a = (2m) 2^(E - 15) */
        if (E > 30)
            E = 31;
        h = (uint16_t)(sign | (uint16_t)(E << 10) |
                       (uint16_t)((2 * m - 1) * 1024));
    }
    if (h2f(h) != v) {
        fprintf(stderr, "test bug: %.17g is not exact in float16\n", v);
        exit(3);
    }
    return h;
}

static uint16_t f2bf_exact(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((double)f != v || (u & 0xffff) != 0) {
        fprintf(stderr, "test bug: %.17g is not exact in bfloat16\n", v);
        exit(3);
    }
    return (uint16_t)(u >> 16);
}

/* Whether a float32 value is exactly representable in float16 / bfloat16. */
static int half_exact(float x)
{
    double a = fabs((double)x), m;
    int e;
    if (x == 0)
        return 1;
    if (!isfinite(x) || a > 65504)
        return 0;
    if (a < ldexp(1, -14))
        return ldexp(a, 24) == floor(ldexp(a, 24));
    m = frexp(a, &e);
    return ldexp(m, 11) == floor(ldexp(m, 11));
}

static int bf16_exact(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (u & 0xffff) == 0;
}

/* ---- dtypes ------------------------------------------------------------- */

static const kolo_dtype_t all_dtypes[] = {
    KOLO_UINT8,   KOLO_INT8,     KOLO_UINT16,  KOLO_INT16,
    KOLO_INT32,   KOLO_INT64,    KOLO_FLOAT16, KOLO_BFLOAT16,
    KOLO_FLOAT32, KOLO_FLOAT64,  KOLO_BOOL};
static const kolo_op_t all_ops[] = {KOLO_OP_SUM, KOLO_OP_AVERAGE, KOLO_OP_MIN,
                                    KOLO_OP_MAX, KOLO_OP_PRODUCT};

static size_t esize(kolo_dtype_t d)
{
    static const size_t s[] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
    return s[d];
}

static int is_float(kolo_dtype_t d)
{
    return d == KOLO_FLOAT16 || d == KOLO_BFLOAT16 || d == KOLO_FLOAT32 ||
           d == KOLO_FLOAT64;
}

static int is_unsigned(kolo_dtype_t d)
{
    return d == KOLO_UINT8 || d == KOLO_UINT16;
}

static int is_int(kolo_dtype_t d)
{
    return !is_float(d) && d != KOLO_BOOL;
}

/* Stores v (exactly representable, in range) as element i of buf. */
static void put(kolo_dtype_t d, void *buf, int64_t i, double v)
{
    switch (d) {
    case KOLO_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case KOLO_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case KOLO_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case KOLO_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case KOLO_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case KOLO_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case KOLO_FLOAT16: ((uint16_t *)buf)[i] = f2h_exact(v); break;
    case KOLO_BFLOAT16: ((uint16_t *)buf)[i] = f2bf_exact(v); break;
    case KOLO_FLOAT32:
        if ((double)(float)v != v) {
            fprintf(stderr, "test bug: %.17g is not exact in float32\n", v);
            exit(3);
        }
        ((float *)buf)[i] = (float)v;
        break;
    case KOLO_FLOAT64: ((double *)buf)[i] = v; break;
    case KOLO_BOOL: ((uint8_t *)buf)[i] = (uint8_t)(v != 0); break;
    default: abort();
    }
}

/* Random bytes for element-wise copies (broadcast, allgather, alltoall):
 * element i of the stream (a, b, c). bool elements are 0 or 1. */
static void gen_bytes(void *buf, kolo_dtype_t d, int64_t n, uint64_t a,
                      uint64_t b, uint64_t c)
{
    size_t es = esize(d);
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = hv(a, b, c, (uint64_t)i, 0x5eed);
        if (d == KOLO_BOOL)
            ((uint8_t *)buf)[i] = (uint8_t)(h & 1);
        else
            memcpy((uint8_t *)buf + (size_t)i * es, &h, es);
    }
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* ---- error helpers ------------------------------------------------------ */

static char lastmsg[4096];

/* Keeps a copy of the message of a failed call (kolo_last_error is only
 * valid until the next kolo call). */
static int grab(int rc)
{
    snprintf(lastmsg, sizeof(lastmsg), "%s", rc < 0 ? kolo_last_error() : "");
    return rc;
}

/* rc from an enqueue: if it succeeded, waits for the handle and returns
 * its status, so that an error reported either at enqueue or at completion
 * is seen. The message is in lastmsg. */
static int finish(int rc, const kolo_handle_t *h)
{
    if (rc == KOLO_OK)
        rc = kolo_wait(*h);
    return grab(rc);
}

/* rc must be negative, one of code_a / code_b when they are nonzero, and
 * lastmsg must contain every non-NULL needle. */
static void expect_error(const char *what, int rc, int code_a, int code_b,
                         const char *n1, const char *n2, const char *n3)
{
    const char *needles[3] = {n1, n2, n3};
    CHECK(rc < 0, "%s: expected an error, got %d", what, rc);
    if (code_a != 0)
        CHECK(rc == code_a || rc == code_b,
              "%s: expected status %d (%s)%s%s, got %d (%s): %s", what, code_a,
              kolo_strerror(code_a), code_b ? " or " : "",
              code_b ? kolo_strerror(code_b) : "", rc, kolo_strerror(rc),
              lastmsg);
    for (int i = 0; i < 3; i++)
        if (needles[i] != NULL && rc < 0)
            CHECK(strstr(lastmsg, needles[i]) != NULL,
                  "%s: message lacks '%s': %s", what, needles[i], lastmsg);
    if (rank == 0 && rc < 0 && getenv("KOLO_TEST_VERBOSE"))
        printf("%s: %d %s\n", what, rc, lastmsg);
}

/* An enqueue that must be refused at once (rc from grab), as expect_error
 * says, with n1 and n2 in the message; a handle given anyway is waited
 * for, so that the job goes on. */
static void expect_refused(const char *what, int rc, const kolo_handle_t *h,
                           int code_a, int code_b, const char *n1,
                           const char *n2)
{
    expect_error(what, rc, code_a, code_b, n1, n2, NULL);
    if (rc == KOLO_OK)
        kolo_wait(*h);
}

static int wait_ok(kolo_handle_t h, const char *name)
{
    int rc = grab(kolo_wait(h));
    CHECK(rc == KOLO_OK, "%s: wait: %d %s", name, rc, lastmsg);
    return rc == KOLO_OK;
}

/* Checks the status of an enqueue (from grab): one that failed leaves no
 * handle to wait for (0). */
static void check_enqueued(int rc, const char *name, kolo_handle_t *h)
{
    CHECK(rc == KOLO_OK, "enqueue %s: %d %s", name, rc, lastmsg);
    if (rc != KOLO_OK)
        *h = 0;
}

/* Waits for the result of an allgather, alltoall or reducescatter enqueued
 * as `name`: 1 when *res holds one to check (and free), 0 when there was
 * no handle or the wait failed. */
static int wait_result_ok(kolo_handle_t h, const char *name,
                          kolo_result_t *res)
{
    int rc;
    if (h == 0)
        return 0;
    rc = grab(kolo_wait_result(h, res));
    CHECK(rc == KOLO_OK, "%s: wait_result: %d %s", name, rc, lastmsg);
    return rc == KOLO_OK;
}

/* A float64 allreduce of one value in a process set; exits on failure. */
static double reduce_scalar(const char *name, double v, kolo_op_t op, int ps)
{
    kolo_opts_t o;
    kolo_handle_t h;
    kolo_opts_init(&o);
    o.op = op;
    o.process_set = ps;
    MUST(kolo_allreduce_async_opts(name, &v, &v, 1, KOLO_FLOAT64, &o, &h));
    MUST(kolo_wait(h));
    return v;
}

/* A correct float32 allreduce that every rank makes: the job still works. */
static void expect_ok(const char *name)
{
    float buf[8];
    kolo_handle_t h;
    int rc;
    for (int i = 0; i < 8; i++)
        buf[i] = (float)(rank + i);
    rc = grab(kolo_allreduce_async(name, buf, buf, 8, KOLO_FLOAT32,
                                   KOLO_OP_SUM, &h));
    if (rc == KOLO_OK)
        rc = grab(kolo_wait(h));
    CHECK(rc == KOLO_OK, "%s: %d %s", name, rc, lastmsg);
    if (rc == KOLO_OK)
        for (int i = 0; i < 8; i++)
            CHECK(buf[i] == (float)(size * (size - 1) / 2 + size * i),
                  "%s[%d] = %g", name, i, buf[i]);
}

/* Checks the shape/splits part of a result. */
static void check_result_meta(const char *name, const kolo_result_t *res,
                              int ndim, const int64_t *shape,
                              const int64_t *splits, int nsplits,
                              size_t bytes)
{
    CHECK(res->ndim == ndim, "%s: result ndim %d, expected %d", name,
          res->ndim, ndim);
    for (int k = 0; k < ndim && k < res->ndim; k++)
        CHECK(res->shape[k] == shape[k], "%s: result shape[%d] = %lld, "
              "expected %lld", name, k, (long long)res->shape[k],
              (long long)shape[k]);
    CHECK(res->bytes == bytes, "%s: result has %zu bytes, expected %zu", name,
          res->bytes, bytes);
    CHECK(bytes == 0 || res->data != NULL, "%s: result data is NULL", name);
    CHECK(res->nsplits == nsplits, "%s: %d splits, expected %d", name,
          res->nsplits, nsplits);
    if (res->nsplits == nsplits) {
        CHECK(nsplits == 0 || res->splits != NULL, "%s: splits is NULL", name);
        for (int k = 0; k < nsplits && res->splits; k++)
            CHECK(res->splits[k] == splits[k],
                  "%s: splits[%d] = %lld, expected %lld", name, k,
                  (long long)res->splits[k], (long long)splits[k]);
    }
}

/* ---- the modes whose results come back as a kolo_result_t --------------- */

/* allgather, alltoall and reducescatter run alike: each step sets up n
 * tensors, enqueues them in one random order (this rank's own), waits for
 * them in another and checks each result against what this rank computes
 * for every rank. A mode gives what differs, for tensor t of its own
 * array ts. */
typedef struct result_mode {
    void *ts;
    int n;
    uint64_t seed; /* of this rank's orders, mixed with the rank */
    void (*setup)(void *ts, int t, int step);
    /* Enqueues tensor t, the j-th of its step, with handle *h: grab's
     * status; *name gets the tensor's name. */
    int (*enqueue)(void *ts, int t, int j, kolo_handle_t *h,
                   const char **name);
    void (*check)(void *ts, int t, int step, const kolo_result_t *res);
    void (*release)(void *ts, int t);
} result_mode_t;

static void run_result_steps(const result_mode_t *m, int steps)
{
    int *order = identity(m->n);
    kolo_handle_t *h = xmalloc((size_t)m->n * sizeof(*h));
    const char **names = xmalloc((size_t)m->n * sizeof(*names));

    rng_state = mix(m->seed + (uint64_t)rank);
    for (int step = 0; step < steps; step++) {
        for (int t = 0; t < m->n; t++)
            m->setup(m->ts, t, step);
        shuffle(order, m->n);
        for (int j = 0; j < m->n; j++) {
            int t = order[j], rc = m->enqueue(m->ts, t, j, &h[t], &names[t]);
            check_enqueued(rc, names[t], &h[t]);
        }
        shuffle(order, m->n);
        for (int j = 0; j < m->n; j++) {
            kolo_result_t res;
            if (wait_result_ok(h[order[j]], names[order[j]], &res)) {
                m->check(m->ts, order[j], step, &res);
                kolo_result_free(&res);
            }
        }
        for (int t = 0; t < m->n; t++)
            m->release(m->ts, t);
    }
    free(names);
    free(h);
    free(order);
}

/* ======================================================================== */
/* allreduce-matrix                                                         */
/* ======================================================================== */

static int64_t int_limit(kolo_dtype_t d)
{
    switch (d) {
    case KOLO_UINT8: return 10;
    case KOLO_INT8: return 5;
    case KOLO_UINT16: return 1000;
    case KOLO_INT16: return 1000;
    case KOLO_INT32: return 10000000;
    case KOLO_INT64: return 1000000000000LL;
    default: return 0;
    }
}

static void int_full_range(kolo_dtype_t d, int64_t *lo, int64_t *hi)
{
    switch (d) {
    case KOLO_UINT8: *lo = 0, *hi = 255; break;
    case KOLO_INT8: *lo = -128, *hi = 127; break;
    case KOLO_UINT16: *lo = 0, *hi = 65535; break;
    case KOLO_INT16: *lo = -32768, *hi = 32767; break;
    case KOLO_INT32: *lo = INT32_MIN, *hi = INT32_MAX; break;
    /* values beyond 2^53 would not survive the double reference */
    default: *lo = -(1LL << 53), *hi = (1LL << 53) - 1; break;
    }
}

static void matrix_scales(kolo_dtype_t d, kolo_op_t op, int scaled,
                          double *pre, double *post)
{
    *pre = *post = 1;
    if (!scaled)
        return;
    if (is_float(d)) {
        *pre = 0.5, *post = 2;
        return;
    }
    switch (op) {
    case KOLO_OP_PRODUCT: *post = 3; break;
    case KOLO_OP_AVERAGE: *pre = 2; break;
    default: *pre = 0.5, *post = 3; break; /* 0.5 truncates odd values */
    }
}

static double matrix_value(kolo_dtype_t d, kolo_op_t op, int scaled, int r,
                           int t, int step, int64_t i)
{
    uint64_t h = hv(0x3a7121c5, (uint64_t)r, (uint64_t)t, (uint64_t)step,
                    (uint64_t)i);
    if (d == KOLO_BOOL) /* and: mostly true; or: mostly false */
        return (op == KOLO_OP_MIN || op == KOLO_OP_PRODUCT) ? (h % 4 != 0)
                                                            : (h % 4 == 0);
    if (op == KOLO_OP_PRODUCT) {
        static const double sv[] = {-1, 1, 2}, fv[] = {-1, 1, 2, 0.5};
        if (is_unsigned(d))
            return (double)(1 + h % 2);
        if (!is_float(d))
            return sv[h % 3];
        return fv[h % 4];
    }
    if ((op == KOLO_OP_MIN || op == KOLO_OP_MAX) && !scaled) {
        if (is_int(d)) {
            int64_t lo, hi;
            int_full_range(d, &lo, &hi);
            return (double)(lo + (int64_t)(h % ((uint64_t)(hi - lo) + 1)));
        }
        if (d == KOLO_BFLOAT16)
            return (double)((int)(h % 401) - 200);
        return ((int)(h % 2001) - 1000) / 8.0;
    }
    /* SUM, AVERAGE, scaled MIN/MAX: sums stay exact and in range. */
    if (is_float(d)) {
        if (d == KOLO_BFLOAT16)
            return (double)((int)(h % 31) - 15);
        return ((int)(h % 201) - 100) / 8.0;
    }
    {
        int64_t L = int_limit(d);
        if (is_unsigned(d))
            return (double)(h % (uint64_t)(L + 1));
        return (double)((int64_t)(h % (uint64_t)(2 * L + 1)) - L);
    }
}

/* The reference, computed with the documented semantics: each input scaled
 * (integers truncated), reduced, scaled again by postscale (divided by the
 * size for AVERAGE; integers truncated toward zero). */
static double matrix_expect(kolo_dtype_t d, kolo_op_t op, int scaled, int t,
                            int step, int64_t i)
{
    double pre, post, acc = 0;
    matrix_scales(d, op, scaled, &pre, &post);
    for (int r = 0; r < size; r++) {
        double x = matrix_value(d, op, scaled, r, t, step, i);
        if (pre != 1)
            x = is_float(d) ? x * pre : trunc(x * pre);
        if (r == 0) {
            acc = x;
            continue;
        }
        switch (op) {
        case KOLO_OP_SUM:
            acc = d == KOLO_BOOL ? fmax(acc, x) : acc + x;
            break;
        case KOLO_OP_AVERAGE: acc += x; break;
        case KOLO_OP_MIN: acc = fmin(acc, x); break;
        case KOLO_OP_MAX: acc = fmax(acc, x); break;
        case KOLO_OP_PRODUCT: acc *= x; break;
        default: abort();
        }
    }
    if (op == KOLO_OP_AVERAGE)
        post /= size; /* AVERAGE: one scaling by postscale / size (kolo.h) */
    if (post != 1)
        acc = is_float(d) ? acc * post : trunc(acc * post);
    return acc;
}

/* One rounding of a float average, relative. */
static double avg_tolerance(kolo_dtype_t d)
{
    switch (d) {
    case KOLO_FLOAT16: return ldexp(1, -10);
    case KOLO_BFLOAT16: return ldexp(1, -7);
    case KOLO_FLOAT32: return ldexp(1, -23);
    default: return ldexp(1, -51);
    }
}

typedef struct mtensor {
    char name[96];
    kolo_dtype_t dtype;
    kolo_op_t op;
    int scaled, in_place, refused;
    int64_t count;
    void *in, *out;
    kolo_handle_t handle;
} mtensor_t;

/* Many tensors of one dtype and op, each with its own prescale, ready in
 * the same round: a fusion buffer may only hold tensors of one scale. */
static void many_scales(int n)
{
    enum { C = 4 };
    float (*b)[C] = malloc((size_t)n * sizeof(*b));
    kolo_handle_t *hs = malloc((size_t)n * sizeof(*hs));
    char name[64];

    expect_ok("scales/sync");
    if (rank == 0) /* the others' requests wait; rank 0's come at once */
        usleep(100000);
    for (int k = 0; k < n; k++) {
        kolo_opts_t o;
        kolo_opts_init(&o);
        o.prescale = 1 + k / 4096.0; /* x * prescale is exact */
        for (int i = 0; i < C; i++)
            b[k][i] = (float)(rank + 1 + i);
        snprintf(name, sizeof(name), "scales/%d", k);
        MUST(kolo_allreduce_async_opts(name, b[k], b[k], C, KOLO_FLOAT32, &o,
                                       &hs[k]));
    }
    for (int k = 0; k < n; k++) {
        int bad = 0;
        if (!wait_ok(hs[k], "scales/k"))
            continue;
        for (int i = 0; i < C && !bad; i++) {
            double e = (1 + k / 4096.0) * (size * (size + 1) / 2 + size * i);
            CHECK_ELEMENT(bad, b[k][i] == (float)e,
                          "scales/%d (prescale %.9g) element %d: got %.9g, "
                          "expected %.9g",
                          k, 1 + k / 4096.0, i, b[k][i], e);
        }
    }
    free(b);
    free(hs);
}

/* Enqueues tensor k of the matrix: half the unscaled ones with the plain
 * call, the others with options; an AVERAGE of bool must be refused. */
static void matrix_enqueue(mtensor_t *t, int k)
{
    kolo_opts_t o;
    int rc;

    kolo_opts_init(&o);
    o.op = t->op;
    matrix_scales(t->dtype, t->op, t->scaled, &o.prescale, &o.postscale);
    if (!t->scaled && k % 2 == 0)
        rc = kolo_allreduce_async(t->name, t->in, t->out, t->count, t->dtype,
                                  t->op, &t->handle);
    else
        rc = kolo_allreduce_async_opts(t->name, t->in, t->out, t->count,
                                       t->dtype, &o, &t->handle);
    grab(rc);
    if (t->refused) {
        expect_refused(t->name, rc, &t->handle, KOLO_ERR_UNSUPPORTED, 0,
                       t->name, NULL);
        t->handle = 0;
    } else {
        check_enqueued(rc, t->name, &t->handle);
    }
}

static void mode_allreduce_matrix(int steps)
{
    static const int64_t counts[] = {0, 1, 7, 1000};
    int n = 0, cap = NELEM(all_dtypes) * NELEM(all_ops) * NELEM(counts) * 2;
    mtensor_t *ts = calloc((size_t)cap, sizeof(*ts));
    int *order;

    rng_state = 4242; /* in_place choices: the same on every rank */
    for (int a = 0; a < NELEM(all_dtypes); a++)
        for (int b = 0; b < NELEM(all_ops); b++)
            for (int c = 0; c < NELEM(counts); c++)
                for (int s = 0; s < 2; s++) {
                    mtensor_t *t;
                    if (all_dtypes[a] == KOLO_BOOL && s == 1)
                        continue; /* scaling of bool is not defined */
                    t = &ts[n++];
                    t->dtype = all_dtypes[a];
                    t->op = all_ops[b];
                    t->count = counts[c];
                    t->scaled = s;
                    t->refused = t->dtype == KOLO_BOOL &&
                                 t->op == KOLO_OP_AVERAGE;
                    t->in_place = (int)(rnd() % 2);
                    snprintf(t->name, sizeof(t->name), "matrix/%s/%s/%lld%s",
                             kolo_dtype_name(t->dtype), kolo_op_name(t->op),
                             (long long)t->count, s ? "/scaled" : "");
                    t->in = xmalloc((size_t)t->count * 8);
                    t->out = t->in_place ? t->in : xmalloc((size_t)t->count * 8);
                }
    for (int a = 0; a < NELEM(all_dtypes); a++)
        CHECK(kolo_dtype_size(all_dtypes[a]) == esize(all_dtypes[a]),
              "kolo_dtype_size(%s) = %zu", kolo_dtype_name(all_dtypes[a]),
              kolo_dtype_size(all_dtypes[a]));

    order = identity(n);
    rng_state = mix(0x77 + (uint64_t)rank); /* per-rank order */
    for (int step = 0; step < steps; step++) {
        for (int k = 0; k < n; k++) {
            mtensor_t *t = &ts[k];
            for (int64_t i = 0; i < t->count; i++)
                put(t->dtype, t->in, i,
                    matrix_value(t->dtype, t->op, t->scaled, rank, k, step, i));
            if (!t->in_place) /* must be overwritten */
                memset(t->out, 0xa5, (size_t)t->count * esize(t->dtype));
        }
        shuffle(order, n);
        for (int k = 0; k < n; k++)
            matrix_enqueue(&ts[order[k]], order[k]);
        shuffle(order, n);
        for (int k = 0; k < n; k++) {
            mtensor_t *t = &ts[order[k]];
            int bad = 0;
            if (t->handle == 0 || !wait_ok(t->handle, t->name))
                continue;
            for (int64_t i = 0; i < t->count && bad < 3; i++) {
                double e = matrix_expect(t->dtype, t->op, t->scaled, order[k],
                                         step, i);
                double g = tu_get(t->dtype, t->out, i);
                double tol = 0;
                if (t->op == KOLO_OP_AVERAGE && is_float(t->dtype))
                    tol = avg_tolerance(t->dtype) * fabs(e);
                CHECK_ELEMENT(bad, fabs(g - e) <= tol,
                              "step %d %s element %lld: got %.17g, expected "
                              "%.17g",
                              step, t->name, (long long)i, g, e);
                if (!t->in_place) {
                    double x = matrix_value(t->dtype, t->op, t->scaled, rank,
                                            order[k], step, i);
                    CHECK_ELEMENT(bad, tu_get(t->dtype, t->in, i) == x,
                                  "step %d %s: input element %lld changed from "
                                  "%.17g to %.17g",
                                  step, t->name, (long long)i, x,
                                  tu_get(t->dtype, t->in, i));
                }
            }
        }
    }
    for (int k = 0; k < n; k++) {
        if (ts[k].out != ts[k].in)
            free(ts[k].out);
        free(ts[k].in);
    }
    free(ts);
    free(order);
    many_scales(300);
}

/* ======================================================================== */
/* compression                                                              */
/* ======================================================================== */

enum { CZ_EXACT_SUM, CZ_EXACT_AVG, CZ_EXACT_MAX, CZ_EXACT_SCALED, CZ_RAND_SUM,
       CZ_RAND_AVG, CZ_KINDS };

/* Element i of tensor t on rank r is a hash of (r, t, wire, i); the hash
 * of the first four (cz_seed) is the same for every element, and each
 * element's value mixes i into it: hv(0xc0de, r, t, wire, i) in one step. */
static uint64_t cz_seed(int wire, int r, int t)
{
    return mix(mix(mix(mix(0xc0de) ^ (uint64_t)r) ^ (uint64_t)t) ^ (uint64_t)wire);
}

static double cz_value(int kind, uint64_t seed, int64_t i)
{
    uint64_t h = mix(seed ^ (uint64_t)i);
    if (kind >= CZ_RAND_SUM) /* uniform in [-1, 1), float32 */
        return (double)(float)((double)(h >> 11) / 9007199254740992.0 * 2 - 1);
    /* multiples of 1/4 in [-8, 8]: every partial sum of 4 ranks is exact in
     * float16 and bfloat16 */
    return ((int)(h % 65) - 32) / 4.0;
}

typedef struct cztensor {
    char name[96];
    int kind, wire; /* wire: KOLO_FLOAT16, KOLO_BFLOAT16 or -1 */
    int64_t count;
    float *in, *out;
    kolo_handle_t handle;
} cztensor_t;

/* Enqueues a float32 tensor with its wire dtype and its kind's op. */
static void cz_enqueue(cztensor_t *t)
{
    kolo_opts_t o;

    kolo_opts_init(&o);
    CHECK(o.wire_dtype == -1, "kolo_opts_init: wire_dtype %d", o.wire_dtype);
    o.wire_dtype = t->wire;
    o.op = (t->kind == CZ_EXACT_AVG || t->kind == CZ_RAND_AVG) ? KOLO_OP_AVERAGE
           : t->kind == CZ_EXACT_MAX                           ? KOLO_OP_MAX
                                                               : KOLO_OP_SUM;
    if (t->kind == CZ_EXACT_SCALED)
        o.prescale = 0.5, o.postscale = 2;
    check_enqueued(grab(kolo_allreduce_async_opts(t->name, t->in, t->out,
                                                  t->count, KOLO_FLOAT32, &o,
                                                  &t->handle)),
                   t->name, &t->handle);
}

static void mode_compression(void)
{
    /* (600001 float16 elements: more than a piece of ops/hier) */
    static const int64_t counts[] = {0, 1, 1000, 100000, 600001};
    static const int wires[] = {KOLO_FLOAT16, KOLO_BFLOAT16, -1};
    static const char *const kind_names[] = {"exact-sum", "exact-avg",
                                             "exact-max", "exact-scaled",
                                             "rand-sum",  "rand-avg"};
    cztensor_t ts[NELEM(counts) * NELEM(wires) * CZ_KINDS];
    int n = 0, *order;
    uint64_t *seeds; /* [size]: each rank's cz_seed of the tensor checked */

    for (int w = 0; w < NELEM(wires); w++)
        for (int k = 0; k < CZ_KINDS; k++)
            for (int c = 0; c < NELEM(counts); c++) {
                cztensor_t *t = &ts[n];
                t->kind = k;
                t->wire = wires[w];
                t->count = counts[c];
                snprintf(t->name, sizeof(t->name), "cz/%s/%s/%lld",
                         wires[w] < 0 ? "none"
                                      : kolo_dtype_name((kolo_dtype_t)wires[w]),
                         kind_names[k], (long long)t->count);
                t->in = xmalloc((size_t)t->count * sizeof(float));
                t->out = (n % 2) ? t->in : xmalloc((size_t)t->count * sizeof(float));
                uint64_t seed = cz_seed(wires[w], rank, n);
                for (int64_t i = 0; i < t->count; i++)
                    t->in[i] = (float)cz_value(k, seed, i);
                n++;
            }
    order = identity(n);
    rng_state = mix(0x1234 + (uint64_t)rank);
    shuffle(order, n);
    for (int j = 0; j < n; j++)
        cz_enqueue(&ts[order[j]]);
    shuffle(order, n);
    seeds = xmalloc((size_t)size * sizeof(*seeds));
    for (int j = 0; j < n; j++) {
        cztensor_t *t = &ts[order[j]];
        int bad = 0, not_half = 0;
        double ulp = t->wire == KOLO_BFLOAT16 ? ldexp(1, -8) : ldexp(1, -11);
        if (t->handle == 0 || !wait_ok(t->handle, t->name))
            continue;
        for (int r = 0; r < size; r++)
            seeds[r] = cz_seed(t->wire, r, order[j]);
        for (int64_t i = 0; i < t->count && bad < 3; i++) {
            double e = 0, g = t->out[i], tol = 0;
            for (int r = 0; r < size; r++) {
                double x = cz_value(t->kind, seeds[r], i);
                e = t->kind == CZ_EXACT_MAX ? (r ? fmax(e, x) : x) : e + x;
            }
            if (t->kind == CZ_EXACT_AVG || t->kind == CZ_RAND_AVG)
                e /= size;
            if (t->wire < 0) /* float32 on the wire: order of the sum only */
                tol = 1e-6 * (fabs(e) + size);
            else if (t->kind == CZ_EXACT_AVG)
                tol = 2 * ulp * fabs(e);
            else if (t->kind >= CZ_RAND_SUM) /* inputs and partials round */
                tol = 8 * size * ulp;
            CHECK_ELEMENT(bad, fabs(g - e) <= tol,
                          "%s element %lld: got %.9g, expected %.9g (tolerance "
                          "%.3g)",
                          t->name, (long long)i, g, e, tol);
            /* A result that travelled as float16 / bfloat16 is one of their
             * values (the average may be divided after the expansion). */
            if (t->wire == KOLO_FLOAT16 && t->kind != CZ_EXACT_AVG &&
                t->kind != CZ_RAND_AVG) {
                CHECK_ELEMENT(bad, half_exact(t->out[i]),
                              "%s element %lld = %.9g is no float16 value: not "
                              "compressed?",
                              t->name, (long long)i, g);
            }
            if (t->wire == KOLO_BFLOAT16 && t->kind != CZ_EXACT_AVG &&
                t->kind != CZ_RAND_AVG) {
                CHECK_ELEMENT(
                    bad, bf16_exact(t->out[i]),
                    "%s element %lld = %.9g is no bfloat16 value: not "
                    "compressed?",
                    t->name, (long long)i, g);
            }
            if (t->wire < 0 && !half_exact(t->out[i]))
                not_half++;
        }
        /* Uncompressed random tensors, fused with compressed ones, must
         * keep float32 precision. */
        if (t->wire < 0 && t->kind >= CZ_RAND_SUM && t->count >= 1000)
            CHECK(not_half > t->count / 2,
                  "%s: only %d of %lld elements are not float16 values: "
                  "compressed by mistake?", t->name, not_half,
                  (long long)t->count);
    }
    free(seeds);

    /* wire_dtype is for float32 tensors, and must be float16 or bfloat16. */
    {
        static const struct {
            const char *name;
            kolo_dtype_t dtype;
            int wire;
        } bad[] = {
            {"cz/refuse/float64", KOLO_FLOAT64, KOLO_FLOAT16},
            {"cz/refuse/float16", KOLO_FLOAT16, KOLO_FLOAT16},
            {"cz/refuse/int32", KOLO_INT32, KOLO_BFLOAT16},
            {"cz/refuse/bfloat16", KOLO_BFLOAT16, KOLO_BFLOAT16},
            {"cz/refuse/wire-int32", KOLO_FLOAT32, KOLO_INT32},
            {"cz/refuse/wire-99", KOLO_FLOAT32, 99},
        };
        double buf[16] = {0};
        for (int b = 0; b < NELEM(bad); b++) {
            kolo_opts_t o;
            kolo_handle_t h;
            int rc;
            kolo_opts_init(&o);
            o.wire_dtype = bad[b].wire;
            for (int i = 0; i < 4; i++)
                put(bad[b].dtype, buf, i, rank + i);
            rc = grab(kolo_allreduce_async_opts(bad[b].name, buf, buf, 4,
                                                bad[b].dtype, &o, &h));
            if (rc == KOLO_OK && (int)bad[b].dtype == bad[b].wire) {
                /* The wire dtype of a float16 / bfloat16 tensor is its own
                 * dtype: refused, or a plain allreduce. */
                if (wait_ok(h, bad[b].name))
                    for (int i = 0; i < 4; i++)
                        CHECK(tu_get(bad[b].dtype, buf, i) ==
                                  size * (size - 1) / 2 + size * i,
                              "%s[%d] = %g", bad[b].name, i,
                              tu_get(bad[b].dtype, buf, i));
                continue;
            }
            expect_refused(bad[b].name, rc, &h, KOLO_ERR_INVALID_ARGUMENT,
                           KOLO_ERR_UNSUPPORTED, bad[b].name, NULL);
        }
        expect_ok("cz/after-refusals");
    }
    for (int j = 0; j < n; j++) {
        if (ts[j].out != ts[j].in)
            free(ts[j].out);
        free(ts[j].in);
    }
    free(order);
}

/* ======================================================================== */
/* broadcast                                                                */
/* ======================================================================== */

typedef struct btensor {
    char name[96];
    kolo_dtype_t dtype;
    int root;
    int64_t count;
    void *buf;
    int64_t shape[2];
    int ndim;
    kolo_handle_t handle;
} btensor_t;

static void mode_broadcast(int steps)
{
    static const kolo_dtype_t dts[] = {KOLO_UINT8,   KOLO_INT16,   KOLO_INT32,
                                       KOLO_INT64,   KOLO_FLOAT16, KOLO_BFLOAT16,
                                       KOLO_FLOAT32, KOLO_FLOAT64, KOLO_BOOL};
    static const int64_t counts[] = {0, 1, 13, 3000};
    int n = size * NELEM(dts) * NELEM(counts), *order = identity(n);
    btensor_t *ts = calloc((size_t)n, sizeof(*ts));
    void *expect = xmalloc(3000 * 8);
    int k = 0;

    for (int root = 0; root < size; root++)
        for (int a = 0; a < NELEM(dts); a++)
            for (int c = 0; c < NELEM(counts); c++, k++) {
                btensor_t *t = &ts[k];
                t->dtype = dts[a];
                t->root = root;
                t->count = counts[c];
                snprintf(t->name, sizeof(t->name), "bc/root%d/%s/%lld", root,
                         kolo_dtype_name(t->dtype), (long long)t->count);
                t->buf = xmalloc((size_t)t->count * 8);
                if (t->count == 3000 && a % 2 == 0)
                    t->ndim = 2, t->shape[0] = 3, t->shape[1] = 1000;
                else if (k % 3 == 0)
                    t->ndim = 1, t->shape[0] = t->count;
            }
    rng_state = mix(0xb0 + (uint64_t)rank);
    for (int step = 0; step < steps; step++) {
        for (k = 0; k < n; k++)
            gen_bytes(ts[k].buf, ts[k].dtype, ts[k].count, (uint64_t)rank,
                      (uint64_t)k, (uint64_t)step);
        shuffle(order, n);
        for (int j = 0; j < n; j++) {
            btensor_t *t = &ts[order[j]];
            kolo_opts_t o;
            kolo_opts_init(&o);
            o.ndim = t->ndim;
            o.shape = t->shape;
            check_enqueued(grab(kolo_broadcast_async(
                               t->name, t->buf, t->count, t->dtype, t->root,
                               order[j] % 4 == 1 ? NULL : &o, &t->handle)),
                           t->name, &t->handle);
        }
        shuffle(order, n);
        for (int j = 0; j < n; j++) {
            btensor_t *t = &ts[order[j]];
            size_t bytes = (size_t)t->count * esize(t->dtype);
            if (t->handle == 0)
                continue;
            if (order[j] % 5 == 0) {
                /* kolo_wait_result on a broadcast: done, result zeroed */
                kolo_result_t res;
                memset(&res, 0x5a, sizeof(res));
                if (!wait_result_ok(t->handle, t->name, &res))
                    continue;
                CHECK(res.data == NULL && res.bytes == 0 && res.ndim == 0 &&
                          res.nsplits == 0 && res.splits == NULL,
                      "%s: wait_result of a broadcast did not zero the result",
                      t->name);
                if (res.data == NULL && res.splits == NULL)
                    kolo_result_free(&res);
            } else if (!wait_ok(t->handle, t->name))
                continue;
            gen_bytes(expect, t->dtype, t->count, (uint64_t)t->root,
                      (uint64_t)order[j], (uint64_t)step);
            CHECK(memcmp(expect, t->buf, bytes) == 0,
                  "step %d %s: buffer differs from the root's", step, t->name);
        }
    }

    /* A root outside the set is refused. */
    {
        int roots[] = {size, -1};
        int32_t x[4] = {1, 2, 3, 4};
        for (int j = 0; j < 2; j++) {
            kolo_handle_t h;
            char name[64];
            snprintf(name, sizeof(name), "bc/bad-root/%d", roots[j]);
            expect_error(name,
                         finish(kolo_broadcast_async(name, x, 4, KOLO_INT32,
                                                     roots[j], NULL, &h), &h),
                         KOLO_ERR_INVALID_ARGUMENT, 0, name, NULL, NULL);
        }
        expect_ok("bc/after-bad-root");
    }
    for (k = 0; k < n; k++)
        free(ts[k].buf);
    free(ts);
    free(order);
    free(expect);
}

/* ======================================================================== */
/* allgather                                                                */
/* ======================================================================== */

/* First dimension of rank r's contribution to tensor t in step s. */
static int64_t ag_rows(int r, int t, int step)
{
    switch (t % 4) {
    case 0: return r + 1 + step;
    case 1: return r == 1 ? 0 : (r + 2 + step) % 5; /* rank 1 has none */
    case 2: return (int64_t)(hv(0xa9, (uint64_t)r, (uint64_t)t, (uint64_t)step, 0) % 4);
    default: return (t / 4) % 2 ? 0 : (r == size - 1 ? 3 : 0); /* mostly empty */
    }
}

typedef struct agtensor {
    char name[96];
    kolo_dtype_t dtype;
    int ndim;
    int64_t shape[3];
    int64_t row; /* elements per row */
    void *in;
    kolo_handle_t handle;
} agtensor_t;

static const kolo_dtype_t ag_dtypes[] = {KOLO_FLOAT32, KOLO_INT16, KOLO_FLOAT64,
                                         KOLO_UINT8,   KOLO_BOOL,  KOLO_INT64,
                                         KOLO_BFLOAT16};

/* Sets up tensor t for this rank (or, with r != rank, just its shape). */
static void ag_setup(agtensor_t *a, int t, int step, const char *prefix)
{
    snprintf(a->name, sizeof(a->name), "%s%d", prefix, t);
    a->dtype = ag_dtypes[t % NELEM(ag_dtypes)];
    a->ndim = (t / 2) % 2 ? 3 : 1;
    a->shape[0] = ag_rows(rank, t, step);
    a->shape[1] = 2, a->shape[2] = 3;
    a->row = a->ndim == 3 ? 6 : 1;
    a->in = xmalloc((size_t)(a->shape[0] * a->row) * esize(a->dtype));
    gen_bytes(a->in, a->dtype, a->shape[0] * a->row, (uint64_t)rank,
              (uint64_t)t + 1000, (uint64_t)step);
}

/* Checks the result of allgather t (ranks set up with ag_setup). */
static void ag_check(const agtensor_t *a, int t, int step,
                     const kolo_result_t *res)
{
    int64_t total = 0, *splits = xmalloc((size_t)size * sizeof(int64_t));
    int64_t shape[3];
    size_t es = esize(a->dtype), off = 0;
    void *expect;

    for (int r = 0; r < size; r++)
        total += splits[r] = ag_rows(r, t, step);
    shape[0] = total, shape[1] = 2, shape[2] = 3;
    check_result_meta(a->name, res, a->ndim, shape, splits, size,
                      (size_t)(total * a->row) * es);
    expect = xmalloc((size_t)(total * a->row) * es);
    for (int r = 0; r < size; r++) {
        size_t bytes = (size_t)(splits[r] * a->row) * es;
        gen_bytes(expect, a->dtype, splits[r] * a->row, (uint64_t)r,
                  (uint64_t)t + 1000, (uint64_t)step);
        if (res->bytes >= off + bytes && bytes > 0)
            CHECK(memcmp((char *)res->data + off, expect, bytes) == 0,
                  "step %d %s: rows of rank %d differ", step, a->name, r);
        off += bytes;
    }
    free(expect);
    free(splits);
}

static void ag_step_setup(void *ts, int t, int step)
{
    ag_setup((agtensor_t *)ts + t, t, step, "ag/");
}

/* Every other one with options (none set), the others with none. */
static int ag_step_enqueue(void *ts, int t, int j, kolo_handle_t *h,
                           const char **name)
{
    agtensor_t *a = (agtensor_t *)ts + t;
    kolo_opts_t o;
    kolo_opts_init(&o);
    *name = a->name;
    return grab(kolo_allgather_async(a->name, a->in, a->ndim, a->shape,
                                     a->dtype, j % 2 ? NULL : &o, h));
}

static void ag_step_check(void *ts, int t, int step, const kolo_result_t *res)
{
    ag_check((agtensor_t *)ts + t, t, step, res);
}

static void ag_step_release(void *ts, int t)
{
    free(((agtensor_t *)ts)[t].in);
}

static void mode_allgather(int steps)
{
    agtensor_t ts[24];
    const result_mode_t m = {ts, NELEM(ts), 0xa6, ag_step_setup,
                             ag_step_enqueue, ag_step_check, ag_step_release};

    run_result_steps(&m, steps);
    /* An allgather waited with kolo_wait (output dropped) releases it. */
    {
        agtensor_t a;
        ag_setup(&a, 0, 0, "ag/plain-wait/");
        MUST(kolo_allgather_async(a.name, a.in, a.ndim, a.shape, a.dtype, NULL,
                                  &a.handle));
        wait_ok(a.handle, a.name);
        CHECK(kolo_wait(a.handle) == KOLO_ERR_INVALID_HANDLE,
              "%s: handle still valid after kolo_wait", a.name);
        free(a.in);
    }
    /* kolo_result_free of a zeroed result is harmless. */
    {
        kolo_result_t z;
        memset(&z, 0, sizeof(z));
        kolo_result_free(&z);
    }
}

/* ======================================================================== */
/* alltoall                                                                 */
/* ======================================================================== */

typedef struct a2a {
    char name[96];
    kolo_dtype_t dtype;
    int ndim, null_splits;
    int64_t cols;
    int64_t shape[2];
    int64_t *splits; /* [size * size]: splits[src * size + dst] */
    void *in;
} a2a_t;

static void a2a_setup(a2a_t *a, int t, int step)
{
    static const kolo_dtype_t dts[] = {KOLO_INT32, KOLO_FLOAT32, KOLO_FLOAT64,
                                       KOLO_UINT8, KOLO_FLOAT16, KOLO_INT64};
    int64_t rows;
    size_t es, off = 0;

    snprintf(a->name, sizeof(a->name), "a2a/%d", t);
    a->dtype = dts[t % NELEM(dts)];
    a->ndim = t % 3 == 2 ? 1 : 2;
    a->cols = a->ndim == 2 ? 1 + t % 3 : 1;
    a->null_splits = t % 5 == 1;
    a->splits = xmalloc((size_t)(size * size) * sizeof(int64_t));
    for (int s = 0; s < size; s++)
        for (int d = 0; d < size; d++) {
            int64_t v;
            if (a->null_splits)
                v = 1 + (t + step) % 3;
            else if (t % 5 == 3)
                v = d == 0 ? 0 : 2; /* rank 0 receives nothing */
            else if (t % 5 == 4)
                v = 0; /* nobody sends anything */
            else
                v = (int64_t)(hv(0xa2a, (uint64_t)s, (uint64_t)d, (uint64_t)t,
                                 (uint64_t)step) % 4);
            a->splits[s * size + d] = v;
        }
    rows = 0;
    for (int d = 0; d < size; d++)
        rows += a->splits[rank * size + d];
    a->shape[0] = rows;
    a->shape[1] = a->cols;
    es = esize(a->dtype);
    a->in = xmalloc((size_t)(rows * a->cols) * es);
    /* Row k sent from src to dst: its own random bytes. */
    for (int d = 0; d < size; d++)
        for (int64_t k = 0; k < a->splits[rank * size + d]; k++) {
            gen_bytes((char *)a->in + off, a->dtype, a->cols, (uint64_t)rank,
                      (uint64_t)(d * 1000 + k), (uint64_t)(t * 100 + step));
            off += (size_t)a->cols * es;
        }
}

static void a2a_check(const a2a_t *a, int t, int step, const kolo_result_t *res)
{
    int64_t total = 0, *recv = xmalloc((size_t)size * sizeof(int64_t));
    int64_t shape[2];
    size_t es = esize(a->dtype), off = 0, rowb = (size_t)a->cols * es;
    void *expect = xmalloc(rowb);

    for (int s = 0; s < size; s++)
        total += recv[s] = a->splits[s * size + rank];
    shape[0] = total, shape[1] = a->cols;
    check_result_meta(a->name, res, a->ndim, shape, recv, size,
                      (size_t)total * rowb);
    for (int s = 0; s < size && res->bytes == (size_t)total * rowb; s++)
        for (int64_t k = 0; k < recv[s]; k++) {
            gen_bytes(expect, a->dtype, a->cols, (uint64_t)s,
                      (uint64_t)(rank * 1000 + k), (uint64_t)(t * 100 + step));
            CHECK(memcmp((char *)res->data + off, expect, rowb) == 0,
                  "step %d %s: row %lld from rank %d differs", step, a->name,
                  (long long)k, s);
            off += rowb;
        }
    free(expect);
    free(recv);
}

static void a2a_step_setup(void *ts, int t, int step)
{
    a2a_setup((a2a_t *)ts + t, t, step);
}

static int a2a_step_enqueue(void *ts, int t, int j, kolo_handle_t *h,
                            const char **name)
{
    a2a_t *a = (a2a_t *)ts + t;
    (void)j;
    *name = a->name;
    return grab(kolo_alltoall_async(
        a->name, a->in, a->ndim, a->shape, a->dtype,
        a->null_splits ? NULL : &a->splits[rank * size], NULL, h));
}

static void a2a_step_check(void *ts, int t, int step, const kolo_result_t *res)
{
    a2a_check((a2a_t *)ts + t, t, step, res);
}

static void a2a_step_release(void *ts, int t)
{
    free(((a2a_t *)ts)[t].in);
    free(((a2a_t *)ts)[t].splits);
}

static void mode_alltoall(int steps)
{
    a2a_t ts[15];
    const result_mode_t m = {ts, NELEM(ts), 0xa2, a2a_step_setup,
                             a2a_step_enqueue, a2a_step_check,
                             a2a_step_release};

    run_result_steps(&m, steps);

    /* Bad splits are refused, on every rank alike. */
    {
        int32_t x[64] = {0};
        int64_t shape[2] = {0, 2}, *sp = calloc((size_t)size, sizeof(int64_t));
        kolo_handle_t h;

        for (int d = 0; d < size; d++)
            sp[d] = 1;
        shape[0] = size + 1; /* splits sum to size */
        expect_error("a2a/bad-sum",
                     finish(kolo_alltoall_async("a2a/bad-sum", x, 2, shape,
                                                KOLO_INT32, sp, NULL, &h), &h),
                     KOLO_ERR_INVALID_ARGUMENT, 0, "a2a/bad-sum", NULL, NULL);
        /* NULL splits, first dimension not divisible */
        expect_error("a2a/indivisible",
                     finish(kolo_alltoall_async("a2a/indivisible", x, 2, shape,
                                                KOLO_INT32, NULL, NULL, &h), &h),
                     KOLO_ERR_INVALID_ARGUMENT, 0, "a2a/indivisible", NULL,
                     NULL);
        sp[0] = -1, sp[size - 1] += 3; /* sums to size + 1, one negative */
        expect_error("a2a/negative",
                     finish(kolo_alltoall_async("a2a/negative", x, 2, shape,
                                                KOLO_INT32, sp, NULL, &h), &h),
                     KOLO_ERR_INVALID_ARGUMENT, 0, "a2a/negative", NULL, NULL);
        free(sp);
        expect_ok("a2a/after-bad-splits");
    }
}

/* ======================================================================== */
/* reducescatter                                                            */
/* ======================================================================== */

typedef struct rscase {
    int64_t shape[3];
    int ndim;
    kolo_dtype_t dtype;
    kolo_op_t op;
    double pre, post;
} rscase_t;

static const rscase_t rs_cases[] = {
    {{7, 3, 0}, 2, KOLO_FLOAT32, KOLO_OP_SUM, 1, 1},
    {{7, 3, 0}, 2, KOLO_FLOAT32, KOLO_OP_AVERAGE, 1, 1},
    {{7, 3, 0}, 2, KOLO_INT32, KOLO_OP_AVERAGE, 1, 1},
    {{5, 0, 0}, 1, KOLO_FLOAT64, KOLO_OP_SUM, 1, 1},
    {{2, 4, 0}, 2, KOLO_FLOAT32, KOLO_OP_SUM, 1, 1},
    {{13, 2, 2}, 3, KOLO_FLOAT16, KOLO_OP_SUM, 1, 1},
    {{9, 5, 0}, 2, KOLO_FLOAT32, KOLO_OP_SUM, 0.5, 2},
    {{11, 1, 0}, 2, KOLO_INT64, KOLO_OP_SUM, 1, 1},
    {{0, 3, 0}, 2, KOLO_FLOAT32, KOLO_OP_SUM, 1, 1},
    {{1000, 0, 0}, 1, KOLO_FLOAT32, KOLO_OP_AVERAGE, 1, 1},
    {{12, 2, 0}, 2, KOLO_INT16, KOLO_OP_SUM, 1, 1},
};

static double rs_value(const rscase_t *c, int r, int t, int step, int64_t i)
{
    uint64_t h = hv(0x125, (uint64_t)r, (uint64_t)t, (uint64_t)step, (uint64_t)i);
    if (is_float(c->dtype))
        return ((int)(h % 201) - 100) / 8.0;
    return (double)((int)(h % 101) - 50);
}

static double rs_expect(const rscase_t *c, int t, int step, int64_t i)
{
    double acc = 0;
    for (int r = 0; r < size; r++)
        acc += rs_value(c, r, t, step, i) * c->pre; /* exact: pre is 0.5 or 1 */
    double post = c->op == KOLO_OP_AVERAGE ? c->post / size : c->post;
    return is_float(c->dtype) ? acc * post : trunc(acc * post);
}

static int64_t rs_share(int64_t rows, int r)
{
    return rows / size + (r < rows % size ? 1 : 0);
}

typedef struct rstensor {
    char name[96];
    int64_t row; /* elements per row */
    void *in;
} rstensor_t;

static void rs_setup(rstensor_t *a, const rscase_t *c, int t, int step,
                     const char *prefix)
{
    int64_t n;
    snprintf(a->name, sizeof(a->name), "%s%d", prefix, t);
    a->row = 1;
    for (int k = 1; k < c->ndim; k++)
        a->row *= c->shape[k];
    n = c->shape[0] * a->row;
    a->in = xmalloc((size_t)n * esize(c->dtype));
    for (int64_t i = 0; i < n; i++)
        put(c->dtype, a->in, i, rs_value(c, rank, t, step, i));
}

static void rs_check(const rstensor_t *a, const rscase_t *c, int t, int step,
                     const kolo_result_t *res)
{
    int64_t *splits = xmalloc((size_t)size * sizeof(int64_t)), first = 0;
    int64_t shape[3];
    int bad = 0;

    for (int r = 0; r < size; r++) {
        splits[r] = rs_share(c->shape[0], r);
        if (r < rank)
            first += splits[r];
    }
    memcpy(shape, c->shape, sizeof(shape));
    shape[0] = splits[rank];
    check_result_meta(a->name, res, c->ndim, shape, splits, size,
                      (size_t)(splits[rank] * a->row) * esize(c->dtype));
    if (res->bytes == (size_t)(splits[rank] * a->row) * esize(c->dtype))
        for (int64_t i = 0; i < splits[rank] * a->row && bad < 3; i++) {
            double e = rs_expect(c, t, step, first * a->row + i);
            double g = tu_get(c->dtype, res->data, i);
            double tol = c->op == KOLO_OP_AVERAGE && is_float(c->dtype)
                             ? avg_tolerance(c->dtype) * fabs(e)
                             : 0;
            CHECK_ELEMENT(bad, fabs(g - e) <= tol,
                          "step %d %s element %lld of this rank's share: got "
                          "%.17g, expected %.17g",
                          step, a->name, (long long)i, g, e);
        }
    free(splits);
}

static void rs_opts(kolo_opts_t *o, const rscase_t *c)
{
    kolo_opts_init(o);
    o->op = c->op;
    o->prescale = c->pre;
    o->postscale = c->post;
}

static void rs_step_setup(void *ts, int t, int step)
{
    rs_setup((rstensor_t *)ts + t, &rs_cases[t], t, step, "rs/");
}

static int rs_step_enqueue(void *ts, int t, int j, kolo_handle_t *h,
                           const char **name)
{
    const rscase_t *c = &rs_cases[t];
    rstensor_t *a = (rstensor_t *)ts + t;
    kolo_opts_t o;
    (void)j;
    rs_opts(&o, c);
    *name = a->name;
    return grab(kolo_reducescatter_async(a->name, a->in, c->ndim, c->shape,
                                         c->dtype, &o, h));
}

static void rs_step_check(void *ts, int t, int step, const kolo_result_t *res)
{
    rs_check((rstensor_t *)ts + t, &rs_cases[t], t, step, res);
}

static void rs_step_release(void *ts, int t)
{
    free(((rstensor_t *)ts)[t].in);
}

static void mode_reducescatter(int steps)
{
    rstensor_t ts[NELEM(rs_cases)];
    const result_mode_t m = {ts, NELEM(ts), 0x125, rs_step_setup,
                             rs_step_enqueue, rs_step_check, rs_step_release};

    run_result_steps(&m, steps);
    /* A tensor of 0 dimensions and an op other than SUM/AVERAGE are
     * refused. */
    {
        float x[4] = {1, 2, 3, 4};
        int64_t shape[1] = {4};
        kolo_handle_t h;
        kolo_opts_t o;
        expect_error("rs/scalar",
                     finish(kolo_reducescatter_async("rs/scalar", x, 0, shape,
                                                     KOLO_FLOAT32, NULL, &h), &h),
                     0, 0, "rs/scalar", NULL, NULL);
        kolo_opts_init(&o);
        o.op = KOLO_OP_MAX;
        expect_error("rs/max",
                     finish(kolo_reducescatter_async("rs/max", x, 1, shape,
                                                     KOLO_FLOAT32, &o, &h), &h),
                     0, 0, "rs/max", NULL, NULL);
        expect_ok("rs/after-refusals");
    }
}

/* ======================================================================== */
/* into: kolo_reducescatter_into_async / kolo_allgather_into_async           */
/* ======================================================================== */

/* A bucket's share per rank is one dimension of `count` elements. */
#define BUCKET(count) {count, 0, 0}, 1

static const rscase_t into_cases[] = {
    {BUCKET(1), KOLO_FLOAT32, KOLO_OP_SUM, 1, 1},
    {BUCKET(37), KOLO_FLOAT32, KOLO_OP_AVERAGE, 1, 1},
    {BUCKET(1000), KOLO_FLOAT32, KOLO_OP_SUM, 0.5, 2},
    {BUCKET(65536), KOLO_FLOAT32, KOLO_OP_AVERAGE, 1, 1},
    {BUCKET(301), KOLO_FLOAT64, KOLO_OP_SUM, 1, 1},
    {BUCKET(64), KOLO_FLOAT16, KOLO_OP_SUM, 1, 1},
    {BUCKET(50), KOLO_INT32, KOLO_OP_AVERAGE, 1, 1},
};

/* What a sharded optimizer does with a bucket: every rank's bucket of
 * count * size elements reduce-scattered into its shard, the shard changed
 * where it lies in the bucket, and the bucket allgathered in place; and
 * the same out of place. Each rank checks its shard and the whole bucket
 * against values it computes for every rank. */
static void mode_into(int steps)
{
    enum { N = NELEM(into_cases) };
    int *order = identity(N);

    rng_state = mix(0x1a7 + (uint64_t)rank);
    for (int step = 0; step < steps; step++) {
        void *in[N], *shard[N], *all[N];
        kolo_handle_t h[N];
        shuffle(order, N);
        for (int j = 0; j < N; j++) {
            int t = order[j];
            const rscase_t *c = &into_cases[t];
            int64_t count = c->shape[0];
            char name[64];
            kolo_opts_t o;
            int rc;
            in[t] = xmalloc((size_t)(count * size) * esize(c->dtype));
            all[t] = xmalloc((size_t)(count * size) * esize(c->dtype));
            shard[t] = xmalloc((size_t)count * esize(c->dtype));
            for (int64_t i = 0; i < count * size; i++)
                put(c->dtype, in[t], i, rs_value(c, rank, t, step, i));
            rs_opts(&o, c);
            snprintf(name, sizeof(name), "into/rs%d", t);
            /* Odd steps in place: the shard is this rank's block of the
             * input. */
            rc = grab(kolo_reducescatter_into_async(
                name, in[t],
                step % 2 ? (uint8_t *)in[t] +
                               (size_t)(rank * count) * esize(c->dtype)
                         : shard[t],
                count, c->dtype, &o, &h[t]));
            CHECK(rc == KOLO_OK, "enqueue %s: %d %s", name, rc, lastmsg);
            if (rc != KOLO_OK)
                exit(1);
        }
        shuffle(order, N);
        for (int j = 0; j < N; j++) {
            int t = order[j];
            const rscase_t *c = &into_cases[t];
            int64_t count = c->shape[0];
            kolo_result_t res;
            int rc = grab(kolo_wait_result(h[t], &res)), bad = 0;
            CHECK(rc == KOLO_OK, "into/rs%d: %d %s", t, rc, lastmsg);
            CHECK(res.data == NULL && res.bytes == 0,
                  "into/rs%d: a result of %zu bytes", t, res.bytes);
            kolo_result_free(&res);
            if (step % 2)
                memcpy(shard[t], (uint8_t *)in[t] +
                                     (size_t)(rank * count) * esize(c->dtype),
                       (size_t)count * esize(c->dtype));
            for (int64_t i = 0; i < count && bad < 3; i++) {
                double e = rs_expect(c, t, step, rank * count + i);
                double g = tu_get(c->dtype, shard[t], i);
                double tol = c->op == KOLO_OP_AVERAGE && is_float(c->dtype)
                                 ? avg_tolerance(c->dtype) * fabs(e) : 0;
                CHECK_ELEMENT(bad, fabs(g - e) <= tol,
                              "step %d into/rs%d element %lld of the shard: "
                              "got %.17g, expected %.17g",
                              step, t, (long long)i, g, e);
            }
            /* The shard updated: every element plus the rank, then the
             * bucket gathered, in place for even steps. */
            for (int64_t i = 0; i < count; i++)
                put(c->dtype, shard[t], i, (double)(rank + (int)(i % 7)));
            {
                char name[64];
                void *src = shard[t];
                if (step % 2 == 0) {
                    src = (uint8_t *)all[t] +
                          (size_t)(rank * count) * esize(c->dtype);
                    memcpy(src, shard[t], (size_t)count * esize(c->dtype));
                }
                snprintf(name, sizeof(name), "into/ag%d", t);
                rc = grab(kolo_allgather_into_async(name, src, all[t], count,
                                                    c->dtype, NULL, &h[t]));
                CHECK(rc == KOLO_OK, "enqueue %s: %d %s", name, rc, lastmsg);
                if (rc != KOLO_OK)
                    exit(1);
            }
        }
        for (int t = 0; t < N; t++) {
            const rscase_t *c = &into_cases[t];
            int64_t count = c->shape[0];
            int bad = 0;
            if (!wait_ok(h[t], "into/ag"))
                exit(1);
            for (int64_t i = 0; i < count * size && bad < 3; i++) {
                double e = (double)(i / count + (int)(i % count % 7));
                double g = tu_get(c->dtype, all[t], i);
                CHECK_ELEMENT(bad, g == e,
                              "step %d into/ag%d element %lld: got %.17g, "
                              "expected %.17g",
                              step, t, (long long)i, g, e);
            }
            free(in[t]);
            free(all[t]);
            free(shard[t]);
        }
    }
    /* Ranks that disagree on the count per rank are told so, with both
     * values; a count of 0 and a NULL output are refused at once. */
    {
        float x[16] = {0}, y[16];
        kolo_handle_t h;
        int64_t count = rank == 0 ? 2 : 3;
        expect_error("into/rs-count",
                     finish(kolo_reducescatter_into_async(
                                "into/rs-count", x, y, count, KOLO_FLOAT32,
                                NULL, &h), &h),
                     KOLO_ERR_MISMATCH, 0, "into/rs-count", "rank 0", NULL);
        expect_error("into/ag-count",
                     finish(kolo_allgather_into_async(
                                "into/ag-count", x, y, count, KOLO_FLOAT32,
                                NULL, &h), &h),
                     KOLO_ERR_MISMATCH, 0, "into/ag-count", "rank 0", NULL);
        expect_error("into/zero",
                     finish(kolo_allgather_into_async("into/zero", x, y, 0,
                                                      KOLO_FLOAT32, NULL, &h),
                            &h),
                     KOLO_ERR_INVALID_ARGUMENT, 0, "into/zero",
                     "0 elements per rank", NULL);
        expect_error("into/null",
                     finish(kolo_reducescatter_into_async(
                                "into/null", x, NULL, 1, KOLO_FLOAT32, NULL,
                                &h), &h),
                     KOLO_ERR_INVALID_ARGUMENT, 0, "into/null", "output",
                     NULL);
        expect_ok("into/after-refusals");
    }
    free(order);
}

/* ======================================================================== */
/* grouped                                                                  */
/* ======================================================================== */

typedef struct group {
    int n;
    kolo_dtype_t dtype;
    kolo_op_t op;
    char names[6][64];
    const char *namep[6];
    int64_t counts[6];
    void *bufs[6];
    const void *inp[6];
    void *outp[6];
    kolo_handle_t handles[6];
    int ok;
} group_t;

static double grp_value(int g, int m, int r, int step, int64_t i)
{
    uint64_t h = hv(0x6e0, (uint64_t)g, (uint64_t)m, (uint64_t)(r * 16 + step),
                    (uint64_t)i);
    return ((int)(h % 201) - 100) / 8.0;
}

static void grp_setup(group_t *g, int gi, int step, const char *prefix)
{
    static const kolo_dtype_t dts[] = {KOLO_FLOAT32, KOLO_INT32, KOLO_FLOAT16,
                                       KOLO_FLOAT64};
    static const int64_t cnts[] = {0, 1, 100, 5000, 33};
    g->n = 2 + gi % 5;
    g->dtype = dts[gi % NELEM(dts)];
    g->op = gi % 3 == 2 ? KOLO_OP_MAX : KOLO_OP_SUM;
    for (int m = 0; m < g->n; m++) {
        snprintf(g->names[m], sizeof(g->names[m]), "%s%d/m%d", prefix, gi, m);
        g->namep[m] = g->names[m];
        g->counts[m] = cnts[(gi + m) % NELEM(cnts)];
        g->bufs[m] = xmalloc((size_t)g->counts[m] * esize(g->dtype));
        g->inp[m] = g->outp[m] = g->bufs[m];
        for (int64_t i = 0; i < g->counts[m]; i++) {
            double v = grp_value(gi, m, rank, step, i);
            put(g->dtype, g->bufs[m], i, is_int(g->dtype) ? trunc(v * 8) : v);
        }
    }
}

static void grp_check(group_t *g, int gi, int step)
{
    for (int m = 0; m < g->n; m++) {
        int bad = 0;
        if (!wait_ok(g->handles[m], g->names[m]))
            continue;
        for (int64_t i = 0; i < g->counts[m] && bad < 3; i++) {
            double e = 0, v;
            for (int r = 0; r < size; r++) {
                v = grp_value(gi, m, r, step, i);
                if (is_int(g->dtype))
                    v = trunc(v * 8);
                e = g->op == KOLO_OP_MAX ? (r ? fmax(e, v) : v) : e + v;
            }
            CHECK_ELEMENT(bad, tu_get(g->dtype, g->bufs[m], i) == e,
                          "step %d %s element %lld: got %.17g, expected %.17g",
                          step, g->names[m], (long long)i,
                          tu_get(g->dtype, g->bufs[m], i), e);
        }
    }
}

static void grp_free(group_t *g)
{
    for (int m = 0; m < g->n; m++)
        free(g->bufs[m]);
}

static void mode_grouped(int steps)
{
    enum { G = 8, SINGLES = 6 };
    group_t gs[G];
    float singles[SINGLES][10];
    kolo_handle_t sh[SINGLES];
    int *order = identity(G + SINGLES);

    rng_state = mix(0x6e0 + (uint64_t)rank);
    for (int step = 0; step < steps; step++) {
        /* Grouped allreduces interleaved with single ones, in a per-rank
         * order. */
        for (int gi = 0; gi < G; gi++)
            grp_setup(&gs[gi], gi, step, "grp/ar");
        shuffle(order, G + SINGLES);
        for (int j = 0; j < G + SINGLES; j++) {
            int k = order[j], rc;
            if (k < G) {
                group_t *g = &gs[k];
                kolo_opts_t o;
                kolo_opts_init(&o);
                o.op = g->op;
                rc = grab(kolo_grouped_allreduce_async(
                    g->n, g->namep, g->inp, g->outp, g->counts, g->dtype, &o,
                    g->handles));
                CHECK(rc == KOLO_OK, "grouped allreduce %d: %d %s", k, rc,
                      lastmsg);
                g->ok = rc == KOLO_OK;
            } else {
                char name[32];
                k -= G;
                snprintf(name, sizeof(name), "grp/single%d", k);
                for (int i = 0; i < 10; i++)
                    singles[k][i] = (float)(rank * 10 + i + k + step);
                MUST(kolo_allreduce_async(name, singles[k], singles[k], 10,
                                          KOLO_FLOAT32, KOLO_OP_SUM, &sh[k]));
            }
        }
        shuffle(order, G + SINGLES);
        for (int j = 0; j < G + SINGLES; j++) {
            int k = order[j];
            if (k < G) {
                if (gs[k].ok)
                    grp_check(&gs[k], k, step);
            } else {
                k -= G;
                if (!wait_ok(sh[k], "grp/single"))
                    continue;
                for (int i = 0; i < 10; i++)
                    CHECK(singles[k][i] ==
                              (float)(10 * size * (size - 1) / 2 +
                                      size * (i + k + step)),
                          "step %d grp/single%d[%d] = %g", step, k, i,
                          singles[k][i]);
            }
        }
        for (int gi = 0; gi < G; gi++)
            grp_free(&gs[gi]);

        /* Grouped allgather: members with per-rank first dimensions. */
        {
            enum { M = 5 };
            agtensor_t a[M];
            const char *names[M];
            const void *inputs[M];
            int ndims[M];
            const int64_t *shapes[M];
            kolo_handle_t hs[M];
            int ok = 1;
            /* one dtype per group: members t with t % 7 == 0 (float32) */
            for (int m = 0; m < M; m++) {
                ag_setup(&a[m], m * 7 * 2, step, "grp/ag");
                names[m] = a[m].name;
                inputs[m] = a[m].in;
                ndims[m] = a[m].ndim;
                shapes[m] = a[m].shape;
            }
            {
                int rc = grab(kolo_grouped_allgather_async(
                    M, names, inputs, ndims, shapes, KOLO_FLOAT32, NULL, hs));
                CHECK(rc == KOLO_OK, "grouped allgather: %d %s", rc, lastmsg);
                ok = rc == KOLO_OK;
            }
            for (int m = M - 1; m >= 0 && ok; m--) {
                kolo_result_t res;
                int rc = grab(kolo_wait_result(hs[m], &res));
                CHECK(rc == KOLO_OK, "%s: %d %s", a[m].name, rc, lastmsg);
                if (rc == KOLO_OK) {
                    ag_check(&a[m], m * 7 * 2, step, &res);
                    kolo_result_free(&res);
                }
            }
            for (int m = 0; m < M; m++)
                free(a[m].in);
        }

        /* Grouped reducescatter: float32 cases of rs_cases. */
        {
            int idx[NELEM(rs_cases)], M = 0;
            rstensor_t a[NELEM(rs_cases)];
            const char *names[NELEM(rs_cases)];
            const void *inputs[NELEM(rs_cases)];
            int ndims[NELEM(rs_cases)];
            const int64_t *shapes[NELEM(rs_cases)];
            kolo_handle_t hs[NELEM(rs_cases)];
            kolo_opts_t o;
            int rc;
            for (int t = 0; t < NELEM(rs_cases); t++)
                if (rs_cases[t].dtype == KOLO_FLOAT32 &&
                    rs_cases[t].op == KOLO_OP_SUM && rs_cases[t].pre == 1)
                    idx[M++] = t;
            for (int m = 0; m < M; m++) {
                rs_setup(&a[m], &rs_cases[idx[m]], idx[m], step, "grp/rs");
                names[m] = a[m].name;
                inputs[m] = a[m].in;
                ndims[m] = rs_cases[idx[m]].ndim;
                shapes[m] = rs_cases[idx[m]].shape;
            }
            rs_opts(&o, &rs_cases[idx[0]]);
            rc = grab(kolo_grouped_reducescatter_async(M, names, inputs, ndims,
                                                       shapes, KOLO_FLOAT32, &o,
                                                       hs));
            CHECK(rc == KOLO_OK, "grouped reducescatter: %d %s", rc, lastmsg);
            for (int m = 0; m < M && rc == KOLO_OK; m++) {
                kolo_result_t res;
                int wrc = grab(kolo_wait_result(hs[m], &res));
                CHECK(wrc == KOLO_OK, "%s: %d %s", a[m].name, wrc, lastmsg);
                if (wrc == KOLO_OK) {
                    rs_check(&a[m], &rs_cases[idx[m]], idx[m], step, &res);
                    kolo_result_free(&res);
                }
            }
            for (int m = 0; m < M; m++)
                free(a[m].in);
        }
    }

    /* One member mismatches on one rank: every member fails everywhere,
     * and the same group works afterwards. */
    for (int attempt = 0; attempt < 2; attempt++) {
        group_t g;
        kolo_opts_t o;
        int rc;
        grp_setup(&g, 3, 0, "grp/bad");
        g.dtype = KOLO_FLOAT32;
        if (attempt == 0 && rank == size - 1)
            g.counts[1] -= 1; /* 32 vs 33 elements */
        for (int m = 0; m < g.n; m++) {
            free(g.bufs[m]);
            g.bufs[m] = xmalloc((size_t)(g.counts[m] + 1) * 4);
            for (int64_t i = 0; i < g.counts[m]; i++)
                ((float *)g.bufs[m])[i] = (float)(rank + i);
            g.inp[m] = g.outp[m] = g.bufs[m];
        }
        kolo_opts_init(&o);
        rc = grab(kolo_grouped_allreduce_async(g.n, g.namep, g.inp, g.outp,
                                               g.counts, g.dtype, &o,
                                               g.handles));
        CHECK(rc == KOLO_OK, "grouped allreduce grp/bad: %d %s", rc, lastmsg);
        for (int m = 0; m < g.n && rc == KOLO_OK; m++) {
            int wrc = grab(kolo_wait(g.handles[m]));
            if (attempt == 0) {
                /* every member fails, naming itself and the culprit */
                expect_error(g.names[m], wrc, m == 1 ? KOLO_ERR_MISMATCH : 0,
                             0, g.names[m], g.names[1], NULL);
            } else {
                CHECK(wrc == KOLO_OK, "%s after the failed group: %d %s",
                      g.names[m], wrc, lastmsg);
                for (int64_t i = 0; i < g.counts[m] && wrc == KOLO_OK; i++)
                    CHECK(((float *)g.bufs[m])[i] ==
                              (float)(size * (size - 1) / 2 + size * i),
                          "%s[%lld] = %g", g.names[m], (long long)i,
                          ((float *)g.bufs[m])[i]);
            }
        }
        grp_free(&g);
    }

    /* Duplicate names inside a group: refused, and no member enqueued (the
     * same names then work one by one). */
    {
        const char *names[3] = {"grp/dup/a", "grp/dup/b", "grp/dup/a"};
        float b[3][4];
        const void *in[3] = {b[0], b[1], b[2]};
        void *out[3] = {b[0], b[1], b[2]};
        int64_t counts[3] = {4, 4, 4};
        kolo_handle_t hs[3];
        int rc;
        for (int m = 0; m < 3; m++)
            for (int i = 0; i < 4; i++)
                b[m][i] = (float)(rank + m);
        rc = grab(kolo_grouped_allreduce_async(3, names, in, out, counts,
                                               KOLO_FLOAT32, NULL, hs));
        expect_error("grouped duplicate names", rc, KOLO_ERR_INVALID_ARGUMENT,
                     KOLO_ERR_DUPLICATE_NAME, "grp/dup/a", NULL, NULL);
        if (rc == KOLO_OK)
            for (int m = 0; m < 3; m++)
                kolo_wait(hs[m]);
        for (int m = 0; m < 2; m++) {
            rc = grab(kolo_allreduce_async(names[m], b[m], b[m], 4,
                                           KOLO_FLOAT32, KOLO_OP_SUM, &hs[m]));
            CHECK(rc == KOLO_OK, "%s alone after the refused group: %d %s",
                  names[m], rc, lastmsg);
            if (rc == KOLO_OK && wait_ok(hs[m], names[m]))
                CHECK(b[m][0] == (float)(size * (size - 1) / 2 + size * m),
                      "%s = %g", names[m], b[m][0]);
        }
        /* n = 0 and n < 0: refused or a no-op, never a hang */
        rc = grab(kolo_grouped_allreduce_async(-1, names, in, out, counts,
                                               KOLO_FLOAT32, NULL, hs));
        expect_error("grouped n=-1", rc, KOLO_ERR_INVALID_ARGUMENT, 0, NULL,
                     NULL, NULL);
    }
    expect_ok("grp/after");
    free(order);
}

/* ======================================================================== */
/* barrier                                                                  */
/* ======================================================================== */

static void mode_barrier(void)
{
    for (int round = 0; round < 4; round++) {
        double before, after, last_before, first_after;
        int rc;
        char name[64];
        usleep((useconds_t)(((rank + round) % size) * 60000));
        before = now();
        rc = grab(kolo_barrier(KOLO_GLOBAL_PROCESS_SET));
        after = now();
        CHECK(rc == KOLO_OK, "barrier round %d: %d %s", round, rc, lastmsg);
        snprintf(name, sizeof(name), "barrier/before%d", round);
        last_before = reduce_scalar(name, before, KOLO_OP_MAX, 0);
        snprintf(name, sizeof(name), "barrier/after%d", round);
        first_after = reduce_scalar(name, after, KOLO_OP_MIN, 0);
        CHECK(after >= last_before,
              "round %d: left the barrier %.6f s before the last rank arrived",
              round, last_before - after);
        CHECK(first_after >= last_before,
              "round %d: some rank left %.6f s before the last arrived", round,
              last_before - first_after);
        /* the barrier did wait: the earliest rank waited about
         * (size-1)*60 ms */
        if (((rank + round) % size) == 0)
            CHECK(after - before > (size - 1) * 0.060 * 0.5,
                  "round %d: the first rank waited only %.3f s", round,
                  after - before);
    }
    /* An unknown process set is refused at once. */
    expect_error("barrier(99)", grab(kolo_barrier(99)),
                 KOLO_ERR_INVALID_ARGUMENT, 0, NULL, NULL, NULL);
    expect_ok("barrier/after");
}

/* ======================================================================== */
/* join                                                                     */
/* ======================================================================== */

/* Waits for h at most `seconds`: a hang becomes a failure with a message
 * (the job is stopped, since the other ranks may be blocked for good). */
static int wait_deadline(kolo_handle_t h, const char *name, double seconds)
{
    double end = now() + seconds;
    int rc;
    while ((rc = kolo_poll(h)) == KOLO_IN_PROGRESS && now() < end)
        usleep(2000);
    if (rc == KOLO_IN_PROGRESS) {
        CHECK(0, "%s did not complete within %.0f s", name, seconds);
        fprintf(stderr, "rank %d: stopping the job\n", rank);
        exit(1);
    }
    return wait_ok(h, name);
}

static void mode_join(void)
{
    int steps = 3 + 2 * rank, last = -7, rc;
    float f[10];
    int32_t iv[5];

    /* Phase 0: tensors never negotiated before (so not in the response
     * cache), single and grouped, that the other ranks enqueue before rank
     * 0 joins: they complete once it has joined, rank 0 contributing
     * zeros. */
    if (rank == 0) {
        usleep(300000);
        rc = grab(kolo_join(&last));
        CHECK(rc == KOLO_OK, "kolo_join (phase 0): %d %s", rc, lastmsg);
    } else {
        const char *names[2] = {"join/fresh-g0", "join/fresh-g1"};
        float a[4], g0[3], g1[2];
        const void *in[2] = {g0, g1};
        void *out[2] = {g0, g1};
        int64_t counts[2] = {3, 2};
        kolo_handle_t h, hg[2];
        for (int i = 0; i < 4; i++)
            a[i] = (float)(rank + i);
        for (int i = 0; i < 3; i++)
            g0[i] = (float)(10 * rank + i);
        for (int i = 0; i < 2; i++)
            g1[i] = (float)(-rank - i);
        MUST(kolo_allreduce_async("join/fresh", a, a, 4, KOLO_FLOAT32,
                                  KOLO_OP_SUM, &h));
        MUST(kolo_grouped_allreduce_async(2, names, in, out, counts,
                                          KOLO_FLOAT32, NULL, hg));
        if (wait_deadline(h, "join/fresh (enqueued before rank 0 joined)", 10))
            for (int i = 0; i < 4; i++)
                CHECK(a[i] == (float)(size * (size - 1) / 2 + (size - 1) * i),
                      "join/fresh[%d] = %g", i, a[i]);
        if (wait_deadline(hg[0], "join/fresh-g0 (grouped, enqueued before "
                                 "rank 0 joined)", 10))
            for (int i = 0; i < 3; i++)
                CHECK(g0[i] == (float)(10 * size * (size - 1) / 2 +
                                       (size - 1) * i),
                      "join/fresh-g0[%d] = %g", i, g0[i]);
        if (wait_deadline(hg[1], "join/fresh-g1", 10))
            for (int i = 0; i < 2; i++)
                CHECK(g1[i] == (float)(-size * (size - 1) / 2 -
                                       (size - 1) * i),
                      "join/fresh-g1[%d] = %g", i, g1[i]);
        rc = grab(kolo_join(&last));
        CHECK(rc == KOLO_OK, "kolo_join (phase 0): %d %s", rc, lastmsg);
    }
    CHECK(last >= 1 && last < size, "phase 0: last_rank %d (rank 0 joined "
          "first)", last);
    expect_ok("join/after0");

    /* Phase 1: uneven steps; joined ranks contribute zeros. */
    for (int s = 0; s < steps; s++) {
        kolo_handle_t hf, hi;
        double esum = 0;
        int64_t isum = 0;
        for (int i = 0; i < 10; i++)
            f[i] = (float)((rank + 1) * (s + 1) + i);
        for (int i = 0; i < 5; i++)
            iv[i] = (int32_t)((rank + 1) * 7 * (s + 1) + i);
        MUST(kolo_allreduce_async("join/sum", f, f, 10, KOLO_FLOAT32,
                                  KOLO_OP_SUM, &hf));
        MUST(kolo_allreduce_async("join/avg", iv, iv, 5, KOLO_INT32,
                                  KOLO_OP_AVERAGE, &hi));
        /* a group and a scaled float average go on too */
        {
            const char *names[2] = {"join/g0", "join/g1"};
            double g0[3], g1[2], sc[4];
            const void *in[2] = {g0, g1};
            void *out[2] = {g0, g1};
            int64_t counts[2] = {3, 2};
            kolo_handle_t hg[2], hs;
            kolo_opts_t o;
            for (int i = 0; i < 3; i++)
                g0[i] = (rank + 1) * (s + 1) + i;
            for (int i = 0; i < 2; i++)
                g1[i] = -(rank + 1.0) * (s + 2) - i;
            for (int i = 0; i < 4; i++)
                sc[i] = (rank + 1) * (s + 1) * 8.0 + i;
            MUST(kolo_grouped_allreduce_async(2, names, in, out, counts,
                                              KOLO_FLOAT64, NULL, hg));
            kolo_opts_init(&o);
            o.op = KOLO_OP_AVERAGE;
            o.prescale = 0.5;
            o.postscale = 4;
            MUST(kolo_allreduce_async_opts("join/scaled-avg", sc, sc, 4,
                                           KOLO_FLOAT64, &o, &hs));
            if (wait_deadline(hg[0], "join/g0", 10) &&
                wait_deadline(hg[1], "join/g1", 10)) {
                for (int i = 0; i < 3; i++) {
                    double e = 0;
                    for (int r = 0; r < size; r++)
                        if (3 + 2 * r > s)
                            e += (r + 1) * (s + 1) + i;
                    CHECK(g0[i] == e, "step %d join/g0[%d] = %g, expected %g",
                          s, i, g0[i], e);
                }
                for (int i = 0; i < 2; i++) {
                    double e = 0;
                    for (int r = 0; r < size; r++)
                        if (3 + 2 * r > s)
                            e += -(r + 1.0) * (s + 2) - i;
                    CHECK(g1[i] == e, "step %d join/g1[%d] = %g, expected %g",
                          s, i, g1[i], e);
                }
            }
            if (wait_deadline(hs, "join/scaled-avg", 10))
                for (int i = 0; i < 4; i++) {
                    double e = 0;
                    for (int r = 0; r < size; r++)
                        if (3 + 2 * r > s)
                            e += ((r + 1) * (s + 1) * 8.0 + i) * 0.5;
                    e = e / size * 4;
                    CHECK(fabs(sc[i] - e) <= 1e-12 * fabs(e),
                          "step %d join/scaled-avg[%d] = %.17g, expected "
                          "%.17g (prescale 0.5, / full size %d, postscale 4)",
                          s, i, sc[i], e, size);
                }
        }
        wait_deadline(hf, "join/sum", 10);
        wait_deadline(hi, "join/avg", 10);
        for (int i = 0; i < 10; i++) {
            esum = 0;
            for (int r = 0; r < size; r++)
                if (3 + 2 * r > s)
                    esum += (r + 1) * (s + 1) + i;
            CHECK(f[i] == (float)esum, "step %d join/sum[%d] = %g, expected "
                  "%g (the sum over the ranks still active)", s, i, f[i], esum);
        }
        for (int i = 0; i < 5; i++) {
            isum = 0;
            for (int r = 0; r < size; r++)
                if (3 + 2 * r > s)
                    isum += (r + 1) * 7 * (s + 1) + i;
            CHECK(iv[i] == (int32_t)(isum / size),
                  "step %d join/avg[%d] = %d, expected %lld (divided by the "
                  "full size %d)", s, i, iv[i], (long long)(isum / size), size);
        }
    }
    rc = grab(kolo_join(&last));
    CHECK(rc == KOLO_OK, "kolo_join: %d %s", rc, lastmsg);
    CHECK(last == size - 1, "kolo_join: last_rank %d, expected %d (most steps)",
          last, size - 1);
    /* Phase 2: everything works again after a join. */
    expect_ok("join/after1");
    CHECK(reduce_scalar("join/last-min", last, KOLO_OP_MIN, 0) ==
              reduce_scalar("join/last-max", last, KOLO_OP_MAX, 0),
          "ranks disagree on last_rank");

    /* Phase 3: rank 0 joins at once; the others' allreduce completes
     * without it (so it is joined), then an allgather and a broadcast
     * fail, naming the join. */
    if (rank == 0) {
        rc = grab(kolo_join(&last));
        CHECK(rc == KOLO_OK, "kolo_join (rank 0 first): %d %s", rc, lastmsg);
    } else {
        kolo_handle_t h;
        int64_t shape[1] = {2};
        for (int i = 0; i < 10; i++)
            f[i] = (float)(rank + i);
        for (int i = 0; i < 5; i++)
            iv[i] = (int32_t)(10 * rank + i);
        MUST(kolo_allreduce_async("join/probe", f, f, 10, KOLO_FLOAT32,
                                  KOLO_OP_SUM, &h));
        wait_ok(h, "join/probe");
        MUST(kolo_allreduce_async("join/probe-avg", iv, iv, 5, KOLO_INT32,
                                  KOLO_OP_AVERAGE, &h));
        wait_ok(h, "join/probe-avg");
        for (int i = 0; i < 10; i++)
            CHECK(f[i] == (float)(size * (size - 1) / 2 + (size - 1) * i),
                  "join/probe[%d] = %g (rank 0 joined)", i, f[i]);
        for (int i = 0; i < 5; i++)
            CHECK(iv[i] == (int32_t)((10 * size * (size - 1) / 2 +
                                      (size - 1) * i) / size),
                  "join/probe-avg[%d] = %d (rank 0 joined)", i, iv[i]);
        rc = finish(kolo_allgather_async("join/allgather", f, 1, shape,
                                         KOLO_FLOAT32, NULL, &h), &h);
        expect_error("allgather while rank 0 is joined", rc, 0, 0,
                     "join/allgather", "join", NULL);
        rc = finish(kolo_broadcast_async("join/broadcast", f, 2, KOLO_FLOAT32,
                                         1, NULL, &h), &h);
        expect_error("broadcast while rank 0 is joined", rc, 0, 0,
                     "join/broadcast", "join", NULL);
        rc = grab(kolo_join(&last));
        CHECK(rc == KOLO_OK, "kolo_join (others): %d %s", rc, lastmsg);
    }
    CHECK(last >= (size > 1 ? 1 : 0) && last < size,
          "second join: last_rank %d (rank 0 joined first)", last);
    CHECK(reduce_scalar("join/last2-min", last, KOLO_OP_MIN, 0) ==
              reduce_scalar("join/last2-max", last, KOLO_OP_MAX, 0),
          "ranks disagree on the second last_rank");

    /* Phase 4: allreduce and allgather work again. */
    expect_ok("join/after2");
    {
        agtensor_t a;
        kolo_result_t res;
        ag_setup(&a, 2, 0, "join/ag");
        MUST(kolo_allgather_async(a.name, a.in, a.ndim, a.shape, a.dtype, NULL,
                                  &a.handle));
        rc = grab(kolo_wait_result(a.handle, &res));
        CHECK(rc == KOLO_OK, "allgather after join: %d %s", rc, lastmsg);
        if (rc == KOLO_OK) {
            ag_check(&a, 2, 0, &res);
            kolo_result_free(&res);
        }
        free(a.in);
    }
}

/* ======================================================================== */
/* process sets                                                             */
/* ======================================================================== */

typedef struct pset {
    int ranks[16], n, id, my; /* my: this rank's index, or -1 */
} pset_t;

static void pset_make(pset_t *p, int id)
{
    p->id = id;
    p->my = -1;
    for (int k = 0; k < p->n; k++)
        if (p->ranks[k] == rank)
            p->my = k;
}

static void check_pset_info(const pset_t *p, const char *what)
{
    CHECK(kolo_process_set_rank(p->id) == p->my,
          "%s (id %d): process_set_rank %d, expected %d", what, p->id,
          kolo_process_set_rank(p->id), p->my);
    CHECK(kolo_process_set_size(p->id) == (p->my >= 0 ? p->n : -1) ||
              kolo_process_set_size(p->id) == p->n,
          "%s (id %d): process_set_size %d, expected %d", what, p->id,
          kolo_process_set_size(p->id), p->n);
}

/* Allreduces in every given set at once (this rank's sets), then checks
 * SUM and AVERAGE results against the members. */
static void pset_allreduce(pset_t *ps, int nps, int step)
{
    enum { C = 50 };
    float (*bs)[C] = calloc((size_t)nps, sizeof(*bs));
    float (*ba)[C] = calloc((size_t)nps, sizeof(*ba));
    kolo_handle_t *hs = calloc((size_t)nps * 2, sizeof(*hs));
    int *order = identity(nps);

    shuffle(order, nps);
    for (int j = 0; j < nps; j++) {
        pset_t *p = &ps[order[j]];
        char name[64];
        kolo_opts_t o;
        if (p->my < 0)
            continue;
        for (int i = 0; i < C; i++)
            bs[order[j]][i] = ba[order[j]][i] =
                (float)(rank * 100 + i + step + p->id);
        kolo_opts_init(&o);
        o.process_set = p->id;
        snprintf(name, sizeof(name), "ps/sum/%d", p->id);
        MUST(kolo_allreduce_async_opts(name, bs[order[j]], bs[order[j]], C,
                                       KOLO_FLOAT32, &o, &hs[2 * order[j]]));
        o.op = KOLO_OP_AVERAGE;
        snprintf(name, sizeof(name), "ps/avg/%d", p->id);
        MUST(kolo_allreduce_async_opts(name, ba[order[j]], ba[order[j]], C,
                                       KOLO_FLOAT32, &o,
                                       &hs[2 * order[j] + 1]));
    }
    shuffle(order, nps);
    for (int j = 0; j < nps; j++) {
        int k = order[j];
        pset_t *p = &ps[k];
        int ok1, ok2;
        if (p->my < 0)
            continue;
        ok1 = wait_ok(hs[2 * k], "ps/sum");
        ok2 = wait_ok(hs[2 * k + 1], "ps/avg");
        for (int i = 0; i < C; i++) {
            double e = 0;
            for (int m = 0; m < p->n; m++)
                e += p->ranks[m] * 100 + i + step + p->id;
            if (ok1)
                CHECK(bs[k][i] == (float)e,
                      "step %d set %d sum[%d] = %g, expected %g", step, p->id,
                      i, bs[k][i], e);
            if (ok2)
                CHECK(fabs(ba[k][i] - e / p->n) <= 1e-6 * fabs(e / p->n),
                      "step %d set %d average[%d] = %g, expected %g", step,
                      p->id, i, ba[k][i], e / p->n);
        }
    }
    free(bs);
    free(ba);
    free(hs);
    free(order);
}

static void mode_process_sets(void)
{
    pset_t ps[8];
    int nps = 0, id, rc, next_id = 1;
    char idtext[16];

    rng_state = mix(0x9e + (uint64_t)rank);

    /* The global set. */
    CHECK(kolo_process_set_rank(KOLO_GLOBAL_PROCESS_SET) == rank,
          "global set rank %d", kolo_process_set_rank(0));
    CHECK(kolo_process_set_size(KOLO_GLOBAL_PROCESS_SET) == size,
          "global set size %d", kolo_process_set_size(0));
    CHECK(kolo_process_set_rank(42) == -1 && kolo_process_set_size(42) == -1,
          "unknown set 42: rank %d size %d", kolo_process_set_rank(42),
          kolo_process_set_size(42));

    /* {0, 1}, {1, ..., size-1}, the even ranks, and all ranks. */
    ps[nps].n = 2, ps[nps].ranks[0] = 0, ps[nps].ranks[1] = 1, nps++;
    ps[nps].n = 0;
    for (int r = 1; r < size; r++)
        ps[nps].ranks[ps[nps].n++] = r;
    nps++;
    ps[nps].n = 0;
    for (int r = 0; r < size; r += 2)
        ps[nps].ranks[ps[nps].n++] = r;
    nps++;
    ps[nps].n = 0;
    for (int r = 0; r < size; r++)
        ps[nps].ranks[ps[nps].n++] = r;
    nps++;
    for (int k = 0; k < nps; k++) {
        rc = grab(kolo_add_process_set(ps[k].ranks, ps[k].n, &id));
        CHECK(rc == KOLO_OK, "add_process_set %d: %d %s", k, rc, lastmsg);
        if (rc != KOLO_OK)
            exit(1);
        CHECK(id == next_id, "add_process_set %d: id %d, expected %d", k, id,
              next_id);
        next_id = id + 1;
        pset_make(&ps[k], id);
        check_pset_info(&ps[k], "set");
    }

    /* Bad sets are refused and use no id. */
    {
        int bad1[2] = {0, size};       /* out of range */
        int bad2[3] = {0, 1, 0};       /* rank twice */
        int bad3[1] = {-1};
        snprintf(idtext, sizeof(idtext), "%d", size);
        rc = grab(kolo_add_process_set(bad1, 2, &id));
        expect_error("add_process_set {0, size}", rc, KOLO_ERR_INVALID_ARGUMENT,
                     0, idtext, NULL, NULL);
        rc = grab(kolo_add_process_set(bad2, 3, &id));
        expect_error("add_process_set {0, 1, 0}", rc, KOLO_ERR_INVALID_ARGUMENT,
                     0, NULL, NULL, NULL);
        rc = grab(kolo_add_process_set(bad3, 1, &id));
        expect_error("add_process_set {-1}", rc, KOLO_ERR_INVALID_ARGUMENT, 0,
                     "-1", NULL, NULL);
        rc = grab(kolo_add_process_set(bad3, 0, &id));
        expect_error("add_process_set of no rank", rc,
                     KOLO_ERR_INVALID_ARGUMENT, 0, NULL, NULL, NULL);
    }

    /* Allreduce in all sets at once, twice (the second through the
     * cache). */
    pset_allreduce(ps, nps, 0);
    pset_allreduce(ps, nps, 1);

    /* A rank outside a set is refused at once, with the set named. */
    for (int k = 0; k < nps; k++) {
        float x[2] = {1, 2};
        kolo_opts_t o;
        kolo_handle_t h;
        if (ps[k].my >= 0)
            continue;
        kolo_opts_init(&o);
        o.process_set = ps[k].id;
        snprintf(idtext, sizeof(idtext), "%d", ps[k].id);
        rc = grab(kolo_allreduce_async_opts("ps/outsider", x, x, 2,
                                            KOLO_FLOAT32, &o, &h));
        expect_refused("allreduce in a set this rank is not in", rc, &h,
                       KOLO_ERR_INVALID_ARGUMENT, 0, "set", idtext);
    }
    /* Unknown set. */
    {
        float x[2] = {1, 2};
        kolo_opts_t o;
        kolo_handle_t h;
        kolo_opts_init(&o);
        o.process_set = 77;
        rc = grab(kolo_allreduce_async_opts("ps/unknown", x, x, 2, KOLO_FLOAT32,
                                            &o, &h));
        expect_refused("allreduce in unknown set 77", rc, &h,
                       KOLO_ERR_INVALID_ARGUMENT, 0, "77", NULL);
    }

    /* Broadcast with a set-relative root; allgather and barrier in a set. */
    for (int k = 0; k < nps; k++) {
        pset_t *p = &ps[k];
        int root = p->n - 1; /* set rank; global rank p->ranks[root] */
        int64_t buf[20], expect[20];
        kolo_opts_t o;
        kolo_handle_t h;
        char name[64];
        if (p->my < 0)
            continue;
        kolo_opts_init(&o);
        o.process_set = p->id;
        gen_bytes(buf, KOLO_INT64, 20, (uint64_t)rank, 0x9e, (uint64_t)p->id);
        gen_bytes(expect, KOLO_INT64, 20, (uint64_t)p->ranks[root], 0x9e,
                  (uint64_t)p->id);
        snprintf(name, sizeof(name), "ps/bcast/%d", p->id);
        rc = grab(kolo_broadcast_async(name, buf, 20, KOLO_INT64, root, &o, &h));
        CHECK(rc == KOLO_OK, "%s: %d %s", name, rc, lastmsg);
        if (rc == KOLO_OK && wait_ok(h, name))
            CHECK(memcmp(buf, expect, sizeof(buf)) == 0,
                  "%s: not the values of set rank %d (global rank %d)", name,
                  root, p->ranks[root]);

        /* allgather: rows = set rank + 1; splits has one entry per member */
        {
            int64_t shape[2] = {p->my + 1, 2}, total = 0, splits[16],
                    eshape[2];
            int32_t in[32], *e;
            kolo_result_t res;
            for (int i = 0; i < (p->my + 1) * 2; i++)
                in[i] = p->ranks[p->my] * 1000 + i;
            snprintf(name, sizeof(name), "ps/ag/%d", p->id);
            rc = grab(kolo_allgather_async(name, in, 2, shape, KOLO_INT32, &o,
                                           &h));
            CHECK(rc == KOLO_OK, "%s: %d %s", name, rc, lastmsg);
            if (rc == KOLO_OK &&
                (rc = grab(kolo_wait_result(h, &res))) == KOLO_OK) {
                for (int m = 0; m < p->n; m++)
                    total += splits[m] = m + 1;
                eshape[0] = total, eshape[1] = 2;
                check_result_meta(name, &res, 2, eshape, splits, p->n,
                                  (size_t)total * 2 * 4);
                e = res.data;
                for (int m = 0, off = 0; m < p->n && res.bytes ==
                                                         (size_t)total * 8; m++)
                    for (int i = 0; i < (m + 1) * 2; i++, off++)
                        CHECK(e[off] == p->ranks[m] * 1000 + i,
                              "%s: element %d = %d", name, off, e[off]);
                kolo_result_free(&res);
            } else
                CHECK(0, "%s: wait_result %d %s", name, rc, lastmsg);
        }
        /* alltoall: set rank i sends i + j + 1 rows to set rank j */
        {
            int64_t sp[16], shape[1] = {0}, recv[16], eshape[1] = {0};
            int32_t *in, *got;
            kolo_result_t res;
            for (int j = 0; j < p->n; j++)
                shape[0] += sp[j] = p->my + j + 1;
            in = xmalloc((size_t)shape[0] * 4);
            for (int j = 0, off = 0; j < p->n; j++)
                for (int k = 0; k < sp[j]; k++)
                    in[off++] = rank * 10000 + j * 100 + k;
            snprintf(name, sizeof(name), "ps/a2a/%d", p->id);
            rc = grab(kolo_alltoall_async(name, in, 1, shape, KOLO_INT32, sp,
                                          &o, &h));
            CHECK(rc == KOLO_OK, "%s: %d %s", name, rc, lastmsg);
            if (rc == KOLO_OK &&
                (rc = grab(kolo_wait_result(h, &res))) == KOLO_OK) {
                for (int m = 0; m < p->n; m++)
                    eshape[0] += recv[m] = m + p->my + 1;
                check_result_meta(name, &res, 1, eshape, recv, p->n,
                                  (size_t)eshape[0] * 4);
                got = res.data;
                for (int m = 0, off = 0;
                     m < p->n && res.bytes == (size_t)eshape[0] * 4; m++)
                    for (int k = 0; k < recv[m]; k++, off++)
                        CHECK(got[off] == p->ranks[m] * 10000 + p->my * 100 + k,
                              "%s: element %d = %d, expected %d", name, off,
                              got[off], p->ranks[m] * 10000 + p->my * 100 + k);
                kolo_result_free(&res);
            } else
                CHECK(0, "%s: wait_result %d %s", name, rc, lastmsg);
            free(in);
        }
        /* reducescatter of [5, 2]: shares by set rank, AVERAGE by set size */
        {
            int64_t shape[2] = {5, 2}, splits[16], eshape[2], first = 0;
            float in[10], *got;
            kolo_result_t res;
            kolo_opts_t ro = o;
            ro.op = KOLO_OP_AVERAGE;
            for (int i = 0; i < 10; i++)
                in[i] = (float)((rank + 1) * (i + 1));
            snprintf(name, sizeof(name), "ps/rs/%d", p->id);
            rc = grab(kolo_reducescatter_async(name, in, 2, shape, KOLO_FLOAT32,
                                               &ro, &h));
            CHECK(rc == KOLO_OK, "%s: %d %s", name, rc, lastmsg);
            if (rc == KOLO_OK &&
                (rc = grab(kolo_wait_result(h, &res))) == KOLO_OK) {
                double msum = 0;
                for (int m = 0; m < p->n; m++) {
                    splits[m] = 5 / p->n + (m < 5 % p->n ? 1 : 0);
                    if (m < p->my)
                        first += splits[m];
                    msum += p->ranks[m] + 1;
                }
                eshape[0] = splits[p->my], eshape[1] = 2;
                check_result_meta(name, &res, 2, eshape, splits, p->n,
                                  (size_t)splits[p->my] * 8);
                got = res.data;
                for (int i = 0;
                     i < splits[p->my] * 2 && res.bytes == (size_t)splits[p->my] * 8;
                     i++) {
                    double e = msum * (double)(first * 2 + i + 1) / p->n;
                    CHECK(fabs(got[i] - e) <= 1e-6 * fabs(e),
                          "%s: element %d of the share = %g, expected %g", name,
                          i, got[i], e);
                }
                kolo_result_free(&res);
            } else
                CHECK(0, "%s: wait_result %d %s", name, rc, lastmsg);
        }
        rc = grab(kolo_barrier(p->id));
        CHECK(rc == KOLO_OK, "barrier in set %d: %d %s", p->id, rc, lastmsg);
    }

    /* Group assignments. */
    {
        int g0[16], g1[16], n0 = 0, n1 = 0, ids[4] = {-5, -5, -5, -5};
        const int *groups[2] = {g0, g1};
        int sizes[2];
        pset_t gp[2];
        /* invalid first: they must use no id */
        /* rank missing: size-1 in no group */
        for (int r = 0; r < size - 1; r++)
            g0[n0++] = r;
        sizes[0] = n0;
        snprintf(idtext, sizeof(idtext), "%d", size - 1);
        rc = grab(kolo_add_process_sets_from_groups(1, groups, sizes, 0, ids));
        expect_error("groups without the last rank", rc,
                     KOLO_ERR_INVALID_ARGUMENT, 0, idtext, NULL, NULL);
        /* rank twice: size-1 in both groups */
        g0[n0] = size - 1, sizes[0] = n0 + 1;
        g1[0] = size - 1, sizes[1] = 1;
        rc = grab(kolo_add_process_sets_from_groups(2, groups, sizes, 0, ids));
        expect_error("groups with the last rank twice", rc,
                     KOLO_ERR_INVALID_ARGUMENT, 0, idtext, NULL, NULL);
        /* unequal sizes with require_equal_size */
        if (size >= 3) {
            char s1[16], s2[16];
            n0 = n1 = 0;
            g0[n0++] = 0;
            for (int r = 1; r < size; r++)
                g1[n1++] = r;
            sizes[0] = n0, sizes[1] = n1;
            snprintf(s1, sizeof(s1), "%d", n0);
            snprintf(s2, sizeof(s2), "%d", n1);
            rc = grab(kolo_add_process_sets_from_groups(2, groups, sizes, 1,
                                                        ids));
            expect_error("groups of unequal size", rc,
                         KOLO_ERR_INVALID_ARGUMENT, 0, s1, s2, NULL);
        }
        CHECK(ids[0] == -5 && ids[1] == -5, "refused group assignment wrote "
              "ids %d %d", ids[0], ids[1]);

        /* valid: pairs for even sizes; for odd sizes {evens}, {odds} */
        n0 = n1 = 0;
        if (size % 2 == 0) {
            for (int r = 0; r < size; r++)
                if (r < size / 2)
                    g0[n0++] = r;
                else
                    g1[n1++] = r;
        } else {
            for (int r = 0; r < size; r++)
                if (r % 2 == 0)
                    g0[n0++] = r;
                else
                    g1[n1++] = r;
        }
        sizes[0] = n0, sizes[1] = n1;
        rc = grab(kolo_add_process_sets_from_groups(2, groups, sizes,
                                                    size % 2 == 0, ids));
        CHECK(rc == KOLO_OK, "valid group assignment: %d %s", rc, lastmsg);
        if (rc == KOLO_OK) {
            CHECK(ids[0] == next_id && ids[1] == next_id + 1,
                  "group ids %d %d, expected %d %d (refused calls must not use "
                  "ids)", ids[0], ids[1], next_id, next_id + 1);
            next_id = ids[1] + 1;
            for (int k = 0; k < 2; k++) {
                gp[k].n = sizes[k];
                memcpy(gp[k].ranks, groups[k], (size_t)sizes[k] * sizeof(int));
                pset_make(&gp[k], ids[k]);
                check_pset_info(&gp[k], "group");
            }
            pset_allreduce(gp, 2, 5);
        }
        /* a second valid call with require_equal_size on equal groups */
        if (size % 2 == 0) {
            rc = grab(kolo_add_process_sets_from_groups(2, groups, sizes, 1,
                                                        ids));
            CHECK(rc == KOLO_OK, "valid equal group assignment: %d %s", rc,
                  lastmsg);
            if (rc == KOLO_OK) {
                CHECK(ids[0] == next_id, "ids %d, expected %d", ids[0],
                      next_id);
                next_id = ids[1] + 1;
                MUST(kolo_remove_process_set(ids[0]));
                MUST(kolo_remove_process_set(ids[1]));
            }
        }
    }

    /* Removing a set fails what is pending in it: rank 0 enqueues in
     * {0, 1} a tensor rank 1 never enqueues. */
    {
        int pair[2] = {0, 1}, pid;
        float x[3] = {1, 2, 3};
        kolo_opts_t o;
        kolo_handle_t h = 0;
        rc = grab(kolo_add_process_set(pair, 2, &pid));
        CHECK(rc == KOLO_OK && pid == next_id, "add {0, 1}: rc %d id %d", rc,
              pid);
        next_id = pid + 1;
        kolo_opts_init(&o);
        o.process_set = pid;
        if (rank == 0) {
            MUST(kolo_allreduce_async_opts("ps/pending", x, x, 3, KOLO_FLOAT32,
                                           &o, &h));
            usleep(50000);
            CHECK(kolo_poll(h) == KOLO_IN_PROGRESS, "ps/pending: poll %d",
                  kolo_poll(h));
        }
        expect_ok("ps/before-remove");
        rc = grab(kolo_remove_process_set(pid));
        CHECK(rc == KOLO_OK, "remove_process_set(%d) with work pending: %d %s",
              pid, rc, lastmsg);
        if (rank == 0) {
            rc = grab(kolo_wait(h));
            expect_error("ps/pending after its set was removed", rc, 0, 0,
                         "ps/pending", NULL, NULL);
        }
    }

    /* Removal: the set is gone for everyone. */
    {
        pset_t *p = &ps[0]; /* {0, 1} */
        float x[2] = {1, 2};
        kolo_opts_t o;
        kolo_handle_t h;
        rc = grab(kolo_remove_process_set(p->id));
        CHECK(rc == KOLO_OK, "remove_process_set(%d): %d %s", p->id, rc,
              lastmsg);
        CHECK(kolo_process_set_rank(p->id) == -1 &&
                  kolo_process_set_size(p->id) == -1,
              "removed set %d: rank %d size %d", p->id,
              kolo_process_set_rank(p->id), kolo_process_set_size(p->id));
        kolo_opts_init(&o);
        o.process_set = p->id;
        snprintf(idtext, sizeof(idtext), "%d", p->id);
        rc = finish(kolo_allreduce_async_opts("ps/removed", x, x, 2,
                                              KOLO_FLOAT32, &o, &h), &h);
        expect_error("allreduce in a removed set", rc, 0, 0, idtext, NULL,
                     NULL);
        rc = grab(kolo_remove_process_set(p->id));
        expect_error("removing a set twice", rc, KOLO_ERR_INVALID_ARGUMENT, 0,
                     NULL, NULL, NULL);
        rc = grab(kolo_remove_process_set(KOLO_GLOBAL_PROCESS_SET));
        expect_error("removing the global set", rc, KOLO_ERR_INVALID_ARGUMENT,
                     0, NULL, NULL, NULL);
        /* the other sets still work */
        pset_allreduce(ps + 1, nps - 1, 9);
        /* a new set gets a new id, not the removed one */
        rc = grab(kolo_add_process_set(p->ranks, p->n, &id));
        CHECK(rc == KOLO_OK && id == next_id,
              "add after remove: rc %d id %d, expected id %d", rc, id, next_id);
    }
    expect_ok("ps/after");
}

/* ======================================================================== */
/* mismatch                                                                 */
/* ======================================================================== */

static void mismatch_allreduce(const char *name, kolo_dtype_t dtype,
                               const kolo_opts_t *o, const char *w1,
                               const char *w2)
{
    double buf[8] = {0};
    kolo_handle_t h;
    int rc = finish(kolo_allreduce_async_opts(name, buf, buf, 6, dtype, o, &h),
                    &h);
    expect_error(name, rc, KOLO_ERR_MISMATCH, 0, name, w1, w2);
}

/* Enqueues a float32 SUM allreduce of 4 elements `name`, which stays in
 * flight, and the same name again: refused at once as a duplicate. */
static void enqueue_twice(const char *name, float *buf, kolo_handle_t *h)
{
    static float again[4]; /* never reduced: the second try is refused */
    kolo_handle_t hd;
    char what[64];

    MUST(kolo_allreduce_async(name, buf, buf, 4, KOLO_FLOAT32, KOLO_OP_SUM, h));
    snprintf(what, sizeof(what), "%s twice", name);
    expect_error(what,
                 grab(kolo_allreduce_async(name, again, again, 4, KOLO_FLOAT32,
                                           KOLO_OP_SUM, &hd)),
                 KOLO_ERR_DUPLICATE_NAME, 0, name, NULL, NULL);
}

static void mode_mismatch(void)
{
    int odd = rank == size - 1; /* the last rank disagrees */
    kolo_opts_t o;
    kolo_handle_t h;
    int rc;
    char after[64];
    int k = 0;

#define AFTER()                                                               \
    do {                                                                      \
        snprintf(after, sizeof(after), "mm/after%d", k++);                    \
        expect_ok(after);                                                     \
    } while (0)

    kolo_opts_init(&o);
    mismatch_allreduce("mm/dtype", odd ? KOLO_FLOAT64 : KOLO_FLOAT32, &o,
                       "float32", "float64");
    AFTER();
    {
        int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
        kolo_opts_init(&o);
        o.ndim = 2;
        o.shape = odd ? s32 : s23;
        mismatch_allreduce("mm/shape", KOLO_FLOAT32, &o, "[2, 3]", "[3, 2]");
        AFTER();
    }
    kolo_opts_init(&o);
    o.op = odd ? KOLO_OP_MAX : KOLO_OP_SUM;
    mismatch_allreduce("mm/op", KOLO_FLOAT32, &o, "sum", "max");
    AFTER();
    kolo_opts_init(&o);
    o.prescale = odd ? 2.0 : 1.0;
    mismatch_allreduce("mm/prescale", KOLO_FLOAT32, &o, "prescale", "2");
    AFTER();
    kolo_opts_init(&o);
    o.postscale = odd ? 0.25 : 1.0;
    mismatch_allreduce("mm/postscale", KOLO_FLOAT32, &o, "postscale", "0.25");
    AFTER();
    kolo_opts_init(&o);
    o.wire_dtype = odd ? KOLO_FLOAT16 : -1;
    mismatch_allreduce("mm/wire", KOLO_FLOAT32, &o, "float16", NULL);
    AFTER();

    /* allgather with different trailing dimensions */
    {
        int64_t shape[2] = {rank + 1, odd ? 4 : 3};
        float in[64] = {0};
        rc = finish(kolo_allgather_async("mm/allgather", in, 2, shape,
                                         KOLO_FLOAT32, NULL, &h), &h);
        expect_error("mm/allgather", rc, KOLO_ERR_MISMATCH, 0, "mm/allgather",
                     "3]", "4]");
        AFTER();
    }
    /* allgather with a different ndim */
    {
        int64_t shape[3] = {rank + 1, 2, 1};
        float in[64] = {0};
        rc = finish(kolo_allgather_async("mm/allgather-ndim", in, odd ? 3 : 2,
                                         shape, KOLO_FLOAT32, NULL, &h), &h);
        expect_error("mm/allgather-ndim", rc, KOLO_ERR_MISMATCH, 0,
                     "mm/allgather-ndim", NULL, NULL);
        AFTER();
    }
    /* the same name, different collectives */
    {
        float buf[6] = {0};
        if (odd)
            rc = kolo_broadcast_async("mm/coll", buf, 6, KOLO_FLOAT32, 0, NULL,
                                      &h);
        else
            rc = kolo_allreduce_async("mm/coll", buf, buf, 6, KOLO_FLOAT32,
                                      KOLO_OP_SUM, &h);
        rc = finish(rc, &h);
        expect_error("mm/coll", rc, KOLO_ERR_MISMATCH, 0, "mm/coll",
                     "allreduce", "broadcast");
        AFTER();
    }
    /* broadcast root */
    {
        float buf[6] = {0};
        rc = finish(kolo_broadcast_async("mm/root", buf, 6, KOLO_FLOAT32,
                                         odd ? 1 : 0, NULL, &h), &h);
        expect_error("mm/root", rc, KOLO_ERR_MISMATCH, 0, "mm/root", "root",
                     NULL);
        AFTER();
    }
    /* reducescatter shape, alltoall dtype */
    {
        float buf[64] = {0};
        int64_t shape[2] = {odd ? 5 : 4, 2};
        rc = finish(kolo_reducescatter_async("mm/rs-shape", buf, 2, shape,
                                             KOLO_FLOAT32, NULL, &h), &h);
        expect_error("mm/rs-shape", rc, KOLO_ERR_MISMATCH, 0, "mm/rs-shape",
                     "[4, 2]", "[5, 2]");
        AFTER();
        shape[0] = size;
        rc = finish(kolo_alltoall_async("mm/a2a-dtype", buf, 2, shape,
                                        odd ? KOLO_INT32 : KOLO_FLOAT32, NULL,
                                        NULL, &h), &h);
        expect_error("mm/a2a-dtype", rc, KOLO_ERR_MISMATCH, 0, "mm/a2a-dtype",
                     "float32", "int32");
        AFTER();
    }
    /* a mismatched name that was negotiated and cached before */
    {
        kolo_opts_init(&o);
        for (int i = 0; i < 2; i++) {
            double buf[8] = {0};
            MUST(kolo_allreduce_async_opts("mm/cached", buf, buf, 6,
                                           KOLO_FLOAT32, &o, &h));
            MUST(kolo_wait(h));
        }
        o.prescale = odd ? 3.0 : 1.0;
        mismatch_allreduce("mm/cached", KOLO_FLOAT32, &o, "prescale", "3");
        kolo_opts_init(&o);
        {
            double buf[8] = {0};
            MUST(kolo_allreduce_async_opts("mm/cached", buf, buf, 6,
                                           KOLO_FLOAT32, &o, &h));
            wait_ok(h, "mm/cached after the mismatch");
        }
        AFTER();
    }

    /* Arguments every rank gets wrong alike: refused at once. */
    {
        double buf[16] = {0};
        int64_t s23[2] = {2, 3}, big[KOLO_MAX_DIMS + 1], neg[2] = {-1, 2};
        for (int i = 0; i <= KOLO_MAX_DIMS; i++)
            big[i] = 1;
        kolo_opts_init(&o);
        o.ndim = 2;
        o.shape = s23; /* 6 elements, count 5 */
        rc = grab(kolo_allreduce_async_opts("mm/shape-count", buf, buf, 5,
                                            KOLO_FLOAT32, &o, &h));
        expect_refused("mm/shape-count", rc, &h, KOLO_ERR_INVALID_ARGUMENT, 0,
                       "mm/shape-count", NULL);
        o.ndim = KOLO_MAX_DIMS + 1;
        o.shape = big;
        rc = grab(kolo_allreduce_async_opts("mm/too-many-dims", buf, buf, 1,
                                            KOLO_FLOAT32, &o, &h));
        expect_refused("mm/too-many-dims", rc, &h, KOLO_ERR_INVALID_ARGUMENT,
                       0, "mm/too-many-dims", NULL);
        rc = grab(kolo_allgather_async("mm/negative-dim", buf, 2, neg,
                                       KOLO_FLOAT32, NULL, &h));
        expect_refused("mm/negative-dim", rc, &h, KOLO_ERR_INVALID_ARGUMENT,
                       0, "mm/negative-dim", NULL);
        rc = grab(kolo_allreduce_async("mm/bad-op", buf, buf, 2, KOLO_FLOAT32,
                                       (kolo_op_t)17, &h));
        expect_refused("mm/bad-op", rc, &h, KOLO_ERR_INVALID_ARGUMENT,
                       KOLO_ERR_UNSUPPORTED, "mm/bad-op", NULL);
        AFTER();
    }

    /* A mismatch inside a process set {0, last}: only its members see it,
     * and the set goes on. */
    {
        int members[2] = {0, size - 1}, pid;
        float buf[4];
        MUST(kolo_add_process_set(members, 2, &pid));
        if (rank == 0 || rank == size - 1) {
            kolo_opts_init(&o);
            o.process_set = pid;
            o.op = odd ? KOLO_OP_MIN : KOLO_OP_SUM;
            for (int i = 0; i < 4; i++)
                buf[i] = (float)(rank + i);
            rc = finish(kolo_allreduce_async_opts("mm/in-set", buf, buf, 4,
                                                  KOLO_FLOAT32, &o, &h), &h);
            expect_error("mm/in-set", rc, KOLO_ERR_MISMATCH, 0, "mm/in-set",
                         "sum", "min");
            o.op = KOLO_OP_SUM;
            for (int i = 0; i < 4; i++)
                buf[i] = (float)(rank + i);
            rc = finish(kolo_allreduce_async_opts("mm/in-set", buf, buf, 4,
                                                  KOLO_FLOAT32, &o, &h), &h);
            CHECK(rc == KOLO_OK, "mm/in-set after its mismatch: %d %s", rc,
                  lastmsg);
            for (int i = 0; i < 4 && rc == KOLO_OK; i++)
                CHECK(buf[i] == (float)(size - 1 + 2 * i), "mm/in-set[%d] = %g",
                      i, buf[i]);
        }
        AFTER();
        MUST(kolo_remove_process_set(pid));
    }

    /* A name in flight: KOLO_ERR_DUPLICATE_NAME at once. "mm/dupA" cannot
     * complete before rank 0 enqueues it, "mm/dupB" before rank 1 does, and
     * they do only after everyone has tried the duplicate. */
    {
        float a[4] = {1, 1, 1, 1}, b[4] = {2, 2, 2, 2};
        kolo_handle_t ha = 0, hb = 0;
        int holder_b = size > 1 ? 1 : 0;
        if (rank != 0)
            enqueue_twice("mm/dupA", a, &ha);
        if (rank != holder_b)
            enqueue_twice("mm/dupB", b, &hb);
        expect_ok("mm/dup-sync");
        if (rank == 0)
            MUST(kolo_allreduce_async("mm/dupA", a, a, 4, KOLO_FLOAT32,
                                      KOLO_OP_SUM, &ha));
        if (rank == holder_b)
            MUST(kolo_allreduce_async("mm/dupB", b, b, 4, KOLO_FLOAT32,
                                      KOLO_OP_SUM, &hb));
        if (wait_ok(ha, "mm/dupA"))
            CHECK(a[0] == (float)size, "mm/dupA = %g", a[0]);
        if (wait_ok(hb, "mm/dupB"))
            CHECK(b[0] == (float)(2 * size), "mm/dupB = %g", b[0]);
    }
    AFTER();
#undef AFTER
}

/* ======================================================================== */
/* allreduce-sizes                                                          */
/* ======================================================================== */

/* One tensor at a time (nothing to fuse it with), at sizes around 64 KiB,
 * where a backend may change algorithm (Gloo with two ranks: an exchange
 * up to 64 KiB, its ring above), in place and out of place, every element
 * checked against matrix_expect. */
static void mode_allreduce_sizes(void)
{
    static const kolo_dtype_t dtypes[] = {KOLO_UINT8,   KOLO_INT16, KOLO_FLOAT16,
                                          KOLO_INT32,   KOLO_FLOAT32,
                                          KOLO_INT64,   KOLO_FLOAT64};
    static const kolo_op_t ops[] = {KOLO_OP_SUM, KOLO_OP_MIN, KOLO_OP_PRODUCT,
                                    KOLO_OP_AVERAGE};
    const int64_t kib64 = 64 * 1024;
    int k = 0;

    for (int a = 0; a < NELEM(dtypes); a++) {
        kolo_dtype_t d = dtypes[a];
        int64_t es = (int64_t)esize(d);
        /* In elements: 1, 64 KiB - 1 element, 64 KiB, + 1 element, and
         * 256 KiB + 1 element. */
        const int64_t counts[] = {1, kib64 / es - 1, kib64 / es, kib64 / es + 1,
                                  4 * kib64 / es + 1};
        for (int b = 0; b < NELEM(ops); b++)
            for (int c = 0; c < NELEM(counts); c++, k++) {
                kolo_op_t op = ops[b];
                int64_t n = counts[c];
                int in_place = k % 2, bad = 0, rc;
                void *in, *out;
                kolo_handle_t h;
                char name[96];

                if (op == KOLO_OP_AVERAGE && !is_float(d))
                    continue; /* integer averages: allreduce-matrix */
                snprintf(name, sizeof(name), "sizes/%s/%s/%lld%s",
                         kolo_dtype_name(d), kolo_op_name(op), (long long)n,
                         in_place ? "/in-place" : "");
                in = xmalloc((size_t)(n * es));
                out = in_place ? in : xmalloc((size_t)(n * es));
                for (int64_t i = 0; i < n; i++)
                    put(d, in, i, matrix_value(d, op, 0, rank, k, 0, i));
                if (!in_place) /* must be overwritten */
                    memset(out, 0xa5, (size_t)(n * es));
                rc = grab(kolo_allreduce_async(name, in, out, n, d, op, &h));
                CHECK(rc == KOLO_OK, "enqueue %s: %d %s", name, rc, lastmsg);
                if (rc == KOLO_OK && wait_ok(h, name))
                    for (int64_t i = 0; i < n && bad < 3; i++) {
                        double e = matrix_expect(d, op, 0, k, 0, i);
                        double g = tu_get(d, out, i);
                        double tol = op == KOLO_OP_AVERAGE
                                         ? avg_tolerance(d) * fabs(e) : 0;
                        CHECK_ELEMENT(bad, fabs(g - e) <= tol,
                                      "%s element %lld: got %.17g, expected "
                                      "%.17g",
                                      name, (long long)i, g, e);
                    }
                if (!in_place)
                    free(out);
                free(in);
            }
    }
}

/* ======================================================================== */

/* The modes, by the name on the command line: each runs some steps (the
 * number here) or once. */
static const struct mode {
    const char *name;
    void (*run)(int steps);
    int steps;
    void (*run_once)(void);
} modes[] = {
    {"allreduce-matrix", .run = mode_allreduce_matrix, .steps = 2},
    {"allreduce-sizes", .run_once = mode_allreduce_sizes},
    {"compression", .run_once = mode_compression},
    {"broadcast", .run = mode_broadcast, .steps = 2},
    {"allgather", .run = mode_allgather, .steps = 3},
    {"alltoall", .run = mode_alltoall, .steps = 3},
    {"reducescatter", .run = mode_reducescatter, .steps = 3},
    {"into", .run = mode_into, .steps = 4},
    {"grouped", .run = mode_grouped, .steps = 2},
    {"barrier", .run_once = mode_barrier},
    {"join", .run_once = mode_join},
    {"process-sets", .run_once = mode_process_sets},
    {"mismatch", .run_once = mode_mismatch},
};

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "allreduce-matrix";
    const struct mode *m;
    double t0;

    MUST(kolo_init());
    rank = kolo_rank();
    size = kolo_size();
    t0 = now();

    for (m = modes; m < modes + NELEM(modes); m++)
        if (strcmp(mode, m->name) == 0)
            break;
    if (m == modes + NELEM(modes)) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    if (m->run_once != NULL)
        m->run_once();
    else /* allreduce-matrix: its number of steps may be given */
        m->run(argc > 2 && m->run == mode_allreduce_matrix ? atoi(argv[2])
                                                           : m->steps);
    MUST(kolo_shutdown());
    if (failures) {
        fprintf(stderr, "rank %d: %s: %ld of %ld checks failed\n", rank, mode,
                failures, nchecks);
        return 1;
    }
    printf("rank %d of %d: PASS %s (%ld checks, %.2f s)\n", rank, size, mode,
           nchecks, now() - t0);
    return 0;
}
