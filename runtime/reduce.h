/*
 * reduce.h — element-wise reduction kernels for every (dtype, op) pair of
 * kolo.h, plus the helpers around them: averaging, scaling, and the local
 * gradient accumulator of backward_passes.
 *
 * Why one module: the semantics promised by kolo.h (integers wrap, bool is
 * logical, 16-bit floats are computed in float32 and rounded once, AVERAGE
 * truncates integers) must be identical in every place that reduces data,
 * whichever backend moves the bytes.
 *
 * Semantics shared by all kernels:
 *  - Integers wrap modulo 2^bits, like unsigned arithmetic (no undefined
 *    behaviour on signed overflow).
 *  - float MIN / MAX propagate NaN: if either operand is NaN the result is
 *    NaN (a NaN gradient should not be hidden by the reduction). Between
 *    -0 and +0 they return either one.
 *  - bool is one byte; any non-zero byte counts as true and results are
 *    always 0 or 1. SUM and MAX are logical or, MIN and PRODUCT logical and.
 *  - float16 / bfloat16 are widened to float32, combined in float32 and
 *    rounded to 16 bits once per call (see half.h for the rounding).
 */
#ifndef KOLO_REDUCE_H
#define KOLO_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "kolo.h"

/* out[i] = a[i] OP b[i] for i < n. out may be the same buffer as a, as b,
 * or as both (in place); other partial overlaps are not supported. */
typedef void (*kolo__reduce_fn)(void *out, const void *a, const void *b,
                                size_t n);

/* The kernel for (dtype, op). AVERAGE gives the SUM kernel: the caller
 * divides afterwards (kolo__average). NULL for an unknown dtype or op, and
 * for AVERAGE of bool, which kolo.h refuses. */
kolo__reduce_fn kolo__reduce_get(kolo_dtype_t dtype, kolo_op_t op);

/* 1 if (dtype, op) is a known pair the runtime accepts; 0 for AVERAGE of
 * bool and for an unknown dtype or op. */
int kolo__op_valid_for_dtype(kolo_dtype_t dtype, kolo_op_t op);

/* Multiplies the n elements of buf by factor, in place (pre/postscale),
 * with the arithmetic of Horovod's CPU ScaleBuffer, so that scaled results
 * agree with horovod bit for bit:
 *  - float32: factor rounded to float32, then a float32 product.
 *  - float64: computed in double.
 *  - float16 / bfloat16: widened to float32, multiplied by (float)factor,
 *    rounded once back to 16 bits (to nearest even).
 *  - integers: value * factor computed in double, then truncated toward
 *    zero; results outside the type's range saturate to its minimum or
 *    maximum (Horovod's conversion is undefined there), a NaN result gives
 *    0. int64 values beyond 2^53 lose precision in the double product (a
 *    factor of exactly 1.0 leaves every type untouched).
 *  - bool: unchanged. Unknown dtype: nothing is done. */
void kolo__scale(void *buf, size_t n, kolo_dtype_t dtype, double factor);

/* kolo__scale as Horovod's CUDA kernels scale a tensor in device memory,
 * the reference of kolo's device backends (ops/nccl's kernels, ops/simdev):
 * the same for every dtype but float16, which is scaled in half precision:
 * the factor is rounded to float32, then to float16 (nearest even), and
 * each element becomes the float16 product x * factor, rounded once (the
 * product of two float16 values is exact in float32: __hmul's result). */
void kolo__scale_device(void *buf, size_t n, kolo_dtype_t dtype,
                        double factor);

/* The factor kolo__scale_device multiplies float16 elements by. */
float kolo__f16_factor(double factor);

/* The factor an allreduce or reducescatter multiplies its result by:
 * postscale, divided by the process set's size for AVERAGE. AVERAGE is SUM
 * followed by this one scaling (kolo__scale), as in Horovod, whose
 * backends do `postscale_factor /= size` in double and scale once. */
static inline double kolo__postscale_factor(int op, double postscale,
                                            int64_t size)
{
    return op == KOLO_OP_AVERAGE && size > 1 ? postscale / (double)size
                                             : postscale;
}

/* Divides the n elements of buf by divisor, in place (the average over
 * local passes of kolo__accumulate_finish; a collective's AVERAGE is
 * kolo__postscale_factor instead).
 *  - integers: exact integer division, truncating toward zero (never goes
 *    through floating point, so int64 is exact).
 *  - float32: correctly rounded quotient (x / divisor, rounded once).
 *  - float64: x / (double)divisor.
 *  - float16 / bfloat16: float32 quotient rounded once to 16 bits.
 *  - bool: unchanged (callers refuse AVERAGE of bool earlier).
 * divisor <= 1 leaves buf unchanged. */
void kolo__average(void *buf, size_t n, kolo_dtype_t dtype, int64_t divisor);

/* Size in bytes of one accumulator element for a tensor of dtype: 4 (a
 * float32) for float16 and bfloat16, else the dtype's own size; 0 for an
 * unknown dtype. */
size_t kolo__accumulator_elem_size(kolo_dtype_t dtype);

/* acc[i] += in[i]. `in` holds n elements of dtype; `acc` holds n
 * accumulator elements (float32 for float16 / bfloat16, so that N passes
 * are rounded once, at the end; dtype otherwise, with the SUM semantics
 * above). A zero-filled acc is a valid start for every dtype. */
void kolo__accumulate(void *acc, const void *in, size_t n, kolo_dtype_t dtype);

/* Writes the accumulator into out (n elements of dtype), divided by divisor
 * when divisor > 1 with kolo__average's rules (integers truncate; float16 /
 * bfloat16 divide in float32 and round once). out may be the same buffer as
 * acc; other overlaps are not supported. */
void kolo__accumulate_finish(void *out, const void *acc, size_t n,
                             kolo_dtype_t dtype, int64_t divisor);

#endif /* KOLO_REDUCE_H */
