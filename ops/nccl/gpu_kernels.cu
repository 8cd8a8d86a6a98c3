/*
 * gpu_kernels.cu — the CUDA kernels of the GPU path (gpu_kernels.h): batched
 * copies that may convert float32 <-> float16/bfloat16 and scale on the way,
 * scaling, averaging and zeroing of device buffers.
 *
 * DESIGN
 *
 * One kernel shape does all the element-wise work: a batch of up to
 * BATCH_MAX (src, dst, count) triples travels by value in the kernel's
 * parameters (a __grid_constant__ struct of about 3.6 KB, under the 4 KB
 * that every supported architecture takes), together with an element
 * operation (a small functor: convert, scale, divide). The copies of a batch
 * get blocks in proportion to their sizes: `first[i]` is the first block of
 * copy i, so a launch is a one-dimensional grid in which each block finds
 * its copy by binary search over `first` and then walks that copy with a
 * grid-stride loop over its own blocks only. A batch of one large tensor and
 * a hundred small biases thus launches one kernel, and the large tensor gets
 * most of the blocks instead of one row of a grid whose other rows finish
 * at once. Batches of more than BATCH_MAX copies take one launch per
 * BATCH_MAX copies, on the same stream, in order.
 *
 * Vectorization. Each thread moves 16 bytes at a time where alignment
 * allows. A plain copy (same dtype, no scaling) is a byte copy: it picks
 * the widest word (16, 8, 4, 2 or 1 bytes) in which source and destination
 * are equally misaligned, copies the few bytes before the first aligned
 * word and after the last one separately, and moves whole words between.
 * Element-wise operations load V elements (16 bytes of the wider of the two
 * types) at a time when, after a head of fewer than V elements that aligns
 * the source, the destination is aligned as well; otherwise they go one
 * element at a time. Elements must be aligned to their own size there
 * (cudaMalloc'd buffers at element offsets always are): a misaligned one is
 * refused on the host with cudaErrorInvalidValue, since the device would
 * fault and lose the context.
 *
 * Semantics. Every result is bit-identical to the host path's (reduce.c,
 * half.c) except for the payload and sign of a NaN produced by arithmetic
 * (the GPU returns its canonical NaN where x86 propagates the operand's):
 * a NaN stays a NaN; and float16 scaling, which is Horovod's on CUDA
 * (kolo__scale_device, reduce.h): the factor is rounded to float16 first,
 * so the product is __hmul's, computed exactly in float32 and rounded
 * once. Unscaled conversions do no arithmetic, so they keep
 * the host's NaN bits exactly. Scaling a converting copy happens on the
 * 16-bit side, as the host does it: float32 -> 16 bits is converted first
 * and then scaled as kolo__scale scales a 16-bit buffer (widen, multiply by
 * (float)scale, round once), like the host's pack-then-prescale; 16 bits ->
 * float32 is scaled that way first and then widened, like the host's
 * postscale-then-unpack. The arithmetic must stay IEEE: the default flags
 * (no --use_fast_math) keep division correctly rounded and subnormals
 * (-ftz=false), and no expression here has a multiply-add to contract.
 *
 * Errors. Arguments are checked on the host before anything is queued, so
 * an invalid batch launches nothing (an unknown dtype or an unsupported
 * conversion is refused even with nothing to do; otherwise n == 0, empty
 * copies, a scale of 1.0 or a divisor <= 1 return 0 without touching the
 * device); then each launch is checked with cudaGetLastError(). No
 * exceptions are thrown and nothing exits: every failure is a returned
 * cudaError_t. The functions keep no state, so any thread may call them.
 */
#include "gpu_kernels.h"

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "kolo.h"

namespace {

/* ---- launch shape -------------------------------------------------------- */

enum {
    BATCH_MAX = 128,    /* copies per launch */
    THREADS = 256,      /* threads per block */
    /* Vectors a thread handles, for sizing the grid: a guess to be measured
     * on a GPU; fewer means more loads in flight for mid-sized copies. */
    UNITS_PER_THREAD = 2,
    BLOCKS_PER_COPY_MAX = 1024 /* then the grid-stride loop takes over */
};

/* A batch, in structure-of-arrays form. copy i is count[i] elements (bytes
 * for plain copies) from src[i] to dst[i], on blocks [first[i],
 * first[i + 1]) of the grid. */
struct batch_t {
    const void *src[BATCH_MAX];
    void *dst[BATCH_MAX];
    size_t count[BATCH_MAX];
    unsigned first[BATCH_MAX + 1];
    int n;
};
static_assert(sizeof(batch_t) + 32 <= 4096,
              "a batch must fit the 4 KB of kernel parameters");

/* The copy this block works on: the last i with first[i] <= blockIdx.x.
 * Uniform across the block, so no divergence. */
__device__ __forceinline__ int batch_find(const batch_t &b)
{
    unsigned blk = blockIdx.x;
    int lo = 0, hi = b.n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b.first[mid] <= blk)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---- 16-bit float formats ------------------------------------------------ */

/* float16, as half.h: widening is exact and makes a NaN quiet, keeping its
 * sign and payload; narrowing rounds to nearest even, and a NaN keeps its
 * sign and top payload bits and gets the quiet bit. The hardware conversions
 * do the finite and infinite cases (round to nearest even, overflow to
 * infinity, float16 subnormals exact); NaNs are done on the bits, because
 * the hardware returns a canonical NaN. */
struct fmt_f16 {
    static __device__ __forceinline__ float widen(uint16_t h)
    {
        if ((h & 0x7c00u) == 0x7c00u) {
            uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
            uint32_t mant = h & 0x3ffu;
            return __uint_as_float(sign | 0x7f800000u | (mant << 13) |
                                   (mant ? 0x00400000u : 0u));
        }
        return __half2float(__ushort_as_half(h));
    }
    static __device__ __forceinline__ uint16_t narrow(float f)
    {
        uint32_t x = __float_as_uint(f);
        if ((x & 0x7fffffffu) > 0x7f800000u)
            return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u |
                              ((x >> 13) & 0x3ffu));
        return __half_as_ushort(__float2half_rn(f));
    }
};

/* bfloat16, as half.h: the top half of a float32. Narrowing is the same
 * integer rounding as the host's (cheaper than the intrinsic, and it keeps
 * NaN payloads). */
struct fmt_bf16 {
    static __device__ __forceinline__ float widen(uint16_t b)
    {
        return __uint_as_float((uint32_t)b << 16);
    }
    static __device__ __forceinline__ uint16_t narrow(float f)
    {
        uint32_t x = __float_as_uint(f);
        if ((x & 0x7fffffffu) > 0x7f800000u)
            return (uint16_t)((x >> 16) | 0x0040u);
        /* Round to nearest even: add 0x7fff plus the lowest kept bit. */
        x += 0x7fffu + ((x >> 16) & 1u);
        return (uint16_t)(x >> 16);
    }
};

/* ---- element operations (kolo__scale, kolo__average, conversions) ------- */

template <typename T> struct int_range;
template <> struct int_range<uint8_t> {
    static constexpr int64_t lo = 0, hi = UINT8_MAX;
};
template <> struct int_range<int8_t> {
    static constexpr int64_t lo = INT8_MIN, hi = INT8_MAX;
};
template <> struct int_range<uint16_t> {
    static constexpr int64_t lo = 0, hi = UINT16_MAX;
};
template <> struct int_range<int16_t> {
    static constexpr int64_t lo = INT16_MIN, hi = INT16_MAX;
};
template <> struct int_range<int32_t> {
    static constexpr int64_t lo = INT32_MIN, hi = INT32_MAX;
};
template <> struct int_range<int64_t> {
    static constexpr int64_t lo = INT64_MIN, hi = INT64_MAX;
};

/* Integer scaling: the product in double, truncated toward zero, saturated
 * to the type's range; NaN gives 0. The bounds are the host's expressions
 * ((double)MAX + 1.0, (double)MIN - 1.0), so they round the same way. */
template <typename T> struct scale_int {
    double f;
    __device__ __forceinline__ T operator()(T x) const
    {
        double r = (double)x * f;
        if (r != r)
            return 0;
        if (r >= (double)int_range<T>::hi + 1.0)
            return (T)int_range<T>::hi;
        if (r <= (double)int_range<T>::lo - 1.0)
            return (T)int_range<T>::lo;
        return (T)(int64_t)r; /* in range: the cast truncates */
    }
};

/* float32: the factor rounded to float32, a float32 product (the host's
 * kolo__scale, Horovod's ScaleBuffer). */
struct scale_f32 {
    float f;
    __device__ __forceinline__ float operator()(float x) const
    {
        return __fmul_rn(x, f);
    }
};

struct scale_f64 {
    double f;
    __device__ __forceinline__ double operator()(double x) const
    {
        return x * f;
    }
};

/* 16-bit floats: widened, multiplied by (float)factor, rounded once. */
template <typename F> struct scale_half {
    float f;
    __device__ __forceinline__ uint16_t operator()(uint16_t h) const
    {
        return F::narrow(F::widen(h) * f);
    }
};

/* Average: x / d, computed in W and rounded once to T. Integers divide
 * exactly, truncating toward zero, in int32_t when the divisor fits (much
 * cheaper on the GPU than int64_t, and the same quotient for types up to
 * 32 bits), else in int64_t. float32 is correctly rounded in float while
 * d is exact as a float (d <= 2^24), else in double (see reduce.c's
 * div_f32); float64 divides in double. */
template <typename T, typename W> struct div_in {
    W d;
    __device__ __forceinline__ T operator()(T x) const
    {
        return (T)((W)x / d);
    }
};

template <typename F> struct div_half {
    float d;
    __device__ __forceinline__ uint16_t operator()(uint16_t h) const
    {
        return F::narrow(F::widen(h) / d);
    }
};

/* float32 -> 16 bits, then (if scaled) scaled as a 16-bit buffer. */
template <typename F> struct f32_to_half {
    float f;
    int scaled;
    __device__ __forceinline__ uint16_t operator()(float x) const
    {
        uint16_t h = F::narrow(x);
        return scaled ? F::narrow(F::widen(h) * f) : h;
    }
};

/* 16 bits -> float32, scaled (if asked) as a 16-bit buffer first. */
template <typename F> struct half_to_f32 {
    float f;
    int scaled;
    __device__ __forceinline__ float operator()(uint16_t h) const
    {
        if (scaled)
            h = F::narrow(F::widen(h) * f);
        return F::widen(h);
    }
};

/* The float multiplier of a float16 scaling: Horovod's CUDA kernels
 * multiply in half precision by the factor rounded to float32, then to
 * float16 (kolo__f16_factor's host reference). */
float f16_factor(double scale)
{
    return __half2float(__float2half_rn((float)scale));
}

/* ---- kernels --------------------------------------------------------------- */

template <typename T, int V> struct alignas(sizeof(T) * V) vec_t {
    T v[V];
};

/* Elements per vector: 16 bytes of the wider type. */
template <typename In, typename Out> struct vec_width {
    static constexpr int value =
        16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));
};

/* dst[k] = op(src[k]) for every copy of the batch. In place (src == dst)
 * is fine: every element is read and written by the same thread, in that
 * order. */
template <typename In, typename Out, typename Op>
__global__ void __launch_bounds__(THREADS)
    map_kernel(const __grid_constant__ batch_t b, const Op op)
{
    constexpr int V = vec_width<In, Out>::value;
    constexpr size_t in_align = sizeof(In) * V, out_align = sizeof(Out) * V;
    int i = batch_find(b);
    const In *src = (const In *)b.src[i];
    Out *dst = (Out *)b.dst[i];
    size_t n = b.count[i];
    size_t t = (size_t)(blockIdx.x - b.first[i]) * THREADS + threadIdx.x;
    size_t stride = (size_t)(b.first[i + 1] - b.first[i]) * THREADS;

    /* Elements before the first aligned vector of the source (the host
     * checked that src is aligned to sizeof(In)). */
    size_t head = (in_align - (uintptr_t)src % in_align) % in_align /
                  sizeof(In);
    if (head > n)
        head = n;
    if ((uintptr_t)(dst + head) % out_align != 0) {
        for (size_t k = t; k < n; k += stride)
            dst[k] = op(src[k]);
        return;
    }
    size_t nvec = (n - head) / V;
    size_t tail = head + nvec * V;
    /* head and n - tail are below V <= 16 < THREADS: block 0 of the copy
     * does them. */
    if (t < head)
        dst[t] = op(src[t]);
    if (t < n - tail)
        dst[tail + t] = op(src[tail + t]);
    const vec_t<In, V> *sv = (const vec_t<In, V> *)(src + head);
    vec_t<Out, V> *dv = (vec_t<Out, V> *)(dst + head);
    for (size_t k = t; k < nvec; k += stride) {
        vec_t<In, V> a = sv[k];
        vec_t<Out, V> r;
#pragma unroll
        for (int j = 0; j < V; j++)
            r.v[j] = op(a.v[j]);
        dv[k] = r;
    }
}

/* Copies `bytes` bytes in words of W, s and d being equally misaligned
 * modulo sizeof(W): the bytes before the first aligned word and after the
 * last one go one by one. */
template <typename W>
__device__ __forceinline__ void copy_words(const unsigned char *s,
                                           unsigned char *d, size_t bytes,
                                           size_t t, size_t stride)
{
    size_t head = (sizeof(W) - (uintptr_t)s % sizeof(W)) % sizeof(W);
    if (head > bytes)
        head = bytes;
    size_t nw = (bytes - head) / sizeof(W);
    size_t tail = head + nw * sizeof(W);
    if (t < head)
        d[t] = s[t];
    if (t < bytes - tail)
        d[tail + t] = s[tail + t];
    const W *sw = (const W *)(s + head);
    W *dw = (W *)(d + head);
    for (size_t k = t; k < nw; k += stride)
        dw[k] = sw[k];
}

/* Plain copies; counts are in bytes. */
__global__ void __launch_bounds__(THREADS)
    copy_kernel(const __grid_constant__ batch_t b)
{
    int i = batch_find(b);
    const unsigned char *s = (const unsigned char *)b.src[i];
    unsigned char *d = (unsigned char *)b.dst[i];
    size_t bytes = b.count[i];
    size_t t = (size_t)(blockIdx.x - b.first[i]) * THREADS + threadIdx.x;
    size_t stride = (size_t)(b.first[i + 1] - b.first[i]) * THREADS;
    uintptr_t skew = (uintptr_t)s ^ (uintptr_t)d;

    if ((skew & 15) == 0)
        copy_words<uint4>(s, d, bytes, t, stride);
    else if ((skew & 7) == 0)
        copy_words<uint2>(s, d, bytes, t, stride);
    else if ((skew & 3) == 0)
        copy_words<unsigned int>(s, d, bytes, t, stride);
    else if ((skew & 1) == 0)
        copy_words<unsigned short>(s, d, bytes, t, stride);
    else
        copy_words<unsigned char>(s, d, bytes, t, stride);
}

/* ---- host side ------------------------------------------------------------- */

size_t dtype_size(int dtype)
{
    switch (dtype) {
    case KOLO_UINT8: case KOLO_INT8: case KOLO_BOOL: return 1;
    case KOLO_UINT16: case KOLO_INT16: case KOLO_FLOAT16: case KOLO_BFLOAT16:
        return 2;
    case KOLO_INT32: case KOLO_FLOAT32: return 4;
    case KOLO_INT64: case KOLO_FLOAT64: return 8;
    default: return 0;
    }
}

/* Blocks for a copy of `units` vectors (or words). */
unsigned blocks_for(size_t units)
{
    size_t per_block = (size_t)THREADS * UNITS_PER_THREAD;
    size_t blocks = units / per_block + 1;
    return blocks < BLOCKS_PER_COPY_MAX ? (unsigned)blocks
                                        : (unsigned)BLOCKS_PER_COPY_MAX;
}

/* Splits the copies into batches of at most BATCH_MAX non-empty copies and
 * calls launch(batch, blocks) for each, in order; stops at the first error.
 * count_mult turns counts into what the kernel counts (bytes for plain
 * copies); per_unit is how many of those a thread moves at a time. The
 * caller has validated everything. */
template <typename Launch>
int for_each_batch(const kolo__gpu_copy_t *copies, size_t n,
                   size_t count_mult, size_t per_unit, Launch launch)
{
    batch_t b;
    unsigned blocks = 0;
    int rc;

    memset(&b, 0, sizeof b);
    for (size_t k = 0; k < n; k++) {
        size_t count = copies[k].count * count_mult;
        if (count == 0)
            continue;
        b.src[b.n] = copies[k].src;
        b.dst[b.n] = copies[k].dst;
        b.count[b.n] = count;
        b.first[b.n] = blocks;
        blocks += blocks_for(count / per_unit);
        if (++b.n == BATCH_MAX) {
            b.first[b.n] = blocks;
            if ((rc = launch(b, blocks)) != 0)
                return rc;
            memset(&b, 0, sizeof b);
            blocks = 0;
        }
    }
    if (b.n == 0)
        return 0;
    b.first[b.n] = blocks;
    return launch(b, blocks);
}

/* Runs op over the copies (elements of In to elements of Out). */
template <typename In, typename Out, typename Op>
int run_map(const kolo__gpu_copy_t *copies, size_t n, Op op,
            cudaStream_t stream)
{
    for (size_t k = 0; k < n; k++) {
        if (copies[k].count == 0)
            continue;
        if ((uintptr_t)copies[k].src % sizeof(In) != 0 ||
            (uintptr_t)copies[k].dst % sizeof(Out) != 0 ||
            copies[k].src == NULL || copies[k].dst == NULL)
            return (int)cudaErrorInvalidValue;
    }
    return for_each_batch(
        copies, n, 1, vec_width<In, Out>::value,
        [&](const batch_t &b, unsigned blocks) {
            map_kernel<In, Out, Op><<<blocks, THREADS, 0, stream>>>(b, op);
            return (int)cudaGetLastError();
        });
}

/* The same as run_map, in place over one buffer. */
template <typename T, typename Op>
int run_inplace(void *buf, size_t n, Op op, cudaStream_t stream)
{
    kolo__gpu_copy_t c = {buf, buf, n};
    return run_map<T, T, Op>(&c, 1, op, stream);
}

int run_copy(const kolo__gpu_copy_t *copies, size_t n, size_t esize,
             cudaStream_t stream)
{
    for (size_t k = 0; k < n; k++) {
        if (copies[k].count == 0)
            continue;
        if (copies[k].count > SIZE_MAX / esize || copies[k].src == NULL ||
            copies[k].dst == NULL)
            return (int)cudaErrorInvalidValue;
    }
    return for_each_batch(copies, n, esize, 16,
                          [&](const batch_t &b, unsigned blocks) {
                              copy_kernel<<<blocks, THREADS, 0, stream>>>(b);
                              return (int)cudaGetLastError();
                          });
}

/* Copies of one dtype, multiplied by scale (!= 1.0) with kolo__scale's
 * rules. */
int run_scaled_copy(const kolo__gpu_copy_t *c, size_t n, int dtype,
                    double scale, cudaStream_t s)
{
    switch (dtype) {
    case KOLO_UINT8: return run_map<uint8_t, uint8_t>(c, n, scale_int<uint8_t>{scale}, s);
    case KOLO_INT8: return run_map<int8_t, int8_t>(c, n, scale_int<int8_t>{scale}, s);
    case KOLO_UINT16: return run_map<uint16_t, uint16_t>(c, n, scale_int<uint16_t>{scale}, s);
    case KOLO_INT16: return run_map<int16_t, int16_t>(c, n, scale_int<int16_t>{scale}, s);
    case KOLO_INT32: return run_map<int32_t, int32_t>(c, n, scale_int<int32_t>{scale}, s);
    case KOLO_INT64: return run_map<int64_t, int64_t>(c, n, scale_int<int64_t>{scale}, s);
    case KOLO_FLOAT16:
        return run_map<uint16_t, uint16_t>(c, n, scale_half<fmt_f16>{f16_factor(scale)}, s);
    case KOLO_BFLOAT16:
        return run_map<uint16_t, uint16_t>(c, n, scale_half<fmt_bf16>{(float)scale}, s);
    case KOLO_FLOAT32: return run_map<float, float>(c, n, scale_f32{(float)scale}, s);
    case KOLO_FLOAT64: return run_map<double, double>(c, n, scale_f64{scale}, s);
    case KOLO_BOOL: return run_copy(c, n, 1, s); /* bool is never scaled */
    default: return (int)cudaErrorInvalidValue;
    }
}

template <typename T>
int run_div_int(void *buf, size_t n, int64_t d, cudaStream_t s)
{
    if constexpr (sizeof(T) <= 4) {
        if (d <= INT32_MAX)
            return run_inplace<T>(buf, n, div_in<T, int32_t>{(int32_t)d}, s);
    }
    return run_inplace<T>(buf, n, div_in<T, int64_t>{d}, s);
}

} /* namespace */

/* ---- the C interface ------------------------------------------------------- */

int kolo__gpu_copy_batch(const kolo__gpu_copy_t *copies, size_t n, int from,
                         int to, double scale, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    int scaled = scale != 1.0; /* NaN scales, as on the host */

    if (dtype_size(from) == 0 || dtype_size(to) == 0 ||
        (n > 0 && copies == NULL))
        return (int)cudaErrorInvalidValue;
    if (from == to)
        return scaled ? run_scaled_copy(copies, n, from, scale, s)
                      : run_copy(copies, n, dtype_size(from), s);
    if (from == KOLO_FLOAT32 && to == KOLO_FLOAT16)
        return run_map<float, uint16_t>(
            copies, n, f32_to_half<fmt_f16>{f16_factor(scale), scaled}, s);
    if (from == KOLO_FLOAT32 && to == KOLO_BFLOAT16)
        return run_map<float, uint16_t>(
            copies, n, f32_to_half<fmt_bf16>{(float)scale, scaled}, s);
    if (from == KOLO_FLOAT16 && to == KOLO_FLOAT32)
        return run_map<uint16_t, float>(
            copies, n, half_to_f32<fmt_f16>{f16_factor(scale), scaled}, s);
    if (from == KOLO_BFLOAT16 && to == KOLO_FLOAT32)
        return run_map<uint16_t, float>(
            copies, n, half_to_f32<fmt_bf16>{(float)scale, scaled}, s);
    return (int)cudaErrorInvalidValue;
}

int kolo__gpu_scale(void *buf, size_t n, int dtype, double factor,
                    void *stream)
{
    kolo__gpu_copy_t c = {buf, buf, n};

    if (dtype_size(dtype) == 0)
        return (int)cudaErrorInvalidValue;
    /* As kolo__scale: a factor of exactly 1.0 and bool leave buf as it is. */
    if (n == 0 || factor == 1.0 || dtype == KOLO_BOOL)
        return 0;
    return run_scaled_copy(&c, 1, dtype, factor, (cudaStream_t)stream);
}

int kolo__gpu_average(void *buf, size_t n, int dtype, int64_t divisor,
                      void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;

    if (dtype_size(dtype) == 0)
        return (int)cudaErrorInvalidValue;
    /* As kolo__average: divisor <= 1 and bool leave buf as it is. */
    if (n == 0 || divisor <= 1 || dtype == KOLO_BOOL)
        return 0;
    switch (dtype) {
    case KOLO_UINT8: return run_div_int<uint8_t>(buf, n, divisor, s);
    case KOLO_INT8: return run_div_int<int8_t>(buf, n, divisor, s);
    case KOLO_UINT16: return run_div_int<uint16_t>(buf, n, divisor, s);
    case KOLO_INT16: return run_div_int<int16_t>(buf, n, divisor, s);
    case KOLO_INT32: return run_div_int<int32_t>(buf, n, divisor, s);
    case KOLO_INT64: return run_div_int<int64_t>(buf, n, divisor, s);
    /* The host divides 16-bit floats by (float)divisor, whatever its size. */
    case KOLO_FLOAT16:
        return run_inplace<uint16_t>(buf, n, div_half<fmt_f16>{(float)divisor}, s);
    case KOLO_BFLOAT16:
        return run_inplace<uint16_t>(buf, n, div_half<fmt_bf16>{(float)divisor}, s);
    case KOLO_FLOAT32:
        if (divisor <= (INT64_C(1) << 24))
            return run_inplace<float>(buf, n, div_in<float, float>{(float)divisor}, s);
        return run_inplace<float>(buf, n, div_in<float, double>{(double)divisor}, s);
    case KOLO_FLOAT64:
        return run_inplace<double>(buf, n, div_in<double, double>{(double)divisor}, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

int kolo__gpu_zero(void *buf, size_t n, int dtype, void *stream)
{
    size_t esize = dtype_size(dtype);

    if (esize == 0 || n > SIZE_MAX / esize)
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    /* Zero bits are zero in every dtype (+0.0 for the floats). */
    return (int)cudaMemsetAsync(buf, 0, n * esize, (cudaStream_t)stream);
}
