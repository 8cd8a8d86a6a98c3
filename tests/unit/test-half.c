/*
 * test-half.c — unit tests of runtime/half.{h,c}: float16 and bfloat16
 * conversions.
 *
 * Why these tests: every 16-bit reduction of the runtime goes through these
 * conversions, and ranks with and without F16C must produce the same bits.
 * So the tests check (1) every one of the 65536 bit patterns of each format
 * exhaustively, (2) rounding against a reference written independently here
 * (ldexp / frexp / nearbyint on doubles, not bit tricks), (3) hand-picked
 * rounding corner cases, and (4) that the vector path and the forced scalar
 * path give identical bits on a million random and special values, at many
 * lengths and alignments.
 */
#include <check.h>
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "unit.h"

/* ---- independent reference ---------------------------------------------- */

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Both 16-bit formats are binary formats of 1 sign bit, 15 - mbits
 * exponent bits and mbits mantissa bits: float16 has 10, bfloat16 7. */
#define F16_MBITS 10
#define BF16_MBITS 7

/* Value of a bit pattern of such a format, from the definition of a
 * binary format (IEEE 754's binary16 for float16). */
static double ref_value(uint16_t h, int mbits)
{
    int emax = (1 << (15 - mbits)) - 1, bias = emax >> 1;
    int sign = h >> 15, e = (h >> mbits) & emax, m = h & ((1 << mbits) - 1);
    double v;
    if (e == emax)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, 1 - bias - mbits);
    else
        v = ldexp((1 << mbits) + m, e - bias - mbits);
    return sign ? -v : v;
}

/* Rounds x to a binary format of p significand bits whose smallest normal
 * is 2^emin and largest finite value is maxfinite, ties to even; infinity
 * beyond. Uses nearbyint in the default rounding mode. */
static double ref_round(double x, int p, int emin, double maxfinite)
{
    if (x == 0 || isnan(x) || isinf(x))
        return x;
    double ax = fabs(x);
    int ex;
    frexp(ax, &ex); /* ax = m * 2^ex, m in [0.5, 1) */
    int e = ex - 1; /* exponent of the leading bit */
    if (e < emin)
        e = emin; /* subnormal: fixed spacing */
    int ulp = e - (p - 1);
    double r = ldexp(nearbyint(ldexp(ax, -ulp)), ulp);
    if (r > maxfinite)
        r = INFINITY;
    return copysign(r, x);
}

/* Encodes a value exactly representable in such a format (or infinity). */
static uint16_t ref_encode(double v, int mbits)
{
    int emax = (1 << (15 - mbits)) - 1, bias = emax >> 1;
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    double av = fabs(v);
    if (isinf(av))
        return (uint16_t)(sign | emax << mbits);
    if (av < ldexp(1, 1 - bias)) /* subnormal */
        return sign | (uint16_t)ldexp(av, bias - 1 + mbits);
    int ex;
    double m = frexp(av, &ex); /* [0.5, 1) */
    int mant = (int)ldexp(m, mbits + 1) - (1 << mbits);
    return (uint16_t)(sign | ((ex - 1 + bias) << mbits) | mant);
}

#define F16_MAX 65504.0
#define BF16_MAX (ldexp(255, 120)) /* (2 - 2^-7) * 2^127 */

/* Expected float16 for a non-NaN float. */
static uint16_t ref_to_f16(float f)
{
    return ref_encode(ref_round(f, F16_MBITS + 1, -14, F16_MAX), F16_MBITS);
}

static uint16_t ref_to_bf16(float f)
{
    return ref_encode(ref_round(f, BF16_MBITS + 1, -126, BF16_MAX),
                      BF16_MBITS);
}

/* splitmix64: a small deterministic generator */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random float: a third random bit patterns, a third around the float16
 * range (including its subnormals and overflow), a third specials and
 * rounding ties of both formats. */
static float rnd_float(void)
{
    uint64_t r = rnd();
    switch (r % 3) {
    case 0: return bitsf((uint32_t)(r >> 32));
    case 1: {
        int e = (int)((r >> 8) % 50) - 30; /* 2^-30 .. 2^19 */
        float f = ldexpf(1.0f + (float)((r >> 16) & 0xffffff) / 16777216.0f,
                         e);
        return (r >> 60) & 1 ? -f : f;
    }
    default: {
        static const uint32_t specials[] = {
            0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
            0xffc00000, 0x7f800001, 0xff800001, 0x7fbfffff, 0x7fffffff,
            0x00000001, 0x807fffff, 0x33000000, 0x33000001, 0x477fe000,
            0x477ff000, 0x477fefff, 0x38800000, 0x387fc000, 0x7f7fffff,
            0x7f7f8000, 0x3f808000, 0x3f818000,
        };
        uint32_t u = specials[(r >> 8) % (sizeof specials / 4)];
        /* and ties: a float16 / bfloat16 value plus exactly half an ulp */
        if ((r >> 16) & 1)
            u = ((uint32_t)(r >> 32) & 0xffffe000u) | 0x1000u;
        else if ((r >> 17) & 1)
            u = ((uint32_t)(r >> 32) & 0xffff0000u) | 0x8000u;
        return bitsf(u);
    }
    }
}

/* The paths to test: 0 = whatever the CPU offers, 1 = forced scalar. */
static void use_path(int scalar)
{
    kolo__half_force_scalar(scalar);
}

/* ---- the two formats ----------------------------------------------------- */

/* What the tests need of a 16-bit format: its mantissa width, the
 * library's conversions (arrays and one value), the reference rounding,
 * the float NaNs to narrow, and its own check of what widening pattern x
 * gave (f). */
typedef struct format {
    const char *name;
    int mbits;
    void (*narrow)(const float *, uint16_t *, size_t);
    void (*widen)(const uint16_t *, float *, size_t);
    uint16_t (*narrow_one)(float);
    float (*widen_one)(uint16_t);
    uint16_t (*ref_narrow)(float);
    const uint32_t *nans;
    size_t n_nans;
    void (*check_pattern)(uint16_t x, float f);
} format_t;

static int is_nan(const format_t *fmt, uint16_t h)
{
    int emax = (1 << (15 - fmt->mbits)) - 1;
    return ((h >> fmt->mbits) & emax) == emax &&
           (h & ((1 << fmt->mbits) - 1)) != 0;
}

/* A NaN's quiet bit: the mantissa's first. */
static uint16_t quiet_bit(const format_t *fmt)
{
    return (uint16_t)(1 << (fmt->mbits - 1));
}

/* A float16 NaN widens to a quiet NaN with the same sign and payload. */
static void check_f16_pattern(uint16_t x, float f)
{
    uint32_t u = fbits(f);

    if ((x & 0x7c00) != 0x7c00 || (x & 0x3ff) == 0)
        return;
    ck_assert_msg(isnan(f), "0x%04x -> not NaN", x);
    ck_assert_msg((u >> 31) == (uint32_t)(x >> 15), "sign of 0x%04x", x);
    ck_assert_msg(u & 0x00400000u, "0x%04x -> signaling", x);
    ck_assert_msg(((u >> 13) & 0x1ff) == (x & 0x1ffu), "payload of 0x%04x", x);
}

/* A bfloat16 widens exactly and bit for bit, NaNs included. */
static void check_bf16_pattern(uint16_t x, float f)
{
    ck_assert_uint_eq(fbits(f), (uint32_t)x << 16);
}

/* float NaNs stay NaN, keep their sign, become quiet, even when their
 * payload lies only in the bits that are dropped. */
static const uint32_t f16_nans[] = {0x7f800001, 0xff800001, 0x7fc00000,
                                    0x7fbfffff, 0xffffffff, 0x7f802000};
static const uint32_t bf16_nans[] = {0x7f800001, 0xff800001, 0x7fc00000,
                                     0x7fbfffff, 0xffffffff, 0x7f80ffff};

static const format_t formats[] = {
    {"float16", F16_MBITS, kolo__f32_to_f16, kolo__f16_to_f32,
     kolo__float_to_f16, kolo__f16_to_float, ref_to_f16, f16_nans,
     sizeof f16_nans / sizeof f16_nans[0], check_f16_pattern},
    {"bfloat16", BF16_MBITS, kolo__f32_to_bf16, kolo__bf16_to_f32,
     kolo__float_to_bf16, kolo__bf16_to_float, ref_to_bf16, bf16_nans,
     sizeof bf16_nans / sizeof bf16_nans[0], check_bf16_pattern},
};
#define F16 (&formats[0])
#define BF16 (&formats[1])

/* The loop index of the tests that run for each format and path: the
 * format (_i / 2: float16, bfloat16) and the path (_i % 2: 0 = run-time,
 * 1 = forced scalar), which it sets. */
static const format_t *format_and_path(int i)
{
    use_path(i % 2);
    return &formats[i / 2];
}

/* ---- every pattern ------------------------------------------------------- */

/* Every pattern: widened exactly (NaN: a quiet NaN, as the format's own
 * check says), and narrowed back to itself (NaN: the quiet version). */
static void check_exhaustive(const format_t *fmt)
{
    uint16_t *h = malloc(65536 * sizeof *h), *back = malloc(65536 * 2);
    float *f = malloc(65536 * sizeof *f);
    ck_assert(h && back && f);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    fmt->widen(h, f, 65536);
    fmt->narrow(f, back, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t x = (uint16_t)i;
        double ref = ref_value(x, fmt->mbits);
        fmt->check_pattern(x, f[i]);
        ck_assert_uint_eq(fbits(f[i]), fbits(fmt->widen_one(x)));
        if (is_nan(fmt, x)) {
            ck_assert(isnan(f[i]));
            ck_assert_msg(back[i] == (x | quiet_bit(fmt)),
                          "%s NaN 0x%04x came back as 0x%04x", fmt->name, x,
                          back[i]);
        } else {
            ck_assert_msg((double)f[i] == ref && !signbit(f[i]) == !signbit(ref),
                          "%s 0x%04x -> %a, want %a", fmt->name, x,
                          (double)f[i], ref);
            ck_assert_msg(back[i] == x, "%s 0x%04x came back as 0x%04x",
                          fmt->name, x, back[i]);
        }
        ck_assert_uint_eq(back[i], fmt->narrow_one(f[i]));
    }
    free(h);
    free(back);
    free(f);
}

START_TEST(exhaustive)
{
    check_exhaustive(format_and_path(_i));
    use_path(0);
}
END_TEST

/* ---- rounding corner cases ---------------------------------------------- */

/* One float narrowed by the array path, the one-value path and the
 * reference gives `want`. */
static void check_narrowed(const format_t *fmt, float in, uint16_t want)
{
    uint16_t got;

    fmt->narrow(&in, &got, 1);
    ck_assert_msg(got == want, "%s: %a (0x%08x) -> 0x%04x, want 0x%04x",
                  fmt->name, (double)in, fbits(in), got, want);
    ck_assert_uint_eq(fmt->narrow_one(in), want);
    ck_assert_uint_eq(fmt->ref_narrow(in), want);
}

/* The format's NaNs narrowed: NaN, the same sign, quiet. */
static void check_nans_narrowed(const format_t *fmt)
{
    for (size_t i = 0; i < fmt->n_nans; i++) {
        float f = bitsf(fmt->nans[i]);
        uint16_t got;
        fmt->narrow(&f, &got, 1);
        ck_assert_msg(is_nan(fmt, got) && (got & quiet_bit(fmt)) &&
                          (got >> 15) == (fmt->nans[i] >> 31),
                      "%s: NaN 0x%08x -> 0x%04x", fmt->name, fmt->nans[i],
                      got);
    }
}

static const struct {
    float in;
    uint16_t out;
} f16_cases[] = {
    {1.0f, 0x3c00},
    {-2.0f, 0xc000},
    {0.0f, 0x0000},
    {-0.0f, 0x8000},
    /* ties to even in the normal range: 1 + 2^-11 is half-way between 1
     * and 1 + 2^-10 (odd) -> 1; 1 + 3 * 2^-11 -> 1 + 2^-9 (even) */
    {0x1.002p0f, 0x3c00},
    {0x1.006p0f, 0x3c02},
    {0x1.002002p0f, 0x3c01}, /* just above the tie */
    {0x1.001ffep0f, 0x3c00}, /* just below the tie */
    /* largest finite, overflow */
    {65504.0f, 0x7bff},
    {65519.996f, 0x7bff},
    {65520.0f, 0x7c00}, /* tie with 65536: even -> infinity */
    {-65520.0f, 0xfc00},
    {1e10f, 0x7c00},
    {-1e10f, 0xfc00},
    {INFINITY, 0x7c00},
    {-INFINITY, 0xfc00},
    {0x1.fffffep127f, 0x7c00},
    /* subnormals */
    {0x1p-24f, 0x0001},  /* smallest subnormal */
    {-0x1p-24f, 0x8001},
    {0x1p-25f, 0x0000},  /* tie between 0 and 2^-24: even -> 0 */
    {0x1.000002p-25f, 0x0001},
    {0x1p-26f, 0x0000},
    {0x3p-25f, 0x0002},  /* 1.5 * 2^-24: tie between 1 and 2 -> 2 */
    {0x5p-25f, 0x0002},  /* 2.5 * 2^-24: tie between 2 and 3 -> 2 */
    {0x7p-25f, 0x0004},  /* 3.5 -> 4 */
    {0x1.4p-24f, 0x0001}, /* 1.25 -> 1 */
    {0x1.cp-24f, 0x0002}, /* 1.75 -> 2 */
    {0x3ffp-24f, 0x03ff}, /* largest subnormal */
    {0x7ffp-25f, 0x0400}, /* 1023.5 * 2^-24: tie -> 1024 (even), normal */
    {0x7fdp-25f, 0x03fe}, /* 1022.5 -> 1022 */
    {0x1p-14f, 0x0400},  /* smallest normal */
    {0x1p-149f, 0x0000}, /* float subnormal */
    {-0x1p-149f, 0x8000},
    {0x1.ffep-15f, 0x0400}, /* rounds up into the smallest normal */
};

START_TEST(f16_rounding_cases)
{
    use_path(_i);
    for (size_t i = 0; i < sizeof f16_cases / sizeof f16_cases[0]; i++)
        check_narrowed(F16, f16_cases[i].in, f16_cases[i].out);
    check_nans_narrowed(F16);
    use_path(0);
}
END_TEST

static const struct {
    uint32_t in; /* float bits */
    uint16_t out;
} bf16_cases[] = {
    {0x3f800000, 0x3f80}, /* 1 */
    {0x3f808000, 0x3f80}, /* tie, kept part even -> down */
    {0x3f818000, 0x3f82}, /* tie, kept part odd -> up */
    {0x3f808001, 0x3f81}, /* just above the tie */
    {0x3f807fff, 0x3f80}, /* just below */
    {0x7f7f0000, 0x7f7f}, /* largest finite */
    {0x7f7f7fff, 0x7f7f},
    {0x7f7f8000, 0x7f80}, /* tie with 2^128: even -> infinity */
    {0x7f7fffff, 0x7f80}, /* FLT_MAX overflows */
    {0xff7fffff, 0xff80},
    {0x7f800000, 0x7f80},
    {0xff800000, 0xff80},
    {0x00000000, 0x0000},
    {0x80000000, 0x8000},
    {0x00000001, 0x0000}, /* float subnormals round in the bf16 grid */
    {0x00008000, 0x0000}, /* tie -> even 0 */
    {0x00018000, 0x0002}, /* tie -> even 2 */
    {0x00008001, 0x0001},
    {0x007fffff, 0x0080}, /* largest float subnormal -> smallest normal */
};

START_TEST(bf16_rounding_cases)
{
    use_path(_i);
    for (size_t i = 0; i < sizeof bf16_cases / sizeof bf16_cases[0]; i++)
        check_narrowed(BF16, bitsf(bf16_cases[i].in), bf16_cases[i].out);
    check_nans_narrowed(BF16);
    use_path(0);
}
END_TEST

/* ---- random floats against the independent reference ------------------- */

static void check_random(const format_t *fmt)
{
    enum { N = 1000000 };
    float *f = malloc(N * sizeof *f);
    uint16_t *h = malloc(N * sizeof *h);
    ck_assert(f && h);
    for (size_t i = 0; i < N; i++)
        f[i] = rnd_float();
    fmt->narrow(f, h, N);
    for (size_t i = 0; i < N; i++) {
        if (isnan(f[i])) {
            ck_assert_msg(is_nan(fmt, h[i]), "%s: NaN %08x", fmt->name,
                          fbits(f[i]));
            continue;
        }
        uint16_t want = fmt->ref_narrow(f[i]);
        ck_assert_msg(h[i] == want, "%s: %a (0x%08x) -> 0x%04x, want 0x%04x",
                      fmt->name, (double)f[i], fbits(f[i]), h[i], want);
    }
    free(f);
    free(h);
}

START_TEST(random_vs_reference)
{
    check_random(format_and_path(_i));
    use_path(0);
}
END_TEST

/* ---- vector path == scalar path ----------------------------------------- */

static const size_t g_lengths[] = {0,  1,  2,  7,   8,   9,    15,   16,
                                   17, 31, 33, 255, 1023, 1024, 1025, 4099};

/* Converts the same input with the run-time path and the forced scalar
 * path, at many lengths and start offsets (so unaligned starts and every
 * tail length occur), plus once over the whole million elements, and
 * compares the bits. Guard elements after each output check that nothing
 * is written past n. */
static void compare_paths(const format_t *fmt)
{
    enum { N = 1000000, GUARD = 16 };
    float *f = malloc(N * sizeof *f);
    uint16_t *h = malloc(N * sizeof *h);
    uint16_t *hv = malloc((N + GUARD) * sizeof *hv);
    uint16_t *hs = malloc((N + GUARD) * sizeof *hs);
    float *fv = malloc((N + GUARD) * sizeof *fv);
    float *fs = malloc((N + GUARD) * sizeof *fs);
    ck_assert(f && h && hv && hs && fv && fs);
    for (size_t i = 0; i < N; i++) {
        f[i] = rnd_float();
        h[i] = (uint16_t)rnd();
    }

    for (size_t li = 0; li <= sizeof g_lengths / sizeof g_lengths[0]; li++) {
        for (size_t start = 0; start < 9; start++) {
            size_t n = li < sizeof g_lengths / sizeof g_lengths[0]
                           ? g_lengths[li]
                           : N - start - GUARD;
            memset(hv, 0xab, (n + GUARD) * sizeof *hv);
            memset(hs, 0xab, (n + GUARD) * sizeof *hs);
            memset(fv, 0xab, (n + GUARD) * sizeof *fv);
            memset(fs, 0xab, (n + GUARD) * sizeof *fs);
            use_path(0);
            fmt->narrow(f + start, hv + start, n);
            fmt->widen(h + start, fv + start, n);
            use_path(1);
            fmt->narrow(f + start, hs + start, n);
            fmt->widen(h + start, fs + start, n);
            use_path(0);
            for (size_t i = 0; i < n + GUARD; i++) {
                ck_assert_msg(hv[start + i] == hs[start + i],
                              "narrow n=%zu i=%zu in=0x%08x: vec 0x%04x "
                              "scalar 0x%04x",
                              n, i,
                              i < n ? fbits(f[start + i]) : 0u,
                              hv[start + i], hs[start + i]);
                ck_assert_msg(fbits(fv[start + i]) == fbits(fs[start + i]),
                              "widen n=%zu i=%zu in=0x%04x: vec 0x%08x "
                              "scalar 0x%08x",
                              n, i, i < n ? h[start + i] : 0u,
                              fbits(fv[start + i]), fbits(fs[start + i]));
            }
            if (li == sizeof g_lengths / sizeof g_lengths[0])
                break; /* the whole-array run needs no other offsets */
        }
    }
    free(f);
    free(h);
    free(hv);
    free(hs);
    free(fv);
    free(fs);
}

START_TEST(vector_equals_scalar)
{
    compare_paths(&formats[_i]);
}
END_TEST

/* The forced-scalar switch really switches, and switches back. */
START_TEST(force_scalar_switch)
{
    int simd = kolo__half_simd();
    kolo__half_force_scalar(1);
    ck_assert_int_eq(kolo__half_simd(), 0);
    kolo__half_force_scalar(0);
    ck_assert_int_eq(kolo__half_simd(), simd);
}
END_TEST

/* The conversions must not depend on the FPU rounding mode. */
START_TEST(rounding_mode_independent)
{
    use_path(_i);
    static const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    float in[3] = {0x1.002p0f, 0x1.006p0f, 0x3p-25f};
    uint16_t want16[3] = {0x3c00, 0x3c02, 0x0002};
    float bin[2] = {bitsf(0x3f808000), bitsf(0x3f818000)};
    uint16_t wantbf[2] = {0x3f80, 0x3f82};
    for (size_t m = 0; m < 3; m++) {
        uint16_t out16[3], outbf[2];
        ck_assert_int_eq(fesetround(modes[m]), 0);
        kolo__f32_to_f16(in, out16, 3);
        kolo__f32_to_bf16(bin, outbf, 2);
        fesetround(FE_TONEAREST);
        for (int i = 0; i < 3; i++)
            ck_assert_uint_eq(out16[i], want16[i]);
        for (int i = 0; i < 2; i++)
            ck_assert_uint_eq(outbf[i], wantbf[i]);
    }
    use_path(0);
}
END_TEST

static Suite *half_suite(void)
{
    Suite *s = suite_create("half");
    TCase *tc = tcase_create("conversions");
    /* exhaustive and million-element loops are slow under sanitizers */
    tcase_set_timeout(tc, 600);
    /* loop index _i: see format_and_path */
    tcase_add_loop_test(tc, exhaustive, 0, 4);
    tcase_add_loop_test(tc, random_vs_reference, 0, 4);
    /* loop index _i: 0 = run-time path, 1 = forced scalar */
    tcase_add_loop_test(tc, f16_rounding_cases, 0, 2);
    tcase_add_loop_test(tc, bf16_rounding_cases, 0, 2);
    /* loop index _i: the format */
    tcase_add_loop_test(tc, vector_equals_scalar, 0, 2);
    tcase_add_test(tc, force_scalar_switch);
    tcase_add_loop_test(tc, rounding_mode_independent, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int simd = kolo__half_simd();
    printf("test-half: vector paths on this CPU: float16 %s, bfloat16 %s\n",
           simd & KOLO__HALF_SIMD_F16C ? "F16C (exercised)"
                                       : "none (scalar only)",
           simd & KOLO__HALF_SIMD_AVX2 ? "AVX2 (exercised)"
                                       : "none (scalar only)");
    return kolo_unit_run(half_suite());
}
