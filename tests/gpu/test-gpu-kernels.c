/*
 * test-gpu-kernels.c — the CUDA kernels of ops/nccl/gpu_kernels.cu against
 * the host's reference: kolo__scale_device (Horovod's CUDA scaling: float16
 * in half precision, the rest as kolo__scale) and kolo__average (reduce.c)
 * and the float16/bfloat16 conversions (half.c).
 *
 * Why these tests: a tensor reduced on the GPU must give what the host path
 * gives, bit for bit (a NaN made by arithmetic may differ in payload; it
 * must stay a NaN). So every kernel runs on random data for every dtype, at
 * sizes that leave heads and tails around the vectorized middle (0, 1, 7,
 * 129, 1000003), at element offsets that misalign source and destination
 * differently, and the whole device region is read back: the bytes around
 * the result must be untouched. Batches of more copies than one launch
 * takes (128), with empty copies and one large copy among many small ones,
 * check the batching. Argument checks that need no device run first,
 * always; then, without a CUDA device, the program prints why it skips and
 * exits 77 (automake's SKIP).
 *
 * A plain C program (not Check): it must run as one process that owns the
 * CUDA context, and prints "N passed, N failed" like the rest of the suite.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_kernels.h"
#include "half.h"
#include "kolo.h"
#include "reduce.h"

/* Under AddressSanitizer, CUDA cannot initialize unless ASan leaves its
 * shadow gap unprotected (the driver maps memory there): without this the
 * test would only report that it skips. ASAN_OPTIONS still overrides it. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__clang__) && defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifdef TEST_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "protect_shadow_gap=0";
}
#endif

#define BIG 1000003
static const size_t g_sizes[] = {0, 1, 7, 129, BIG};
#define NSIZES (sizeof g_sizes / sizeof g_sizes[0])
#define GUARD 64            /* bytes after every result, checked untouched */
#define GUARD_BYTE 0xa5     /* what the destination holds before a kernel */
#define POOL_BYTES ((size_t)32 << 20) /* device and host buffers, each */
#define BATCH_LAUNCH 128    /* copies per launch in gpu_kernels.cu */

static int g_passed, g_failed;
static cudaStream_t g_stream;
static unsigned char *g_dev_src, *g_dev_dst;   /* POOL_BYTES each */
static unsigned char *g_src, *g_got, *g_want;  /* host, POOL_BYTES each */

/* ---- small helpers --------------------------------------------------------- */

static const char *dtype_name(int dtype)
{
    static const char *names[] = {"uint8",   "int8",     "uint16", "int16",
                                  "int32",   "int64",    "float16", "bfloat16",
                                  "float32", "float64", "bool"};
    return (unsigned)dtype < KOLO_DTYPE_COUNT_ ? names[dtype] : "unknown";
}

static size_t dsize(int dtype)
{
    static const size_t sizes[] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
    return (unsigned)dtype < KOLO_DTYPE_COUNT_ ? sizes[dtype] : 0;
}

static int is_float(int dtype)
{
    return dtype == KOLO_FLOAT16 || dtype == KOLO_BFLOAT16 ||
           dtype == KOLO_FLOAT32 || dtype == KOLO_FLOAT64;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void)
{
    /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1du;
}

static size_t rnd_below(size_t n)
{
    return n ? (size_t)(rnd() % n) : 0;
}

static void check(int ok, const char *fmt_what)
{
    if (ok)
        g_passed++;
    else {
        g_failed++;
        printf("FAIL: %s\n", fmt_what);
    }
}

/* float32 values where rounding to 16 bits is decided: ties, overflow,
 * subnormals, NaNs with payloads (quiet and signalling), zeros. */
static const uint32_t g_f32_special[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
    0x7f800001, 0xff812345, 0x7fbfffff, 0x7f7fffff, 0x00000001, 0x807fffff,
    0x477fe000, /* 65504, the largest float16 */
    0x477fefff, 0x477ff000, /* just below and at 65520: float16 overflow */
    0x3f801000, 0x3f803000, /* 1 + 2^-11, 1 + 3 * 2^-11: float16 ties */
    0x3f808000, 0x3f818000, /* bfloat16 ties, to even down and up */
    0x33000000, 0x33000001, 0x33c00000, /* 2^-25 (ties to 0), above, 1.5 * 2^-24 */
    0x387fc000, 0x38800000, /* float16 subnormal / smallest normal */
    0x7f7f8000, 0x7f7f7fff, /* bfloat16 overflow to inf / not */
};

/* The fill functions write through memcpy: plain copies are tested at
 * byte offsets that misalign the elements. */
static void fill_f32(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        uint32_t bits;
        switch (r & 7) {
        case 0: bits = (uint32_t)(r >> 32); break; /* any pattern */
        case 1:
            bits = g_f32_special[(r >> 8) %
                                 (sizeof g_f32_special / sizeof *g_f32_special)];
            break;
        default: {
            /* a "gradient": +-[1, 2) * 2^[-30, 30] */
            int e = (int)((r >> 8) % 61) - 30;
            float m = 1.0f + (float)((r >> 16) & 0xffffff) / 16777216.0f;
            float v = ldexpf(m, e);
            memcpy(&bits, &v, sizeof bits);
            bits |= (uint32_t)(r >> 63) << 31;
        }
        }
        memcpy(p + 4 * i, &bits, sizeof bits);
    }
}

static void fill_f64(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        double v;
        if ((r & 7) == 0) {
            uint64_t bits = rnd();
            memcpy(&v, &bits, sizeof v);
        } else if ((r & 7) == 1) {
            static const double special[] = {0.0, -0.0, INFINITY, -INFINITY,
                                             NAN, 1e308, 5e-324, -2.5};
            v = special[(r >> 8) % 8];
        } else {
            v = ldexp(1.0 + (double)(r >> 11 & 0xfffffffffffffu) / 4503599627370496.0,
                      (int)((r >> 3) % 81) - 40);
            if (r >> 63)
                v = -v;
        }
        memcpy(p + 8 * i, &v, sizeof v);
    }
}

/* n random elements of dtype at p (any alignment). */
static void fill(unsigned char *p, size_t n, int dtype)
{
    switch (dtype) {
    case KOLO_FLOAT32: fill_f32(p, n); return;
    case KOLO_FLOAT64: fill_f64(p, n); return;
    case KOLO_BOOL: {
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rnd();
            p[i] = (r & 3) == 0 ? 0 : (r & 4) ? 1 : (unsigned char)(r >> 8);
        }
        return;
    }
    default: {
        /* integers and 16-bit floats: any bit pattern (for 16-bit floats
         * that includes infinities, NaNs and subnormals) */
        size_t bytes = n * dsize(dtype);
        for (size_t i = 0; i < bytes; i += 8) {
            uint64_t r = rnd();
            memcpy(p + i, &r, bytes - i < 8 ? bytes - i : 8);
        }
        return;
    }
    }
}

static int elem_is_nan(const unsigned char *p, int dtype)
{
    uint16_t h;
    uint32_t f;
    uint64_t d;
    switch (dtype) {
    case KOLO_FLOAT16: memcpy(&h, p, 2); return (h & 0x7fffu) > 0x7c00u;
    case KOLO_BFLOAT16: memcpy(&h, p, 2); return (h & 0x7fffu) > 0x7f80u;
    case KOLO_FLOAT32: memcpy(&f, p, 4); return (f & 0x7fffffffu) > 0x7f800000u;
    case KOLO_FLOAT64:
        memcpy(&d, p, 8);
        return (d & 0x7fffffffffffffffu) > 0x7ff0000000000000u;
    default: return 0;
    }
}

static uint64_t elem_bits(const unsigned char *p, size_t es)
{
    uint64_t v = 0;
    memcpy(&v, p, es); /* little-endian: the value of the element's bits */
    return v;
}

/* 1 if the n elements at got and want are equal: bit for bit, or both NaN
 * when nan_lax (results of arithmetic). Reports the first difference. */
static int same(const unsigned char *got, const unsigned char *want, size_t n,
                int dtype, int nan_lax, const char *what)
{
    size_t es = dsize(dtype);
    for (size_t i = 0; i < n; i++) {
        const unsigned char *g = got + i * es, *w = want + i * es;
        if (memcmp(g, w, es) == 0)
            continue;
        if (nan_lax && is_float(dtype) && elem_is_nan(g, dtype) &&
            elem_is_nan(w, dtype))
            continue;
        printf("  %s: element %zu of %zu: got 0x%llx, want 0x%llx\n", what, i,
               n, (unsigned long long)elem_bits(g, es),
               (unsigned long long)elem_bits(w, es));
        return 0;
    }
    return 1;
}

/* 1 if bytes [0, a) and [b, end) of got equal GUARD_BYTE. */
static int guards_intact(const unsigned char *got, size_t a, size_t b,
                         size_t end, const char *what)
{
    for (size_t i = 0; i < end; i++) {
        if (i == a)
            i = b;
        if (i >= end)
            break;
        if (got[i] != GUARD_BYTE) {
            printf("  %s: byte %zu outside the result (%zu..%zu) changed to "
                   "0x%02x\n",
                   what, i, a, b, got[i]);
            return 0;
        }
    }
    return 1;
}

static int cuda_ok(cudaError_t rc, const char *call, int line)
{
    if (rc == cudaSuccess)
        return 1;
    printf("  line %d: %s: %s (%d)\n", line, call, cudaGetErrorString(rc),
           (int)rc);
    return 0;
}
#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)

/* Host reference of a copy: what the host path gives (see
 * gpu_kernels.cu): a plain copy; same dtype scaled as kolo__scale_device; float32
 * -> 16 bits converted, then scaled as a 16-bit buffer; 16 bits -> float32
 * scaled as a 16-bit buffer, then widened. */
static void ref_copy(const void *src, void *dst, size_t n, int from, int to,
                     double scale)
{
    if (n == 0)
        return;
    if (from == to) {
        memcpy(dst, src, n * dsize(from));
        kolo__scale_device(dst, n, (kolo_dtype_t)from, scale);
    } else if (from == KOLO_FLOAT32) {
        if (to == KOLO_FLOAT16)
            kolo__f32_to_f16(src, dst, n);
        else
            kolo__f32_to_bf16(src, dst, n);
        kolo__scale_device(dst, n, (kolo_dtype_t)to, scale);
    } else {
        uint16_t *tmp = malloc(n * sizeof *tmp);
        if (tmp == NULL) {
            printf("out of host memory\n");
            exit(1);
        }
        memcpy(tmp, src, n * sizeof *tmp);
        kolo__scale_device(tmp, n, (kolo_dtype_t)from, scale);
        if (from == KOLO_FLOAT16)
            kolo__f16_to_f32(tmp, dst, n);
        else
            kolo__bf16_to_f32(tmp, dst, n);
        free(tmp);
    }
}

/* ---- one copy -------------------------------------------------------------- */

/* One kolo__gpu_copy_batch of one copy: n elements from byte offset soff of
 * the source pool to byte offset doff of the destination pool. */
static void copy_case(int from, int to, double scale, size_t n, size_t soff,
                      size_t doff)
{
    char what[160];
    size_t ies = dsize(from), oes = dsize(to);
    size_t send = soff + n * ies, dend = doff + n * oes, end = dend + GUARD;
    kolo__gpu_copy_t c = {g_dev_src + soff, g_dev_dst + doff, n};
    int ok;

    snprintf(what, sizeof what, "copy %s -> %s scale %g n %zu offsets %zu/%zu",
             dtype_name(from), dtype_name(to), scale, n, soff, doff);
    memset(g_src, 0x5a, send);
    fill(g_src + soff, n, from);
    memset(g_want, GUARD_BYTE, end);
    ok = CUDA_OK(cudaMemcpy(g_dev_src, g_src, send, cudaMemcpyHostToDevice)) &&
         CUDA_OK(cudaMemcpy(g_dev_dst, g_want, end, cudaMemcpyHostToDevice)) &&
         CUDA_OK((cudaError_t)kolo__gpu_copy_batch(&c, 1, from, to, scale,
                                                   g_stream)) &&
         CUDA_OK(cudaStreamSynchronize(g_stream)) &&
         CUDA_OK(cudaMemcpy(g_got, g_dev_dst, end, cudaMemcpyDeviceToHost));
    if (ok) {
        ref_copy(g_src + soff, g_want + doff, n, from, to, scale);
        /* Unscaled copies and conversions are exact, NaNs included. */
        ok = guards_intact(g_got, doff, dend, end, what) &&
             same(g_got + doff, g_want + doff, n, to, scale != 1.0, what);
    }
    check(ok, what);
}

static void test_copies(void)
{
    static const size_t offs[][2] = {{0, 0}, {1, 0}, {0, 3}, {3, 1}, {5, 5}};
    static const double scales[] = {0.37, -2.5, 3.0, 1e-3};
    static const int conv[][2] = {{KOLO_FLOAT32, KOLO_FLOAT16},
                                  {KOLO_FLOAT32, KOLO_BFLOAT16},
                                  {KOLO_FLOAT16, KOLO_FLOAT32},
                                  {KOLO_BFLOAT16, KOLO_FLOAT32}};

    for (int dt = 0; dt < KOLO_DTYPE_COUNT_; dt++) {
        size_t es = dsize(dt);
        for (size_t s = 0; s < NSIZES; s++) {
            for (size_t o = 0; o < sizeof offs / sizeof *offs; o++)
                copy_case(dt, dt, 1.0, g_sizes[s], offs[o][0] * es,
                          offs[o][1] * es);
            /* A plain copy is a byte copy: any alignment, even one that
             * splits elements. */
            copy_case(dt, dt, 1.0, g_sizes[s], 1, 6);
            copy_case(dt, dt, 1.0, g_sizes[s], 7, 2);
            for (size_t k = 0; k < sizeof scales / sizeof *scales; k++)
                copy_case(dt, dt, scales[k], g_sizes[s], es, 3 * es);
        }
    }
    for (size_t p = 0; p < sizeof conv / sizeof *conv; p++) {
        int from = conv[p][0], to = conv[p][1];
        for (size_t s = 0; s < NSIZES; s++) {
            for (size_t o = 0; o < sizeof offs / sizeof *offs; o++)
                copy_case(from, to, 1.0, g_sizes[s],
                          offs[o][0] * dsize(from), offs[o][1] * dsize(to));
            for (size_t k = 0; k < sizeof scales / sizeof *scales; k++)
                copy_case(from, to, scales[k], g_sizes[s], 0, dsize(to));
        }
    }
}

/* ---- batches --------------------------------------------------------------- */

/* ncopies copies in one call: random sizes (some empty, a few large; with
 * `big`, the first one BIG elements), random element offsets into the
 * source pool (sources may overlap: they are only read), destinations one
 * after the other with random gaps. The descriptors are overwritten as soon
 * as the call returns (gpu_kernels.h allows it), and the whole destination
 * region is compared, gaps included. */
static void batch_case(int from, int to, double scale, size_t ncopies,
                       int big)
{
    char what[160];
    size_t ies = dsize(from), oes = dsize(to);
    size_t src_elems = 4 * (size_t)BIG, dst_at = 0, end;
    /* + 1: calloc(0) may return NULL */
    kolo__gpu_copy_t *dev = calloc(ncopies + 1, sizeof *dev);
    size_t *soffs = calloc(ncopies + 1, sizeof *soffs);
    size_t *doffs = calloc(ncopies + 1, sizeof *doffs);
    size_t *counts = calloc(ncopies + 1, sizeof *counts);
    int ok = dev != NULL && soffs != NULL && doffs != NULL && counts != NULL;

    snprintf(what, sizeof what, "batch of %zu copies%s %s -> %s scale %g",
             ncopies, big ? " (one large)" : "", dtype_name(from),
             dtype_name(to), scale);
    for (size_t k = 0; ok && k < ncopies; k++) {
        uint64_t r = rnd() % 100;
        size_t count = r < 10   ? 0
                       : r < 95 ? 1 + rnd_below(300)
                                : 1000 + rnd_below(20000);
        if (big && k == 0)
            count = BIG;
        soffs[k] = rnd_below(src_elems - count);
        dst_at += rnd_below(6);
        doffs[k] = dst_at;
        counts[k] = count;
        dst_at += count;
        dev[k].src = g_dev_src + soffs[k] * ies;
        dev[k].dst = g_dev_dst + doffs[k] * oes;
        dev[k].count = count;
    }
    end = dst_at * oes + GUARD;
    if (ok && (src_elems * ies > POOL_BYTES || end > POOL_BYTES)) {
        printf("  %s: the batch does not fit the pools\n", what);
        ok = 0;
    }
    if (ok) {
        fill(g_src, src_elems, from);
        memset(g_want, GUARD_BYTE, end);
        ok = CUDA_OK(cudaMemcpy(g_dev_src, g_src, src_elems * ies,
                                cudaMemcpyHostToDevice)) &&
             CUDA_OK(cudaMemcpy(g_dev_dst, g_want, end,
                                cudaMemcpyHostToDevice)) &&
             CUDA_OK((cudaError_t)kolo__gpu_copy_batch(dev, ncopies, from, to,
                                                       scale, g_stream));
        memset(dev, 0xff, ncopies * sizeof *dev);
        ok = ok && CUDA_OK(cudaStreamSynchronize(g_stream)) &&
             CUDA_OK(cudaMemcpy(g_got, g_dev_dst, end,
                                cudaMemcpyDeviceToHost));
    }
    if (ok) {
        for (size_t k = 0; k < ncopies; k++)
            ref_copy(g_src + soffs[k] * ies, g_want + doffs[k] * oes,
                     counts[k], from, to, scale);
        /* Gaps hold GUARD_BYTE in want too, and 0xa5a5... is not a NaN in
         * any float format, so the element compare checks them exactly. */
        ok = same(g_got, g_want, end / oes, to, scale != 1.0, what) &&
             guards_intact(g_got, 0, dst_at * oes, end, what);
    }
    check(ok, what);
    free(dev);
    free(soffs);
    free(doffs);
    free(counts);
}

static void test_batches(void)
{
    static const size_t counts[] = {1,   2,   BATCH_LAUNCH - 1, BATCH_LAUNCH,
                                    BATCH_LAUNCH + 1, 300, 1000};
    static const struct {
        int from, to;
        double scale;
    } kinds[] = {
        {KOLO_FLOAT32, KOLO_FLOAT32, 1.0},  {KOLO_UINT8, KOLO_UINT8, 1.0},
        {KOLO_FLOAT16, KOLO_FLOAT16, 1.0},  {KOLO_INT32, KOLO_INT32, 2.5},
        {KOLO_FLOAT32, KOLO_FLOAT32, 0.125}, {KOLO_FLOAT32, KOLO_FLOAT16, 1.0},
        {KOLO_FLOAT32, KOLO_BFLOAT16, 0.5}, {KOLO_BFLOAT16, KOLO_FLOAT32, 1.0},
        {KOLO_FLOAT16, KOLO_FLOAT32, 4.0},
    };

    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
            batch_case(kinds[k].from, kinds[k].to, kinds[k].scale, counts[c],
                       0);
        batch_case(kinds[k].from, kinds[k].to, kinds[k].scale, 300, 1);
    }
    /* All empty: nothing to launch, nothing written. */
    batch_case(KOLO_FLOAT32, KOLO_FLOAT32, 1.0, 0, 0);
}

/* ---- in place: scale, average, zero ---------------------------------------- */

enum { OP_SCALE, OP_AVERAGE, OP_ZERO };

/* One in-place kernel on n elements of dtype at byte offset off. */
static void inplace_case(int op, int dtype, size_t n, size_t off,
                         double factor, int64_t divisor, void *stream)
{
    char what[160];
    size_t es = dsize(dtype), dend = off + n * es, end = dend + GUARD;
    void *buf = g_dev_dst + off;
    int ok, rc = 0;

    if (op == OP_SCALE)
        snprintf(what, sizeof what, "scale %s n %zu offset %zu by %g",
                 dtype_name(dtype), n, off, factor);
    else if (op == OP_AVERAGE)
        snprintf(what, sizeof what, "average %s n %zu offset %zu by %lld",
                 dtype_name(dtype), n, off, (long long)divisor);
    else
        snprintf(what, sizeof what, "zero %s n %zu offset %zu%s",
                 dtype_name(dtype), n, off, stream ? "" : " (NULL stream)");
    memset(g_want, GUARD_BYTE, end);
    fill(g_want + off, n, dtype);
    ok = CUDA_OK(cudaMemcpy(g_dev_dst, g_want, end, cudaMemcpyHostToDevice));
    if (ok) {
        if (op == OP_SCALE)
            rc = kolo__gpu_scale(buf, n, dtype, factor, stream);
        else if (op == OP_AVERAGE)
            rc = kolo__gpu_average(buf, n, dtype, divisor, stream);
        else
            rc = kolo__gpu_zero(buf, n, dtype, stream);
        ok = CUDA_OK((cudaError_t)rc) &&
             CUDA_OK(cudaStreamSynchronize((cudaStream_t)stream)) &&
             CUDA_OK(cudaMemcpy(g_got, g_dev_dst, end, cudaMemcpyDeviceToHost));
    }
    if (ok) {
        if (op == OP_SCALE)
            kolo__scale_device(g_want + off, n, (kolo_dtype_t)dtype, factor);
        else if (op == OP_AVERAGE)
            kolo__average(g_want + off, n, (kolo_dtype_t)dtype, divisor);
        else
            memset(g_want + off, 0, n * es);
        ok = guards_intact(g_got, off, dend, end, what) &&
             same(g_got + off, g_want + off, n, dtype, 1, what);
    }
    check(ok, what);
}

static void test_inplace(void)
{
    /* 1.0 is a no-op on both sides; 1e10 saturates every integer type but
     * int64; NaN gives 0 for integers. */
    static const double factors[] = {0.5, -1.75, 3.0, 1.0, 1e10, -1e10,
                                     0.0, NAN};
    /* 1, 0 and negative: no-ops. 2^25 + 3: float32 divides in double.
     * 2^31 + 1: types up to 32 bits divide in int64. */
    static const int64_t divisors[] = {2,
                                       3,
                                       7,
                                       1000,
                                       1,
                                       0,
                                       -4,
                                       (INT64_C(1) << 25) + 3,
                                       (INT64_C(1) << 31) + 1,
                                       INT64_MAX};
    static const size_t offs[] = {0, 1, 3};

    for (int dt = 0; dt < KOLO_DTYPE_COUNT_; dt++) {
        size_t es = dsize(dt);
        for (size_t s = 0; s < NSIZES; s++) {
            for (size_t o = 0; o < sizeof offs / sizeof *offs; o++) {
                size_t n = g_sizes[s], off = offs[o] * es;
                for (size_t f = 0; f < sizeof factors / sizeof *factors; f++)
                    inplace_case(OP_SCALE, dt, n, off, factors[f], 0,
                                 g_stream);
                for (size_t d = 0; d < sizeof divisors / sizeof *divisors; d++)
                    inplace_case(OP_AVERAGE, dt, n, off, 1.0, divisors[d],
                                 g_stream);
                inplace_case(OP_ZERO, dt, n, off, 1.0, 0, g_stream);
                inplace_case(OP_ZERO, dt, n, off, 1.0, 0, NULL);
            }
        }
    }
}

/* ---- argument checks (no device needed) ------------------------------------ */

/* Every call here is refused or a no-op before anything is queued, so it
 * returns the same with and without a device; the pointers are never
 * dereferenced. */
static void test_arguments(void)
{
    char *bogus = (char *)(uintptr_t)0x10000; /* never touched */
    kolo__gpu_copy_t one = {bogus, bogus + 4096, 4};
    kolo__gpu_copy_t empty[3] = {
        {bogus, bogus + 4096, 0}, {NULL, NULL, 0}, {bogus + 1, bogus + 3, 0}};
    kolo__gpu_copy_t odd_src = {bogus + 2, bogus + 4096, 4};
    kolo__gpu_copy_t odd_dst = {bogus, bogus + 4097, 4};
    kolo__gpu_copy_t null_dst = {bogus, NULL, 4};
    kolo__gpu_copy_t huge = {bogus, bogus + 4096, SIZE_MAX / 4};
    static const int bad_pairs[][2] = {
        {KOLO_INT32, KOLO_FLOAT16},   {KOLO_FLOAT16, KOLO_BFLOAT16},
        {KOLO_FLOAT64, KOLO_FLOAT32}, {KOLO_FLOAT32, KOLO_FLOAT64},
        {KOLO_FLOAT32, KOLO_INT32},   {KOLO_UINT8, KOLO_BOOL},
        {KOLO_FLOAT32, 11},           {-1, KOLO_FLOAT32}};
    /* One copy that copy_batch must refuse, and why. */
    const struct {
        const kolo__gpu_copy_t *copy;
        int from, to;
        double scale;
        const char *why;
    } refused[] = {
        {&odd_src, KOLO_FLOAT32, KOLO_FLOAT16, 1.0,
         "a float32 source not aligned to 4 bytes"},
        {&odd_dst, KOLO_FLOAT32, KOLO_BFLOAT16, 1.0,
         "a bfloat16 destination not aligned to 2 bytes"},
        {&odd_src, KOLO_INT32, KOLO_INT32, 2.0,
         "a misaligned scaled int32 copy"},
        {&null_dst, KOLO_FLOAT32, KOLO_FLOAT32, 1.0, "a NULL destination"},
        {&huge, KOLO_FLOAT64, KOLO_FLOAT64, 1.0,
         "a byte count that overflows size_t"},
    };
    char what[120];
    const int inval = (int)cudaErrorInvalidValue;

    check(kolo__gpu_copy_batch(NULL, 0, KOLO_FLOAT32, KOLO_FLOAT32, 1.0,
                               NULL) == 0,
          "copy_batch of 0 copies is a no-op");
    check(kolo__gpu_copy_batch(empty, 3, KOLO_FLOAT32, KOLO_FLOAT16, 2.0,
                               NULL) == 0,
          "copy_batch of empty copies is a no-op");
    check(kolo__gpu_copy_batch(empty, 3, KOLO_INT64, KOLO_INT64, 1.0, NULL) ==
              0,
          "copy_batch of empty plain copies is a no-op");
    check(kolo__gpu_copy_batch(NULL, 2, KOLO_FLOAT32, KOLO_FLOAT32, 1.0,
                               NULL) == inval,
          "copy_batch refuses copies == NULL with n > 0");
    for (size_t p = 0; p < sizeof bad_pairs / sizeof *bad_pairs; p++) {
        snprintf(what, sizeof what, "copy_batch refuses %s -> %s",
                 dtype_name(bad_pairs[p][0]), dtype_name(bad_pairs[p][1]));
        check(kolo__gpu_copy_batch(&one, 1, bad_pairs[p][0], bad_pairs[p][1],
                                   1.0, NULL) == inval,
              what);
    }
    for (size_t r = 0; r < sizeof refused / sizeof *refused; r++) {
        snprintf(what, sizeof what, "copy_batch refuses %s", refused[r].why);
        check(kolo__gpu_copy_batch(refused[r].copy, 1, refused[r].from,
                                   refused[r].to, refused[r].scale,
                                   NULL) == inval,
              what);
    }

    for (int dt = 0; dt < KOLO_DTYPE_COUNT_; dt++) {
        snprintf(what, sizeof what, "scale/average/zero of 0 %s are no-ops",
                 dtype_name(dt));
        check(kolo__gpu_scale(NULL, 0, dt, 2.0, NULL) == 0 &&
                  kolo__gpu_average(NULL, 0, dt, 4, NULL) == 0 &&
                  kolo__gpu_zero(NULL, 0, dt, NULL) == 0,
              what);
        snprintf(what, sizeof what,
                 "scale by 1.0 and average by 1, 0, -3 of %s are no-ops",
                 dtype_name(dt));
        check(kolo__gpu_scale(bogus, 4, dt, 1.0, NULL) == 0 &&
                  kolo__gpu_average(bogus, 4, dt, 1, NULL) == 0 &&
                  kolo__gpu_average(bogus, 4, dt, 0, NULL) == 0 &&
                  kolo__gpu_average(bogus, 4, dt, -3, NULL) == 0,
              what);
    }
    check(kolo__gpu_scale(bogus, 4, KOLO_BOOL, 3.0, NULL) == 0 &&
              kolo__gpu_average(bogus, 4, KOLO_BOOL, 3, NULL) == 0,
          "scale and average of bool leave it as it is");
    check(kolo__gpu_scale(bogus, 4, 11, 2.0, NULL) == inval &&
              kolo__gpu_scale(bogus, 4, -1, 2.0, NULL) == inval &&
              kolo__gpu_average(bogus, 4, 11, 2, NULL) == inval &&
              kolo__gpu_zero(bogus, 4, 11, NULL) == inval,
          "an unknown dtype is refused");
    check(kolo__gpu_scale(bogus + 1, 4, KOLO_FLOAT32, 2.0, NULL) == inval &&
              kolo__gpu_average(bogus + 2, 4, KOLO_INT64, 2, NULL) == inval &&
              kolo__gpu_scale(NULL, 4, KOLO_FLOAT32, 2.0, NULL) == inval,
          "scale and average refuse misaligned and NULL buffers");
    check(kolo__gpu_zero(bogus, SIZE_MAX / 4, KOLO_FLOAT64, NULL) == inval,
          "zero refuses a byte count that overflows size_t");
}

/* Without a device, a real launch must come back as an error (not crash,
 * not claim success). */
static void test_no_device(void)
{
    void *bogus = (void *)(uintptr_t)0x10000;
    int rc = kolo__gpu_scale(bogus, 4, KOLO_FLOAT32, 2.0, NULL);
    check(rc != 0, "without a device, a kernel launch reports an error");
}

/* ---- main ------------------------------------------------------------------ */

int main(void)
{
    int devices = 0;
    cudaError_t rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    test_arguments();
    rc = cudaGetDeviceCount(&devices);
    if (rc != cudaSuccess || devices == 0) {
        test_no_device();
        if (g_failed > 0) {
            printf("%d passed, %d failed\n", g_passed, g_failed);
            return 1;
        }
        printf("SKIP: no CUDA device visible (cudaGetDeviceCount: %s); the "
               "%d checks that need none passed\n",
               rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices",
               g_passed);
        return 77;
    }

    g_src = malloc(POOL_BYTES);
    g_got = malloc(POOL_BYTES);
    g_want = malloc(POOL_BYTES);
    if (g_src == NULL || g_got == NULL || g_want == NULL) {
        printf("out of host memory\n");
        return 1;
    }
    if (!CUDA_OK(cudaSetDevice(0)) ||
        !CUDA_OK(cudaMalloc((void **)&g_dev_src, POOL_BYTES)) ||
        !CUDA_OK(cudaMalloc((void **)&g_dev_dst, POOL_BYTES)) ||
        !CUDA_OK(cudaStreamCreate(&g_stream))) {
        printf("cannot set up the device\n");
        return 1;
    }

    test_copies();
    test_batches();
    test_inplace();

    cudaStreamDestroy(g_stream);
    cudaFree(g_dev_src);
    cudaFree(g_dev_dst);
    free(g_src);
    free(g_got);
    free(g_want);
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
