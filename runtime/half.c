/*
 * half.c — array conversions between float32 and float16 / bfloat16 (see
 * half.h for the exact semantics).
 *
 * Why this file exists: reductions of 16-bit tensors widen every block to
 * float32 and narrow it back, so conversion speed matters as much as the
 * arithmetic. On x86-64 CPUs with F16C, float16 conversion is one
 * instruction per 8 elements; bfloat16 is integer shifting, which AVX2 does
 * 8 or 16 elements at a time. The vector functions are compiled with
 * target attributes, so this file builds with plain -O2 (no -mf16c), and are
 * chosen at run time with __builtin_cpu_supports; everywhere else (or with
 * kolo__half_force_scalar) the portable scalar helpers of half.h run. The
 * scalar loops and the four public conversions that choose are generated
 * (DEFINE_SCALAR, DEFINE_CONVERSION): they differ only in types and names.
 *
 * The vector paths must agree bit for bit with the scalar helpers, which
 * is what tests/unit/test-half.c checks: vcvtph2ps quiets NaNs and
 * vcvtps2ph (with an explicit round-to-nearest-even immediate, so MXCSR's
 * rounding mode does not matter) keeps the top payload bits and sets the
 * quiet bit, exactly as the scalar code does. Tails shorter than a vector
 * are copied through a small padded buffer so that they too go through the
 * same instructions.
 */
#include "half.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define KOLO_HALF_X86 1
#include <immintrin.h>
#if defined(__clang__)
#include <cpuid.h>
#endif
#else
#define KOLO_HALF_X86 0
#endif

/* ---- scalar paths -------------------------------------------------------- */

/* NAME_scalar(in, out, n): half.h's helper ELEM on every element. */
#define DEFINE_SCALAR(NAME, IN_T, OUT_T, ELEM)                                \
    static void NAME##_scalar(const IN_T *in, OUT_T *out, size_t n)           \
    {                                                                         \
        for (size_t i = 0; i < n; i++)                                        \
            out[i] = ELEM(in[i]);                                             \
    }

DEFINE_SCALAR(f16_to_f32, uint16_t, float, kolo__f16_to_float)
DEFINE_SCALAR(f32_to_f16, float, uint16_t, kolo__float_to_f16)
DEFINE_SCALAR(bf16_to_f32, uint16_t, float, kolo__bf16_to_float)
DEFINE_SCALAR(f32_to_bf16, float, uint16_t, kolo__float_to_bf16)

/* ---- x86 vector paths ---------------------------------------------------- */

#if KOLO_HALF_X86

__attribute__((target("avx,f16c"))) static void
f16_to_f32_f16c(const uint16_t *in, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    if (i < n) {
        uint16_t hb[8] = {0};
        float fb[8];
        memcpy(hb, in + i, (n - i) * sizeof *hb);
        _mm256_storeu_ps(fb, _mm256_cvtph_ps(_mm_loadu_si128(
                                 (const __m128i *)(const void *)hb)));
        memcpy(out + i, fb, (n - i) * sizeof *fb);
    }
}

__attribute__((target("avx,f16c"))) static void
f32_to_f16_f16c(const float *in, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i),
                                    _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(out + i), h);
    }
    if (i < n) {
        float fb[8] = {0};
        uint16_t hb[8];
        memcpy(fb, in + i, (n - i) * sizeof *fb);
        _mm_storeu_si128((__m128i *)(void *)hb,
                         _mm256_cvtps_ph(_mm256_loadu_ps(fb),
                                         _MM_FROUND_TO_NEAREST_INT));
        memcpy(out + i, hb, (n - i) * sizeof *hb);
    }
}

/* out = round16(widen(a) + widen(b)), eight at a time: the same
 * operations as widening both blocks, adding in float32 and narrowing
 * (reduce.c's block path), in one pass. out may be a and/or b (each vector
 * is loaded before it is stored). */
__attribute__((target("avx,f16c"))) static void
f16_add_f16c(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(const void *)(a + i)));
        __m256 y = _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(const void *)(b + i)));
        _mm_storeu_si128((__m128i *)(void *)(out + i),
                         _mm256_cvtps_ph(_mm256_add_ps(x, y),
                                         _MM_FROUND_TO_NEAREST_INT));
    }
    if (i < n) {
        uint16_t ha[8] = {0}, hb[8] = {0}, ho[8];
        memcpy(ha, a + i, (n - i) * sizeof *ha);
        memcpy(hb, b + i, (n - i) * sizeof *hb);
        f16_add_f16c(ho, ha, hb, 8);
        memcpy(out + i, ho, (n - i) * sizeof *ho);
    }
}

__attribute__((target("avx2"))) static void
bf16_to_f32_avx2(const uint16_t *in, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(
            _mm_loadu_si128((const __m128i *)(const void *)(in + i)));
        _mm256_storeu_si256((__m256i *)(void *)(out + i),
                            _mm256_slli_epi32(w, 16));
    }
    /* The tail is at most 7 elements of pure shifting: the scalar helper
     * is the same operation, so no padded buffer is needed. */
    bf16_to_f32_scalar(in + i, out + i, n - i);
}

/* Eight float32 (as integers) to eight bfloat16 in the low 16 bits of each
 * 32-bit lane: the same integer recipe as kolo__float_to_bf16. */
__attribute__((target("avx2"))) static inline __m256i
bf16_round8(__m256i x)
{
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i bias = _mm256_set1_epi32(0x7fff);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x0040);

    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
    /* NaN: |x| > inf as signed ints (both are non-negative after masking) */
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
    return _mm256_blendv_epi8(rounded, nan, is_nan);
}

__attribute__((target("avx2"))) static void
f32_to_bf16_avx2(const float *in, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i lo = bf16_round8(
            _mm256_loadu_si256((const __m256i *)(const void *)(in + i)));
        __m256i hi = bf16_round8(
            _mm256_loadu_si256((const __m256i *)(const void *)(in + i + 8)));
        /* Every lane is 0..0xffff, so unsigned saturation packs exactly;
         * packus works per 128-bit half (lo0-3 hi0-3 lo4-7 hi4-7), and the
         * permute puts the 64-bit quarters back in order. */
        __m256i packed = _mm256_packus_epi32(lo, hi);
        packed = _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)(void *)(out + i), packed);
    }
    f32_to_bf16_scalar(in + i, out + i, n - i);
}

#endif /* KOLO_HALF_X86 */

/* ---- run-time choice ----------------------------------------------------- */

/* -1: not probed yet; else a KOLO__HALF_SIMD_* bit set of what the CPU (and
 * OS: gcc's AVX probe checks that the OS saves the AVX state) supports.
 * Atomics because any thread may probe first; probing twice is harmless. */
static atomic_int g_cpu_simd = -1;
static atomic_int g_force_scalar = 0;

#if KOLO_HALF_X86
/* gcc's __builtin_cpu_supports knows "f16c"; clang 14's does not, so there
 * we read the CPUID bit (leaf 1, ECX bit 29) ourselves. Only consulted
 * after the "avx" probe, which also checks that the OS saves the YMM
 * registers. */
#if defined(__clang__)
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#else
static int cpu_has_f16c(void)
{
    return __builtin_cpu_supports("f16c");
}
#endif
#endif

static int cpu_simd(void)
{
    int s = atomic_load_explicit(&g_cpu_simd, memory_order_relaxed);
    if (s >= 0)
        return s;
    s = 0;
#if KOLO_HALF_X86
    /* Needed if we run before libgcc's own constructor (e.g. from another
     * constructor); harmless otherwise. */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx") && cpu_has_f16c())
        s |= KOLO__HALF_SIMD_F16C;
    if (__builtin_cpu_supports("avx2"))
        s |= KOLO__HALF_SIMD_AVX2;
#endif
    atomic_store_explicit(&g_cpu_simd, s, memory_order_relaxed);
    return s;
}

void kolo__half_force_scalar(int on)
{
    atomic_store_explicit(&g_force_scalar, on != 0, memory_order_relaxed);
}

int kolo__half_simd(void)
{
    if (atomic_load_explicit(&g_force_scalar, memory_order_relaxed))
        return 0;
    return cpu_simd();
}

int kolo__f16_add(uint16_t *out, const uint16_t *a, const uint16_t *b,
                  size_t n)
{
#if KOLO_HALF_X86
    if (kolo__half_simd() & KOLO__HALF_SIMD_F16C) {
        f16_add_f16c(out, a, b, n);
        return 1;
    }
#endif
    (void)out, (void)a, (void)b, (void)n;
    return 0;
}

/* kolo__NAME: the vector path NAME_VEC where the CPU has SIMD (a
 * KOLO__HALF_SIMD_* bit), else NAME_scalar. */
#if KOLO_HALF_X86
#define DEFINE_CONVERSION(NAME, IN_T, OUT_T, SIMD, VEC)                       \
    void kolo__##NAME(const IN_T *in, OUT_T *out, size_t n)                   \
    {                                                                         \
        if (kolo__half_simd() & (SIMD))                                       \
            NAME##_##VEC(in, out, n);                                         \
        else                                                                  \
            NAME##_scalar(in, out, n);                                        \
    }
#else
#define DEFINE_CONVERSION(NAME, IN_T, OUT_T, SIMD, VEC)                       \
    void kolo__##NAME(const IN_T *in, OUT_T *out, size_t n)                   \
    {                                                                         \
        NAME##_scalar(in, out, n);                                            \
    }
#endif

DEFINE_CONVERSION(f16_to_f32, uint16_t, float, KOLO__HALF_SIMD_F16C, f16c)
DEFINE_CONVERSION(f32_to_f16, float, uint16_t, KOLO__HALF_SIMD_F16C, f16c)
DEFINE_CONVERSION(bf16_to_f32, uint16_t, float, KOLO__HALF_SIMD_AVX2, avx2)
DEFINE_CONVERSION(f32_to_bf16, float, uint16_t, KOLO__HALF_SIMD_AVX2, avx2)
