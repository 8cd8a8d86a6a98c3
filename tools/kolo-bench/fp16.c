/*
 * fp16.c — the fp16 workload: large's sizes from 1 MiB and resnet50
 * through the runtime with float16 on the wire, against float32 through
 * the runtime and the raw float32 backend; on the host also one memory
 * pass, the bound of what compression can gain (bench.h, "Workloads").
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* The fp16 rows: kolo = float16 on the wire, raw = the raw float32 backend
 * (ratio, as in large and resnet50), kolo_fp32 = float32 through the
 * runtime (speedup = how much faster float16 is), and on the host the
 * memory pass (bound = float32 time / pass time: the most any compression
 * could gain here). */
static void emit_fp16(const char *size_text, long long bytes, const char *unit,
                      double scale, int per_time, const bench_result_t *r,
                      int warmup, int iters)
{
    bench_figure_t f16 = bench_figure(&r[0], scale, per_time),
             f32 = bench_figure(&r[1], scale, per_time);
    double speedup = r[1].med / r[0].med;
    char note[192], extra[768], pass[256] = "", a[32], c[32];
    int len;
    bench_row_t row;

    len = snprintf(note, sizeof(note), "fp32 kolo %s %s, fp16 speedup %.2fx",
                   bench_fmt_num(a, sizeof(a), f32.med), unit, speedup);
    if (!bench_gpu && len > 0 && (size_t)len < sizeof(note)) {
        bench_figure_t fp = bench_figure(&r[BENCH_PASS_SIDE], scale, per_time);
        double bound = r[1].med / r[BENCH_PASS_SIDE].med;
        snprintf(note + len, sizeof(note) - (size_t)len,
                 "; one pass %s %s: at most %.2fx",
                 bench_fmt_num(c, sizeof(c), fp.med), unit, bound);
        snprintf(pass, sizeof(pass),
                 ", \"memory_pass\": %.6g, \"memory_pass_time_s\": %.6g, "
                 "\"speedup_bound\": %.6g, \"speedup_bound_is\": \"float32 "
                 "time through the runtime / time of one pass over the "
                 "float32 tensors on every rank at once\"",
                 fp.med, r[BENCH_PASS_SIDE].med, bound);
    }
    snprintf(extra, sizeof(extra),
             ", \"wire_dtype\": \"float16\", \"kolo_fp32\": %.6g, "
             "\"kolo_fp32_min\": %.6g, \"kolo_fp32_max\": %.6g, "
             "\"kolo_fp32_time_s\": %.6g, \"speedup\": %.6g, "
             "\"speedup_is\": \"float32 time / float16 time through the "
             "runtime, higher is better\"%s%s",
             f32.med, f32.min, f32.max, r[1].med, speedup,
             bytes == BENCH_RESNET50_ELEMENTS * 4 ? ", \"tensors\": 161" : "",
             pass);
    row = (bench_row_t){
        .workload = "fp16", .size_bytes = bytes, .size_text = size_text,
        .unit = unit, .kolo = f16,
        .raw = bench_figure(&r[2], scale, per_time),
        .kolo_t = &r[0], .raw_t = &r[2],
        .ratio = per_time ? r[2].med / r[0].med : r[0].med / r[2].med,
        .ratio_is = per_time
                        ? "kolo fp16/raw fp32 bus bandwidth, higher is better"
                        : "kolo fp16/raw fp32 time, lower is better",
        .wrong = r[0].wrong || r[1].wrong || r[2].wrong,
        .warmup = warmup, .iters = iters, .note = note,
        .extra_json = extra};
    bench_emit(&row);
}

void bench_workload_fp16(void)
{
    long long sizes[64];
    int n = bench_large_sizes(sizes, 64, 1 * MIB);
    int nsides = bench_gpu ? BENCH_FP16_SIDES_GPU : BENCH_FP16_SIDES;
    bench_result_t r[BENCH_FP16_SIDES];
    int warmup, iters;

#define FP16_TITLE                                                             \
    "fp16: float32 tensors sent as float16 (wire_dtype); kolo = fp16 through " \
    "the runtime, raw = the raw float32 backend, ratio as in "                 \
    "large/resnet50; speedup = over float32 through the runtime"
    bench_table_header(bench_gpu ? FP16_TITLE
                       : FP16_TITLE ";\none pass = every rank reads and writes "
                                    "its float32 tensors once, all at once (the "
                                    "least an in-place allreduce must do); at "
                                    "most = fp32 time / pass time, the most any "
                                    "compression could gain here");
#undef FP16_TITLE
    bench_side_names[0] = "kolo fp16";
    bench_side_names[1] = "kolo fp32";
    bench_side_names[2] = "raw";
    bench_side_names[BENCH_PASS_SIDE] = "one pass";
    if (n > 0) {
        bench_large_state_t s;
        bench_t b = {.nsides = nsides, .prepare = bench_large_prepare,
                 .run = bench_large_run, .fetch = bench_large_fetch,
                 .verify = bench_large_verify, .state = &s};
        memset(&s, 0, sizeof(s));
        s.fp16 = 1;
        s.buf = bench_xalloc((size_t)sizes[n - 1]);
        if (bench_gpu)
            s.dev = bench_dev_alloc((size_t)sizes[n - 1]);
        for (int i = 0; i < n; i++) {
            char size_text[32], label[64];
            s.count = (size_t)(sizes[i] / 4);
            snprintf(s.name32, sizeof(s.name32), "bench/large/%lld", sizes[i]);
            snprintf(s.name16, sizeof(s.name16), "bench/large-fp16/%lld",
                     sizes[i]);
            bench_large_defaults(sizes[i], &warmup, &iters);
            bench_fmt_bytes(size_text, sizeof(size_text), sizes[i]);
            snprintf(label, sizeof(label), "fp16 %s", size_text);
            bench_measure(&b, warmup, iters, label, r);
            emit_fp16(size_text, sizes[i], "GB/s",
                      bench_busbw_factor() * (double)sizes[i] / 1e9, 1, r,
                      warmup, iters);
        }
        if (bench_gpu)
            bench_dev_free(s.dev);
        free(s.buf);
    }
    {
        bench_resnet_state_t *s = bench_resnet_new(1);
        bench_t b = {.nsides = nsides, .prepare = bench_resnet_prepare,
                 .run = bench_resnet_run, .fetch = bench_resnet_fetch,
                 .verify = bench_resnet_verify, .state = s};
        bench_resnet_defaults(&warmup, &iters);
        bench_measure(&b, warmup, iters, "fp16 resnet50", r);
        emit_fp16("resnet50", BENCH_RESNET50_ELEMENTS * 4, "ms", 1e3, 0, r,
                  warmup, iters);
        bench_resnet_free(s);
    }
}
