/*
 * gpu_kernels.h — the CUDA kernels of the GPU path (gpu_kernels.cu, built by
 * nvcc), callable from C.
 *
 * Each function queues its work on `stream` (a cudaStream_t, passed as
 * void * so that C callers need no CUDA header) and returns at once with a
 * cudaError_t as int: 0 (cudaSuccess) when the launch was accepted. The
 * element-wise semantics are the host's (runtime/reduce.c, runtime/half.c),
 * so a tensor reduced on the device gives what the host path gives:
 * float16/bfloat16 conversion rounds to nearest even, scaling and averaging
 * compute in double for float64 and integers (truncated toward zero
 * afterwards) and in float32 otherwise, bfloat16 is scaled in float32 and
 * rounded once; float16 is scaled in half precision, as Horovod's CUDA
 * kernels scale it (kolo__scale_device).
 *
 * dtype arguments are kolo_dtype_t values (kolo.h).
 */
#ifndef KOLO_GPU_KERNELS_H
#define KOLO_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One copy of a batch: `count` elements from src to dst. */
typedef struct kolo__gpu_copy {
    const void *src;
    void *dst;
    size_t count;
} kolo__gpu_copy_t;

/* Performs n copies (any n; as few launches as it can), converting each
 * element from dtype `from` to dtype `to` and multiplying it by `scale`
 * (1.0: no multiplication). from == to: a copy (any dtype). Otherwise only
 * float32 -> float16, float32 -> bfloat16, float16 -> float32 and
 * bfloat16 -> float32; anything else returns cudaErrorInvalidValue (1).
 * `copies` is read before the function returns (host memory; it may be
 * reused at once). Sources and destinations must not overlap. */
int kolo__gpu_copy_batch(const kolo__gpu_copy_t *copies, size_t n, int from,
                         int to, double scale, void *stream);

/* buf[i] = buf[i] * factor for n elements of dtype, as kolo__scale. */
int kolo__gpu_scale(void *buf, size_t n, int dtype, double factor,
                    void *stream);

/* buf[i] = buf[i] / divisor for n elements of dtype, as kolo__average
 * (integers truncate toward zero). */
int kolo__gpu_average(void *buf, size_t n, int dtype, int64_t divisor,
                      void *stream);

/* buf = 0 for n elements of dtype, on the stream (a joined rank's
 * contribution). */
int kolo__gpu_zero(void *buf, size_t n, int dtype, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_GPU_KERNELS_H */
