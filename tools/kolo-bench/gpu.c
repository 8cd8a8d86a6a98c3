/*
 * gpu.c — the GPU: --backend nccl (described in bench.h). Each rank's CUDA
 * device and the bench's stream, device memory and the copies to and from
 * it, and the raw side's NCCL communicator. Only this file needs a CUDA
 * header: elsewhere the stream is kept as a void *. A build without GPU
 * support (no KOLO_HAVE_GPU) has stubs instead, never reached:
 * bench_gpu_require exits first, saying why.
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KOLO_HAVE_GPU
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include "bench.h"

/* The exit status of "--backend nccl cannot run here" (no GPU support in
 * this build, or no CUDA device visible): automake's "skipped". */
#define EXIT_CANNOT_RUN 77

int bench_gpu;                     /* --backend nccl */
int bench_dev = -1;                /* this rank's CUDA device, -1 before */
void *bench_stream;                /* the bench's cudaStream_t, on bench_dev */
char bench_gpu_name[256] = "";     /* the device's name */
char bench_nccl_version[32] = "";  /* "2.28.9" */

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
    if (bench_dev < 0)
        return "";
    snprintf(text, sizeof(text), " (CUDA device %d)", bench_dev);
    return text;
}

/* Exits: "WHAT failed (CUDA device D): ERR: DETAIL", WHAT from fmt. */
static void gpu_fail(const char *err, const char *detail, const char *fmt,
                     ...) __attribute__((format(printf, 3, 4), noreturn));
static void gpu_fail(const char *err, const char *detail, const char *fmt,
                     ...)
{
    char what[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    bench_die("%s failed%s: %s%s%s", what, dev_text(), err,
              detail && detail[0] ? ": " : "", detail ? detail : "");
}

/* CUDA_MUST(call, fmt, ...), NCCL_MUST(call, fmt, ...): run call; unless it
 * succeeds, exit naming what failed (fmt, ...) and the library's error (for
 * NCCL, its last error's text, of any communicator). A loop that never
 * comes round: gpu_fail does not return. */
#define CUDA_MUST(call, ...)                                                  \
    for (cudaError_t e_ = (call); e_ != cudaSuccess;)                         \
    gpu_fail(cudaGetErrorName(e_), cudaGetErrorString(e_), __VA_ARGS__)
#define NCCL_MUST(call, ...)                                                  \
    for (ncclResult_t r_ = (call); r_ != ncclSuccess;)                        \
    gpu_fail(ncclGetErrorString(r_), ncclGetLastError(NULL), __VA_ARGS__)

/* Exits EXIT_CANNOT_RUN, saying why, unless a CUDA device is visible. Runs
 * before kolo_init, so that the job ends without connecting. */
void bench_gpu_require(void)
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
void bench_gpu_init(void)
{
    const char *id_name = "kolo-bench/nccl-unique-id";
    struct cudaDeviceProp prop;
    cudaStream_t stream;
    ncclUniqueId id;
    kolo_handle_t h;
    int n = 0, local = kolo_local_rank(), v = 0;

    CUDA_MUST(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (n <= 0)
        bench_die("cudaGetDeviceCount: no CUDA device");
    bench_dev = (local > 0 ? local : 0) % n;
    CUDA_MUST(cudaSetDevice(bench_dev), "cudaSetDevice(%d)", bench_dev);
    CUDA_MUST(cudaGetDeviceProperties(&prop, bench_dev),
              "cudaGetDeviceProperties(%d)", bench_dev);
    snprintf(bench_gpu_name, sizeof(bench_gpu_name), "%s", prop.name);
    CUDA_MUST(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
    bench_stream = stream;

    /* Rank 0's id reaches every rank through kolo itself, in host memory. */
    memset(&id, 0, sizeof(id));
    if (bench_rank == 0)
        NCCL_MUST(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bench_kolo_must(kolo_broadcast_async(id_name, &id, (int64_t)sizeof(id),
                                         KOLO_UINT8, 0, NULL, &h),
                    "kolo_broadcast_async", id_name);
    bench_kolo_must(kolo_wait(h), "kolo_wait", id_name);
    NCCL_MUST(ncclCommInitRank(&g_comm, bench_size, id, bench_rank),
              "ncclCommInitRank (rank %d of %d)", bench_rank, bench_size);
    NCCL_MUST(ncclGetVersion(&v), "ncclGetVersion");
    snprintf(bench_nccl_version, sizeof(bench_nccl_version), "%d.%d.%d",
             v / 10000, v / 100 % 100, v % 100);
}

/* After kolo_shutdown, on every rank (finalizing waits for the others). */
void bench_gpu_finalize(void)
{
    NCCL_MUST(ncclCommFinalize(g_comm), "ncclCommFinalize");
    NCCL_MUST(ncclCommDestroy(g_comm), "ncclCommDestroy");
    g_comm = NULL;
    CUDA_MUST(cudaStreamDestroy((cudaStream_t)bench_stream),
              "cudaStreamDestroy");
    bench_stream = NULL;
}

void *bench_dev_alloc(size_t bytes)
{
    void *p = NULL;
    CUDA_MUST(cudaMalloc(&p, bytes ? bytes : 4), "cudaMalloc of %zu bytes",
              bytes);
    return p;
}

void bench_dev_free(void *p)
{
    if (p != NULL)
        CUDA_MUST(cudaFree(p), "cudaFree");
}

/* Queue a copy on the bench's stream; dev_sync waits for it. */
void bench_dev_put(void *dst, const void *src, size_t bytes)
{
    CUDA_MUST(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                              (cudaStream_t)bench_stream),
              "cudaMemcpyAsync of %zu bytes to the device", bytes);
}

void bench_dev_get(void *dst, const void *src, size_t bytes)
{
    CUDA_MUST(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                              (cudaStream_t)bench_stream),
              "cudaMemcpyAsync of %zu bytes from the device", bytes);
}

void bench_dev_sync(const char *after)
{
    CUDA_MUST(cudaStreamSynchronize((cudaStream_t)bench_stream),
              "cudaStreamSynchronize after %s", after);
}

/* Raw: a float32 sum in place, queued on the bench's stream. */
void bench_nccl_allreduce(float *buf, size_t count)
{
    NCCL_MUST(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, g_comm,
                            (cudaStream_t)bench_stream),
              "ncclAllReduce of %zu bytes", count * sizeof(float));
}
#else
void bench_gpu_require(void)
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

/* Never reached: bench_gpu_require exits first. */
static void no_gpu(void) __attribute__((noreturn));
static void no_gpu(void)
{
    bench_die(
        "internal error: GPU code reached in a build without GPU support");
}
void bench_gpu_init(void) { no_gpu(); }
void bench_gpu_finalize(void) { no_gpu(); }
void *bench_dev_alloc(size_t bytes) { (void)bytes; no_gpu(); }
void bench_dev_free(void *p) { (void)p; no_gpu(); }
void bench_dev_put(void *dst, const void *src, size_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    no_gpu();
}
void bench_dev_get(void *dst, const void *src, size_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    no_gpu();
}
void bench_dev_sync(const char *after) { (void)after; no_gpu(); }
void bench_nccl_allreduce(float *buf, size_t count)
{
    (void)buf, (void)count;
    no_gpu();
}
#endif
