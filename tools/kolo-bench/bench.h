/*
 * kolo-bench — measures kolo against a backend called directly.
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
 *
 * The files (tools/kolo-bench/), one subject each:
 *   job.c             this rank and the job's size, dying, allocating, the
 *                     environment
 *   data.c            the inputs every rank fills and the sums it checks
 *   raw.c             the raw side: the backends called directly (--backend,
 *                     --compare), barriers and the reduction of the times
 *   gpu.c             --backend nccl: the CUDA device, its stream, NCCL
 *                     called directly; stubs in a build without GPU support
 *   measure.c         one workload at one size: its sides timed and checked
 *   report.c          the header, the table and the JSON document
 *   options.c         the command line
 *   large.c, resnet50.c, small.c (small and latency), fp16.c: the workloads
 *   resnet50_table.c  the shapes of ResNet-50's parameters
 *   main.c            the order of it all
 * This header declares what they share, every name of it bench_* (or
 * BENCH_*); everything else is static in its file.
 */
#ifndef KOLO_BENCH_H
#define KOLO_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "kolo.h"
#include "ops.h"

#define KIB (1024LL)
#define MIB (1024LL * 1024)
#define GIB (1024LL * 1024 * 1024)

#define BENCH_SMALL_TENSORS 1000
#define BENCH_RESNET50_TENSORS 161
#define BENCH_RESNET50_ELEMENTS 25557032LL
#define BENCH_DETAIL_LEN 256 /* the sentence a failed check leaves */

/* ------------------------------------------------------------ job.c */

extern int bench_rank, bench_size;
extern int bench_wrong; /* WRONG results seen (any rank) */
extern int bench_fault; /* KOLO_BENCH_FAULT=1: see bench_measure() */

/* Says why on stderr and exits 2 (the other ranks are stopped by kolorun). */
void bench_die(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
void *bench_xalloc(size_t bytes); /* 64-byte aligned; dies if out of memory */
/* The variable's value, or def when it is unset or empty. */
const char *bench_env_or(const char *name, const char *def);

/* ----------------------------------------------------------- data.c */

void bench_data_init(void); /* after kolo_init: the expected sums */
void bench_fill(float *p, size_t n, int t);
int bench_check(const float *p, size_t n, int t, float tol, const char *what,
                char *detail);
void bench_kolo_must(int rc, const char *what, const char *name);

/* ------------------------------------------------------------ raw.c */

/* --compare: more backends called directly, as extra sides of the large,
 * resnet50, small and latency workloads. */
enum { BENCH_MAX_COMPARE = 3 };

extern const kolo__ops_t *bench_raw; /* the backend, called directly */
extern const kolo__ops_t *bench_cmp[BENCH_MAX_COMPARE];
extern int bench_ncmp;
extern char bench_cmp_side[BENCH_MAX_COMPARE][32]; /* "raw gloo" */
extern kolo__ops_reduce_fn bench_sum_f32, bench_max_f64, bench_max_i32;

void bench_raw_allreduce_on(int which, void *buf, size_t count,
                            size_t elem_size, kolo__ops_reduce_fn fn);
void bench_raw_allreduce(void *buf, size_t count, size_t elem_size,
                         kolo__ops_reduce_fn fn);
void bench_barrier(void);
void bench_raw_init(const char *backend);
void bench_raw_finalize(void);
void bench_parse_compare(void);
const char *bench_nccl_host_backend(void);

/* ------------------------------------------------------------ gpu.c */

extern int bench_gpu;        /* --backend nccl */
extern int bench_dev;        /* this rank's CUDA device, -1 before */
extern void *bench_stream;   /* the bench's cudaStream_t, on bench_dev */
extern char bench_gpu_name[256];    /* the device's name */
extern char bench_nccl_version[32]; /* "2.28.9" */

void bench_gpu_require(void);
void bench_gpu_init(void);
void bench_gpu_finalize(void);
void *bench_dev_alloc(size_t bytes);
void bench_dev_free(void *p);
void bench_dev_put(void *dst, const void *src, size_t bytes);
void bench_dev_get(void *dst, const void *src, size_t bytes);
void bench_dev_sync(const char *after);
void bench_nccl_allreduce(float *buf, size_t count);

/* -------------------------------------------------------- measure.c */

/* One workload at one size: up to three sides, each a way of doing the same
 * allreduce, and the compared backends. prepare fills the inputs, run is
 * the timed part, fetch brings the output to where verify reads it
 * (--backend nccl: from the device; not timed), verify checks it (0 =
 * right). */
enum { BENCH_MAX_SIDES = 3 + BENCH_MAX_COMPARE };

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

typedef struct bench_result {
    double med, min, max; /* seconds, slowest rank per iteration */
    int wrong;            /* some rank got a wrong answer */
} bench_result_t;

/* The fp16 workload's sides: kolo fp16, kolo fp32, raw, and on the host the
 * memory pass (see "fp16" above). */
enum { BENCH_FP16_SIDES_GPU = 3, BENCH_FP16_SIDES = 4, BENCH_PASS_SIDE = 3 };

extern const char *bench_side_names[BENCH_MAX_SIDES];

int bench_is_pass(int fp16, int side);
void bench_memory_pass(float *buf, size_t count);
void bench_compare_sides(int first);
void bench_measure(bench_t *b, int warmup, int iters, const char *label,
                   bench_result_t *res);
void bench_allreduce_one(const char *name, float *buf, size_t count, int wire,
                         int ndim, const int64_t *shape, kolo_handle_t *h);
/* The end of the runtime's side of a run: on the GPU a CUDA tensor's
 * handle is done once its allreduce is ordered on the bench's stream
 * (kolo_wait), so the stream is synchronized, as on the raw side; on the
 * host nothing. */
void bench_runtime_done(void);

/* --------------------------------------------------------- report.c */

/* A figure from times: fig(t) is the figure of time t (seconds); a figure
 * that grows as time shrinks (bandwidth, rate) has its min at the max time. */
typedef struct bench_figure {
    double med, min, max;
} bench_figure_t;

/* One row: the table on rank 0, and one JSON object. extra_json (may be
 * NULL) is appended inside the object, starting with ", ". */
typedef struct bench_row {
    const char *workload;
    long long size_bytes; /* -1: not a size */
    const char *size_text;
    const char *unit;
    bench_figure_t kolo, raw;
    const bench_result_t *kolo_t, *raw_t;
    double ratio;
    const char *ratio_is;
    int wrong;
    int warmup, iters;
    const char *note;
    const char *extra_json;
} bench_row_t;

const char *bench_fmt_num(char *buf, size_t len, double v);
const char *bench_fmt_time(char *buf, size_t len, double s);
const char *bench_fmt_bytes(char *buf, size_t len, long long b);
bench_figure_t bench_figure(const bench_result_t *r, double scale,
                            int per_time);
void bench_compare_note(const bench_result_t *r, double scale, int per_time,
                        const char *unit, char *note, size_t nlen, char *json,
                        size_t jlen);
void bench_table_header(const char *title);
void bench_emit(const bench_row_t *r);
void bench_emit_sides(bench_row_t *row, const bench_result_t *r, double scale,
                      int per_time);
void bench_print_header(void);
void bench_json_begin(void);
void bench_json_end(void);

/* -------------------------------------------------------- options.c */

typedef struct bench_options {
    int large, resnet50, small, latency, fp16;
    const char *backend;
    const char *compare; /* --compare: "gloo,mpi" */
    const char *json;
    int iters, warmup; /* -1: the workload's default */
    long long max_bytes;
    int quick;
} bench_options_t;

extern bench_options_t bench_opt;

int bench_iters_or(int def);
int bench_warmup_or(int def);
long long bench_parse_bytes(const char *s); /* -1: not a size */
/* Says fmt (with arg) and the usage on rank 0's stderr, and exits 2. */
void bench_bad_usage(const char *fmt, const char *arg);
void bench_parse_args(int argc, char **argv);

/* ------------------------------------------------------ the workloads */

typedef struct bench_large_state {
    float *buf;
    float *dev; /* --backend nccl: the tensor on the device (buf: its copy) */
    size_t count;
    char name16[64], name32[64];
    int fp16; /* sides: fp16 ? {kolo fp16, kolo fp32, raw} : {kolo, raw} */
} bench_large_state_t;

/* large.c; fp16.c measures its sizes with the same sides */
void bench_large_prepare(bench_t *b, int side);
void bench_large_run(bench_t *b, int side);
void bench_large_fetch(bench_t *b, int side);
int bench_large_verify(bench_t *b, int side, char *detail);
void bench_large_defaults(long long bytes, int *warmup, int *iters);
int bench_large_sizes(long long *sizes, int max, long long from);
double bench_busbw_factor(void);
void bench_workload_large(void);

typedef struct bench_param {
    const char *name;
    int ndim;
    int64_t shape[4];
} bench_param_t;

/* resnet50_table.c */
extern const bench_param_t bench_resnet50[BENCH_RESNET50_TENSORS];
int64_t bench_param_count(const bench_param_t *p);
void bench_resnet50_selfcheck(void);

typedef struct bench_resnet_state {
    float *tensor[BENCH_RESNET50_TENSORS];
    int64_t count[BENCH_RESNET50_TENSORS];
    char name32[BENCH_RESNET50_TENSORS][80], name16[BENCH_RESNET50_TENSORS][80];
    float *flat; /* the raw side: all the bytes as one buffer */
    /* --backend nccl: the same on the device (the above: their copies) */
    float *dtensor[BENCH_RESNET50_TENSORS];
    float *dflat;
    int fp16;
} bench_resnet_state_t;

/* resnet50.c; fp16.c measures the same tensors */
void bench_resnet_prepare(bench_t *b, int side);
void bench_resnet_run(bench_t *b, int side);
void bench_resnet_fetch(bench_t *b, int side);
int bench_resnet_verify(bench_t *b, int side, char *detail);
bench_resnet_state_t *bench_resnet_new(int fp16);
void bench_resnet_free(bench_resnet_state_t *s);
void bench_resnet_defaults(int *warmup, int *iters);
void bench_workload_resnet50(void);

void bench_workload_many(int n); /* small.c: n tensors (1: latency) */
void bench_workload_fp16(void);  /* fp16.c */

#endif
