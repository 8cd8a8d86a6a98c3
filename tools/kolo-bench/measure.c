/*
 * measure.c — measuring: one workload at one size (a bench_t), its sides
 * alternated within every iteration, timed alone between a barrier and
 * the end of the operation, and checked; then the slowest rank's time per
 * iteration (bench.h, "How a figure is measured"). Also what the sides of
 * several workloads do: one tensor through the runtime, and the memory
 * pass of fp16.
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reduce.h"
#include "bench.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

const char *bench_side_names[BENCH_MAX_SIDES];

int bench_is_pass(int fp16, int side)
{
    return fp16 && side == BENCH_PASS_SIDE;
}

/* One pass over a float32 tensor in place: every element read and written
 * (doubled: kolo's own scaling, the pass it makes over a tensor). */
void bench_memory_pass(float *buf, size_t count)
{
    kolo__scale(buf, count, KOLO_FLOAT32, 2.0);
}

/* Names the compared sides, from side `first` on. */
void bench_compare_sides(int first)
{
    for (int k = 0; k < bench_ncmp; k++)
        bench_side_names[first + k] = bench_cmp_side[k];
}

void bench_measure(bench_t *b, int warmup, int iters, const char *label,
                   bench_result_t *res)
{
    int ns = b->nsides;
    double *t = calloc((size_t)ns * (size_t)iters, sizeof(double));
    int32_t wrong[BENCH_MAX_SIDES] = {0};
    char detail[BENCH_MAX_SIDES][BENCH_DETAIL_LEN];

    if (t == NULL)
        bench_die("out of memory");
    memset(detail, 0, sizeof(detail));
    for (int it = -warmup; it < iters; it++) {
        for (int k = 0; k < ns; k++) {
            /* swap the order every other iteration */
            int s = ((it + warmup) & 1) ? ns - 1 - k : k;
            double t0, dt;
            b->prepare(b, s);
            bench_barrier();
            t0 = now();
            b->run(b, s);
            dt = now() - t0;
            b->fetch(b, s);
            if (bench_fault && s == 0 && it == iters - 1 &&
                bench_rank == bench_size - 1)
                *b->probe += 1.0f; /* KOLO_BENCH_FAULT: test the checks */
            if (b->verify(b, s, detail[s]))
                wrong[s] = 1;
            if (it >= 0)
                t[(size_t)s * (size_t)iters + (size_t)it] = dt;
        }
    }
    for (int s = 0; s < ns; s++)
        if (wrong[s])
            fprintf(stderr, "kolo-bench: rank %d: WRONG %s (%s): %s\n",
                    bench_rank, label, bench_side_names[s], detail[s]);
    /* The slowest rank's time per iteration, and whether any rank was wrong. */
    bench_raw_allreduce(t, (size_t)ns * (size_t)iters, sizeof(double),
                        bench_max_f64);
    bench_raw_allreduce(wrong, (size_t)ns, sizeof(int32_t), bench_max_i32);
    for (int s = 0; s < ns; s++) {
        double *ts = t + (size_t)s * (size_t)iters;
        qsort(ts, (size_t)iters, sizeof(double), cmp_double);
        res[s].min = ts[0];
        res[s].max = ts[iters - 1];
        res[s].med = (iters & 1) ? ts[iters / 2]
                                 : 0.5 * (ts[iters / 2 - 1] + ts[iters / 2]);
        res[s].wrong = wrong[s];
        if (wrong[s])
            bench_wrong++;
    }
    free(t);
}

/* The runtime's side: one float32 tensor enqueued (wire: its wire_dtype,
 * -1 for the default), as a training loop enqueues it. */
void bench_allreduce_one(const char *name, float *buf, size_t count,
                         int wire, int ndim, const int64_t *shape,
                         kolo_handle_t *h)
{
    kolo_opts_t o;
    kolo_opts_init(&o);
    o.wire_dtype = wire;
    o.ndim = ndim;
    o.shape = shape;
    if (bench_gpu) {
        /* buf is on bench_dev; its input was written on bench_stream. */
        o.device_type = KOLO_DEVICE_CUDA;
        o.device = bench_dev;
        o.stream = bench_stream;
    }
    bench_kolo_must(kolo_allreduce_async_opts(name, buf, buf, (int64_t)count,
                                              KOLO_FLOAT32, &o, h),
                    "kolo_allreduce_async_opts", name);
}

void bench_runtime_done(void)
{
    if (bench_gpu)
        bench_dev_sync("the runtime's allreduces");
}
