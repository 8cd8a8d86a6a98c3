/*
 * test-reduce.c — unit tests of runtime/reduce.{h,c}: the reduction kernels
 * for every (dtype, op), and average / scale / accumulate.
 *
 * Why these tests: the kernels are where kolo.h's promises about results
 * (integer wrap, bool logic, 16-bit floats rounded once from float32,
 * truncating integer AVERAGE) are kept, and they have several bodies
 * (disjoint, in place, aliased; vectorized chunks and scalar tails) that
 * must all agree. Each result is compared with a reference computed
 * element by element in this file, plainly: integers in __int128 reduced
 * modulo 2^bits, float32 through double, 16-bit floats decoded and
 * rounded with ldexp/frexp/nearbyint (never with the code under test).
 * The 16-bit cases run both with the vector conversions and with the
 * forced scalar ones.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "kolo.h"
#include "reduce.h"
#include "unit.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t esize(kolo_dtype_t d)
{
    switch (d) {
    case KOLO_UINT8: case KOLO_INT8: case KOLO_BOOL: return 1;
    case KOLO_UINT16: case KOLO_INT16: case KOLO_FLOAT16:
    case KOLO_BFLOAT16: return 2;
    case KOLO_INT32: case KOLO_FLOAT32: return 4;
    case KOLO_INT64: case KOLO_FLOAT64: return 8;
    default: return 0;
    }
}

static int is_int(kolo_dtype_t d)
{
    return d <= KOLO_INT64;
}

static int is_half(kolo_dtype_t d)
{
    return d == KOLO_FLOAT16 || d == KOLO_BFLOAT16;
}

/* bits and signedness of the integer dtypes */
static int int_bits(kolo_dtype_t d)
{
    return (int)esize(d) * 8;
}

static int int_signed(kolo_dtype_t d)
{
    return d == KOLO_INT8 || d == KOLO_INT16 || d == KOLO_INT32 ||
           d == KOLO_INT64;
}

/* v modulo 2^bits, as the type's value (two's complement if signed) */
static __int128 wrap(__int128 v, kolo_dtype_t d)
{
    __int128 m = (__int128)1 << int_bits(d);
    v %= m;
    if (v < 0)
        v += m;
    if (int_signed(d) && v >= m / 2)
        v -= m;
    return v;
}

/* Element i of an integer buffer as a wide value: its bits (the host is
 * little-endian, as message.c asserts) as the type's value. */
static __int128 get_int(const void *buf, size_t i, kolo_dtype_t d)
{
    uint64_t bits = 0;
    memcpy(&bits, (const char *)buf + i * esize(d), esize(d));
    return wrap(bits, d);
}

/* float16 / bfloat16 reference decode and rounding (independent of half.c) */
static double ref_half_value(uint16_t h, int bf)
{
    int sign = h >> 15, e, m;
    double v;
    if (bf) {
        e = (h >> 7) & 255, m = h & 127;
        v = e == 255 ? (m ? NAN : INFINITY)
            : e == 0 ? ldexp(m, -133)
                     : ldexp(128 + m, e - 134);
    } else {
        e = (h >> 10) & 31, m = h & 1023;
        v = e == 31 ? (m ? NAN : INFINITY)
            : e == 0 ? ldexp(m, -24)
                     : ldexp(1024 + m, e - 25);
    }
    return sign ? -v : v;
}

static int half_is_nan(uint16_t h, int bf)
{
    return bf ? ((h & 0x7f80) == 0x7f80 && (h & 0x7f))
              : ((h & 0x7c00) == 0x7c00 && (h & 0x3ff));
}

/* Rounds x (any double or long double value) to float16 / bfloat16 bits,
 * ties to even, infinity on overflow. Not for NaN. */
static uint16_t ref_half_round(long double x, int bf)
{
    int p = bf ? 8 : 11, emin = bf ? -126 : -14, bias = bf ? 127 : 15;
    int mbits = p - 1;
    long double maxfinite =
        bf ? ldexpl(255, 120) : 65504.0L;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    uint16_t inf = bf ? 0x7f80 : 0x7c00;
    long double ax = fabsl(x);
    if (isinf(ax))
        return sign | inf;
    if (ax == 0)
        return sign;
    int ex;
    frexpl(ax, &ex);
    int e = ex - 1 < emin ? emin : ex - 1;
    int ulp = e - mbits;
    long double r = ldexpl(nearbyintl(ldexpl(ax, -ulp)), ulp);
    if (r > maxfinite)
        return sign | inf;
    if (r < ldexpl(1, emin)) /* subnormal (or zero) */
        return sign | (uint16_t)ldexpl(r, -(emin - mbits));
    frexpl(r, &ex);
    int mant = (int)ldexpl(r, -(ex - 1) + mbits) - (1 << mbits);
    return (uint16_t)(sign | ((ex - 1 + bias) << mbits) | mant);
}

/* Whether g is v rounded once to the 16-bit format (a NaN for NaN). */
static int half_rounds(uint16_t g, long double v, int bf)
{
    return isnan(v) ? half_is_nan(g, bf) : g == ref_half_round(v, bf);
}

/* Random float of moderate size, with specials now and then. */
static double rnd_real(void)
{
    uint64_t r = rnd();
    if (r % 64 == 0) {
        static const double specials[] = {0.0, -0.0, INFINITY, -INFINITY,
                                          NAN, 1e-40, -1e-310, 1.0, -1.0};
        return specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
    }
    double m = (double)(r >> 11) / 9007199254740992.0; /* [0, 1) */
    int e = (int)((r >> 6) % 40) - 20;
    return ((r >> 5) & 1 ? -1 : 1) * ldexp(1 + m, e);
}

/* Fills n elements of dtype with random data suited to it. */
static void fill(void *buf, size_t n, kolo_dtype_t d)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        switch (d) {
        case KOLO_BOOL: ((uint8_t *)buf)[i] = r & 1; break;
        case KOLO_FLOAT32: ((float *)buf)[i] = (float)rnd_real(); break;
        case KOLO_FLOAT64: ((double *)buf)[i] = rnd_real(); break;
        case KOLO_FLOAT16:
        case KOLO_BFLOAT16:
            /* half of them any bit pattern (NaN, inf, subnormals too),
             * half moderate values, so that sums do not all overflow */
            if (r & 1)
                ((uint16_t *)buf)[i] = (uint16_t)(r >> 16);
            else if (d == KOLO_FLOAT16)
                ((uint16_t *)buf)[i] =
                    (uint16_t)((r >> 16) & 0x8000) |
                    (uint16_t)(0x2000 + ((r >> 20) % 0x3800));
            else
                ((uint16_t *)buf)[i] =
                    (uint16_t)((r >> 16) & 0x8000) |
                    (uint16_t)(0x3000 + ((r >> 20) % 0x2000));
            break;
        default: memcpy((char *)buf + i * esize(d), &r, esize(d)); break;
        }
    }
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint64_t dbits(double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
}

/* Equal as results: same bits, or both NaN; for MIN/MAX (loose) also zeros
 * of either sign, since min(-0, +0) may be either. */
static int same_f(double got, double want, uint64_t gb, uint64_t wb, int loose)
{
    if (isnan(got) || isnan(want))
        return isnan(got) && isnan(want);
    if (loose && got == 0 && want == 0)
        return 1;
    return gb == wb;
}

/* ---- references --------------------------------------------------------- */

/* min / max with NaN propagation, as reduce.h specifies */
static double ref_minmax(double x, double y, int is_max)
{
    if (isnan(x) || isnan(y))
        return NAN;
    if (is_max)
        return x > y ? x : y;
    return x < y ? x : y;
}

/* Checks out[i] == a[i] OP b[i] for all i (the inputs are the original
 * values, saved before the call). */
static void check_binary(const void *out, const void *a, const void *b,
                         size_t n, kolo_dtype_t d, kolo_op_t op,
                         const char *mode)
{
    if (op == KOLO_OP_AVERAGE) /* the kernel of AVERAGE is SUM's */
        op = KOLO_OP_SUM;
    int is_max = op == KOLO_OP_MAX;
    int mm = op == KOLO_OP_MIN || op == KOLO_OP_MAX;
    for (size_t i = 0; i < n; i++) {
        if (is_int(d)) {
            __int128 x = get_int(a, i, d), y = get_int(b, i, d), want;
            switch (op) {
            case KOLO_OP_SUM: want = wrap(x + y, d); break;
            case KOLO_OP_PRODUCT: want = wrap(x * y, d); break;
            case KOLO_OP_MIN: want = x < y ? x : y; break;
            default: want = x > y ? x : y; break;
            }
            __int128 got = get_int(out, i, d);
            ck_assert_msg(got == want,
                          "dtype %d op %d %s n=%zu i=%zu: %lld op %lld = %lld, "
                          "want %lld",
                          d, op, mode, n, i, (long long)x, (long long)y,
                          (long long)got, (long long)want);
        } else if (d == KOLO_BOOL) {
            uint8_t x = ((const uint8_t *)a)[i], y = ((const uint8_t *)b)[i];
            int want = (op == KOLO_OP_SUM || op == KOLO_OP_MAX)
                           ? (x != 0 || y != 0)
                           : (x != 0 && y != 0);
            ck_assert_msg(((const uint8_t *)out)[i] == want,
                          "bool op %d %s n=%zu i=%zu: %d, %d -> %d", op, mode,
                          n, i, x, y, ((const uint8_t *)out)[i]);
        } else if (d == KOLO_FLOAT32) {
            float x = ((const float *)a)[i], y = ((const float *)b)[i];
            float want;
            /* double has more than 2 * 24 + 2 bits: rounding the exact
             * double sum / product to float is the float32 result */
            if (op == KOLO_OP_SUM)
                want = (float)((double)x + (double)y);
            else if (op == KOLO_OP_PRODUCT)
                want = (float)((double)x * (double)y);
            else
                want = (float)ref_minmax(x, y, is_max);
            float got = ((const float *)out)[i];
            ck_assert_msg(same_f(got, want, fbits(got), fbits(want), mm),
                          "float32 op %d %s n=%zu i=%zu: %a op %a = %a, want %a",
                          op, mode, n, i, (double)x, (double)y, (double)got,
                          (double)want);
        } else if (d == KOLO_FLOAT64) {
            double x = ((const double *)a)[i], y = ((const double *)b)[i];
            double want = op == KOLO_OP_SUM       ? x + y
                          : op == KOLO_OP_PRODUCT ? x * y
                                                  : ref_minmax(x, y, is_max);
            double got = ((const double *)out)[i];
            ck_assert_msg(same_f(got, want, dbits(got), dbits(want), mm),
                          "float64 op %d %s n=%zu i=%zu: %a op %a = %a, want %a",
                          op, mode, n, i, x, y, got, want);
        } else { /* float16 / bfloat16: float32 arithmetic, one rounding */
            int bf = d == KOLO_BFLOAT16;
            uint16_t hx = ((const uint16_t *)a)[i], hy = ((const uint16_t *)b)[i];
            float x = (float)ref_half_value(hx, bf);
            float y = (float)ref_half_value(hy, bf);
            float r = op == KOLO_OP_SUM       ? x + y
                      : op == KOLO_OP_PRODUCT ? x * y
                                              : (float)ref_minmax(x, y, is_max);
            uint16_t got = ((const uint16_t *)out)[i];
            if (isnan(r)) {
                ck_assert_msg(half_is_nan(got, bf),
                              "dtype %d op %d %s i=%zu: 0x%04x op 0x%04x = "
                              "0x%04x, want NaN",
                              d, op, mode, i, hx, hy, got);
                continue;
            }
            uint16_t want = ref_half_round(r, bf);
            int ok = got == want ||
                     (mm && (got & 0x7fff) == 0 && (want & 0x7fff) == 0);
            ck_assert_msg(ok,
                          "dtype %d op %d %s n=%zu i=%zu: 0x%04x op 0x%04x = "
                          "0x%04x, want 0x%04x",
                          d, op, mode, n, i, hx, hy, got, want);
        }
    }
}

static const size_t g_lengths[] = {0,  1,  2,  7,   8,   15,   16,   17,
                                   31, 32, 33, 100, 511, 512,  513,  1023,
                                   1024, 1025, 4099};
#define NLENGTHS (sizeof g_lengths / sizeof g_lengths[0])

/* Every dtype x op (loop index = dtype * KOLO_OP_COUNT_ + op), every
 * length, four aliasings: out separate (and misaligned by one element),
 * out == a, out == b, out == a == b. */
START_TEST(reduce_all)
{
    kolo_dtype_t d = (kolo_dtype_t)(_i / KOLO_OP_COUNT_);
    kolo_op_t op = (kolo_op_t)(_i % KOLO_OP_COUNT_);
    kolo__reduce_fn fn = kolo__reduce_get(d, op);
    if (d == KOLO_BOOL && op == KOLO_OP_AVERAGE) {
        ck_assert_ptr_null(fn);
        return;
    }
    ck_assert_ptr_nonnull(fn);
    size_t es = esize(d);
    for (int scalar = 0; scalar < (is_half(d) ? 2 : 1); scalar++) {
        kolo__half_force_scalar(scalar);
        for (size_t li = 0; li < NLENGTHS; li++) {
            size_t n = g_lengths[li];
            size_t bytes = (n + 1) * es;
            char *a = malloc(bytes), *b = malloc(bytes), *o = malloc(bytes);
            char *a0 = malloc(bytes), *b0 = malloc(bytes);
            ck_assert(a && b && o && a0 && b0);
            fill(a0, n + 1, d);
            fill(b0, n + 1, d);

            /* separate output, misaligned by one element */
            memcpy(a, a0, bytes);
            memcpy(b, b0, bytes);
            memset(o, 0x5a, bytes);
            fn(o + es, a, b, n);
            check_binary(o + es, a0, b0, n, d, op, "disjoint");
            ck_assert(memcmp(a, a0, bytes) == 0 && memcmp(b, b0, bytes) == 0);
            /* nothing written before the output */
            for (size_t k = 0; k < es; k++)
                ck_assert_int_eq((unsigned char)o[k], 0x5a);

            /* out == a */
            fn(a, a, b, n);
            check_binary(a, a0, b0, n, d, op, "out==a");
            ck_assert(memcmp(a + n * es, a0 + n * es, es) == 0);

            /* out == b */
            memcpy(a, a0, bytes);
            fn(b, a, b, n);
            check_binary(b, a0, b0, n, d, op, "out==b");

            /* out == a == b */
            memcpy(a, a0, bytes);
            fn(a, a, a, n);
            check_binary(a, a0, a0, n, d, op, "out==a==b");

            /* misaligned in place */
            memcpy(a, a0, bytes);
            memcpy(b, b0, bytes);
            fn(a + es, a + es, b, n);
            check_binary(a + es, a0 + es, b0, n, d, op, "out==a+1");

            free(a);
            free(b);
            free(o);
            free(a0);
            free(b0);
        }
    }
    kolo__half_force_scalar(0);
}
END_TEST

START_TEST(lookup)
{
    for (int d = 0; d < KOLO_DTYPE_COUNT_; d++) {
        for (int op = 0; op < KOLO_OP_COUNT_; op++) {
            int valid = !(d == KOLO_BOOL && op == KOLO_OP_AVERAGE);
            ck_assert_int_eq(kolo__op_valid_for_dtype(d, op), valid);
            if (valid)
                ck_assert_ptr_nonnull(kolo__reduce_get(d, op));
        }
        if (d != KOLO_BOOL)
            ck_assert_ptr_eq(kolo__reduce_get(d, KOLO_OP_AVERAGE),
                             kolo__reduce_get(d, KOLO_OP_SUM));
        ck_assert_ptr_null(kolo__reduce_get(d, KOLO_OP_COUNT_));
        ck_assert_ptr_null(kolo__reduce_get(d, (kolo_op_t)-1));
        ck_assert_int_eq(kolo__op_valid_for_dtype(d, KOLO_OP_COUNT_), 0);
    }
    for (int op = 0; op < KOLO_OP_COUNT_; op++) {
        ck_assert_ptr_null(kolo__reduce_get(KOLO_DTYPE_COUNT_, op));
        ck_assert_ptr_null(kolo__reduce_get((kolo_dtype_t)-1, op));
        ck_assert_ptr_null(kolo__reduce_get((kolo_dtype_t)1000, op));
        ck_assert_int_eq(kolo__op_valid_for_dtype(KOLO_DTYPE_COUNT_, op), 0);
        ck_assert_int_eq(kolo__op_valid_for_dtype((kolo_dtype_t)-1, op), 0);
    }
    ck_assert_int_eq(kolo__op_valid_for_dtype(KOLO_BOOL, KOLO_OP_AVERAGE), 0);
}
END_TEST

/* ---- hand-picked cases -------------------------------------------------- */

START_TEST(integer_wrap)
{
    int8_t a8[4] = {127, -128, 100, -1}, b8[4] = {1, -1, 100, -1}, o8[4];
    kolo__reduce_get(KOLO_INT8, KOLO_OP_SUM)(o8, a8, b8, 4);
    ck_assert_int_eq(o8[0], -128);
    ck_assert_int_eq(o8[1], 127);
    ck_assert_int_eq(o8[2], -56);
    ck_assert_int_eq(o8[3], -2);
    kolo__reduce_get(KOLO_INT8, KOLO_OP_PRODUCT)(o8, a8, b8, 4);
    ck_assert_int_eq(o8[0], 127);
    ck_assert_int_eq(o8[1], -128); /* -128 * -1 = 128 wraps to -128 */
    ck_assert_int_eq(o8[2], 16);   /* 10000 mod 256 */
    ck_assert_int_eq(o8[3], 1);

    uint8_t ua[2] = {255, 200}, ub[2] = {1, 100}, uo[2];
    kolo__reduce_get(KOLO_UINT8, KOLO_OP_SUM)(uo, ua, ub, 2);
    ck_assert_uint_eq(uo[0], 0);
    ck_assert_uint_eq(uo[1], 44);

    /* uint16 * uint16 must not overflow int */
    uint16_t u16a[1] = {65535}, u16b[1] = {65535}, u16o[1];
    kolo__reduce_get(KOLO_UINT16, KOLO_OP_PRODUCT)(u16o, u16a, u16b, 1);
    ck_assert_uint_eq(u16o[0], 1);

    int32_t i32a[2] = {INT32_MAX, INT32_MIN}, i32b[2] = {1, -1}, i32o[2];
    kolo__reduce_get(KOLO_INT32, KOLO_OP_SUM)(i32o, i32a, i32b, 2);
    ck_assert_int_eq(i32o[0], INT32_MIN);
    ck_assert_int_eq(i32o[1], INT32_MAX);
    kolo__reduce_get(KOLO_INT32, KOLO_OP_PRODUCT)(i32o, i32a, i32a, 2);
    ck_assert_int_eq(i32o[0], 1);
    ck_assert_int_eq(i32o[1], 0);

    int64_t i64a[2] = {INT64_MAX, INT64_MIN}, i64b[2] = {1, -1}, i64o[2];
    kolo__reduce_get(KOLO_INT64, KOLO_OP_SUM)(i64o, i64a, i64b, 2);
    ck_assert(i64o[0] == INT64_MIN && i64o[1] == INT64_MAX);
    kolo__reduce_get(KOLO_INT64, KOLO_OP_PRODUCT)(i64o, i64a, i64a, 2);
    ck_assert(i64o[0] == 1 && i64o[1] == 0);
}
END_TEST

START_TEST(bool_semantics)
{
    uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1}, o[4];
    static const uint8_t or_[4] = {0, 1, 1, 1}, and_[4] = {0, 0, 0, 1};
    kolo__reduce_get(KOLO_BOOL, KOLO_OP_SUM)(o, a, b, 4);
    ck_assert(memcmp(o, or_, 4) == 0);
    kolo__reduce_get(KOLO_BOOL, KOLO_OP_MAX)(o, a, b, 4);
    ck_assert(memcmp(o, or_, 4) == 0);
    kolo__reduce_get(KOLO_BOOL, KOLO_OP_MIN)(o, a, b, 4);
    ck_assert(memcmp(o, and_, 4) == 0);
    kolo__reduce_get(KOLO_BOOL, KOLO_OP_PRODUCT)(o, a, b, 4);
    ck_assert(memcmp(o, and_, 4) == 0);
    /* bytes other than 0/1 are true, results stay 0/1 (2 & 1 would be 0
     * with bitwise and, 2 + 255 would wrap with arithmetic) */
    uint8_t c[3] = {2, 255, 0}, e[3] = {1, 2, 4};
    kolo__reduce_get(KOLO_BOOL, KOLO_OP_PRODUCT)(o, c, e, 3);
    ck_assert(o[0] == 1 && o[1] == 1 && o[2] == 0);
    kolo__reduce_get(KOLO_BOOL, KOLO_OP_SUM)(o, c, e, 3);
    ck_assert(o[0] == 1 && o[1] == 1 && o[2] == 1);
}
END_TEST

START_TEST(float_nan_minmax)
{
    float a[3] = {NAN, 1.0f, NAN}, b[3] = {1.0f, NAN, NAN}, o[3];
    kolo__reduce_get(KOLO_FLOAT32, KOLO_OP_MIN)(o, a, b, 3);
    ck_assert(isnan(o[0]) && isnan(o[1]) && isnan(o[2]));
    kolo__reduce_get(KOLO_FLOAT32, KOLO_OP_MAX)(o, a, b, 3);
    ck_assert(isnan(o[0]) && isnan(o[1]) && isnan(o[2]));
    uint16_t ha[2] = {0x7e00, 0x3c00}, hb[2] = {0x3c00, 0x7e00}, ho[2];
    kolo__reduce_get(KOLO_FLOAT16, KOLO_OP_MIN)(ho, ha, hb, 2);
    ck_assert(half_is_nan(ho[0], 0) && half_is_nan(ho[1], 0));
    kolo__reduce_get(KOLO_BFLOAT16, KOLO_OP_MAX)(ho, ha, hb, 2);
    ck_assert(half_is_nan(ho[0], 1) || ho[0] == 0x7e00);
}
END_TEST

/* float16 SUM of two halves is round(float(a) + float(b)): every float16
 * value as a, against random b; and the same for bfloat16. */
START_TEST(half_sum_rounds_once)
{
    int bf = _i;
    kolo_dtype_t d = bf ? KOLO_BFLOAT16 : KOLO_FLOAT16;
    enum { REP = 16, N = 65536 * REP };
    uint16_t *a = malloc(N * 2), *b = malloc(N * 2), *o = malloc(N * 2);
    ck_assert(a && b && o);
    for (size_t i = 0; i < N; i++) {
        a[i] = (uint16_t)(i % 65536);
        /* b near a half the time, so that sums cancel and round finely */
        uint64_t r = rnd();
        b[i] = r & 1 ? (uint16_t)(r >> 16) : (uint16_t)(a[i] ^ 0x8000 ^ ((r >> 16) & 0xff));
    }
    for (int scalar = 0; scalar < 2; scalar++) {
        kolo__half_force_scalar(scalar);
        kolo__reduce_get(d, KOLO_OP_SUM)(o, a, b, N);
        for (size_t i = 0; i < N; i++) {
            float x = (float)ref_half_value(a[i], bf);
            float y = (float)ref_half_value(b[i], bf);
            float s = x + y;
            ck_assert_msg(half_rounds(o[i], s, bf),
                          "0x%04x + 0x%04x = 0x%04x, want 0x%04x", a[i], b[i],
                          o[i], ref_half_round(s, bf));
        }
    }
    kolo__half_force_scalar(0);
    free(a);
    free(b);
    free(o);
}
END_TEST

/* ---- average ------------------------------------------------------------ */

static const int64_t g_divisors[] = {1, 2, 3, 4, 7, 8, 64, 100, 1000, 4096};

/* |x| / d with the sign of x: truncation toward zero, written without C's
 * signed division */
static __int128 ref_trunc_div(__int128 x, int64_t d)
{
    __int128 mag = x < 0 ? -x : x;
    __int128 q = mag / d;
    return x < 0 ? -q : q;
}

/* A fresh input of n random elements of d (and a spare byte, so that n = 0
 * allocates too). */
static char *fresh_input(size_t n, kolo_dtype_t d)
{
    char *orig = malloc(n * esize(d) + 1);
    ck_assert(orig);
    fill(orig, n, d);
    return orig;
}

/* A copy of the input to work on. */
static char *copy_of(const char *orig, size_t n, kolo_dtype_t d)
{
    char *buf = malloc(n * esize(d) + 1);
    ck_assert(buf);
    memcpy(buf, orig, n * esize(d));
    return buf;
}

/* Averages a copy of orig over div ranks with kolo__average and checks
 * it elementwise (the rules of kolo__average). */
static void check_average(const char *orig, size_t n, kolo_dtype_t d,
                          int64_t div)
{
    char *got = copy_of(orig, n, d);

    kolo__average(got, n, d, div);
    for (size_t i = 0; i < n; i++) {
        if (div <= 1 || d == KOLO_BOOL) {
            ck_assert(memcmp((const char *)got + i * esize(d),
                             (const char *)orig + i * esize(d),
                             esize(d)) == 0);
        } else if (is_int(d)) {
            __int128 want = ref_trunc_div(get_int(orig, i, d), div);
            ck_assert_msg(get_int(got, i, d) == want,
                          "dtype %d: %lld / %lld = %lld, want %lld", d,
                          (long long)get_int(orig, i, d), (long long)div,
                          (long long)get_int(got, i, d), (long long)want);
        } else if (d == KOLO_FLOAT32) {
            float x = ((const float *)orig)[i];
            /* long double has 64 >= 2 * 24 + 2 bits: correctly rounded */
            float want = (float)((long double)x / div);
            float g = ((const float *)got)[i];
            ck_assert_msg(same_f(g, want, fbits(g), fbits(want), 0),
                          "%a / %lld = %a, want %a", (double)x, (long long)div,
                          (double)g, (double)want);
        } else if (d == KOLO_FLOAT64) {
            double x = ((const double *)orig)[i], want = x / (double)div;
            double g = ((const double *)got)[i];
            ck_assert(same_f(g, want, dbits(g), dbits(want), 0));
        } else {
            /* the exact quotient rounded once to 16 bits: the float32
             * intermediate must not change the result */
            int bf = d == KOLO_BFLOAT16;
            uint16_t x = ((const uint16_t *)orig)[i];
            uint16_t g = ((const uint16_t *)got)[i];
            long double q = (long double)ref_half_value(x, bf) / div;
            ck_assert_msg(half_rounds(g, q, bf),
                          "dtype %d: 0x%04x / %lld = 0x%04x, want 0x%04x", d,
                          x, (long long)div, g, ref_half_round(q, bf));
        }
    }
    free(got);
}

/* Runs run_case(d, n, k) for every length n and every k < ncases, on the
 * run-time path and, for float16 and bfloat16, on the forced scalar one
 * too. */
static void for_lengths_and_paths(kolo_dtype_t d, size_t ncases,
                                  void (*run_case)(kolo_dtype_t d, size_t n,
                                                   size_t k))
{
    for (int scalar = 0; scalar < (is_half(d) ? 2 : 1); scalar++) {
        kolo__half_force_scalar(scalar);
        for (size_t li = 0; li < NLENGTHS; li++)
            for (size_t k = 0; k < ncases; k++)
                run_case(d, g_lengths[li], k);
    }
    kolo__half_force_scalar(0);
}

/* A random buffer of n elements averaged over g_divisors[k] ranks. */
static void average_case(kolo_dtype_t d, size_t n, size_t k)
{
    int64_t div = g_divisors[k];
    /* bfloat16 only holds integers up to 256 exactly; above, the float32
     * quotient is a double rounding */
    if (d == KOLO_BFLOAT16 && div > 256)
        return;
    char *orig = fresh_input(n, d);
    if (is_half(d) && n > 0) /* all 65536 patterns, spread */
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)orig)[i] = (uint16_t)(rnd() >> 48);
    check_average(orig, n, d, div);
    free(orig);
}

START_TEST(average_all)
{
    for_lengths_and_paths((kolo_dtype_t)_i,
                          sizeof g_divisors / sizeof g_divisors[0],
                          average_case);
}
END_TEST

/* All 65536 float16 / bfloat16 patterns divided by small rank counts. */
START_TEST(average_half_exhaustive)
{
    kolo_dtype_t d = _i ? KOLO_BFLOAT16 : KOLO_FLOAT16;
    uint16_t *orig = malloc(65536 * 2);
    ck_assert(orig);
    for (uint32_t i = 0; i < 65536; i++)
        orig[i] = (uint16_t)i;
    for (int64_t div = 2; div <= 16; div++)
        check_average((const char *)orig, 65536, d, div);
    free(orig);
}
END_TEST

START_TEST(average_int_extremes)
{
    int64_t v[6] = {INT64_MAX, INT64_MIN, -7, 7, INT64_MAX - 1, -1};
    int64_t w[6];
    memcpy(w, v, sizeof v);
    kolo__average(w, 6, KOLO_INT64, 3);
    ck_assert(w[0] == INT64_MAX / 3 && w[1] == INT64_MIN / 3);
    ck_assert(w[2] == -2 && w[3] == 2 && w[5] == 0);
    /* a quotient that double could not represent exactly */
    int64_t big = (INT64_C(1) << 62) + 3, q = big;
    kolo__average(&q, 1, KOLO_INT64, 1);
    ck_assert(q == big);
    kolo__average(&q, 1, KOLO_INT64, 2);
    ck_assert(q == (INT64_C(1) << 61) + 1);
    int8_t s[3] = {-128, 127, -3};
    kolo__average(s, 3, KOLO_INT8, 2);
    ck_assert(s[0] == -64 && s[1] == 63 && s[2] == -1);
    uint8_t b[2] = {1, 0};
    kolo__average(b, 2, KOLO_BOOL, 2);
    ck_assert(b[0] == 1 && b[1] == 0);
    /* divisor <= 1: unchanged */
    int32_t x = 5;
    kolo__average(&x, 1, KOLO_INT32, 0);
    kolo__average(&x, 1, KOLO_INT32, -3);
    ck_assert_int_eq(x, 5);
    /* n == 0 with NULL */
    kolo__average(NULL, 0, KOLO_FLOAT32, 4);
    kolo__average(&x, 1, KOLO_DTYPE_COUNT_, 4);
    ck_assert_int_eq(x, 5);
}
END_TEST

/* ---- scale -------------------------------------------------------------- */

static const double g_factors[] = {0.5, 1.0 / 3.0, 2.0, -1.5, 1.0,
                                   0.0, 1e30, -1e30, 0.1, 3.0};

/* r truncated toward zero, saturated to the type's range, NaN -> 0 */
static __int128 ref_sat(double r, kolo_dtype_t d)
{
    int bits = int_bits(d);
    __int128 mx = int_signed(d) ? ((__int128)1 << (bits - 1)) - 1
                                : ((__int128)1 << bits) - 1;
    __int128 mn = int_signed(d) ? -((__int128)1 << (bits - 1)) : 0;
    if (isnan(r))
        return 0;
    double t = trunc(r);
    if (t >= ldexp(1, 64))
        return mx;
    if (t <= -ldexp(1, 64))
        return mn;
    __int128 v = (__int128)t;
    return v > mx ? mx : v < mn ? mn : v;
}

/* Scales a copy of orig by f with kolo__scale and checks it as Horovod
 * scales: integers saturated, float32 with the factor rounded to float32,
 * halves through float32. */
static void check_scale(const char *orig, size_t n, kolo_dtype_t d, double f)
{
    size_t es = esize(d);
    char *buf = copy_of(orig, n, d);

    kolo__scale(buf, n, d, f);
    for (size_t i = 0; i < n; i++) {
        if (d == KOLO_BOOL || f == 1.0) {
            ck_assert(memcmp(buf + i * es, orig + i * es, es) == 0);
        } else if (is_int(d)) {
            __int128 x = get_int(orig, i, d);
            __int128 want = ref_sat((double)x * f, d);
            ck_assert_msg(get_int(buf, i, d) == want,
                          "dtype %d: %lld * %g = %lld, want %lld", d,
                          (long long)x, f, (long long)get_int(buf, i, d),
                          (long long)want);
        } else if (d == KOLO_FLOAT32) {
            /* Horovod's ScaleBuffer: float32 product with
             * the factor rounded to float32. */
            float x = ((const float *)orig)[i];
            float want = x * (float)f;
            float g = ((float *)buf)[i];
            ck_assert(same_f(g, want, fbits(g), fbits(want), 0));
        } else if (d == KOLO_FLOAT64) {
            double x = ((const double *)orig)[i], want = x * f;
            double g = ((double *)buf)[i];
            ck_assert(same_f(g, want, dbits(g), dbits(want), 0));
        } else {
            int bf = d == KOLO_BFLOAT16;
            uint16_t x = ((const uint16_t *)orig)[i];
            uint16_t g = ((uint16_t *)buf)[i];
            float p = (float)ref_half_value(x, bf) * (float)f;
            ck_assert_msg(half_rounds(g, p, bf),
                          "dtype %d: 0x%04x * %g = 0x%04x, want 0x%04x", d, x,
                          f, g, ref_half_round(p, bf));
        }
    }
    free(buf);
}

/* A random buffer of n elements scaled by g_factors[k]. */
static void scale_case(kolo_dtype_t d, size_t n, size_t k)
{
    double f = g_factors[k];
    char *orig = fresh_input(n, d);
    check_scale(orig, n, d, f);
    free(orig);
}

START_TEST(scale_all)
{
    for_lengths_and_paths((kolo_dtype_t)_i,
                          sizeof g_factors / sizeof g_factors[0], scale_case);
}
END_TEST

START_TEST(scale_int_saturation)
{
    int8_t s[4] = {100, -100, 3, -3};
    kolo__scale(s, 4, KOLO_INT8, 2.0);
    ck_assert(s[0] == 127 && s[1] == -128 && s[2] == 6 && s[3] == -6);
    int8_t t[2] = {3, -3};
    kolo__scale(t, 2, KOLO_INT8, 0.63); /* 1.89 -> 1, -1.89 -> -1 */
    ck_assert(t[0] == 1 && t[1] == -1);
    uint8_t u[2] = {10, 0};
    kolo__scale(u, 2, KOLO_UINT8, -1.0);
    ck_assert(u[0] == 0 && u[1] == 0);
    int64_t v[3] = {INT64_MAX, INT64_MIN, 5};
    kolo__scale(v, 3, KOLO_INT64, 2.0);
    ck_assert(v[0] == INT64_MAX && v[1] == INT64_MIN && v[2] == 10);
    int32_t w[1] = {7};
    kolo__scale(w, 1, KOLO_INT32, NAN);
    ck_assert_int_eq(w[0], 0);
    /* factor 1.0 leaves even int64 beyond 2^53 untouched */
    int64_t big = (INT64_C(1) << 62) + 1;
    kolo__scale(&big, 1, KOLO_INT64, 1.0);
    ck_assert(big == (INT64_C(1) << 62) + 1);
    kolo__scale(NULL, 0, KOLO_FLOAT64, 2.0);
}
END_TEST

/* Values where Horovod's float32 scaling (x * (float)f) and a product in
 * double rounded once ((float)((double)x * f)) disagree in the last bit:
 * kolo must give Horovod's. */
START_TEST(scale_f32_is_horovods)
{
    float a[3] = {3.0f, 11.0f, 7.0f};
    uint32_t bits[3];
    kolo__scale(a, 2, KOLO_FLOAT32, 0.3);      /* 0x3f666666 in double */
    kolo__scale(a + 2, 1, KOLO_FLOAT32, 1.0 / 3.0);
    memcpy(bits, a, sizeof(bits));
    ck_assert_uint_eq(bits[0], 0x3f666667u);     /* 3 * 0.3f */
    ck_assert_uint_eq(bits[1], 0x40533334u);     /* 11 * 0.3f */
    ck_assert_uint_eq(bits[2], 0x40155556u);     /* 7 * (float)(1/3) */
}
END_TEST

/* The device's scaling (Horovod's CUDA kernels): float16 in half precision,
 * the factor rounded to float16 first (0.1 -> 0.0999755859375), so 3 * 0.1
 * is the tie 0.2998046875 + 2^-13, rounded to even: 0.2998046875 (0x34cc),
 * where the host's float32 factor gives 0.300048828125 (0x34cd); the other
 * dtypes as the host. */
START_TEST(scale_device_is_horovods_cuda)
{
    uint16_t h[2] = {0x4200, 0x4200}; /* 3.0, 3.0 */
    float f[2] = {3.0f, 3.0f};

    kolo__scale_device(h, 1, KOLO_FLOAT16, 0.1);
    kolo__scale(h + 1, 1, KOLO_FLOAT16, 0.1);
    ck_assert_uint_eq(h[0], 0x34cc);
    ck_assert_uint_eq(h[1], 0x34cd);
    ck_assert(kolo__f16_factor(0.1) == 0.0999755859375f);
    kolo__scale_device(f, 1, KOLO_FLOAT32, 0.1);
    kolo__scale(f + 1, 1, KOLO_FLOAT32, 0.1);
    ck_assert(f[0] == f[1]);
    h[0] = 0x4200;
    kolo__scale_device(h, 1, KOLO_FLOAT16, 1.0); /* 1.0 leaves it */
    ck_assert_uint_eq(h[0], 0x4200);
}
END_TEST

/* AVERAGE's factor: postscale / size in double, size 1 (or less) leaving
 * postscale as it is; other ops keep postscale. */
START_TEST(postscale_factor)
{
    ck_assert(kolo__postscale_factor(KOLO_OP_SUM, 0.7, 3) == 0.7);
    ck_assert(kolo__postscale_factor(KOLO_OP_MAX, 2.0, 4) == 2.0);
    ck_assert(kolo__postscale_factor(KOLO_OP_AVERAGE, 1.0, 3) == 1.0 / 3.0);
    ck_assert(kolo__postscale_factor(KOLO_OP_AVERAGE, 0.7, 3) == 0.7 / 3.0);
    ck_assert(kolo__postscale_factor(KOLO_OP_AVERAGE, 0.7, 1) == 0.7);
    ck_assert(kolo__postscale_factor(KOLO_OP_AVERAGE, 5.0, 4) == 1.25);
}
END_TEST

/* ---- accumulate --------------------------------------------------------- */

START_TEST(accumulator_sizes)
{
    for (int d = 0; d < KOLO_DTYPE_COUNT_; d++)
        ck_assert_uint_eq(kolo__accumulator_elem_size(d),
                          is_half(d) ? 4 : esize(d));
    ck_assert_uint_eq(kolo__accumulator_elem_size(KOLO_DTYPE_COUNT_), 0);
    ck_assert_uint_eq(kolo__accumulator_elem_size((kolo_dtype_t)-1), 0);
}
END_TEST

/* Three passes accumulated from a zero accumulator, then finished with
 * divisor 1 and 3, into a separate buffer and in place. */
START_TEST(accumulate_all)
{
    kolo_dtype_t d = (kolo_dtype_t)_i;
    enum { PASSES = 3 };
    size_t es = esize(d), as = kolo__accumulator_elem_size(d);
    for (int scalar = 0; scalar < (is_half(d) ? 2 : 1); scalar++) {
        kolo__half_force_scalar(scalar);
        for (size_t li = 0; li < NLENGTHS; li++) {
            size_t n = g_lengths[li];
            char *in[PASSES];
            char *acc = calloc(n + 1, as), *out = malloc(n * es + 1);
            ck_assert(acc && out);
            for (int p = 0; p < PASSES; p++) {
                in[p] = malloc(n * es + 1);
                ck_assert(in[p]);
                fill(in[p], n, d);
                kolo__accumulate(acc, in[p], n, d);
            }
            for (int64_t div = 1; div <= PASSES; div += PASSES - 1) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    char *dst = out;
                    char *acc2 = NULL;
                    if (inplace) { /* finish over a copy of acc */
                        acc2 = malloc(n * as + 1);
                        ck_assert(acc2);
                        memcpy(acc2, acc, n * as);
                        dst = acc2;
                    }
                    kolo__accumulate_finish(dst, inplace ? acc2 : acc, n, d,
                                            div);
                    for (size_t i = 0; i < n; i++) {
                        if (is_int(d)) {
                            __int128 s = 0;
                            for (int p = 0; p < PASSES; p++)
                                s += get_int(in[p], i, d);
                            __int128 want =
                                ref_trunc_div(wrap(s, d), div);
                            ck_assert(get_int(dst, i, d) == want);
                        } else if (d == KOLO_BOOL) {
                            int any = 0;
                            for (int p = 0; p < PASSES; p++)
                                any |= in[p][i] != 0;
                            ck_assert_int_eq(dst[i], any);
                        } else if (d == KOLO_FLOAT32) {
                            float s = 0;
                            for (int p = 0; p < PASSES; p++)
                                s += ((float *)in[p])[i];
                            float want = (float)((long double)s / div);
                            float g = ((float *)dst)[i];
                            ck_assert(same_f(g, want, fbits(g), fbits(want), 0));
                        } else if (d == KOLO_FLOAT64) {
                            double s = 0;
                            for (int p = 0; p < PASSES; p++)
                                s += ((double *)in[p])[i];
                            double want = s / (double)div;
                            double g = ((double *)dst)[i];
                            ck_assert(same_f(g, want, dbits(g), dbits(want), 0));
                        } else {
                            /* float32 sum, float32 division, one rounding */
                            int bf = d == KOLO_BFLOAT16;
                            float s = 0;
                            for (int p = 0; p < PASSES; p++)
                                s += (float)ref_half_value(
                                    ((uint16_t *)in[p])[i], bf);
                            if (div > 1)
                                s /= (float)div;
                            uint16_t g = ((uint16_t *)dst)[i];
                            ck_assert_msg(half_rounds(g, s, bf),
                                          "dtype %d i=%zu: 0x%04x, want "
                                          "0x%04x",
                                          d, i, g, ref_half_round(s, bf));
                        }
                    }
                    free(acc2);
                }
            }
            for (int p = 0; p < PASSES; p++)
                free(in[p]);
            free(acc);
            free(out);
        }
    }
    kolo__half_force_scalar(0);
}
END_TEST

/* Accumulating halves in float32 is more precise than summing in halves:
 * 4096 passes of 1.0 in float16 reach 4096 exactly, while half sums stall
 * at 2048 (2048 + 1 rounds back to 2048). */
START_TEST(accumulate_half_precision)
{
    uint16_t one = 0x3c00, out;
    float acc = 0;
    for (int p = 0; p < 4096; p++)
        kolo__accumulate(&acc, &one, 1, KOLO_FLOAT16);
    ck_assert(acc == 4096.0f);
    kolo__accumulate_finish(&out, &acc, 1, KOLO_FLOAT16, 1);
    ck_assert_uint_eq(out, 0x6c00); /* 4096 */
    kolo__accumulate_finish(&out, &acc, 1, KOLO_FLOAT16, 4096);
    ck_assert_uint_eq(out, 0x3c00);
    kolo__accumulate(NULL, NULL, 0, KOLO_FLOAT16);
    kolo__accumulate_finish(NULL, NULL, 0, KOLO_FLOAT16, 2);
}
END_TEST

static Suite *reduce_suite(void)
{
    Suite *s = suite_create("reduce");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 600); /* slow under sanitizers */
    tcase_add_loop_test(tc, reduce_all, 0, KOLO_DTYPE_COUNT_ * KOLO_OP_COUNT_);
    tcase_add_test(tc, lookup);
    tcase_add_test(tc, integer_wrap);
    tcase_add_test(tc, bool_semantics);
    tcase_add_test(tc, float_nan_minmax);
    tcase_add_loop_test(tc, half_sum_rounds_once, 0, 2);
    tcase_add_loop_test(tc, average_all, 0, KOLO_DTYPE_COUNT_);
    tcase_add_loop_test(tc, average_half_exhaustive, 0, 2);
    tcase_add_test(tc, average_int_extremes);
    tcase_add_loop_test(tc, scale_all, 0, KOLO_DTYPE_COUNT_);
    tcase_add_test(tc, scale_int_saturation);
    tcase_add_test(tc, scale_f32_is_horovods);
    tcase_add_test(tc, scale_device_is_horovods_cuda);
    tcase_add_test(tc, postscale_factor);
    tcase_add_test(tc, accumulator_sizes);
    tcase_add_loop_test(tc, accumulate_all, 0, KOLO_DTYPE_COUNT_);
    tcase_add_test(tc, accumulate_half_precision);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int simd = kolo__half_simd();
    printf("test-reduce: 16-bit conversions: float16 %s, bfloat16 %s "
           "(16-bit cases also rerun with the scalar path forced)\n",
           simd & KOLO__HALF_SIMD_F16C ? "F16C" : "scalar",
           simd & KOLO__HALF_SIMD_AVX2 ? "AVX2" : "scalar");
    return kolo_unit_run(reduce_suite());
}
