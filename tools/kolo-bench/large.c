/*
 * large.c — the large workload: one float32 tensor of each size, 4 B to
 * --max-bytes in powers of 4, as a bus bandwidth (bench.h, "Workloads").
 * Its sides serve the fp16 workload's sizes too (bench_large_state_t.fp16).
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

void bench_large_prepare(bench_t *b, int side)
{
    bench_large_state_t *s = b->state;
    (void)side;
    bench_fill(s->buf, s->count, 0);
    if (bench_gpu) {
        bench_dev_put(s->dev, s->buf, s->count * sizeof(float));
        bench_dev_sync("copying the input to the device");
    }
}

void bench_large_run(bench_t *b, int side)
{
    bench_large_state_t *s = b->state;
    int raw_side = s->fp16 ? 2 : 1;
    float *buf = bench_gpu ? s->dev : s->buf;
    kolo_handle_t h;
    b->probe = s->buf;
    if (bench_is_pass(s->fp16, side)) {
        bench_memory_pass(s->buf, s->count);
        return;
    }
    if (side == raw_side && bench_gpu) {
        bench_nccl_allreduce(s->dev, s->count);
        bench_dev_sync("ncclAllReduce");
        return;
    }
    if (side == raw_side) {
        bench_raw_allreduce(s->buf, s->count, sizeof(float), bench_sum_f32);
        return;
    }
    if (side > raw_side) {
        bench_raw_allreduce_on(side - raw_side - 1, s->buf, s->count,
                               sizeof(float), bench_sum_f32);
        return;
    }
    if (s->fp16 && side == 0) {
        bench_allreduce_one(s->name16, buf, s->count, KOLO_FLOAT16, 0, NULL,
                            &h);
        bench_kolo_must(kolo_wait(h), "kolo_wait", s->name16);
    } else {
        bench_allreduce_one(s->name32, buf, s->count, -1, 0, NULL, &h);
        bench_kolo_must(kolo_wait(h), "kolo_wait", s->name32);
    }
    bench_runtime_done();
}

void bench_large_fetch(bench_t *b, int side)
{
    bench_large_state_t *s = b->state;
    (void)side;
    if (bench_gpu) {
        bench_dev_get(s->buf, s->dev, s->count * sizeof(float));
        bench_dev_sync("copying the result from the device");
    }
}

int bench_large_verify(bench_t *b, int side, char *detail)
{
    bench_large_state_t *s = b->state;
    if (bench_is_pass(s->fp16, side))
        return 0; /* not an allreduce: no result to check */
    return bench_check(s->buf, s->count, 0,
                       (s->fp16 && side == 0) ? 1e-3f : 0.0f,
                       bench_side_names[side], detail);
}

void bench_large_defaults(long long bytes, int *warmup, int *iters)
{
    if (bench_opt.quick) {
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
    *warmup = bench_warmup_or(*warmup);
    *iters = bench_iters_or(*iters);
}

/* The sizes: powers of 4 from 4 B, and --max-bytes itself (a multiple of
 * 4) when it is not one of them. */
int bench_large_sizes(long long *sizes, int max, long long from)
{
    int n = 0;
    long long cap = bench_opt.max_bytes / 4 * 4;
    for (long long b = 4; b <= cap && n < max; b *= 4)
        if (b >= from)
            sizes[n++] = b;
    if (n < max && cap >= from && (n == 0 || sizes[n - 1] != cap))
        sizes[n++] = cap;
    return n;
}

double bench_busbw_factor(void)
{
    return bench_size > 1 ? 2.0 * (bench_size - 1) / bench_size : 1.0;
}

void bench_workload_large(void)
{
    long long sizes[64];
    int n = bench_large_sizes(sizes, 64, 4);
    bench_large_state_t s;
    bench_t b = {.nsides = 2 + bench_ncmp, .prepare = bench_large_prepare,
                 .run = bench_large_run, .fetch = bench_large_fetch,
                 .verify = bench_large_verify, .state = &s};
    char title[256];

    memset(&s, 0, sizeof(s));
    s.buf = bench_xalloc((size_t)sizes[n - 1]);
    if (bench_gpu)
        s.dev = bench_dev_alloc((size_t)sizes[n - 1]);
    snprintf(title, sizeof(title),
             "large: one float32 tensor; %s in GB/s; ratio = kolo/raw "
             "bandwidth (higher is better)",
             bench_size > 1 ? "bus bandwidth 2(n-1)/n*bytes/time"
                        : "1 rank: bytes/time");
    bench_table_header(title);
    bench_side_names[0] = "kolo";
    bench_side_names[1] = "raw";
    bench_compare_sides(2);
    for (int i = 0; i < n; i++) {
        bench_result_t r[BENCH_MAX_SIDES];
        int warmup, iters;
        char size_text[32], label[64], note[256], t1[32], t2[32], extra[256];
        bench_row_t row;

        s.count = (size_t)(sizes[i] / 4);
        snprintf(s.name32, sizeof(s.name32), "bench/large/%lld", sizes[i]);
        bench_large_defaults(sizes[i], &warmup, &iters);
        bench_fmt_bytes(size_text, sizeof(size_text), sizes[i]);
        snprintf(label, sizeof(label), "large %s", size_text);
        bench_measure(&b, warmup, iters, label, r);
        snprintf(note, sizeof(note), "time %s vs %s",
                 bench_fmt_time(t1, sizeof(t1), r[0].med),
                 bench_fmt_time(t2, sizeof(t2), r[1].med));
        bench_compare_note(r + 2, bench_busbw_factor() * (double)sizes[i] / 1e9,
                           1, "GB/s", note, sizeof(note), extra, sizeof(extra));
        row = (bench_row_t){
            .workload = "large", .size_bytes = sizes[i],
            .size_text = size_text, .unit = "GB/s",
            .ratio_is = "kolo/raw bus bandwidth, higher is better",
            .warmup = warmup, .iters = iters, .note = note,
            .extra_json = bench_ncmp ? extra : NULL};
        bench_emit_sides(&row, r, bench_busbw_factor() * (double)sizes[i] / 1e9,
                         1);
    }
    if (bench_gpu)
        bench_dev_free(s.dev);
    free(s.buf);
}
