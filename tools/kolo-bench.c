/*
 * kolo-bench.c — measures kolo against a backend called directly.
 *
 *     kolorun -np N kolo-bench [--workload W[,W...]|all] [--backend B]
 *     kolorun --mpi -np N kolo-bench ... --backend mpi
 *     kolorun -np N kolo-bench ... --backend nccl   (CUDA tensors)
 *                              [--json FILE] [--iters N] [--warmup N]
 *                              [--max-bytes B] [--quick]
 *
 * Every workload is measured twice in one run, with the same bytes: through
 * the runtime (kolo_allreduce_async_opts + kolo_wait, named tensors, as a
 * training loop does it) and "raw": the allreduce of the backend named by
 * --backend called directly, from this thread, on one buffer holding all
 * the bytes. The runtime runs as it runs a training job: its backends are
 * the environment's (KOLO_CONTROLLER, KOLO_CPU_OPERATIONS), by default its
 * own choice, shared memory among the ranks of one host. So the default
 * (--backend gloo) answers "kolo, or Gloo called directly?";
 * KOLO_CPU_OPERATIONS=gloo measures kolo's Gloo path against Gloo itself;
 * --backend shm measures the runtime against its own shared-memory
 * transport called directly, i.e. what negotiation and fusion cost.
 * The raw side links a private static copy of the backends (libkolo_raw)
 * and opens its own backend context under the rendezvous prefix
 * "kolo-bench-raw", next to the runtime's "kolo<N>/set<M>" contexts. The
 * ratio of the two is the figure that counts (DESIGN.md, "Performance is
 * measured, not assumed"): on shared 2-core machines wall times are noise,
 * a ratio measured in one run is not.
 *
 * How a figure is measured
 *  - Each iteration: every rank fills its input (not timed), the ranks meet
 *    at a barrier (a raw allreduce of one float), then each rank times the
 *    operation alone and checks the result (not timed).
 *  - The sides of a workload (kolo and raw; for fp16 also kolo in float32)
 *    alternate within every iteration, their order swapped every other
 *    iteration, so that both see the same machine.
 *  - A figure is the slowest rank's: after the last iteration, one raw
 *    allreduce with MAX over every rank's array of per-iteration times gives,
 *    per iteration, the time of the slowest rank (done once at the end, so
 *    it never disturbs a timed iteration). The table shows the median of
 *    those over the timed iterations (after the warm-up), with the min and
 *    the max.
 *  - Every result is checked, warm-up included: rank r holds 1 + ((r + t +
 *    i) & 7) at element i of tensor t, so every sum is a small integer,
 *    exact in float32 and in float16. A wrong value is reported as WRONG in
 *    the table and the JSON, and the exit status is 1. A failed operation
 *    stops the job with status 2. For the test of these checks,
 *    KOLO_BENCH_FAULT=1 makes the last rank add 1 to one element of the
 *    runtime's result in the last iteration of every figure.
 *
 * Workloads
 *   large     one float32 tensor, 4 B ... --max-bytes (256 MiB) in powers of
 *             4; bus bandwidth 2(n-1)/n * bytes / time (GB/s); ratio
 *             kolo/raw bandwidth (higher is better)
 *   resnet50  the 161 parameter tensors of torchvision's ResNet-50
 *             (25,557,032 float32), enqueued in backward order as separate
 *             named tensors with their shapes, then waited: time per step
 *             (ms) vs the raw allreduce of all the bytes as one buffer;
 *             ratio kolo/raw time (lower is better)
 *   small     1000 tensors of one float, enqueued then waited, vs 1000 raw
 *             4-byte allreduces: allreduces per second; ratio kolo/raw
 *             (higher is better)
 *   latency   one 4-byte allreduce, nothing else in flight: microseconds;
 *             ratio kolo/raw (lower is better), and the difference
 *   fp16      large (sizes >= 1 MiB) and resnet50 through the runtime with
 *             float16 on the wire (kolo_opts_t.wire_dtype), against float32
 *             through the runtime (speedup) and the raw float32 backend
 *             (ratio). Results are checked with a tolerance. On the host, a
 *             fourth side times one pass over the same float32 tensors,
 *             every rank at once (read and write each element, as an
 *             in-place allreduce must at least): no reduction, compressed
 *             or not, can finish faster, so fp32 time / pass time bounds
 *             the speed-up that compression can give on this machine.
 *
 * GPU: --backend nccl
 *   The same workloads on CUDA device memory. Each rank takes device
 *   KOLO_LOCAL_RANK mod cudaGetDeviceCount, allocates every buffer there
 *   (cudaMalloc) and creates one stream. kolo gets the device pointers
 *   (kolo_opts_t.device_type KOLO_DEVICE_CUDA, .device, .stream = that
 *   stream) and is timed from the first enqueue to the last kolo_wait, as
 *   on the host. KOLO_CONTROLLER and KOLO_CPU_OPERATIONS are left as the
 *   environment has them: the runtime negotiates as it does in training.
 *   Raw is NCCL called directly: a
 *   communicator of the bench's own (rank 0's ncclUniqueId broadcast to the
 *   others through kolo, in host memory), ncclAllReduce in place on one
 *   device buffer of the same bytes on the bench's stream, timed up to
 *   cudaStreamSynchronize; small enqueues its 1000 ncclAllReduce calls
 *   before the one synchronization, as a program would. Inputs are filled
 *   on the host and copied up before the barrier; results are copied down
 *   after the timed part and checked there, as on the host. Barriers and
 *   the reduction of the times go through a host backend called directly
 *   (the one the runtime negotiates on), never timed. --compare is for host
 *   backends and is refused. Where it cannot run (a build without GPU
 *   support, or no CUDA device visible), kolo-bench says why in one line on
 *   stderr and exits 77 before connecting to the other ranks.
 *
 * Output: a table on rank 0's stdout; with --json FILE, rank 0 writes one
 * JSON document: the job (ranks, backend, environment) and "results", one
 * object per workload and size with the fields "kolo", "raw" and "ratio".
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef KOLO_HAVE_GPU
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include "kolo.h"
#include "env.h"
#include "ops.h"
#include "reduce.h"

#define KIB (1024LL)
#define MIB (1024LL * 1024)
#define GIB (1024LL * 1024 * 1024)

#define DEFAULT_MAX_BYTES (256 * MIB)
#define QUICK_MAX_BYTES (1 * MIB)
#define SMALL_TENSORS 1000
#define RESNET50_TENSORS 161
#define RESNET50_ELEMENTS 25557032LL
#define DETAIL_LEN 256
/* The exit status of "--backend nccl cannot run here" (no GPU support in
 * this build, or no CUDA device visible): automake's "skipped". */
#define EXIT_CANNOT_RUN 77

/* ------------------------------------------------------------------ job */

static int g_rank, g_size;
static const kolo__ops_t *g_raw;     /* the backend, called directly */
static void *g_raw_ctx;
static int *g_raw_members; /* the raw contexts keep a pointer to it */
/* --compare: more backends called directly, as extra sides of the large,
 * resnet50, small and latency workloads. */
enum { MAX_COMPARE = 3 };
static const kolo__ops_t *g_cmp[MAX_COMPARE];
static void *g_cmp_ctx[MAX_COMPARE];
static int g_ncmp;
static char g_cmp_side[MAX_COMPARE][32]; /* "raw gloo" */
static kolo__ops_reduce_fn g_sum_f32, g_max_f64, g_max_i32;
static int g_wrong;                  /* WRONG results seen (any rank) */
static int g_fault;                  /* KOLO_BENCH_FAULT=1: see measure() */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kolo-bench: rank %d: ", g_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    /* kolorun stops the other ranks when one exits non-zero. */
    exit(2);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* which < 0: the raw backend; else compared backend `which`. */
static void raw_allreduce_on(int which, void *buf, size_t count,
                             size_t elem_size, kolo__ops_reduce_fn fn)
{
    const kolo__ops_t *ops = which < 0 ? g_raw : g_cmp[which];
    char err[512] = "";
    int rc = ops->allreduce(which < 0 ? g_raw_ctx : g_cmp_ctx[which], NULL, buf,
                            count, elem_size, fn, err, sizeof(err));
    if (rc != KOLO_OK)
        die("raw %s allreduce of %zu bytes failed: %s (%s)", ops->name,
            count * elem_size, err, kolo_strerror(rc));
}

static void raw_allreduce(void *buf, size_t count, size_t elem_size,
                          kolo__ops_reduce_fn fn)
{
    raw_allreduce_on(-1, buf, count, elem_size, fn);
}


/* Every rank leaves after every rank has arrived. */
static void barrier(void)
{
    float one = 1.0f;
    raw_allreduce(&one, 1, sizeof(one), g_sum_f32);
}

static void *xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        die("out of memory allocating %zu bytes", bytes);
    return p;
}

/* ------------------------------------------------------- data and checks */

/* Rank r holds 1 + ((r + t + i) & 7) at element i of tensor t; the sum over
 * ranks at that element is g_expect[(t + i) & 7]. */
static float g_expect[8];

static void data_init(void)
{
    for (int k = 0; k < 8; k++) {
        long s = 0;
        for (int r = 0; r < g_size; r++)
            s += 1 + ((r + k) & 7);
        g_expect[k] = (float)s;
    }
}

static void fill(float *p, size_t n, int t)
{
    float pat[8];
    for (int k = 0; k < 8; k++)
        pat[k] = (float)(1 + ((g_rank + k) & 7));
    for (size_t i = 0; i < n; i++)
        p[i] = pat[(i + (size_t)t) & 7];
}

/* 0 when every element holds the expected sum (within tol, relative, when
 * tol > 0); else 1 and a sentence in detail (if detail is still empty). */
static int check(const float *p, size_t n, int t, float tol, const char *what,
                 char *detail)
{
    for (size_t i = 0; i < n; i++) {
        float e = g_expect[(i + (size_t)t) & 7];
        int bad = tol > 0 ? !(fabsf(p[i] - e) <= tol * e) : p[i] != e;
        if (bad) {
            if (detail[0] == '\0')
                snprintf(detail, DETAIL_LEN,
                         "%s: element %zu is %.9g, expected %.9g", what, i,
                         (double)p[i], (double)e);
            return 1;
        }
    }
    return 0;
}

static void kolo_must(int rc, const char *what, const char *name)
{
    if (rc != KOLO_OK)
        die("%s of '%s' failed: %s (%s)", what, name, kolo_last_error(),
            kolo_strerror(rc));
}

/* ------------------------------------------------------------- the GPU */

/* --backend nccl (see the top of this file). Outside this section nothing
 * needs a CUDA header: the stream is kept as a void *, and a build without
 * GPU support has stubs that are never reached (gpu_require exits first). */
static int g_gpu;         /* --backend nccl */
static int g_dev = -1;    /* this rank's CUDA device */
static void *g_stream;    /* the bench's cudaStream_t, on g_dev */
static char g_gpu_name[256] = "";    /* the device's name */
static char g_nccl_version[32] = ""; /* "2.28.9" */

/* The rank's local rank before kolo_init: every rank on a host sees the same
 * devices, so only local rank 0 says why the GPU mode cannot run. */
static int env_local_rank(void)
{
    const char *v = getenv("KOLO_LOCAL_RANK");
    return v && v[0] ? atoi(v) : 0;
}

#ifdef KOLO_HAVE_GPU
static ncclComm_t g_comm; /* the raw side's communicator */

/* " (CUDA device N)" once the device is chosen, for error messages. */
static const char *dev_text(void)
{
    static char text[48];
    if (g_dev < 0)
        return "";
    snprintf(text, sizeof(text), " (CUDA device %d)", g_dev);
    return text;
}

static void cuda_must(cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void cuda_must(cudaError_t e, const char *fmt, ...)
{
    char what[256];
    va_list ap;

    if (e == cudaSuccess)
        return;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    die("%s failed%s: %s: %s", what, dev_text(), cudaGetErrorName(e),
        cudaGetErrorString(e));
}

static void nccl_must(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void nccl_must(ncclResult_t r, const char *fmt, ...)
{
    char what[256];
    const char *last;
    va_list ap;

    if (r == ncclSuccess)
        return;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    /* The last error's text is NCCL's, of any communicator. */
    last = ncclGetLastError(NULL);
    die("%s failed%s: %s%s%s", what, dev_text(), ncclGetErrorString(r),
        last && last[0] ? ": " : "", last ? last : "");
}

/* Exits EXIT_CANNOT_RUN, saying why, unless a CUDA device is visible. Runs
 * before kolo_init, so that the job ends without connecting. */
static void gpu_require(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    if (e == cudaSuccess && n > 0 && kolo_built("nccl"))
        return;
    if (env_local_rank() == 0) {
        if (e == cudaSuccess && n > 0)
            fprintf(stderr, "kolo-bench: --backend nccl needs a libkolo built "
                            "with NCCL, and the one loaded was built "
                            "without it\n");
        else if (e == cudaSuccess)
            fprintf(stderr, "kolo-bench: --backend nccl needs a CUDA device, "
                            "and none is visible (cudaGetDeviceCount: 0 "
                            "devices)\n");
        else
            fprintf(stderr, "kolo-bench: --backend nccl needs a CUDA device, "
                            "and none is visible (cudaGetDeviceCount: %s: "
                            "%s%s)\n",
                    cudaGetErrorName(e), cudaGetErrorString(e),
                    e == cudaErrorInsufficientDriver
                        ? "; no NVIDIA driver is loaded, or it is older than "
                          "this CUDA runtime"
                        : "");
        fflush(stderr);
    }
    exit(EXIT_CANNOT_RUN);
}

/* After kolo_init: the device, the stream, and the raw communicator. */
static void gpu_init(void)
{
    const char *id_name = "kolo-bench/nccl-unique-id";
    struct cudaDeviceProp prop;
    cudaStream_t stream;
    ncclUniqueId id;
    kolo_handle_t h;
    int n = 0, local = kolo_local_rank(), v = 0;

    cuda_must(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (n <= 0)
        die("cudaGetDeviceCount: no CUDA device");
    g_dev = (local > 0 ? local : 0) % n;
    cuda_must(cudaSetDevice(g_dev), "cudaSetDevice(%d)", g_dev);
    cuda_must(cudaGetDeviceProperties(&prop, g_dev),
              "cudaGetDeviceProperties(%d)", g_dev);
    snprintf(g_gpu_name, sizeof(g_gpu_name), "%s", prop.name);
    cuda_must(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
    g_stream = stream;

    /* Rank 0's id reaches every rank through kolo itself, in host memory. */
    memset(&id, 0, sizeof(id));
    if (g_rank == 0)
        nccl_must(ncclGetUniqueId(&id), "ncclGetUniqueId");
    kolo_must(kolo_broadcast_async(id_name, &id, (int64_t)sizeof(id),
                                   KOLO_UINT8, 0, NULL, &h),
              "kolo_broadcast_async", id_name);
    kolo_must(kolo_wait(h), "kolo_wait", id_name);
    nccl_must(ncclCommInitRank(&g_comm, g_size, id, g_rank),
              "ncclCommInitRank (rank %d of %d)", g_rank, g_size);
    nccl_must(ncclGetVersion(&v), "ncclGetVersion");
    snprintf(g_nccl_version, sizeof(g_nccl_version), "%d.%d.%d", v / 10000,
             v / 100 % 100, v % 100);
}

/* After kolo_shutdown, on every rank (finalizing waits for the others). */
static void gpu_finalize(void)
{
    nccl_must(ncclCommFinalize(g_comm), "ncclCommFinalize");
    nccl_must(ncclCommDestroy(g_comm), "ncclCommDestroy");
    g_comm = NULL;
    cuda_must(cudaStreamDestroy((cudaStream_t)g_stream), "cudaStreamDestroy");
    g_stream = NULL;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    cuda_must(cudaMalloc(&p, bytes ? bytes : 4), "cudaMalloc of %zu bytes",
              bytes);
    return p;
}

static void dev_free(void *p)
{
    if (p != NULL)
        cuda_must(cudaFree(p), "cudaFree");
}

/* Queue a copy on the bench's stream; dev_sync waits for it. */
static void dev_put(void *dst, const void *src, size_t bytes)
{
    cuda_must(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                              (cudaStream_t)g_stream),
              "cudaMemcpyAsync of %zu bytes to the device", bytes);
}

static void dev_get(void *dst, const void *src, size_t bytes)
{
    cuda_must(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                              (cudaStream_t)g_stream),
              "cudaMemcpyAsync of %zu bytes from the device", bytes);
}

static void dev_sync(const char *after)
{
    cuda_must(cudaStreamSynchronize((cudaStream_t)g_stream),
              "cudaStreamSynchronize after %s", after);
}

/* Raw: a float32 sum in place, queued on the bench's stream. */
static void nccl_allreduce(float *buf, size_t count)
{
    nccl_must(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, g_comm,
                            (cudaStream_t)g_stream),
              "ncclAllReduce of %zu bytes", count * sizeof(float));
}
#else
static void gpu_require(void)
{
    if (env_local_rank() == 0) {
        fprintf(stderr, "kolo-bench: --backend nccl cannot run: this "
                        "kolo-bench was built without GPU support "
                        "(configure's \"GPU tensors\" needs CUDA, nvcc and "
                        "NCCL)\n");
        fflush(stderr);
    }
    exit(EXIT_CANNOT_RUN);
}

/* Never reached: gpu_require exits first. */
static void no_gpu(void) __attribute__((noreturn));
static void no_gpu(void)
{
    die("internal error: GPU code reached in a build without GPU support");
}
static void gpu_init(void) { no_gpu(); }
static void gpu_finalize(void) { no_gpu(); }
static void *dev_alloc(size_t bytes) { (void)bytes; no_gpu(); }
static void dev_free(void *p) { (void)p; no_gpu(); }
static void dev_put(void *dst, const void *src, size_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    no_gpu();
}
static void dev_get(void *dst, const void *src, size_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    no_gpu();
}
static void dev_sync(const char *after) { (void)after; no_gpu(); }
static void nccl_allreduce(float *buf, size_t count)
{
    (void)buf, (void)count;
    no_gpu();
}
#endif

/* ----------------------------------------------------------- measuring */

/* One workload at one size: up to three sides, each a way of doing the same
 * allreduce. prepare fills the inputs, run is the timed part, fetch brings
 * the output to where verify reads it (--backend nccl: from the device; not
 * timed), verify checks it (0 = right). */
enum { MAX_SIDES = 3 + MAX_COMPARE };

typedef struct bench bench_t;
struct bench {
    int nsides;
    float *probe; /* run sets it: one element of the output it wrote, in
                   * the host memory that fetch fills and verify reads */
    void (*prepare)(bench_t *b, int side);
    void (*run)(bench_t *b, int side);
    void (*fetch)(bench_t *b, int side);
    int (*verify)(bench_t *b, int side, char *detail);
    void *state;
};

typedef struct side_result {
    double med, min, max; /* seconds, slowest rank per iteration */
    int wrong;            /* some rank got a wrong answer */
} side_result_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *g_side_names[MAX_SIDES];

/* The fp16 workload's sides: kolo fp16, kolo fp32, raw, and on the host the
 * memory pass (see "fp16" above). */
enum { FP16_SIDES_GPU = 3, FP16_SIDES = 4, PASS_SIDE = 3 };

static int is_pass(int fp16, int side) { return fp16 && side == PASS_SIDE; }

/* One pass over a float32 tensor in place: every element read and written
 * (doubled: kolo's own scaling, the pass it makes over a tensor). */
static void memory_pass(float *buf, size_t count)
{
    kolo__scale(buf, count, KOLO_FLOAT32, 2.0);
}

/* Names the compared sides, from side `first` on. */
static void compare_sides(int first)
{
    for (int k = 0; k < g_ncmp; k++)
        g_side_names[first + k] = g_cmp_side[k];
}

static void measure(bench_t *b, int warmup, int iters, const char *label,
                    side_result_t *res)
{
    int ns = b->nsides;
    double *t = calloc((size_t)ns * (size_t)iters, sizeof(double));
    int32_t wrong[MAX_SIDES] = {0};
    char detail[MAX_SIDES][DETAIL_LEN];

    if (t == NULL)
        die("out of memory");
    memset(detail, 0, sizeof(detail));
    for (int it = -warmup; it < iters; it++) {
        for (int k = 0; k < ns; k++) {
            /* swap the order every other iteration */
            int s = ((it + warmup) & 1) ? ns - 1 - k : k;
            double t0, dt;
            b->prepare(b, s);
            barrier();
            t0 = now();
            b->run(b, s);
            dt = now() - t0;
            b->fetch(b, s);
            if (g_fault && s == 0 && it == iters - 1 && g_rank == g_size - 1)
                *b->probe += 1.0f; /* KOLO_BENCH_FAULT: test the checks */
            if (b->verify(b, s, detail[s]))
                wrong[s] = 1;
            if (it >= 0)
                t[(size_t)s * (size_t)iters + (size_t)it] = dt;
        }
    }
    for (int s = 0; s < ns; s++)
        if (wrong[s])
            fprintf(stderr, "kolo-bench: rank %d: WRONG %s (%s): %s\n", g_rank,
                    label, g_side_names[s], detail[s]);
    /* The slowest rank's time per iteration, and whether any rank was wrong. */
    raw_allreduce(t, (size_t)ns * (size_t)iters, sizeof(double), g_max_f64);
    raw_allreduce(wrong, (size_t)ns, sizeof(int32_t), g_max_i32);
    for (int s = 0; s < ns; s++) {
        double *ts = t + (size_t)s * (size_t)iters;
        qsort(ts, (size_t)iters, sizeof(double), cmp_double);
        res[s].min = ts[0];
        res[s].max = ts[iters - 1];
        res[s].med = (iters & 1) ? ts[iters / 2]
                                 : 0.5 * (ts[iters / 2 - 1] + ts[iters / 2]);
        res[s].wrong = wrong[s];
        if (wrong[s])
            g_wrong++;
    }
    free(t);
}

/* ---------------------------------------------------------- the report */

static FILE *g_json;
static int g_json_first = 1;

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, const char *key, double v)
{
    fprintf(f, ", \"%s\": ", key);
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* Three significant digits, without an exponent where it fits. */
static const char *fmt_num(char *buf, size_t len, double v)
{
    double a = fabs(v);
    if (!isfinite(v))
        snprintf(buf, len, "-");
    else if (a >= 1000 || a == 0)
        snprintf(buf, len, "%.0f", v);
    else if (a >= 100)
        snprintf(buf, len, "%.1f", v);
    else if (a >= 10)
        snprintf(buf, len, "%.2f", v);
    else if (a >= 0.001)
        snprintf(buf, len, "%.3f", v);
    else
        snprintf(buf, len, "%.2e", v);
    return buf;
}

static const char *fmt_time(char *buf, size_t len, double s)
{
    if (s < 1e-5)
        snprintf(buf, len, "%.3f us", s * 1e6);
    else if (s < 1e-3)
        snprintf(buf, len, "%.1f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, len, "%.2f ms", s * 1e3);
    else
        snprintf(buf, len, "%.3f s", s);
    return buf;
}

static const char *fmt_bytes(char *buf, size_t len, long long b)
{
    if (b >= GIB && b % GIB == 0)
        snprintf(buf, len, "%lld GiB", b / GIB);
    else if (b >= MIB && b % MIB == 0)
        snprintf(buf, len, "%lld MiB", b / MIB);
    else if (b >= KIB && b % KIB == 0)
        snprintf(buf, len, "%lld KiB", b / KIB);
    else
        snprintf(buf, len, "%lld B", b);
    return buf;
}

/* A figure from times: fig(t) is the figure of time t (seconds); a figure
 * that grows as time shrinks (bandwidth, rate) has its min at the max time. */
typedef struct figure {
    double med, min, max;
} figure_t;

static figure_t figure(const side_result_t *r, double scale, int per_time)
{
    figure_t f;
    if (per_time) {
        f.med = scale / r->med;
        f.min = scale / r->max;
        f.max = scale / r->min;
    } else {
        f.med = scale * r->med;
        f.min = scale * r->min;
        f.max = scale * r->max;
    }
    return f;
}

/* The compared backends' figures (r[0..g_ncmp)): appended to the table's
 * note as "; raw gloo 1.23 GB/s" and to the JSON as "compare": {...}. */
static void compare_note(const side_result_t *r, double scale, int per_time,
                         const char *unit, char *note, size_t nlen,
                         char *json, size_t jlen)
{
    size_t jused;

    jused = (size_t)snprintf(json, jlen, ", \"compare\": {");
    for (int k = 0; k < g_ncmp; k++) {
        figure_t f = figure(&r[k], scale, per_time);
        size_t used = strlen(note);
        snprintf(note + used, nlen - used, "; %s %.4g %s%s", g_cmp_side[k],
                 f.med, unit, r[k].wrong ? " WRONG" : "");
        if (jused < jlen)
            jused += (size_t)snprintf(json + jused, jlen - jused,
                                      "%s\"%s\": %.6g", k ? ", " : "",
                                      g_cmp[k]->name, f.med);
    }
    if (jused < jlen)
        snprintf(json + jused, jlen - jused, "}");
}

/* One row: the table on rank 0, and one JSON object. extra_json (may be
 * NULL) is appended inside the object, starting with ", ". */
typedef struct row {
    const char *workload;
    long long size_bytes; /* -1: not a size */
    const char *size_text;
    const char *unit;
    figure_t kolo, raw;
    const side_result_t *kolo_t, *raw_t;
    double ratio;
    const char *ratio_is;
    int wrong;
    int warmup, iters;
    const char *note;
    const char *extra_json;
} row_t;

static void table_header(const char *title)
{
    if (g_rank != 0)
        return;
    printf("\n%s\n", title);
    printf("%-9s %-9s %-6s %9s %-24s %9s %-24s %7s  %-5s %s\n", "workload",
           "size", "unit", "kolo", " [min .. max]", "raw", " [min .. max]",
           "ratio", "check", "notes");
    fflush(stdout);
}

static void emit(const row_t *r)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], range1[48],
        range2[48];

    if (g_rank != 0)
        return;
    snprintf(range1, sizeof(range1), " [%s .. %s]",
             fmt_num(a, sizeof(a), r->kolo.min), fmt_num(b, sizeof(b), r->kolo.max));
    snprintf(range2, sizeof(range2), " [%s .. %s]",
             fmt_num(c, sizeof(c), r->raw.min), fmt_num(d, sizeof(d), r->raw.max));
    printf("%-9s %-9s %-6s %9s %-24s %9s %-24s %7s  %-5s %s\n", r->workload,
           r->size_text, r->unit, fmt_num(e, sizeof(e), r->kolo.med), range1,
           fmt_num(f, sizeof(f), r->raw.med), range2,
           fmt_num(g, sizeof(g), r->ratio), r->wrong ? "WRONG" : "ok",
           r->note ? r->note : "");
    fflush(stdout);

    if (g_json == NULL)
        return;
    fprintf(g_json, "%s\n    {\"workload\": ", g_json_first ? "" : ",");
    g_json_first = 0;
    json_string(g_json, r->workload);
    if (r->size_bytes >= 0)
        fprintf(g_json, ", \"size_bytes\": %lld", r->size_bytes);
    fprintf(g_json, ", \"size\": ");
    json_string(g_json, r->size_text);
    fprintf(g_json, ", \"unit\": ");
    json_string(g_json, r->unit);
    json_num(g_json, "kolo", r->kolo.med);
    json_num(g_json, "raw", r->raw.med);
    json_num(g_json, "ratio", r->ratio);
    fprintf(g_json, ", \"ratio_is\": ");
    json_string(g_json, r->ratio_is);
    json_num(g_json, "kolo_min", r->kolo.min);
    json_num(g_json, "kolo_max", r->kolo.max);
    json_num(g_json, "raw_min", r->raw.min);
    json_num(g_json, "raw_max", r->raw.max);
    json_num(g_json, "kolo_time_s", r->kolo_t->med);
    json_num(g_json, "raw_time_s", r->raw_t->med);
    fprintf(g_json, ", \"warmup\": %d, \"iters\": %d", r->warmup, r->iters);
    if (r->extra_json)
        fputs(r->extra_json, g_json);
    fprintf(g_json, ", \"check\": \"%s\"}", r->wrong ? "WRONG" : "ok");
    fflush(g_json);
}

/* ---------------------------------------------------------- options */

typedef struct options {
    int large, resnet50, small, latency, fp16;
    const char *backend;
    const char *compare; /* --compare: "gloo,mpi" */
    const char *json;
    int iters, warmup; /* -1: the workload's default */
    long long max_bytes;
    int quick;
} options_t;

static options_t g_opt;

static int iters_or(int def) { return g_opt.iters > 0 ? g_opt.iters : def; }
static int warmup_or(int def) { return g_opt.warmup >= 0 ? g_opt.warmup : def; }

/* ------------------------------------------------------------- large */

typedef struct large_state {
    float *buf;
    float *dev; /* --backend nccl: the tensor on the device (buf: its copy) */
    size_t count;
    char name16[64], name32[64];
    int fp16; /* sides: fp16 ? {kolo fp16, kolo fp32, raw} : {kolo, raw} */
} large_state_t;

static void allreduce_one(const char *name, float *buf, size_t count,
                          int wire, int ndim, const int64_t *shape,
                          kolo_handle_t *h)
{
    kolo_opts_t o;
    kolo_opts_init(&o);
    o.wire_dtype = wire;
    o.ndim = ndim;
    o.shape = shape;
    if (g_gpu) {
        /* buf is on g_dev; its input was written on g_stream. */
        o.device_type = KOLO_DEVICE_CUDA;
        o.device = g_dev;
        o.stream = g_stream;
    }
    kolo_must(kolo_allreduce_async_opts(name, buf, buf, (int64_t)count,
                                        KOLO_FLOAT32, &o, h),
              "kolo_allreduce_async_opts", name);
}

static void large_prepare(bench_t *b, int side)
{
    large_state_t *s = b->state;
    (void)side;
    fill(s->buf, s->count, 0);
    if (g_gpu) {
        dev_put(s->dev, s->buf, s->count * sizeof(float));
        dev_sync("copying the input to the device");
    }
}

static void large_run(bench_t *b, int side)
{
    large_state_t *s = b->state;
    int raw_side = s->fp16 ? 2 : 1;
    float *buf = g_gpu ? s->dev : s->buf;
    kolo_handle_t h;
    b->probe = s->buf;
    if (is_pass(s->fp16, side)) {
        memory_pass(s->buf, s->count);
        return;
    }
    if (side == raw_side && g_gpu) {
        nccl_allreduce(s->dev, s->count);
        dev_sync("ncclAllReduce");
        return;
    }
    if (side == raw_side) {
        raw_allreduce(s->buf, s->count, sizeof(float), g_sum_f32);
        return;
    }
    if (side > raw_side) {
        raw_allreduce_on(side - raw_side - 1, s->buf, s->count, sizeof(float),
                         g_sum_f32);
        return;
    }
    if (s->fp16 && side == 0) {
        allreduce_one(s->name16, buf, s->count, KOLO_FLOAT16, 0, NULL, &h);
        kolo_must(kolo_wait(h), "kolo_wait", s->name16);
    } else {
        allreduce_one(s->name32, buf, s->count, -1, 0, NULL, &h);
        kolo_must(kolo_wait(h), "kolo_wait", s->name32);
    }
}

static void large_fetch(bench_t *b, int side)
{
    large_state_t *s = b->state;
    (void)side;
    if (g_gpu) {
        dev_get(s->buf, s->dev, s->count * sizeof(float));
        dev_sync("copying the result from the device");
    }
}

static int large_verify(bench_t *b, int side, char *detail)
{
    large_state_t *s = b->state;
    if (is_pass(s->fp16, side))
        return 0; /* not an allreduce: no result to check */
    return check(s->buf, s->count, 0, (s->fp16 && side == 0) ? 1e-3f : 0.0f,
                 g_side_names[side], detail);
}

static void large_defaults(long long bytes, int *warmup, int *iters)
{
    if (g_opt.quick) {
        *warmup = 1;
        *iters = bytes <= 64 * KIB ? 10 : 5;
    } else if (bytes <= 1 * MIB) {
        *warmup = 3;
        *iters = 30;
    } else if (bytes <= 16 * MIB) {
        *warmup = 2;
        *iters = 10;
    } else {
        *warmup = 1;
        *iters = 5;
    }
    *warmup = warmup_or(*warmup);
    *iters = iters_or(*iters);
}

/* The sizes: powers of 4 from 4 B, and --max-bytes itself (a multiple of
 * 4) when it is not one of them. */
static int large_sizes(long long *sizes, int max, long long from)
{
    int n = 0;
    long long cap = g_opt.max_bytes / 4 * 4;
    for (long long b = 4; b <= cap && n < max; b *= 4)
        if (b >= from)
            sizes[n++] = b;
    if (n < max && cap >= from && (n == 0 || sizes[n - 1] != cap))
        sizes[n++] = cap;
    return n;
}

static double busbw_factor(void)
{
    return g_size > 1 ? 2.0 * (g_size - 1) / g_size : 1.0;
}

static void workload_large(void)
{
    long long sizes[64];
    int n = large_sizes(sizes, 64, 4);
    large_state_t s;
    bench_t b = {.nsides = 2 + g_ncmp, .prepare = large_prepare,
                 .run = large_run, .fetch = large_fetch,
                 .verify = large_verify, .state = &s};
    char title[256];

    memset(&s, 0, sizeof(s));
    s.buf = xalloc((size_t)sizes[n - 1]);
    if (g_gpu)
        s.dev = dev_alloc((size_t)sizes[n - 1]);
    snprintf(title, sizeof(title),
             "large: one float32 tensor; %s in GB/s; ratio = kolo/raw "
             "bandwidth (higher is better)",
             g_size > 1 ? "bus bandwidth 2(n-1)/n*bytes/time"
                        : "1 rank: bytes/time");
    table_header(title);
    g_side_names[0] = "kolo";
    g_side_names[1] = "raw";
    compare_sides(2);
    for (int i = 0; i < n; i++) {
        side_result_t r[MAX_SIDES];
        int warmup, iters;
        char size_text[32], label[64], note[256], t1[32], t2[32], extra[256];
        row_t row;

        s.count = (size_t)(sizes[i] / 4);
        snprintf(s.name32, sizeof(s.name32), "bench/large/%lld", sizes[i]);
        large_defaults(sizes[i], &warmup, &iters);
        fmt_bytes(size_text, sizeof(size_text), sizes[i]);
        snprintf(label, sizeof(label), "large %s", size_text);
        measure(&b, warmup, iters, label, r);
        snprintf(note, sizeof(note), "time %s vs %s",
                 fmt_time(t1, sizeof(t1), r[0].med), fmt_time(t2, sizeof(t2), r[1].med));
        compare_note(r + 2, busbw_factor() * (double)sizes[i] / 1e9, 1, "GB/s",
                     note, sizeof(note), extra, sizeof(extra));
        row = (row_t){
            .workload = "large", .size_bytes = sizes[i], .size_text = size_text,
            .unit = "GB/s",
            .kolo = figure(&r[0], busbw_factor() * (double)sizes[i] / 1e9, 1),
            .raw = figure(&r[1], busbw_factor() * (double)sizes[i] / 1e9, 1),
            .kolo_t = &r[0], .raw_t = &r[1],
            .ratio = r[1].med / r[0].med,
            .ratio_is = "kolo/raw bus bandwidth, higher is better",
            .wrong = r[0].wrong || r[1].wrong, .warmup = warmup, .iters = iters,
            .note = note, .extra_json = g_ncmp ? extra : NULL};
        emit(&row);
    }
    if (g_gpu)
        dev_free(s.dev);
    free(s.buf);
}

/* ----------------------------------------------------------- resnet50 */

typedef struct param {
    const char *name;
    int ndim;
    int64_t shape[4];
} param_t;

/* torchvision.models.resnet50(): the shapes of its 161 parameters (conv
 * weights, batch-norm weights and biases, fc), in backward order, that is
 * the reverse of named_parameters(); 25,557,032 values. */
static const param_t g_resnet50[RESNET50_TENSORS] = {
    {"fc.bias", 1, {1000}},
    {"fc.weight", 2, {1000, 2048}},
    {"layer4.2.bn3.bias", 1, {2048}},
    {"layer4.2.bn3.weight", 1, {2048}},
    {"layer4.2.conv3.weight", 4, {2048, 512, 1, 1}},
    {"layer4.2.bn2.bias", 1, {512}},
    {"layer4.2.bn2.weight", 1, {512}},
    {"layer4.2.conv2.weight", 4, {512, 512, 3, 3}},
    {"layer4.2.bn1.bias", 1, {512}},
    {"layer4.2.bn1.weight", 1, {512}},
    {"layer4.2.conv1.weight", 4, {512, 2048, 1, 1}},
    {"layer4.1.bn3.bias", 1, {2048}},
    {"layer4.1.bn3.weight", 1, {2048}},
    {"layer4.1.conv3.weight", 4, {2048, 512, 1, 1}},
    {"layer4.1.bn2.bias", 1, {512}},
    {"layer4.1.bn2.weight", 1, {512}},
    {"layer4.1.conv2.weight", 4, {512, 512, 3, 3}},
    {"layer4.1.bn1.bias", 1, {512}},
    {"layer4.1.bn1.weight", 1, {512}},
    {"layer4.1.conv1.weight", 4, {512, 2048, 1, 1}},
    {"layer4.0.downsample.1.bias", 1, {2048}},
    {"layer4.0.downsample.1.weight", 1, {2048}},
    {"layer4.0.downsample.0.weight", 4, {2048, 1024, 1, 1}},
    {"layer4.0.bn3.bias", 1, {2048}},
    {"layer4.0.bn3.weight", 1, {2048}},
    {"layer4.0.conv3.weight", 4, {2048, 512, 1, 1}},
    {"layer4.0.bn2.bias", 1, {512}},
    {"layer4.0.bn2.weight", 1, {512}},
    {"layer4.0.conv2.weight", 4, {512, 512, 3, 3}},
    {"layer4.0.bn1.bias", 1, {512}},
    {"layer4.0.bn1.weight", 1, {512}},
    {"layer4.0.conv1.weight", 4, {512, 1024, 1, 1}},
    {"layer3.5.bn3.bias", 1, {1024}},
    {"layer3.5.bn3.weight", 1, {1024}},
    {"layer3.5.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.5.bn2.bias", 1, {256}},
    {"layer3.5.bn2.weight", 1, {256}},
    {"layer3.5.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.5.bn1.bias", 1, {256}},
    {"layer3.5.bn1.weight", 1, {256}},
    {"layer3.5.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.4.bn3.bias", 1, {1024}},
    {"layer3.4.bn3.weight", 1, {1024}},
    {"layer3.4.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.4.bn2.bias", 1, {256}},
    {"layer3.4.bn2.weight", 1, {256}},
    {"layer3.4.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.4.bn1.bias", 1, {256}},
    {"layer3.4.bn1.weight", 1, {256}},
    {"layer3.4.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.3.bn3.bias", 1, {1024}},
    {"layer3.3.bn3.weight", 1, {1024}},
    {"layer3.3.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.3.bn2.bias", 1, {256}},
    {"layer3.3.bn2.weight", 1, {256}},
    {"layer3.3.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.3.bn1.bias", 1, {256}},
    {"layer3.3.bn1.weight", 1, {256}},
    {"layer3.3.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.2.bn3.bias", 1, {1024}},
    {"layer3.2.bn3.weight", 1, {1024}},
    {"layer3.2.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.2.bn2.bias", 1, {256}},
    {"layer3.2.bn2.weight", 1, {256}},
    {"layer3.2.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.2.bn1.bias", 1, {256}},
    {"layer3.2.bn1.weight", 1, {256}},
    {"layer3.2.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.1.bn3.bias", 1, {1024}},
    {"layer3.1.bn3.weight", 1, {1024}},
    {"layer3.1.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.1.bn2.bias", 1, {256}},
    {"layer3.1.bn2.weight", 1, {256}},
    {"layer3.1.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.1.bn1.bias", 1, {256}},
    {"layer3.1.bn1.weight", 1, {256}},
    {"layer3.1.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.0.downsample.1.bias", 1, {1024}},
    {"layer3.0.downsample.1.weight", 1, {1024}},
    {"layer3.0.downsample.0.weight", 4, {1024, 512, 1, 1}},
    {"layer3.0.bn3.bias", 1, {1024}},
    {"layer3.0.bn3.weight", 1, {1024}},
    {"layer3.0.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.0.bn2.bias", 1, {256}},
    {"layer3.0.bn2.weight", 1, {256}},
    {"layer3.0.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.0.bn1.bias", 1, {256}},
    {"layer3.0.bn1.weight", 1, {256}},
    {"layer3.0.conv1.weight", 4, {256, 512, 1, 1}},
    {"layer2.3.bn3.bias", 1, {512}},
    {"layer2.3.bn3.weight", 1, {512}},
    {"layer2.3.conv3.weight", 4, {512, 128, 1, 1}},
    {"layer2.3.bn2.bias", 1, {128}},
    {"layer2.3.bn2.weight", 1, {128}},
    {"layer2.3.conv2.weight", 4, {128, 128, 3, 3}},
    {"layer2.3.bn1.bias", 1, {128}},
    {"layer2.3.bn1.weight", 1, {128}},
    {"layer2.3.conv1.weight", 4, {128, 512, 1, 1}},
    {"layer2.2.bn3.bias", 1, {512}},
    {"layer2.2.bn3.weight", 1, {512}},
    {"layer2.2.conv3.weight", 4, {512, 128, 1, 1}},
    {"layer2.2.bn2.bias", 1, {128}},
    {"layer2.2.bn2.weight", 1, {128}},
    {"layer2.2.conv2.weight", 4, {128, 128, 3, 3}},
    {"layer2.2.bn1.bias", 1, {128}},
    {"layer2.2.bn1.weight", 1, {128}},
    {"layer2.2.conv1.weight", 4, {128, 512, 1, 1}},
    {"layer2.1.bn3.bias", 1, {512}},
    {"layer2.1.bn3.weight", 1, {512}},
    {"layer2.1.conv3.weight", 4, {512, 128, 1, 1}},
    {"layer2.1.bn2.bias", 1, {128}},
    {"layer2.1.bn2.weight", 1, {128}},
    {"layer2.1.conv2.weight", 4, {128, 128, 3, 3}},
    {"layer2.1.bn1.bias", 1, {128}},
    {"layer2.1.bn1.weight", 1, {128}},
    {"layer2.1.conv1.weight", 4, {128, 512, 1, 1}},
    {"layer2.0.downsample.1.bias", 1, {512}},
    {"layer2.0.downsample.1.weight", 1, {512}},
    {"layer2.0.downsample.0.weight", 4, {512, 256, 1, 1}},
    {"layer2.0.bn3.bias", 1, {512}},
    {"layer2.0.bn3.weight", 1, {512}},
    {"layer2.0.conv3.weight", 4, {512, 128, 1, 1}},
    {"layer2.0.bn2.bias", 1, {128}},
    {"layer2.0.bn2.weight", 1, {128}},
    {"layer2.0.conv2.weight", 4, {128, 128, 3, 3}},
    {"layer2.0.bn1.bias", 1, {128}},
    {"layer2.0.bn1.weight", 1, {128}},
    {"layer2.0.conv1.weight", 4, {128, 256, 1, 1}},
    {"layer1.2.bn3.bias", 1, {256}},
    {"layer1.2.bn3.weight", 1, {256}},
    {"layer1.2.conv3.weight", 4, {256, 64, 1, 1}},
    {"layer1.2.bn2.bias", 1, {64}},
    {"layer1.2.bn2.weight", 1, {64}},
    {"layer1.2.conv2.weight", 4, {64, 64, 3, 3}},
    {"layer1.2.bn1.bias", 1, {64}},
    {"layer1.2.bn1.weight", 1, {64}},
    {"layer1.2.conv1.weight", 4, {64, 256, 1, 1}},
    {"layer1.1.bn3.bias", 1, {256}},
    {"layer1.1.bn3.weight", 1, {256}},
    {"layer1.1.conv3.weight", 4, {256, 64, 1, 1}},
    {"layer1.1.bn2.bias", 1, {64}},
    {"layer1.1.bn2.weight", 1, {64}},
    {"layer1.1.conv2.weight", 4, {64, 64, 3, 3}},
    {"layer1.1.bn1.bias", 1, {64}},
    {"layer1.1.bn1.weight", 1, {64}},
    {"layer1.1.conv1.weight", 4, {64, 256, 1, 1}},
    {"layer1.0.downsample.1.bias", 1, {256}},
    {"layer1.0.downsample.1.weight", 1, {256}},
    {"layer1.0.downsample.0.weight", 4, {256, 64, 1, 1}},
    {"layer1.0.bn3.bias", 1, {256}},
    {"layer1.0.bn3.weight", 1, {256}},
    {"layer1.0.conv3.weight", 4, {256, 64, 1, 1}},
    {"layer1.0.bn2.bias", 1, {64}},
    {"layer1.0.bn2.weight", 1, {64}},
    {"layer1.0.conv2.weight", 4, {64, 64, 3, 3}},
    {"layer1.0.bn1.bias", 1, {64}},
    {"layer1.0.bn1.weight", 1, {64}},
    {"layer1.0.conv1.weight", 4, {64, 64, 1, 1}},
    {"bn1.bias", 1, {64}},
    {"bn1.weight", 1, {64}},
    {"conv1.weight", 4, {64, 3, 7, 7}},
};

static int64_t param_count(const param_t *p)
{
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++)
        n *= p->shape[d];
    return n;
}

static void resnet50_selfcheck(void)
{
    int64_t total = 0;
    for (int i = 0; i < RESNET50_TENSORS; i++)
        total += param_count(&g_resnet50[i]);
    if (total != RESNET50_ELEMENTS)
        die("internal error: the ResNet-50 table holds %lld values, not %lld",
            (long long)total, RESNET50_ELEMENTS);
}

typedef struct resnet_state {
    float *tensor[RESNET50_TENSORS];
    int64_t count[RESNET50_TENSORS];
    char name32[RESNET50_TENSORS][80], name16[RESNET50_TENSORS][80];
    float *flat; /* the raw side: all the bytes as one buffer */
    /* --backend nccl: the same on the device (the above: their copies) */
    float *dtensor[RESNET50_TENSORS];
    float *dflat;
    int fp16;
} resnet_state_t;

static void resnet_prepare(bench_t *b, int side)
{
    resnet_state_t *s = b->state;
    if (side >= (s->fp16 ? 2 : 1) && !is_pass(s->fp16, side)) {
        fill(s->flat, (size_t)RESNET50_ELEMENTS, 0);
        if (g_gpu)
            dev_put(s->dflat, s->flat,
                    (size_t)RESNET50_ELEMENTS * sizeof(float));
    } else {
        for (int i = 0; i < RESNET50_TENSORS; i++) {
            fill(s->tensor[i], (size_t)s->count[i], i);
            if (g_gpu)
                dev_put(s->dtensor[i], s->tensor[i],
                        (size_t)s->count[i] * sizeof(float));
        }
    }
    if (g_gpu)
        dev_sync("copying the inputs to the device");
}

static void resnet_run(bench_t *b, int side)
{
    resnet_state_t *s = b->state;
    kolo_handle_t h[RESNET50_TENSORS];
    int fp16 = s->fp16 && side == 0;

    b->probe = side >= (s->fp16 ? 2 : 1) ? s->flat : s->tensor[0];
    if (is_pass(s->fp16, side)) {
        b->probe = s->tensor[0];
        for (int i = 0; i < RESNET50_TENSORS; i++)
            memory_pass(s->tensor[i], (size_t)s->count[i]);
        return;
    }
    if (side >= (s->fp16 ? 2 : 1) && g_gpu) {
        nccl_allreduce(s->dflat, (size_t)RESNET50_ELEMENTS);
        dev_sync("ncclAllReduce");
        return;
    }
    if (side >= (s->fp16 ? 2 : 1)) {
        raw_allreduce_on(side - (s->fp16 ? 2 : 1) - 1, s->flat,
                         (size_t)RESNET50_ELEMENTS, sizeof(float), g_sum_f32);
        return;
    }
    for (int i = 0; i < RESNET50_TENSORS; i++)
        allreduce_one(fp16 ? s->name16[i] : s->name32[i],
                      g_gpu ? s->dtensor[i] : s->tensor[i],
                      (size_t)s->count[i], fp16 ? KOLO_FLOAT16 : -1,
                      g_resnet50[i].ndim, g_resnet50[i].shape, &h[i]);
    for (int i = 0; i < RESNET50_TENSORS; i++)
        kolo_must(kolo_wait(h[i]), "kolo_wait",
                  fp16 ? s->name16[i] : s->name32[i]);
}

static void resnet_fetch(bench_t *b, int side)
{
    resnet_state_t *s = b->state;
    if (!g_gpu)
        return;
    if (side >= (s->fp16 ? 2 : 1))
        dev_get(s->flat, s->dflat, (size_t)RESNET50_ELEMENTS * sizeof(float));
    else
        for (int i = 0; i < RESNET50_TENSORS; i++)
            dev_get(s->tensor[i], s->dtensor[i],
                    (size_t)s->count[i] * sizeof(float));
    dev_sync("copying the results from the device");
}

static int resnet_verify(bench_t *b, int side, char *detail)
{
    resnet_state_t *s = b->state;
    char what[160];
    int bad = 0;
    if (is_pass(s->fp16, side))
        return 0; /* not an allreduce: no result to check */
    if (side >= (s->fp16 ? 2 : 1)) /* raw and --compare: the one buffer */
        return check(s->flat, (size_t)RESNET50_ELEMENTS, 0, 0.0f,
                     g_side_names[side], detail);
    for (int i = 0; i < RESNET50_TENSORS && !bad; i++) {
        snprintf(what, sizeof(what), "%s, tensor %s", g_side_names[side],
                 g_resnet50[i].name);
        bad = check(s->tensor[i], (size_t)s->count[i], i,
                    (s->fp16 && side == 0) ? 1e-3f : 0.0f, what, detail);
    }
    return bad;
}

static resnet_state_t *resnet_new(int fp16)
{
    resnet_state_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        die("out of memory");
    s->fp16 = fp16;
    for (int i = 0; i < RESNET50_TENSORS; i++) {
        s->count[i] = param_count(&g_resnet50[i]);
        s->tensor[i] = xalloc((size_t)s->count[i] * sizeof(float));
        if (g_gpu)
            s->dtensor[i] = dev_alloc((size_t)s->count[i] * sizeof(float));
        snprintf(s->name32[i], sizeof(s->name32[i]), "resnet50/%s",
                 g_resnet50[i].name);
        snprintf(s->name16[i], sizeof(s->name16[i]), "resnet50-fp16/%s",
                 g_resnet50[i].name);
    }
    s->flat = xalloc((size_t)RESNET50_ELEMENTS * sizeof(float));
    if (g_gpu)
        s->dflat = dev_alloc((size_t)RESNET50_ELEMENTS * sizeof(float));
    return s;
}

static void resnet_free(resnet_state_t *s)
{
    for (int i = 0; i < RESNET50_TENSORS; i++) {
        free(s->tensor[i]);
        if (g_gpu)
            dev_free(s->dtensor[i]);
    }
    free(s->flat);
    if (g_gpu)
        dev_free(s->dflat);
    free(s);
}

static void resnet_defaults(int *warmup, int *iters)
{
    *warmup = warmup_or(g_opt.quick ? 1 : 2);
    *iters = iters_or(g_opt.quick ? 2 : 10);
}

static void workload_resnet50(void)
{
    resnet_state_t *s = resnet_new(0);
    bench_t b = {.nsides = 2 + g_ncmp, .prepare = resnet_prepare,
                 .run = resnet_run, .fetch = resnet_fetch,
                 .verify = resnet_verify, .state = s};
    side_result_t r[MAX_SIDES];
    int warmup, iters;
    char note[256], extra[320];
    row_t row;

    table_header("resnet50: 161 tensors (25,557,032 float32, 102 MB) enqueued "
                 "in backward order, then waited; ms per step; raw = one "
                 "allreduce of all the bytes; ratio = kolo/raw time (lower is "
                 "better)");
    g_side_names[0] = "kolo";
    g_side_names[1] = "raw";
    compare_sides(2);
    resnet_defaults(&warmup, &iters);
    measure(&b, warmup, iters, "resnet50", r);
    snprintf(note, sizeof(note), "busbw %.3f vs %.3f GB/s",
             busbw_factor() * RESNET50_ELEMENTS * 4 / r[0].med / 1e9,
             busbw_factor() * RESNET50_ELEMENTS * 4 / r[1].med / 1e9);
    snprintf(extra, sizeof(extra), ", \"tensors\": 161, \"elements\": 25557032");
    compare_note(r + 2, 1e3, 0, "ms", note, sizeof(note), extra + strlen(extra),
                 sizeof(extra) - strlen(extra));
    row = (row_t){.workload = "resnet50", .size_bytes = RESNET50_ELEMENTS * 4,
                  .size_text = "161 tens", .unit = "ms",
                  .kolo = figure(&r[0], 1e3, 0), .raw = figure(&r[1], 1e3, 0),
                  .kolo_t = &r[0], .raw_t = &r[1],
                  .ratio = r[0].med / r[1].med,
                  .ratio_is = "kolo/raw time per step, lower is better",
                  .wrong = r[0].wrong || r[1].wrong, .warmup = warmup,
                  .iters = iters, .note = note,
                  .extra_json = extra};
    emit(&row);
    resnet_free(s);
}

/* ------------------------------------------------------ small, latency */

typedef struct many_state {
    float *vals;
    float *dvals; /* --backend nccl: the tensors on the device */
    int n;
    char (*names)[32];
} many_state_t;

static void many_prepare(bench_t *b, int side)
{
    many_state_t *s = b->state;
    (void)side;
    fill(s->vals, (size_t)s->n, 0);
    if (g_gpu) {
        dev_put(s->dvals, s->vals, (size_t)s->n * sizeof(float));
        dev_sync("copying the inputs to the device");
    }
}

static void many_run(bench_t *b, int side)
{
    many_state_t *s = b->state;
    b->probe = &s->vals[0];
    if (side >= 1 && g_gpu) {
        /* As a program calls NCCL: every allreduce queued, then one wait. */
        for (int i = 0; i < s->n; i++)
            nccl_allreduce(&s->dvals[i], 1);
        dev_sync("ncclAllReduce");
        return;
    }
    if (side >= 1) {
        for (int i = 0; i < s->n; i++)
            raw_allreduce_on(side - 2, &s->vals[i], 1, sizeof(float), g_sum_f32);
        return;
    }
    kolo_handle_t hs[SMALL_TENSORS];
    for (int i = 0; i < s->n; i++)
        allreduce_one(s->names[i], g_gpu ? &s->dvals[i] : &s->vals[i], 1, -1,
                      0, NULL, &hs[i]);
    for (int i = 0; i < s->n; i++)
        kolo_must(kolo_wait(hs[i]), "kolo_wait", s->names[i]);
}

static void many_fetch(bench_t *b, int side)
{
    many_state_t *s = b->state;
    (void)side;
    if (g_gpu) {
        dev_get(s->vals, s->dvals, (size_t)s->n * sizeof(float));
        dev_sync("copying the results from the device");
    }
}

static int many_verify(bench_t *b, int side, char *detail)
{
    many_state_t *s = b->state;
    return check(s->vals, (size_t)s->n, 0, 0.0f, g_side_names[side], detail);
}

static void workload_many(int n)
{
    many_state_t s;
    bench_t b = {.nsides = 2 + g_ncmp, .prepare = many_prepare,
                 .run = many_run, .fetch = many_fetch,
                 .verify = many_verify, .state = &s};
    side_result_t r[MAX_SIDES];
    int warmup, iters;
    char note[256], t1[32], t2[32], cmp_json[256];
    row_t row;

    s.n = n;
    s.vals = xalloc((size_t)n * sizeof(float));
    s.dvals = g_gpu ? dev_alloc((size_t)n * sizeof(float)) : NULL;
    s.names = calloc((size_t)n, sizeof(*s.names));
    if (s.names == NULL)
        die("out of memory");
    for (int i = 0; i < n; i++)
        snprintf(s.names[i], sizeof(s.names[i]),
                 n == 1 ? "bench/latency" : "bench/small/%04d", i);
    g_side_names[0] = "kolo";
    g_side_names[1] = "raw";
    compare_sides(2);
    if (n == 1) {
        table_header("latency: one 4-byte allreduce, nothing else in flight; "
                     "microseconds; ratio = kolo/raw time (lower is better)");
        warmup = warmup_or(g_opt.quick ? 5 : 20);
        iters = iters_or(g_opt.quick ? 50 : 200);
        measure(&b, warmup, iters, "latency", r);
        char extra[384];
        snprintf(note, sizeof(note), "kolo - raw = %+.1f us",
                 (r[0].med - r[1].med) * 1e6);
        snprintf(extra, sizeof(extra), ", \"diff_us\": %.6g",
                 (r[0].med - r[1].med) * 1e6);
        cmp_json[0] = '\0';
        if (g_ncmp)
            compare_note(r + 2, 1e6, 0, "us", note, sizeof(note), cmp_json,
                         sizeof(cmp_json));
        snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), "%s",
                 cmp_json);
        row = (row_t){.workload = "latency", .size_bytes = 4, .size_text = "4 B",
                      .unit = "us", .kolo = figure(&r[0], 1e6, 0),
                      .raw = figure(&r[1], 1e6, 0), .kolo_t = &r[0],
                      .raw_t = &r[1], .ratio = r[0].med / r[1].med,
                      .ratio_is = "kolo/raw time, lower is better",
                      .wrong = r[0].wrong || r[1].wrong, .warmup = warmup,
                      .iters = iters, .note = note, .extra_json = extra};
        emit(&row);
    } else {
        table_header("small: 1000 tensors of one float, enqueued then waited "
                     "(raw: 1000 4-byte allreduces); allreduces per second; "
                     "ratio = kolo/raw (higher is better)");
        warmup = warmup_or(g_opt.quick ? 1 : 2);
        iters = iters_or(g_opt.quick ? 3 : 10);
        measure(&b, warmup, iters, "small", r);
        snprintf(note, sizeof(note), "time %s vs %s per 1000",
                 fmt_time(t1, sizeof(t1), r[0].med),
                 fmt_time(t2, sizeof(t2), r[1].med));
        snprintf(cmp_json, sizeof(cmp_json), ", \"tensors\": 1000");
        compare_note(r + 2, n, 1, "ops/s", note, sizeof(note),
                     cmp_json + strlen(cmp_json),
                     sizeof(cmp_json) - strlen(cmp_json));
        row = (row_t){.workload = "small", .size_bytes = -1,
                      .size_text = "1000x4 B", .unit = "ops/s",
                      .kolo = figure(&r[0], n, 1), .raw = figure(&r[1], n, 1),
                      .kolo_t = &r[0], .raw_t = &r[1],
                      .ratio = r[1].med / r[0].med,
                      .ratio_is = "kolo/raw allreduces per second, higher is better",
                      .wrong = r[0].wrong || r[1].wrong, .warmup = warmup,
                      .iters = iters, .note = note,
                      .extra_json = cmp_json};
        emit(&row);
    }
    if (g_gpu)
        dev_free(s.dvals);
    free(s.vals);
    free(s.names);
}

/* --------------------------------------------------------------- fp16 */

/* The fp16 rows: kolo = float16 on the wire, raw = the raw float32 backend
 * (ratio, as in large and resnet50), kolo_fp32 = float32 through the
 * runtime (speedup = how much faster float16 is), and on the host the
 * memory pass (bound = float32 time / pass time: the most any compression
 * could gain here). */
static void emit_fp16(const char *size_text, long long bytes, const char *unit,
                      double scale, int per_time, const side_result_t *r,
                      int warmup, int iters)
{
    figure_t f16 = figure(&r[0], scale, per_time),
             f32 = figure(&r[1], scale, per_time);
    double speedup = r[1].med / r[0].med;
    char note[192], extra[768], pass[256] = "", a[32], c[32];
    int len;
    row_t row;

    len = snprintf(note, sizeof(note), "fp32 kolo %s %s, fp16 speedup %.2fx",
                   fmt_num(a, sizeof(a), f32.med), unit, speedup);
    if (!g_gpu && len > 0 && (size_t)len < sizeof(note)) {
        figure_t fp = figure(&r[PASS_SIDE], scale, per_time);
        double bound = r[1].med / r[PASS_SIDE].med;
        snprintf(note + len, sizeof(note) - (size_t)len,
                 "; one pass %s %s: at most %.2fx",
                 fmt_num(c, sizeof(c), fp.med), unit, bound);
        snprintf(pass, sizeof(pass),
                 ", \"memory_pass\": %.6g, \"memory_pass_time_s\": %.6g, "
                 "\"speedup_bound\": %.6g, \"speedup_bound_is\": \"float32 "
                 "time through the runtime / time of one pass over the "
                 "float32 tensors on every rank at once\"",
                 fp.med, r[PASS_SIDE].med, bound);
    }
    snprintf(extra, sizeof(extra),
             ", \"wire_dtype\": \"float16\", \"kolo_fp32\": %.6g, "
             "\"kolo_fp32_min\": %.6g, \"kolo_fp32_max\": %.6g, "
             "\"kolo_fp32_time_s\": %.6g, \"speedup\": %.6g, "
             "\"speedup_is\": \"float32 time / float16 time through the "
             "runtime, higher is better\"%s%s",
             f32.med, f32.min, f32.max, r[1].med, speedup,
             bytes == RESNET50_ELEMENTS * 4 ? ", \"tensors\": 161" : "", pass);
    row = (row_t){.workload = "fp16", .size_bytes = bytes, .size_text = size_text,
                  .unit = unit, .kolo = f16,
                  .raw = figure(&r[2], scale, per_time),
                  .kolo_t = &r[0], .raw_t = &r[2],
                  .ratio = per_time ? r[2].med / r[0].med : r[0].med / r[2].med,
                  .ratio_is = per_time
                                  ? "kolo fp16/raw fp32 bus bandwidth, higher is better"
                                  : "kolo fp16/raw fp32 time, lower is better",
                  .wrong = r[0].wrong || r[1].wrong || r[2].wrong,
                  .warmup = warmup, .iters = iters, .note = note,
                  .extra_json = extra};
    emit(&row);
}

static void workload_fp16(void)
{
    long long sizes[64];
    int n = large_sizes(sizes, 64, 1 * MIB);
    int nsides = g_gpu ? FP16_SIDES_GPU : FP16_SIDES;
    side_result_t r[FP16_SIDES];
    int warmup, iters;

#define FP16_TITLE                                                             \
    "fp16: float32 tensors sent as float16 (wire_dtype); kolo = fp16 through " \
    "the runtime, raw = the raw float32 backend, ratio as in "                 \
    "large/resnet50; speedup = over float32 through the runtime"
    table_header(g_gpu ? FP16_TITLE
                       : FP16_TITLE ";\none pass = every rank reads and writes "
                                    "its float32 tensors once, all at once (the "
                                    "least an in-place allreduce must do); at "
                                    "most = fp32 time / pass time, the most any "
                                    "compression could gain here");
#undef FP16_TITLE
    g_side_names[0] = "kolo fp16";
    g_side_names[1] = "kolo fp32";
    g_side_names[2] = "raw";
    g_side_names[PASS_SIDE] = "one pass";
    if (n > 0) {
        large_state_t s;
        bench_t b = {.nsides = nsides, .prepare = large_prepare,
                 .run = large_run, .fetch = large_fetch,
                 .verify = large_verify, .state = &s};
        memset(&s, 0, sizeof(s));
        s.fp16 = 1;
        s.buf = xalloc((size_t)sizes[n - 1]);
        if (g_gpu)
            s.dev = dev_alloc((size_t)sizes[n - 1]);
        for (int i = 0; i < n; i++) {
            char size_text[32], label[64];
            s.count = (size_t)(sizes[i] / 4);
            snprintf(s.name32, sizeof(s.name32), "bench/large/%lld", sizes[i]);
            snprintf(s.name16, sizeof(s.name16), "bench/large-fp16/%lld",
                     sizes[i]);
            large_defaults(sizes[i], &warmup, &iters);
            fmt_bytes(size_text, sizeof(size_text), sizes[i]);
            snprintf(label, sizeof(label), "fp16 %s", size_text);
            measure(&b, warmup, iters, label, r);
            emit_fp16(size_text, sizes[i], "GB/s",
                      busbw_factor() * (double)sizes[i] / 1e9, 1, r, warmup,
                      iters);
        }
        if (g_gpu)
            dev_free(s.dev);
        free(s.buf);
    }
    {
        resnet_state_t *s = resnet_new(1);
        bench_t b = {.nsides = nsides, .prepare = resnet_prepare,
                 .run = resnet_run, .fetch = resnet_fetch,
                 .verify = resnet_verify, .state = s};
        resnet_defaults(&warmup, &iters);
        measure(&b, warmup, iters, "fp16 resnet50", r);
        emit_fp16("resnet50", RESNET50_ELEMENTS * 4, "ms", 1e3, 0, r, warmup,
                  iters);
        resnet_free(s);
    }
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kolorun -np N kolo-bench [options]\n"
        "  --workload W      large, resnet50, small, latency, fp16 or all\n"
        "                    (several: comma-separated; default all)\n"
        "  --backend B       the backend called directly (raw): gloo (default),\n"
        "                    mpi, shm (kolo's own shared-memory transport), or\n"
        "                    nccl: the tensors on CUDA devices (device\n"
        "                    KOLO_LOCAL_RANK mod the devices visible), kolo\n"
        "                    against NCCL called directly on the same bytes.\n"
        "                    kolo itself runs as in training: KOLO_CONTROLLER\n"
        "                    and KOLO_CPU_OPERATIONS choose its backends\n"
        "                    (default: shared memory within a host)\n"
        "  --compare B,B     more backends called directly in the same run, as\n"
        "                    extra figures of large, resnet50, small, latency\n"
        "                    (mpi: run under kolorun --mpi or mpirun)\n"
        "  --json FILE       rank 0 writes the results there as JSON\n"
        "  --iters N         timed iterations per figure (default: by workload\n"
        "                    and size, e.g. 30 for small tensors, 5 for 64 MiB)\n"
        "  --warmup N        untimed iterations before them (default: 1-20)\n"
        "  --max-bytes B     largest tensor of large and fp16 (default 256M;\n"
        "                    suffixes K, M, G are powers of 1024)\n"
        "  --quick           a short run: sizes up to 1 MiB, few iterations\n"
        "Every figure is measured through kolo and with the backend called\n"
        "directly on one buffer of the same bytes (raw), in the same run;\n"
        "times are the slowest rank's, median over the iterations.\n"
        "Exit status: 0, 1 if a result was WRONG, 2 on any other failure,\n"
        "77 if --backend nccl cannot run here (a build without GPU support,\n"
        "or no CUDA device visible; one line on stderr says which).\n");
}

static long long parse_bytes(const char *s)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    if (*end == 'K' || *end == 'k')
        v *= KIB, end++;
    else if (*end == 'M' || *end == 'm')
        v *= MIB, end++;
    else if (*end == 'G' || *end == 'g')
        v *= GIB, end++;
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end != '\0' || v > 64.0 * GIB)
        return -1;
    return (long long)v;
}

static int parse_int(const char *s, int min)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > 1000000)
        return -1;
    return (int)v;
}

static void bad_usage(const char *fmt, const char *arg)
{
    if (g_rank == 0) {
        fprintf(stderr, "kolo-bench: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, "\n");
        usage(stderr);
    }
    exit(2);
}

static void parse_workloads(const char *list)
{
    char buf[256], *save = NULL, *w;
    snprintf(buf, sizeof(buf), "%s", list);
    for (w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        if (strcmp(w, "all") == 0)
            g_opt.large = g_opt.resnet50 = g_opt.small = g_opt.latency =
                g_opt.fp16 = 1;
        else if (strcmp(w, "large") == 0)
            g_opt.large = 1;
        else if (strcmp(w, "resnet50") == 0)
            g_opt.resnet50 = 1;
        else if (strcmp(w, "small") == 0)
            g_opt.small = 1;
        else if (strcmp(w, "latency") == 0)
            g_opt.latency = 1;
        else if (strcmp(w, "fp16") == 0)
            g_opt.fp16 = 1;
        else
            bad_usage("unknown workload '%s'", w);
    }
}

static void parse_args(int argc, char **argv)
{
    int any = 0;
    g_opt.backend = "gloo";
    g_opt.iters = -1;
    g_opt.warmup = -1;
    g_opt.max_bytes = DEFAULT_MAX_BYTES;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            if (g_rank == 0)
                usage(stdout);
            exit(0);
        } else if (strcmp(a, "--quick") == 0) {
            g_opt.quick = 1;
            continue;
        }
        if (v == NULL)
            bad_usage("%s needs a value", a);
        i++;
        if (strcmp(a, "--workload") == 0) {
            parse_workloads(v);
            any = 1;
        } else if (strcmp(a, "--backend") == 0) {
            g_opt.backend = v;
        } else if (strcmp(a, "--compare") == 0) {
            g_opt.compare = v;
        } else if (strcmp(a, "--json") == 0) {
            g_opt.json = v;
        } else if (strcmp(a, "--iters") == 0) {
            if ((g_opt.iters = parse_int(v, 1)) < 0)
                bad_usage("--iters: '%s' is not a number >= 1", v);
        } else if (strcmp(a, "--warmup") == 0) {
            if ((g_opt.warmup = parse_int(v, 0)) < 0)
                bad_usage("--warmup: '%s' is not a number >= 0", v);
        } else if (strcmp(a, "--max-bytes") == 0) {
            if ((g_opt.max_bytes = parse_bytes(v)) < 4)
                bad_usage("--max-bytes: '%s' is not a size of 4 bytes or more "
                          "(like 4096, 64M, 1G)", v);
        } else {
            bad_usage("unknown option '%s'", a);
        }
    }
    if (!any)
        parse_workloads("all");
    if (g_opt.quick && g_opt.max_bytes > QUICK_MAX_BYTES)
        g_opt.max_bytes = QUICK_MAX_BYTES;
}

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && v[0] ? v : def;
}

/* KOLO_SHM_SLOT_BYTES as the runtime reads it: auto (0) or bytes. */
static size_t raw_slot_bytes(void)
{
    long long v = parse_bytes(env_or("KOLO_SHM_SLOT_BYTES", "auto"));
    return v > 0 ? (size_t)v : 0;
}

/* The backend the runtime uses for a role (KOLO_CONTROLLER or
 * KOLO_CPU_OPERATIONS), as the runtime chose it: the variable when set,
 * else shared memory when every rank is on one host, else the network
 * backend the job was started with. `data` also names hierarchical
 * allreduce. Only for the header and the JSON. */
static const char *runtime_backend(const char *var, int data)
{
    const char *v = getenv(var);
    const char *cross = getenv("KOLO_CROSS_SIZE");
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); /* mpirun */
    int hosts = cross ? atoi(cross) > 1 : local && atoi(local) < g_size;
    int mpi = kolo_enabled("mpi");

    if (g_size == 1)
        return "local";
    if (v && v[0] && strcmp(v, "auto") != 0)
        return v;
    if (!hosts)
        return "shm";
    if (data && kolo_enabled("shm"))
        return mpi ? "hier (shm + mpi)" : "hier (shm + gloo)";
    return mpi ? "mpi" : "gloo";
}

static const char *env_get(const char *name) { return getenv(name); }

/* The raw side: the backend's own context, next to the runtime's.
 * --backend nccl: the host backend of barriers and of the reduction of the
 * times; the raw NCCL side is gpu_init's. */
static void raw_init(const char *backend)
{
    const char *rdv = getenv("KOLO_RENDEZVOUS");
    const char *host = getenv("KOLO_HOSTNAME");
    const char *iface = getenv("KOLO_NETWORK_INTERFACE");
    static kolo__config_t kc; /* its hostname outlives raw_init */
    char err[512] = "";
    kolo__ops_config_t cfg;
    int *members;
    int rc;

    if (g_size == 1) {
        g_raw = &kolo__ops_local;
    } else if (strcmp(backend, "mpi") == 0) {
        /* kolo_init initialised MPI; the raw side uses it too. */
        g_raw = kolo__ops_find("mpi");
    } else {
        g_raw = kolo__ops_named(backend);
        if (g_raw == NULL)
            die("this kolo-bench has no raw backend '%s'", backend);
        if (iface != NULL && iface[0] != '\0') {
            /* Bind where the runtime binds: the interface's address, as
             * env.c finds it (kolorun --network-interface). */
            kolo__err_t e;
            if (kolo__config_load(&kc, env_get, &e) != 0)
                die("%s", e.msg);
            host = kc.hostname;
        }
        if ((rdv == NULL || rdv[0] == '\0') && getenv("PMIX_NAMESPACE") &&
            strcmp(backend, "gloo") != 0) {
            /* Started by mpirun: shared memory keys its segment on the job's
             * PMIx namespace, unique per job. */
            static char mpi_rdv[300];
            snprintf(mpi_rdv, sizeof(mpi_rdv), "mpi-bench:%s",
                     getenv("PMIX_NAMESPACE"));
            rdv = mpi_rdv;
        }
        if (rdv == NULL || rdv[0] == '\0')
            die("KOLO_RENDEZVOUS is not set: run kolo-bench under kolorun "
                "(--backend gloo and --compare gloo need kolorun without "
                "--mpi)");
    }
    members = g_raw_members = malloc((size_t)g_size * sizeof(int));
    if (members == NULL)
        die("out of memory");
    for (int i = 0; i < g_size; i++)
        members[i] = i;
    cfg = (kolo__ops_config_t){
        .rank = g_rank, .size = g_size, .members = members,
        .global_rank = g_rank, .rendezvous = rdv ? rdv : "",
        .prefix = "kolo-bench-raw",
        .hostname = host && host[0] ? host : "127.0.0.1",
        .timeout_s = 300, .start_timeout_s = 60, .on_wake = NULL,
        .wake_arg = NULL,
        /* The raw side runs as the runtime's does (env.c checked these). */
        .shm_slot_bytes = raw_slot_bytes(),
        .shm_spin_us = atoi(env_or("KOLO_SHM_SPIN_US", "50"))};
    rc = g_raw->init(&cfg, &g_raw_ctx, err, sizeof(err));
    if (rc != KOLO_OK)
        die("raw %s backend: init failed: %s (%s)", g_raw->name, err,
            kolo_strerror(rc));
    for (int k = 0; k < g_ncmp; k++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "kolo-bench-compare-%s", g_cmp[k]->name);
        cfg.prefix = prefix;
        rc = g_cmp[k]->init(&cfg, &g_cmp_ctx[k], err, sizeof(err));
        if (rc != KOLO_OK)
            die("raw %s backend (--compare): init failed: %s (%s)",
                g_cmp[k]->name, err, kolo_strerror(rc));
    }
}

/* --compare B[,B...]: the backends this build has, not the one measured. */
static void parse_compare(void)
{
    char list[128], *save = NULL;

    if (g_opt.compare == NULL || g_size == 1)
        return;
    snprintf(list, sizeof(list), "%s", g_opt.compare);
    for (char *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        const kolo__ops_t *ops = kolo__ops_named(w);
        if (ops == NULL)
            bad_usage("--compare: no backend '%s' in this build", w);
        if (g_ncmp == MAX_COMPARE)
            bad_usage("--compare: at most 3 backends ('%s' is one more)", w);
        g_cmp[g_ncmp] = ops;
        snprintf(g_cmp_side[g_ncmp], sizeof(g_cmp_side[g_ncmp]), "raw %s", w);
        g_ncmp++;
    }
}


/* --backend nccl: barriers and the reduction of the times go through a host
 * backend called directly (never timed): one that spans every rank, as the
 * runtime's negotiation does. Shared memory only when nothing else is up:
 * the runtime enables it within each host of a hierarchical job too. */
static const char *nccl_host_backend(void)
{
    static const char *const names[] = {"gloo", "mpi", "shm"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (kolo_enabled(names[i]) && kolo__ops_find(names[i]) != NULL)
            return names[i];
    return "gloo";
}

static const char *g_env_names[] = {
    "KOLO_FUSION_THRESHOLD", "KOLO_CYCLE_TIME", "KOLO_CACHE_CAPACITY",
    "KOLO_TIMELINE", "KOLO_AUTOTUNE", "KOLO_LOG_LEVEL", "KOLO_CONTROLLER",
    "KOLO_CPU_OPERATIONS", "KOLO_SHM_SLOT_BYTES"};
#define N_ENV ((int)(sizeof(g_env_names) / sizeof(g_env_names[0])))

static void print_header(void)
{
    char wl[128] = "";
    if (g_rank != 0)
        return;
    snprintf(wl, sizeof(wl), "%s%s%s%s%s", g_opt.large ? " large" : "",
             g_opt.resnet50 ? " resnet50" : "", g_opt.small ? " small" : "",
             g_opt.latency ? " latency" : "", g_opt.fp16 ? " fp16" : "");
    if (g_gpu) {
        printf("kolo-bench %d.%d.%d: %d rank%s; CUDA tensors on device %d "
               "(%s) through kolo (NCCL); raw = NCCL %s called directly on "
               "one device buffer (its own communicator and stream), timed "
               "to cudaStreamSynchronize; barriers over %s (host, not "
               "timed)\n",
               KOLO_VERSION_MAJOR, KOLO_VERSION_MINOR, KOLO_VERSION_PATCH,
               g_size, g_size == 1 ? "" : "s", g_dev, g_gpu_name,
               g_nccl_version, g_raw->name);
    } else {
        printf("kolo-bench %d.%d.%d: %d rank%s; kolo negotiates over %s and "
               "moves tensors over %s (as a training job does; "
               "KOLO_CONTROLLER and KOLO_CPU_OPERATIONS change that); raw = "
               "%s called directly on one buffer\n",
               KOLO_VERSION_MAJOR, KOLO_VERSION_MINOR, KOLO_VERSION_PATCH,
               g_size, g_size == 1 ? "" : "s",
               runtime_backend("KOLO_CONTROLLER", 0),
               runtime_backend("KOLO_CPU_OPERATIONS", 1), g_raw->name);
    }
    printf("environment: KOLO_FUSION_THRESHOLD=%s KOLO_CYCLE_TIME=%s "
           "KOLO_CACHE_CAPACITY=%s KOLO_SHM_SLOT_BYTES=%s KOLO_TIMELINE=%s "
           "KOLO_AUTOTUNE=%s\n",
           env_or("KOLO_FUSION_THRESHOLD", "(default)"),
           env_or("KOLO_CYCLE_TIME", "(default)"),
           env_or("KOLO_CACHE_CAPACITY", "(default)"),
           env_or("KOLO_SHM_SLOT_BYTES", "(auto)"),
           env_or("KOLO_TIMELINE", "(off)"), env_or("KOLO_AUTOTUNE", "(off)"));
    printf("workloads:%s%s; times: per iteration the slowest rank's (MAX over "
           "ranks, reduced through the raw context after the run), median "
           "[min .. max] over the timed iterations after warm-up; every "
           "result checked\n",
           wl, g_opt.quick ? " (--quick)" : "");
    fflush(stdout);
}

static void json_begin(void)
{
    if (g_rank != 0 || g_opt.json == NULL)
        return;
    g_json = fopen(g_opt.json, "w");
    if (g_json == NULL)
        die("cannot write %s: %s", g_opt.json, strerror(errno));
    fprintf(g_json, "{\"tool\": \"kolo-bench\", \"version\": \"%d.%d.%d\", "
                    "\"ranks\": %d, \"backend\": ",
            KOLO_VERSION_MAJOR, KOLO_VERSION_MINOR, KOLO_VERSION_PATCH, g_size);
    json_string(g_json, g_gpu ? "nccl" : g_size == 1 ? "local" : g_opt.backend);
    fprintf(g_json, ", \"raw_backend\": ");
    json_string(g_json, g_gpu ? "nccl" : g_raw->name);
    fprintf(g_json, ", \"kolo_controller\": ");
    json_string(g_json, runtime_backend("KOLO_CONTROLLER", 0));
    fprintf(g_json, ", \"kolo_cpu_operations\": ");
    json_string(g_json, runtime_backend("KOLO_CPU_OPERATIONS", 1));
    if (g_gpu) {
        /* rank 0's device; every rank's is KOLO_LOCAL_RANK mod its count */
        fprintf(g_json, ", \"device\": {\"type\": \"cuda\", \"index\": %d, "
                        "\"name\": ",
                g_dev);
        json_string(g_json, g_gpu_name);
        fprintf(g_json, "}, \"nccl_version\": ");
        json_string(g_json, g_nccl_version);
        fprintf(g_json, ", \"host_backend\": ");
        json_string(g_json, g_raw->name);
    }
    fprintf(g_json, ", \"quick\": %s, \"max_bytes\": %lld,\n  \"env\": {",
            g_opt.quick ? "true" : "false", g_opt.max_bytes);
    for (int i = 0; i < N_ENV; i++) {
        const char *v = getenv(g_env_names[i]);
        fprintf(g_json, "%s\"%s\": ", i ? ", " : "", g_env_names[i]);
        if (v)
            json_string(g_json, v);
        else
            fputs("null", g_json);
    }
    fprintf(g_json, "},\n  \"timing\": \"per iteration the slowest rank's "
                    "time (MAX over ranks); median, min and max over the "
                    "timed iterations after warm-up\",\n  \"results\": [");
}

static void json_end(void)
{
    if (g_json == NULL)
        return;
    fprintf(g_json, "\n  ],\n  \"wrong\": %d, \"ok\": %s}\n", g_wrong,
            g_wrong ? "false" : "true");
    if (fclose(g_json) != 0)
        die("cannot write %s: %s", g_opt.json, strerror(errno));
    g_json = NULL;
}

int main(int argc, char **argv)
{
    const char *r = getenv("KOLO_RANK");
    int rc;

    /* Usage errors before connecting: only rank 0 talks. */
    g_rank = r ? atoi(r) : 0;
    parse_args(argc, argv);
    g_gpu = strcmp(g_opt.backend, "nccl") == 0;
    if (g_gpu && g_opt.compare != NULL)
        bad_usage("--compare %s: it adds host backends, not with --backend "
                  "nccl", g_opt.compare);
    if (!g_gpu && kolo__ops_named(g_opt.backend) == NULL) {
        char msg[256];
        kolo__ops_names(msg, sizeof(msg));
        snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg),
                 "%s", " are in this build, and nccl for CUDA tensors; "
                 "not '%s'");
        bad_usage(msg, g_opt.backend);
    }
    if (g_gpu)
        gpu_require(); /* or exit EXIT_CANNOT_RUN, saying why */
    if (strcmp(g_opt.backend, "mpi") == 0 && getenv("KOLO_RANK") != NULL)
        bad_usage("--backend mpi needs the job started by MPI: run %s",
                  "kolorun --mpi -np N kolo-bench --backend mpi (or "
                  "mpirun -np N kolo-bench --backend mpi)");
    /* The runtime runs as this job would run a training loop: its backends
     * are the environment's (KOLO_CONTROLLER, KOLO_CPU_OPERATIONS), by
     * default its own choice (shared memory for the ranks of one host).
     * --backend picks what it is measured against. */
    resnet50_selfcheck();
    g_fault = env_or("KOLO_BENCH_FAULT", "0")[0] == '1';

    g_sum_f32 = kolo__reduce_get(KOLO_FLOAT32, KOLO_OP_SUM);
    g_max_f64 = kolo__reduce_get(KOLO_FLOAT64, KOLO_OP_MAX);
    g_max_i32 = kolo__reduce_get(KOLO_INT32, KOLO_OP_MAX);
    if (!g_sum_f32 || !g_max_f64 || !g_max_i32)
        die("internal error: no reduction kernel");

    if ((rc = kolo_init()) != KOLO_OK)
        die("kolo_init failed: %s (%s)", kolo_last_error(), kolo_strerror(rc));
    g_rank = kolo_rank();
    g_size = kolo_size();
    parse_compare();
    raw_init(g_gpu ? nccl_host_backend() : g_opt.backend);
    if (g_gpu)
        gpu_init();
    data_init();
    print_header();
    json_begin();

    if (g_opt.large)
        workload_large();
    if (g_opt.resnet50)
        workload_resnet50();
    if (g_opt.small)
        workload_many(SMALL_TENSORS);
    if (g_opt.latency)
        workload_many(1);
    if (g_opt.fp16)
        workload_fp16();

    json_end();
    if (g_rank == 0) {
        if (g_wrong)
            printf("\n%d result%s WRONG\n", g_wrong, g_wrong == 1 ? "" : "s");
        else
            printf("\nevery result checked: ok\n");
        fflush(stdout);
    }
    /* Every rank is done with kolo before the first one shuts it down. */
    barrier();
    if ((rc = kolo_shutdown()) != KOLO_OK)
        die("kolo_shutdown failed: %s", kolo_last_error());
    if (g_gpu)
        gpu_finalize();
    for (int k = 0; k < g_ncmp; k++)
        g_cmp[k]->finalize(g_cmp_ctx[k]);
    g_raw->finalize(g_raw_ctx);
    free(g_raw_members);
    return g_wrong ? 1 : 0;
}
