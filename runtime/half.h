/*
 * half.h — conversions between float32 and the two 16-bit float formats
 * kolo reduces: IEEE 754 binary16 ("float16") and bfloat16. Both are stored
 * as uint16_t bit patterns.
 *
 * Why: the runtime reduces 16-bit tensors in float32 (see kolo.h) and must
 * convert whole fusion buffers quickly, so the array functions pick an
 * F16C/AVX2 path at run time; the scalar helpers below are the reference
 * semantics, and the vector paths give bit-identical results.
 *
 * Semantics, shared by every path:
 *  - float16 -> float32 and bfloat16 -> float32 are exact. A float16 NaN
 *    becomes a quiet float32 NaN with the same sign and payload (the quiet
 *    bit is set, as the F16C instruction does); a bfloat16 NaN is widened
 *    bit for bit (bfloat16 is the top half of a float32).
 *  - float32 -> float16 / bfloat16 rounds to nearest, ties to even,
 *    whatever the FPU rounding mode. Values too large for the format become
 *    infinity; float16 subnormals are rounded correctly. A NaN stays a NaN:
 *    it keeps its sign and the top bits of its payload, and its quiet bit is
 *    set (so a payload truncated to zero cannot turn it into an infinity).
 */
#ifndef KOLO_HALF_H
#define KOLO_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Number of elements the block-wise users of these conversions (reductions
 * on 16-bit types) convert at a time into a float32 stack buffer: two
 * buffers of this size take 4 KiB, small enough to stay in L1. */
#define KOLO__HALF_BLOCK 512

static inline uint32_t kolo__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u); /* memcpy: type punning without aliasing UB */
    return u;
}

static inline float kolo__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float16 -> float32, exact. Done on integers so that it does not depend on
 * the FPU's denormals-are-zero / flush-to-zero modes. */
static inline float kolo__f16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f) /* inf, or NaN made quiet */
        return kolo__f32_from_bits(sign | 0x7f800000u | (mant << 13) |
                                   (mant ? 0x00400000u : 0));
    if (exp == 0) {
        if (mant == 0)
            return kolo__f32_from_bits(sign);
        /* Subnormal: mant * 2^-24. Shift the leading one up to bit 10,
         * where a normal number keeps its implicit bit; every shift lowers
         * the exponent by one. */
        exp = 1;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            exp--;
        }
        mant &= 0x3ffu;
    }
    /* Rebias the exponent: 127 - 15 = 112. (For subnormals exp may have
     * become 0 or negative; unsigned wrap-around adds back correctly.) */
    return kolo__f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* float32 -> float16, round to nearest even, done on integers so that the
 * result does not depend on the FPU rounding mode. */
static inline uint16_t kolo__float_to_f16(float f)
{
    uint32_t x = kolo__f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;

    if (x >= 0x7f800000u) {
        if (x == 0x7f800000u)
            return sign | 0x7c00u;
        /* NaN: keep the top 10 payload bits, force the quiet bit. */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    }
    /* 65520 = 0x477ff000 is half-way between the largest float16, 65504,
     * and 65536 (which would be the next one); the tie goes to the even
     * one, 65536, that is, to infinity. */
    if (x >= 0x477ff000u)
        return sign | 0x7c00u;
    if (x < 0x38800000u) {
        /* Below 2^-14, the smallest normal float16: the result is the
         * subnormal round(|f| * 2^24). */
        uint32_t e = x >> 23;
        if (e < 102) /* |f| < 2^-25: rounds to zero (2^-25 itself ties to 0,
                        handled below) */
            return sign;
        uint32_t m = (x & 0x7fffffu) | 0x800000u;
        /* |f| * 2^24 = m * 2^(e - 126); shift is 14..24 here */
        uint32_t shift = 126 - e;
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1)))
            r++; /* may carry into 0x400: the smallest normal, correct */
        return (uint16_t)(sign | r);
    }
    /* Normal: rebias the exponent (subtract 112 << 23) and drop 13 bits,
     * rounding to nearest even; a carry out of the mantissa correctly bumps
     * the exponent. */
    uint32_t h = (x - 0x38000000u) >> 13;
    uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

/* bfloat16 -> float32: bfloat16 is the upper half of a float32, so this is
 * exact and keeps NaNs bit for bit. */
static inline float kolo__bf16_to_float(uint16_t b)
{
    return kolo__f32_from_bits((uint32_t)b << 16);
}

/* float32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t kolo__float_to_bf16(float f)
{
    uint32_t x = kolo__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u); /* quiet bit of bfloat16 */
    /* Adding 0x7fff plus the lowest kept bit rounds to nearest even: a
     * remainder above 0x8000, or exactly 0x8000 with an odd kept part,
     * carries into bit 16. Large finite values carry into infinity, as they
     * should. Cannot overflow 32 bits: x <= 0xff800000 here. */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Array conversions. `in` and `out` must not overlap. n may be 0. They use
 * the F16C (float16) and AVX2 (bfloat16) instructions when this CPU has
 * them, with results bit-identical to the scalar helpers above. */
void kolo__f16_to_f32(const uint16_t *in, float *out, size_t n);
void kolo__f32_to_f16(const float *in, uint16_t *out, size_t n);
void kolo__bf16_to_f32(const uint16_t *in, float *out, size_t n);
void kolo__f32_to_bf16(const float *in, uint16_t *out, size_t n);

/* out = round16(widen(a) + widen(b)) in one pass where this CPU has F16C
 * (out may be a and/or b): returns 1; returns 0, doing nothing, where the
 * caller must widen, add and narrow itself (same bits either way). */
int kolo__f16_add(uint16_t *out, const uint16_t *a, const uint16_t *b,
                  size_t n);

/* on != 0: every later array conversion (in any thread) uses the portable
 * scalar code, even on a CPU with F16C/AVX2; on == 0: back to the run-time
 * choice. For tests and benchmarks. */
void kolo__half_force_scalar(int on);

/* Which vector paths the array conversions use now, as a bit set:
 * KOLO__HALF_SIMD_F16C (float16 via F16C+AVX), KOLO__HALF_SIMD_AVX2
 * (bfloat16 via AVX2). 0 when the CPU has neither or scalar is forced. */
#define KOLO__HALF_SIMD_F16C 1
#define KOLO__HALF_SIMD_AVX2 2
int kolo__half_simd(void);

#endif /* KOLO_HALF_H */
