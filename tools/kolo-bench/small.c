/*
 * small.c — the small and latency workloads: n tensors of one float (1000:
 * small; 1: latency), enqueued then waited, against n 4-byte allreduces of
 * the backend called directly (bench.h, "Workloads").
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

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
    bench_fill(s->vals, (size_t)s->n, 0);
    if (bench_gpu) {
        bench_dev_put(s->dvals, s->vals, (size_t)s->n * sizeof(float));
        bench_dev_sync("copying the inputs to the device");
    }
}

static void many_run(bench_t *b, int side)
{
    many_state_t *s = b->state;
    b->probe = &s->vals[0];
    if (side >= 1 && bench_gpu) {
        /* As a program calls NCCL: every allreduce queued, then one wait. */
        for (int i = 0; i < s->n; i++)
            bench_nccl_allreduce(&s->dvals[i], 1);
        bench_dev_sync("ncclAllReduce");
        return;
    }
    if (side >= 1) {
        for (int i = 0; i < s->n; i++)
            bench_raw_allreduce_on(side - 2, &s->vals[i], 1, sizeof(float),
                                   bench_sum_f32);
        return;
    }
    kolo_handle_t hs[BENCH_SMALL_TENSORS];
    for (int i = 0; i < s->n; i++)
        bench_allreduce_one(s->names[i], bench_gpu ? &s->dvals[i] : &s->vals[i],
                            1, -1, 0, NULL, &hs[i]);
    for (int i = 0; i < s->n; i++)
        bench_kolo_must(kolo_wait(hs[i]), "kolo_wait", s->names[i]);
    bench_runtime_done();
}

static void many_fetch(bench_t *b, int side)
{
    many_state_t *s = b->state;
    (void)side;
    if (bench_gpu) {
        bench_dev_get(s->vals, s->dvals, (size_t)s->n * sizeof(float));
        bench_dev_sync("copying the results from the device");
    }
}

static int many_verify(bench_t *b, int side, char *detail)
{
    many_state_t *s = b->state;
    return bench_check(s->vals, (size_t)s->n, 0, 0.0f, bench_side_names[side],
                       detail);
}

void bench_workload_many(int n)
{
    many_state_t s;
    bench_t b = {.nsides = 2 + bench_ncmp, .prepare = many_prepare,
                 .run = many_run, .fetch = many_fetch,
                 .verify = many_verify, .state = &s};
    bench_result_t r[BENCH_MAX_SIDES];
    int warmup, iters;
    char note[256], t1[32], t2[32], cmp_json[256];
    bench_row_t row;

    s.n = n;
    s.vals = bench_xalloc((size_t)n * sizeof(float));
    s.dvals = bench_gpu ? bench_dev_alloc((size_t)n * sizeof(float)) : NULL;
    s.names = calloc((size_t)n, sizeof(*s.names));
    if (s.names == NULL)
        bench_die("out of memory");
    for (int i = 0; i < n; i++)
        snprintf(s.names[i], sizeof(s.names[i]),
                 n == 1 ? "bench/latency" : "bench/small/%04d", i);
    bench_side_names[0] = "kolo";
    bench_side_names[1] = "raw";
    bench_compare_sides(2);
    if (n == 1) {
        bench_table_header(
            "latency: one 4-byte allreduce, nothing else in flight; "
            "microseconds; ratio = kolo/raw time (lower is better)");
        warmup = bench_warmup_or(bench_opt.quick ? 5 : 20);
        iters = bench_iters_or(bench_opt.quick ? 50 : 200);
        bench_measure(&b, warmup, iters, "latency", r);
        char extra[384];
        snprintf(note, sizeof(note), "kolo - raw = %+.1f us",
                 (r[0].med - r[1].med) * 1e6);
        snprintf(extra, sizeof(extra), ", \"diff_us\": %.6g",
                 (r[0].med - r[1].med) * 1e6);
        cmp_json[0] = '\0';
        if (bench_ncmp)
            bench_compare_note(r + 2, 1e6, 0, "us", note, sizeof(note),
                               cmp_json, sizeof(cmp_json));
        snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), "%s",
                 cmp_json);
        row = (bench_row_t){
            .workload = "latency", .size_bytes = 4, .size_text = "4 B",
            .unit = "us", .ratio_is = "kolo/raw time, lower is better",
            .warmup = warmup, .iters = iters, .note = note,
            .extra_json = extra};
        bench_emit_sides(&row, r, 1e6, 0);
    } else {
        bench_table_header(
            "small: 1000 tensors of one float, enqueued then waited "
            "(raw: 1000 4-byte allreduces); allreduces per second; "
            "ratio = kolo/raw (higher is better)");
        warmup = bench_warmup_or(bench_opt.quick ? 1 : 2);
        iters = bench_iters_or(bench_opt.quick ? 3 : 10);
        bench_measure(&b, warmup, iters, "small", r);
        snprintf(note, sizeof(note), "time %s vs %s per 1000",
                 bench_fmt_time(t1, sizeof(t1), r[0].med),
                 bench_fmt_time(t2, sizeof(t2), r[1].med));
        snprintf(cmp_json, sizeof(cmp_json), ", \"tensors\": 1000");
        bench_compare_note(r + 2, n, 1, "ops/s", note, sizeof(note),
                           cmp_json + strlen(cmp_json),
                           sizeof(cmp_json) - strlen(cmp_json));
        row = (bench_row_t){
            .workload = "small", .size_bytes = -1,
            .size_text = "1000x4 B", .unit = "ops/s",
            .ratio_is = "kolo/raw allreduces per second, higher is better",
            .warmup = warmup, .iters = iters, .note = note,
            .extra_json = cmp_json};
        bench_emit_sides(&row, r, n, 1);
    }
    if (bench_gpu)
        bench_dev_free(s.dvals);
    free(s.vals);
    free(s.names);
}
