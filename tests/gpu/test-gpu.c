/*
 * test-gpu.c — CUDA tensors through kolo (NCCL), run by tests/gpu/run-gpu.sh
 * under kolorun.
 *
 *   test-gpu count       prints the number of CUDA devices this process sees
 *   test-gpu no-device   (no GPU visible) a CUDA tensor is refused at once,
 *                        with a message naming the tensor, device and rank;
 *                        kolo_enabled("nccl") is 0
 *   test-gpu all         every collective on CUDA tensors, checked against
 *                        a reference every rank computes itself: allreduce
 *                        of every dtype NCCL reduces and every op, fused
 *                        batches, prescale/postscale, float16/bfloat16
 *                        compression, grouped allreduce, broadcast, uneven
 *                        allgather, alltoall with splits, uneven
 *                        reducescatter; a host buffer passed as CUDA and a
 *                        second device in one set are refused
 *   test-gpu allreduce   the allreduce part of `all` only (the hierarchical
 *                        runs, where only allreduce stays within one GPU per
 *                        NCCL communicator)
 *   test-gpu sets        every rank runs `all` in a process set of its own
 *                        (single-rank NCCL communicators, several sets)
 *   test-gpu mismatch    rank 0 enqueues a CUDA tensor, the others a host
 *                        tensor of the same name: KOLO_ERR_MISMATCH
 *                        everywhere, naming both places
 *   test-gpu lost        after two 256 MiB allreduces of CUDA tensors, the
 *                        last rank SIGKILLs itself a quarter of the way
 *                        into the third: every other rank's handle fails
 *                        (KOLO_ERR_RANK_LOST) within KOLO_TIMEOUT_SECONDS
 *                        and a margin, naming the tensor and the lost
 *                        rank; its stream still completes, and
 *                        kolo_shutdown returns (the hierarchical job runs it:
 *                        one GPU carries it)
 *
 * Rank r uses CUDA device KOLO_LOCAL_RANK mod the device count. Prints
 * "rank R: N passed, N failed" and exits 0 when nothing failed.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kolo.h"

static int rank, size, failures, passes;

#include "../multi/testutil.h"

#define MUST(call) TU_MUST(call, "rank %d: ", rank)
#define CUDA_MUST(call)                                                       \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) {                                              \
            fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call,          \
                    cudaGetErrorString(e_));                                  \
            exit(1);                                                          \
        }                                                                     \
    } while (0)
#define EXPECT(cond, ...)                                                     \
    do {                                                                      \
        if (cond)                                                             \
            passes++;                                                         \
        else {                                                                \
            TU_FAIL_HERE(__VA_ARGS__);                                        \
            failures++;                                                       \
        }                                                                     \
    } while (0)

static int dev;
static cudaStream_t stream;
static int pset = KOLO_GLOBAL_PROCESS_SET;
static int prank, psize; /* this rank's place in pset */

/* ---- host values ---------------------------------------------------------- */

/* float16 bits of a value that float16 holds exactly (small integers and
 * quarters here). */
static uint16_t exact_f16(double v)
{
    int e;
    double m;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    if (v == 0)
        return sign;
    m = frexp(fabs(v), &e); /* v = m * 2^e, m in [0.5, 1) */
    /* normal: 1.f * 2^(e-1), exponent field e - 1 + 15 */
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) |
                      (uint16_t)((m * 2 - 1) * 1024));
}

static uint16_t exact_bf16(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static void put(void *buf, kolo_dtype_t t, size_t i, double v)
{
    switch (t) {
    case KOLO_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case KOLO_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    case KOLO_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case KOLO_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case KOLO_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case KOLO_FLOAT16: ((uint16_t *)buf)[i] = exact_f16(v); break;
    case KOLO_BFLOAT16: ((uint16_t *)buf)[i] = exact_bf16(v); break;
    case KOLO_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case KOLO_FLOAT64: ((double *)buf)[i] = v; break;
    default: break;
    }
}

static int is_int(kolo_dtype_t t)
{
    return t == KOLO_UINT8 || t == KOLO_INT8 || t == KOLO_INT32 ||
           t == KOLO_INT64 || t == KOLO_BOOL;
}

/* Rank r's element i: 1..4, so that sums and products of 4 ranks stay
 * exact in every dtype (bool: 0 or 1). */
static double val(int r, size_t i, kolo_dtype_t t)
{
    if (t == KOLO_BOOL)
        return (double)((i + (size_t)r) % 3 == 0);
    return (double)(1 + (i * 7 + (size_t)r * 3) % 4);
}

static double reduce_ref(kolo_op_t op, kolo_dtype_t t, size_t i)
{
    double acc = val(0, i, t);
    for (int r = 1; r < psize; r++) {
        double v = val(r, i, t);
        switch (op) {
        case KOLO_OP_MIN: acc = v < acc ? v : acc; break;
        case KOLO_OP_MAX: acc = v > acc ? v : acc; break;
        case KOLO_OP_PRODUCT:
            acc = t == KOLO_BOOL ? (acc != 0 && v != 0) : acc * v;
            break;
        default: acc = t == KOLO_BOOL ? (acc != 0 || v != 0) : acc + v; break;
        }
    }
    if (op == KOLO_OP_AVERAGE)
        acc = is_int(t) ? trunc(acc / psize) : acc / psize;
    return acc;
}

static int close_enough(double got, double want, kolo_dtype_t t)
{
    double tol = t == KOLO_FLOAT16 ? 2e-3 : t == KOLO_BFLOAT16 ? 1e-2
                 : t == KOLO_FLOAT32 ? 1e-6 : t == KOLO_FLOAT64 ? 1e-12 : 0;
    return fabs(got - want) <= tol * fabs(want) + (tol > 0 ? tol : 0);
}

/* ---- device buffers ------------------------------------------------------- */

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    CUDA_MUST(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes)
        CUDA_MUST(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice,
                                  stream));
    return d;
}

static void host_copy(void *host, const void *d, size_t bytes)
{
    CUDA_MUST(cudaStreamSynchronize(stream));
    if (bytes)
        CUDA_MUST(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost));
}

static void opts_cuda(kolo_opts_t *o)
{
    kolo_opts_init(o);
    o->device_type = KOLO_DEVICE_CUDA;
    o->device = dev;
    o->stream = stream;
    o->process_set = pset;
}

/* Copies a device result to the host through kolo_result_copy. */
static void *result_to_host(const kolo_result_t *res)
{
    void *d = NULL, *h = malloc(res->bytes ? res->bytes : 1);
    EXPECT(res->device_type == KOLO_DEVICE_CUDA && res->device == dev,
           "result lives on %d/%d, expected CUDA device %d", res->device_type,
           res->device, dev);
    CUDA_MUST(cudaMalloc(&d, res->bytes ? res->bytes : 1));
    MUST(kolo_result_copy(res, d));
    CUDA_MUST(cudaMemcpy(h, d, res->bytes, cudaMemcpyDeviceToHost));
    CUDA_MUST(cudaFree(d));
    return h;
}

/* ---- allreduce ------------------------------------------------------------ */

static void allreduce_one(kolo_dtype_t t, kolo_op_t op, size_t n, int in_place)
{
    size_t es = kolo_dtype_size(t);
    uint8_t *h = malloc(n * es + 1), *out = malloc(n * es + 1);
    void *din, *dout;
    kolo_opts_t o;
    kolo_handle_t hd;
    char name[96];
    size_t bad = 0, first = 0;

    for (size_t i = 0; i < n; i++)
        put(h, t, i, val(prank, i, t));
    din = dev_copy(h, n * es);
    dout = din;
    if (!in_place)
        CUDA_MUST(cudaMalloc(&dout, n * es + 1));
    opts_cuda(&o);
    o.op = op;
    snprintf(name, sizeof name, "ar.%s.%s.%zu.%d", kolo_dtype_name(t),
             kolo_op_name(op), n, in_place);
    MUST(kolo_allreduce_async_opts(name, din, dout, (int64_t)n, t, &o, &hd));
    MUST(kolo_wait(hd));
    host_copy(out, dout, n * es);
    for (size_t i = 0; i < n; i++)
        if (!close_enough(tu_get(t, out, (int64_t)i), reduce_ref(op, t, i),
                          t) &&
            bad++ == 0)
            first = i;
    EXPECT(bad == 0, "%s: %zu of %zu wrong, first [%zu] = %g, expected %g",
           name, bad, n, first, tu_get(t, out, (int64_t)first),
           reduce_ref(op, t, first));
    if (!in_place)
        CUDA_MUST(cudaFree(dout));
    CUDA_MUST(cudaFree(din));
    free(h);
    free(out);
}

static void allreduce_dtypes(void)
{
    static const kolo_dtype_t types[] = {KOLO_UINT8, KOLO_INT8, KOLO_INT32,
                                         KOLO_INT64, KOLO_FLOAT16,
                                         KOLO_BFLOAT16, KOLO_FLOAT32,
                                         KOLO_FLOAT64, KOLO_BOOL};
    static const kolo_op_t ops[] = {KOLO_OP_SUM, KOLO_OP_AVERAGE, KOLO_OP_MIN,
                                    KOLO_OP_MAX, KOLO_OP_PRODUCT};
    for (size_t a = 0; a < sizeof types / sizeof types[0]; a++)
        for (size_t b = 0; b < sizeof ops / sizeof ops[0]; b++) {
            if (types[a] == KOLO_BOOL && ops[b] == KOLO_OP_AVERAGE)
                continue;
            allreduce_one(types[a], ops[b], 1001, (a + b) % 2);
        }
    allreduce_one(KOLO_FLOAT32, KOLO_OP_SUM, 0, 1);
    allreduce_one(KOLO_FLOAT32, KOLO_OP_SUM, 1, 0);
    allreduce_one(KOLO_FLOAT32, KOLO_OP_AVERAGE, (size_t)5 << 20, 0);
}

/* Many tensors at once, so that they are fused; with scaling or
 * compression. */
static void allreduce_fused(const char *tag, double pre, double post,
                            int wire, kolo_op_t op)
{
    enum { N = 24 };
    void *d[N];
    float *h[N];
    size_t n[N];
    kolo_handle_t hd[N];
    kolo_opts_t o;
    char name[64];

    opts_cuda(&o);
    o.prescale = pre;
    o.postscale = post;
    o.wire_dtype = wire;
    o.op = op;
    for (int k = 0; k < N; k++) {
        n[k] = (size_t)(k * 997 % 5003) + (size_t)k;
        h[k] = malloc(n[k] * 4 + 4);
        for (size_t i = 0; i < n[k]; i++)
            h[k][i] = (float)val(prank, i + (size_t)k, KOLO_FLOAT32) * 0.25f;
        d[k] = dev_copy(h[k], n[k] * 4);
    }
    for (int k = 0; k < N; k++) {
        snprintf(name, sizeof name, "fused.%s.%d", tag, k);
        MUST(kolo_allreduce_async_opts(name, d[k], d[k], (int64_t)n[k],
                                       KOLO_FLOAT32, &o, &hd[k]));
    }
    for (int k = 0; k < N; k++) {
        size_t bad = 0;
        MUST(kolo_wait(hd[k]));
        host_copy(h[k], d[k], n[k] * 4);
        for (size_t i = 0; i < n[k]; i++) {
            double want = 0;
            for (int r = 0; r < psize; r++)
                want += val(r, i + (size_t)k, KOLO_FLOAT32) * 0.25 * pre;
            if (op == KOLO_OP_AVERAGE)
                want /= psize;
            want *= post;
            bad += !close_enough(h[k][i], want,
                                 wire == -1 ? KOLO_FLOAT32 : (kolo_dtype_t)wire);
        }
        EXPECT(bad == 0, "fused %s tensor %d: %zu of %zu wrong", tag, k, bad,
               n[k]);
        CUDA_MUST(cudaFree(d[k]));
        free(h[k]);
    }
}

static void allreduce_grouped(void)
{
    const char *names[3] = {"grp.a", "grp.b", "grp.c"};
    int64_t counts[3] = {5, 1000, 77};
    void *d[3];
    float *h[3];
    kolo_handle_t hd[3];
    kolo_opts_t o;

    opts_cuda(&o);
    for (int k = 0; k < 3; k++) {
        h[k] = malloc((size_t)counts[k] * 4);
        for (int64_t i = 0; i < counts[k]; i++)
            h[k][i] = (float)val(prank, (size_t)(i + k), KOLO_FLOAT32);
        d[k] = dev_copy(h[k], (size_t)counts[k] * 4);
    }
    MUST(kolo_grouped_allreduce_async(3, names, (const void *const *)d,
                                      (void *const *)d, counts, KOLO_FLOAT32,
                                      &o, hd));
    for (int k = 0; k < 3; k++) {
        size_t bad = 0;
        MUST(kolo_wait(hd[k]));
        host_copy(h[k], d[k], (size_t)counts[k] * 4);
        for (int64_t i = 0; i < counts[k]; i++)
            bad += !close_enough(h[k][i],
                                 reduce_ref(KOLO_OP_SUM, KOLO_FLOAT32,
                                            (size_t)(i + k)),
                                 KOLO_FLOAT32);
        EXPECT(bad == 0, "grouped member %s: %zu wrong", names[k], bad);
        CUDA_MUST(cudaFree(d[k]));
        free(h[k]);
    }
}

/* ---- the other collectives ------------------------------------------------ */

static void broadcast_test(void)
{
    for (int root = 0; root < psize; root++) {
        size_t n = 3001, bad = 0;
        double *h = malloc(n * 8);
        void *d;
        kolo_opts_t o;
        kolo_handle_t hd;
        char name[64];

        for (size_t i = 0; i < n; i++)
            h[i] = prank == root ? (double)i * 0.5 + root : -1.0;
        d = dev_copy(h, n * 8);
        opts_cuda(&o);
        snprintf(name, sizeof name, "bcast.%d", root);
        MUST(kolo_broadcast_async(name, d, (int64_t)n, KOLO_FLOAT64, root, &o,
                                  &hd));
        MUST(kolo_wait(hd));
        host_copy(h, d, n * 8);
        for (size_t i = 0; i < n; i++)
            bad += h[i] != (double)i * 0.5 + root;
        EXPECT(bad == 0, "broadcast from %d: %zu wrong", root, bad);
        CUDA_MUST(cudaFree(d));
        free(h);
    }
}

static void allgather_test(void)
{
    int64_t rows = prank + 1, shape[2] = {rows, 3}, total = 0, off = 0;
    int32_t *h = malloc((size_t)rows * 3 * 4);
    void *d;
    kolo_opts_t o;
    kolo_handle_t hd;
    kolo_result_t res;
    int32_t *got;
    size_t bad = 0;

    for (int64_t i = 0; i < rows * 3; i++)
        h[i] = prank * 1000 + (int32_t)i;
    d = dev_copy(h, (size_t)rows * 12);
    opts_cuda(&o);
    MUST(kolo_allgather_async("gather.uneven", d, 2, shape, KOLO_INT32, &o,
                              &hd));
    MUST(kolo_wait_result(hd, &res));
    for (int r = 0; r < psize; r++)
        total += r + 1;
    EXPECT(res.shape[0] == total && res.bytes == (size_t)total * 12,
           "allgather result has %lld rows (%zu bytes), expected %lld",
           (long long)res.shape[0], res.bytes, (long long)total);
    got = result_to_host(&res);
    for (int r = 0; r < psize && res.bytes == (size_t)total * 12; r++) {
        for (int64_t i = 0; i < (r + 1) * 3; i++)
            bad += got[off + i] != r * 1000 + (int32_t)i;
        off += (r + 1) * 3;
    }
    EXPECT(bad == 0, "allgather: %zu wrong", bad);
    kolo_result_free(&res);
    free(got);
    CUDA_MUST(cudaFree(d));
    free(h);
}

static void alltoall_test(void)
{
    /* Rank i sends j + 1 rows of 2 floats to rank j. */
    int64_t *splits = malloc((size_t)psize * 8), rows = 0, shape[2];
    float *h;
    void *d;
    kolo_opts_t o;
    kolo_handle_t hd;
    kolo_result_t res;
    float *got;
    size_t bad = 0, at = 0;

    for (int j = 0; j < psize; j++)
        rows += splits[j] = j + 1;
    h = malloc((size_t)rows * 8);
    for (int j = 0; j < psize; j++)
        for (int64_t k = 0; k < (j + 1) * 2; k++)
            h[at++] = (float)(prank * 100 + j * 10) + (float)k;
    shape[0] = rows;
    shape[1] = 2;
    d = dev_copy(h, (size_t)rows * 8);
    opts_cuda(&o);
    MUST(kolo_alltoall_async("a2a", d, 2, shape, KOLO_FLOAT32, splits, &o,
                             &hd));
    MUST(kolo_wait_result(hd, &res));
    EXPECT(res.shape[0] == (int64_t)psize * (prank + 1),
           "alltoall received %lld rows, expected %d",
           (long long)res.shape[0], psize * (prank + 1));
    got = result_to_host(&res);
    at = 0;
    for (int i = 0; i < psize && res.shape[0] == (int64_t)psize * (prank + 1);
         i++)
        for (int64_t k = 0; k < (prank + 1) * 2; k++)
            bad += got[at++] != (float)(i * 100 + prank * 10) + (float)k;
    EXPECT(bad == 0, "alltoall: %zu wrong", bad);
    kolo_result_free(&res);
    free(got);
    CUDA_MUST(cudaFree(d));
    free(h);
    free(splits);
}

static void reducescatter_test(kolo_op_t op)
{
    int64_t d0 = (int64_t)psize * 2 + 1, shape[2] = {d0, 5}, first = 0;
    size_t n = (size_t)d0 * 5, bad = 0;
    float *h = malloc(n * 4), *got;
    void *d;
    kolo_opts_t o;
    kolo_handle_t hd;
    kolo_result_t res;
    int64_t mine = d0 / psize + (prank < d0 % psize ? 1 : 0);

    for (size_t i = 0; i < n; i++)
        h[i] = (float)val(prank, i, KOLO_FLOAT32);
    d = dev_copy(h, n * 4);
    opts_cuda(&o);
    o.op = op;
    MUST(kolo_reducescatter_async(op == KOLO_OP_SUM ? "rs.sum" : "rs.avg", d,
                                  2, shape, KOLO_FLOAT32, &o, &hd));
    MUST(kolo_wait_result(hd, &res));
    for (int r = 0; r < prank; r++)
        first += d0 / psize + (r < d0 % psize ? 1 : 0);
    EXPECT(res.shape[0] == mine, "reducescatter gave %lld rows, expected %lld",
           (long long)res.shape[0], (long long)mine);
    got = result_to_host(&res);
    for (int64_t i = 0; res.shape[0] == mine && i < mine * 5; i++)
        bad += !close_enough(got[i],
                             reduce_ref(op, KOLO_FLOAT32,
                                        (size_t)(first * 5 + i)),
                             KOLO_FLOAT32);
    EXPECT(bad == 0, "reducescatter %s: %zu wrong", kolo_op_name(op), bad);
    kolo_result_free(&res);
    free(got);
    CUDA_MUST(cudaFree(d));
    free(h);
}

/* ---- refusals ------------------------------------------------------------- */

static void refusals(void)
{
    float host[4] = {0};
    kolo_opts_t o;
    kolo_handle_t hd;
    int rc;

    opts_cuda(&o);
    rc = kolo_allreduce_async_opts("refuse.host", host, host, 4, KOLO_FLOAT32,
                                   &o, &hd);
    EXPECT(rc == KOLO_ERR_INVALID_ARGUMENT &&
               strstr(kolo_last_error(), "host memory") != NULL &&
               strstr(kolo_last_error(), "refuse.host") != NULL,
           "a host buffer passed as CUDA: %d %s", rc, kolo_last_error());
    o.device = 999;
    rc = kolo_allreduce_async_opts("refuse.dev", host, host, 4, KOLO_FLOAT32,
                                   &o, &hd);
    EXPECT(rc == KOLO_ERR_INVALID_ARGUMENT &&
               strstr(kolo_last_error(), "no CUDA device 999") != NULL,
           "device 999: %d %s", rc, kolo_last_error());
}

static void run_all(int allreduce_only)
{
    allreduce_dtypes();
    allreduce_fused("plain", 1.0, 1.0, -1, KOLO_OP_SUM);
    allreduce_fused("scaled", 0.5, 3.0, -1, KOLO_OP_AVERAGE);
    allreduce_fused("fp16", 1.0, 1.0, KOLO_FLOAT16, KOLO_OP_SUM);
    allreduce_fused("bf16", 2.0, 0.5, KOLO_BFLOAT16, KOLO_OP_AVERAGE);
    allreduce_grouped();
    if (allreduce_only)
        return;
    broadcast_test();
    allgather_test();
    alltoall_test();
    reducescatter_test(KOLO_OP_SUM);
    reducescatter_test(KOLO_OP_AVERAGE);
    refusals();
}

/* ---- modes ---------------------------------------------------------------- */

static int no_device(void)
{
    float x[4] = {0};
    kolo_opts_t o;
    kolo_handle_t hd;
    int rc;

    kolo_opts_init(&o);
    o.device_type = KOLO_DEVICE_CUDA;
    o.device = 0;
    rc = kolo_allreduce_async_opts("grad.gpu", x, x, 4, KOLO_FLOAT32, &o, &hd);
    if (kolo_built("nccl"))
        EXPECT(rc == KOLO_ERR_UNSUPPORTED &&
                   strstr(kolo_last_error(), "grad.gpu") != NULL &&
                   strstr(kolo_last_error(), "sees no CUDA device") != NULL,
               "a CUDA tensor without a GPU: %d '%s'", rc, kolo_last_error());
    else
        EXPECT(rc == KOLO_ERR_UNSUPPORTED &&
                   strstr(kolo_last_error(), "without GPU support") != NULL,
               "a CUDA tensor in a build without GPU: %d '%s'", rc,
               kolo_last_error());
    EXPECT(kolo_enabled("nccl") == 0, "kolo_enabled(\"nccl\") is %d without a "
           "GPU", kolo_enabled("nccl"));
    /* A bad device_type is refused too; the job goes on. */
    o.device_type = 7;
    rc = kolo_allreduce_async_opts("grad.bad", x, x, 4, KOLO_FLOAT32, &o, &hd);
    EXPECT(rc == KOLO_ERR_INVALID_ARGUMENT &&
               strstr(kolo_last_error(), "device_type 7") != NULL,
           "device_type 7: %d '%s'", rc, kolo_last_error());
    kolo_opts_init(&o);
    MUST(kolo_allreduce_async_opts("grad.host", x, x, 4, KOLO_FLOAT32, &o, &hd));
    MUST(kolo_wait(hd));
    return 0;
}

static void mismatch(void)
{
    float h[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    void *d = NULL;
    kolo_opts_t o;
    kolo_handle_t hd;
    int rc;

    if (rank == 0) {
        d = dev_copy(h, sizeof h);
        opts_cuda(&o);
    } else {
        kolo_opts_init(&o);
    }
    MUST(kolo_allreduce_async_opts("where", rank == 0 ? d : h,
                                   rank == 0 ? d : h, 8, KOLO_FLOAT32, &o,
                                   &hd));
    rc = kolo_wait(hd);
    EXPECT(rc == KOLO_ERR_MISMATCH &&
               strstr(kolo_last_error(), "CUDA device memory") != NULL &&
               strstr(kolo_last_error(), "host memory") != NULL,
           "host against CUDA: %d '%s'", rc, kolo_last_error());
    if (d != NULL)
        CUDA_MUST(cudaFree(d));
}

/* The last rank dies in the middle of a large allreduce on the device. */
static void lost(void)
{
    const int64_t count = 64 * 1024 * 1024;
    const size_t bytes = (size_t)count * sizeof(float);
    const int victim = size - 1;
    float *h = malloc(bytes);
    void *din, *dout;
    kolo_opts_t o;
    kolo_handle_t hd;
    double t_step = 0, t0, dt, bound = env_double("KOLO_TIMEOUT_SECONDS", 30) + 15;
    char want[32];
    int rc;

    if (h == NULL) {
        fprintf(stderr, "rank %d: FAIL out of host memory\n", rank);
        exit(1);
    }
    for (int64_t i = 0; i < count; i++)
        h[i] = (float)(rank + 1);
    din = dev_copy(h, bytes);
    CUDA_MUST(cudaMalloc(&dout, bytes));
    opts_cuda(&o);
    for (int step = 0; step < 2; step++) {
        int64_t bad = 0;
        CUDA_MUST(cudaMemsetAsync(dout, 0, bytes, stream));
        t0 = now();
        MUST(kolo_allreduce_async_opts("big", din, dout, count, KOLO_FLOAT32,
                                       &o, &hd));
        MUST(kolo_wait(hd));
        host_copy(h, dout, bytes);
        t_step = now() - t0;
        for (int64_t i = 0; i < count; i++)
            bad += h[i] != (float)(size * (size + 1) / 2);
        EXPECT(bad == 0, "big, step %d: %lld of %lld wrong", step,
               (long long)bad, (long long)count);
    }
    printf("rank %d: lost: one 256 MiB allreduce took %.1f ms\n", rank,
           t_step * 1e3);
    fflush(stdout);
    if (rank == victim) {
        MUST(kolo_allreduce_async_opts("big", din, dout, count, KOLO_FLOAT32,
                                       &o, &hd));
        usleep((useconds_t)(t_step * 0.25 * 1e6));
        printf("rank %d: victim: SIGKILL to myself in the third allreduce\n",
               rank);
        fflush(stdout);
        raise(SIGKILL);
    }
    t0 = now();
    rc = kolo_allreduce_async_opts("big", din, dout, count, KOLO_FLOAT32, &o,
                                   &hd);
    if (rc == KOLO_OK)
        rc = kolo_wait(hd);
    dt = now() - t0;
    snprintf(want, sizeof want, "rank %d", victim);
    printf("rank %d: lost: %s (%d) after %.2f s: %s\n", rank,
           kolo_strerror(rc), rc, dt, kolo_last_error());
    EXPECT(rc == KOLO_ERR_RANK_LOST, "expected KOLO_ERR_RANK_LOST, got %d",
           rc);
    EXPECT(strstr(kolo_last_error(), want) != NULL &&
               strstr(kolo_last_error(), "big") != NULL,
           "the message names neither '%s' nor the tensor 'big': %s", want,
           kolo_last_error());
    EXPECT(dt < bound, "the error came after %.1f s (bound %.0f s)", dt,
           bound);
    /* The program's stream is not left waiting for kolo. */
    t0 = now();
    alarm(20);
    CUDA_MUST(cudaStreamSynchronize(stream));
    alarm(0);
    EXPECT(now() - t0 < 10, "the stream took %.1f s to complete",
           now() - t0);
    CUDA_MUST(cudaFree(dout));
    CUDA_MUST(cudaFree(din));
    free(h);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    int count = 0, rc;
    double t0;

    if (strcmp(mode, "count") == 0) {
        if (cudaGetDeviceCount(&count) != cudaSuccess)
            count = 0;
        printf("%d\n", count);
        return 0;
    }
    signal(SIGALRM, tu_on_alarm);
    MUST(kolo_init());
    rank = kolo_rank();
    size = kolo_size();
    prank = rank;
    psize = size;
    tu_watchdog(rank, mode, mode, (unsigned)env_double("TEST_TIMEOUT", 300));

    if (strcmp(mode, "no-device") == 0) {
        no_device();
    } else {
        CUDA_MUST(cudaGetDeviceCount(&count));
        dev = (int)(strtol(getenv("KOLO_LOCAL_RANK") ? getenv("KOLO_LOCAL_RANK")
                                                     : "0", NULL, 10) % count);
        CUDA_MUST(cudaSetDevice(dev));
        CUDA_MUST(cudaStreamCreate(&stream));
        if (strcmp(mode, "all") == 0 || strcmp(mode, "allreduce") == 0) {
            run_all(strcmp(mode, "allreduce") == 0);
        } else if (strcmp(mode, "sets") == 0) {
            /* Sets {0}, {1}, ...: every rank adds all of them, in order. */
            int mine = 0;
            for (int r = 0; r < size; r++) {
                int id;
                MUST(kolo_add_process_set(&r, 1, &id));
                if (r == rank)
                    mine = id;
            }
            pset = mine;
            prank = 0;
            psize = 1;
            run_all(0);
            pset = KOLO_GLOBAL_PROCESS_SET;
            MUST(kolo_barrier(KOLO_GLOBAL_PROCESS_SET));
        } else if (strcmp(mode, "mismatch") == 0) {
            mismatch();
        } else if (strcmp(mode, "lost") == 0) {
            lost();
            CUDA_MUST(cudaStreamDestroy(stream));
            t0 = now();
            rc = kolo_shutdown();
            printf("rank %d: lost: kolo_shutdown returned %d after %.2f s\n",
                   rank, rc, now() - t0);
            EXPECT(now() - t0 < 10, "kolo_shutdown took %.1f s", now() - t0);
            printf("rank %d: %s: %d passed, %d failed\n", rank, mode, passes,
                   failures);
            return failures ? 1 : 0;
        } else {
            fprintf(stderr, "test-gpu: unknown mode '%s'\n", mode);
            return 2;
        }
        CUDA_MUST(cudaStreamDestroy(stream));
    }
    MUST(kolo_shutdown());
    printf("rank %d: %s: %d passed, %d failed\n", rank, mode, passes, failures);
    return failures ? 1 : 0;
}
