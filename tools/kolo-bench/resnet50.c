/*
 * resnet50.c — the resnet50 workload: ResNet-50's 161 parameter tensors
 * (resnet50_table.c) enqueued in backward order as named tensors with
 * their shapes, then waited, against the raw allreduce of all their bytes
 * as one buffer (bench.h, "Workloads"). Its sides serve the fp16
 * workload's resnet50 row too (bench_resnet_state_t.fp16).
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

void bench_resnet_prepare(bench_t *b, int side)
{
    bench_resnet_state_t *s = b->state;
    if (side >= (s->fp16 ? 2 : 1) && !bench_is_pass(s->fp16, side)) {
        bench_fill(s->flat, (size_t)BENCH_RESNET50_ELEMENTS, 0);
        if (bench_gpu)
            bench_dev_put(s->dflat, s->flat,
                          (size_t)BENCH_RESNET50_ELEMENTS * sizeof(float));
    } else {
        for (int i = 0; i < BENCH_RESNET50_TENSORS; i++) {
            bench_fill(s->tensor[i], (size_t)s->count[i], i);
            if (bench_gpu)
                bench_dev_put(s->dtensor[i], s->tensor[i],
                              (size_t)s->count[i] * sizeof(float));
        }
    }
    if (bench_gpu)
        bench_dev_sync("copying the inputs to the device");
}

void bench_resnet_run(bench_t *b, int side)
{
    bench_resnet_state_t *s = b->state;
    kolo_handle_t h[BENCH_RESNET50_TENSORS];
    int fp16 = s->fp16 && side == 0;

    b->probe = side >= (s->fp16 ? 2 : 1) ? s->flat : s->tensor[0];
    if (bench_is_pass(s->fp16, side)) {
        b->probe = s->tensor[0];
        for (int i = 0; i < BENCH_RESNET50_TENSORS; i++)
            bench_memory_pass(s->tensor[i], (size_t)s->count[i]);
        return;
    }
    if (side >= (s->fp16 ? 2 : 1) && bench_gpu) {
        bench_nccl_allreduce(s->dflat, (size_t)BENCH_RESNET50_ELEMENTS);
        bench_dev_sync("ncclAllReduce");
        return;
    }
    if (side >= (s->fp16 ? 2 : 1)) {
        bench_raw_allreduce_on(side - (s->fp16 ? 2 : 1) - 1, s->flat,
                               (size_t)BENCH_RESNET50_ELEMENTS, sizeof(float),
                               bench_sum_f32);
        return;
    }
    for (int i = 0; i < BENCH_RESNET50_TENSORS; i++)
        bench_allreduce_one(fp16 ? s->name16[i] : s->name32[i],
                            bench_gpu ? s->dtensor[i] : s->tensor[i],
                            (size_t)s->count[i], fp16 ? KOLO_FLOAT16 : -1,
                            bench_resnet50[i].ndim, bench_resnet50[i].shape,
                            &h[i]);
    for (int i = 0; i < BENCH_RESNET50_TENSORS; i++)
        bench_kolo_must(kolo_wait(h[i]), "kolo_wait",
                        fp16 ? s->name16[i] : s->name32[i]);
    bench_runtime_done();
}

void bench_resnet_fetch(bench_t *b, int side)
{
    bench_resnet_state_t *s = b->state;
    if (!bench_gpu)
        return;
    if (side >= (s->fp16 ? 2 : 1))
        bench_dev_get(s->flat, s->dflat,
                      (size_t)BENCH_RESNET50_ELEMENTS * sizeof(float));
    else
        for (int i = 0; i < BENCH_RESNET50_TENSORS; i++)
            bench_dev_get(s->tensor[i], s->dtensor[i],
                          (size_t)s->count[i] * sizeof(float));
    bench_dev_sync("copying the results from the device");
}

int bench_resnet_verify(bench_t *b, int side, char *detail)
{
    bench_resnet_state_t *s = b->state;
    char what[160];
    int bad = 0;
    if (bench_is_pass(s->fp16, side))
        return 0; /* not an allreduce: no result to check */
    if (side >= (s->fp16 ? 2 : 1)) /* raw and --compare: the one buffer */
        return bench_check(s->flat, (size_t)BENCH_RESNET50_ELEMENTS, 0, 0.0f,
                           bench_side_names[side], detail);
    for (int i = 0; i < BENCH_RESNET50_TENSORS && !bad; i++) {
        snprintf(what, sizeof(what), "%s, tensor %s", bench_side_names[side],
                 bench_resnet50[i].name);
        bad = bench_check(s->tensor[i], (size_t)s->count[i], i,
                          (s->fp16 && side == 0) ? 1e-3f : 0.0f, what, detail);
    }
    return bad;
}

bench_resnet_state_t *bench_resnet_new(int fp16)
{
    bench_resnet_state_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        bench_die("out of memory");
    s->fp16 = fp16;
    for (int i = 0; i < BENCH_RESNET50_TENSORS; i++) {
        s->count[i] = bench_param_count(&bench_resnet50[i]);
        s->tensor[i] = bench_xalloc((size_t)s->count[i] * sizeof(float));
        if (bench_gpu)
            s->dtensor[i] =
                bench_dev_alloc((size_t)s->count[i] * sizeof(float));
        snprintf(s->name32[i], sizeof(s->name32[i]), "resnet50/%s",
                 bench_resnet50[i].name);
        snprintf(s->name16[i], sizeof(s->name16[i]), "resnet50-fp16/%s",
                 bench_resnet50[i].name);
    }
    s->flat = bench_xalloc((size_t)BENCH_RESNET50_ELEMENTS * sizeof(float));
    if (bench_gpu)
        s->dflat =
            bench_dev_alloc((size_t)BENCH_RESNET50_ELEMENTS * sizeof(float));
    return s;
}

void bench_resnet_free(bench_resnet_state_t *s)
{
    for (int i = 0; i < BENCH_RESNET50_TENSORS; i++) {
        free(s->tensor[i]);
        if (bench_gpu)
            bench_dev_free(s->dtensor[i]);
    }
    free(s->flat);
    if (bench_gpu)
        bench_dev_free(s->dflat);
    free(s);
}

void bench_resnet_defaults(int *warmup, int *iters)
{
    *warmup = bench_warmup_or(bench_opt.quick ? 1 : 2);
    *iters = bench_iters_or(bench_opt.quick ? 2 : 10);
}

void bench_workload_resnet50(void)
{
    bench_resnet_state_t *s = bench_resnet_new(0);
    bench_t b = {.nsides = 2 + bench_ncmp, .prepare = bench_resnet_prepare,
                 .run = bench_resnet_run, .fetch = bench_resnet_fetch,
                 .verify = bench_resnet_verify, .state = s};
    bench_result_t r[BENCH_MAX_SIDES];
    int warmup, iters;
    char note[256], extra[320];
    bench_row_t row;

    bench_table_header(
        "resnet50: 161 tensors (25,557,032 float32, 102 MB) enqueued "
        "in backward order, then waited; ms per step; raw = one "
        "allreduce of all the bytes; ratio = kolo/raw time (lower is "
        "better)");
    bench_side_names[0] = "kolo";
    bench_side_names[1] = "raw";
    bench_compare_sides(2);
    bench_resnet_defaults(&warmup, &iters);
    bench_measure(&b, warmup, iters, "resnet50", r);
    snprintf(
        note, sizeof(note), "busbw %.3f vs %.3f GB/s",
        bench_busbw_factor() * BENCH_RESNET50_ELEMENTS * 4 / r[0].med / 1e9,
        bench_busbw_factor() * BENCH_RESNET50_ELEMENTS * 4 / r[1].med / 1e9);
    snprintf(extra, sizeof(extra), ", \"tensors\": 161, \"elements\": 25557032");
    bench_compare_note(r + 2, 1e3, 0, "ms", note, sizeof(note),
                       extra + strlen(extra), sizeof(extra) - strlen(extra));
    row = (bench_row_t){
        .workload = "resnet50", .size_bytes = BENCH_RESNET50_ELEMENTS * 4,
        .size_text = "161 tens", .unit = "ms",
        .ratio_is = "kolo/raw time per step, lower is better",
        .warmup = warmup, .iters = iters, .note = note, .extra_json = extra};
    bench_emit_sides(&row, r, 1e3, 0);
    bench_resnet_free(s);
}
