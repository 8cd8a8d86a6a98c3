/*
 * test-autotune.c — the autotuner's search (runtime/autotune.c), driven by
 * a synthetic workload whose speed is a known function of the settings:
 *  - with one setting clearly faster, the search settles on it;
 *  - when every setting scores the same give or take 1% of noise (so no
 *    two windows differ by 3%), the defaults stay: the incumbent is only
 *    replaced when beaten by more than 3%;
 *  - warm-up windows are not scored, each candidate gets three samples,
 *    and once settled nothing is measured any more;
 *  - two tuners fed the same numbers (two ranks) take the same decisions.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "autotune.h"
#include "unit.h"

#define MIB (1024 * 1024)

static const kolo__tune_params_t dflt = {128 * MIB, 4 * MIB, 5.0};

/* Busy seconds of a window of 100 MB under the settings: the model. */
typedef double (*model_fn)(const kolo__tune_params_t *p, unsigned *seed);

static double noise(unsigned *seed, double amount)
{
    *seed = *seed * 1103515245u + 12345u;
    return 1.0 + amount * ((double)(*seed >> 16 & 0x7fff) / 32767.0 * 2.0 - 1.0);
}

/* 16 MiB fusion and 1 MiB chunks are 20% faster each; cycle time does not
 * matter. */
static double model_peaked(const kolo__tune_params_t *p, unsigned *seed)
{
    double t = 0.1;
    if (p->fusion_threshold == 16 * MIB)
        t *= 0.8;
    if (p->chunk_bytes == 1 * MIB)
        t *= 0.8;
    return t * noise(seed, 0.01);
}

static double model_flat(const kolo__tune_params_t *p, unsigned *seed)
{
    (void)p;
    return 0.1 * noise(seed, 0.01);
}

/* Runs windows of `rounds` rounds until settled; returns the windows. */
static int drive(kolo__autotune_t *t, model_fn model, unsigned seed,
                 int *warmups)
{
    int windows = 0;
    *warmups = 0;
    while (!kolo__autotune_settled(t) && windows < 1000) {
        kolo__tune_row_t row;
        double busy = model(&t->cur, &seed);
        int full = 0;
        for (int r = 0; r < 4; r++)
            full = kolo__autotune_round(t, 25000000, (int64_t)(busy / 4 * 1e6));
        ck_assert_int_eq(full, 1);
        kolo__autotune_window(t, kolo__autotune_busy_s(t), &row);
        *warmups += row.warmup;
        windows++;
    }
    return windows;
}

START_TEST(settles_on_the_faster_settings)
{
    kolo__autotune_t t;
    int warmups;
    kolo__autotune_init(&t, &dflt, 4);
    drive(&t, model_peaked, 1, &warmups);
    ck_assert(kolo__autotune_settled(&t));
    ck_assert_int_eq(t.cur.fusion_threshold, 16 * MIB);
    ck_assert_int_eq(t.cur.chunk_bytes, 1 * MIB);
    ck_assert(t.cur.cycle_ms == 5.0); /* no difference: the default stays */
}
END_TEST

START_TEST(noise_alone_keeps_the_defaults)
{
    for (unsigned seed = 1; seed < 50; seed++) {
        kolo__autotune_t t;
        int warmups;
        kolo__autotune_init(&t, &dflt, 4);
        drive(&t, model_flat, seed, &warmups);
        ck_assert(kolo__autotune_settled(&t));
        ck_assert_msg(t.cur.fusion_threshold == dflt.fusion_threshold &&
                          t.cur.chunk_bytes == dflt.chunk_bytes &&
                          t.cur.cycle_ms == dflt.cycle_ms,
                      "seed %u: moved to %lld/%lld/%g on noise", seed,
                      (long long)t.cur.fusion_threshold,
                      (long long)t.cur.chunk_bytes, t.cur.cycle_ms);
    }
}
END_TEST

START_TEST(windows_warmups_and_samples)
{
    kolo__autotune_t t;
    int warmups, windows;
    kolo__autotune_init(&t, &dflt, 4);
    ck_assert_int_eq(t.cand[0][0], dflt.fusion_threshold); /* incumbent first */
    windows = drive(&t, model_flat, 7, &warmups);
    /* every candidate of every parameter: one warm-up, three samples */
    ck_assert_int_eq(windows, 4 * (t.ncand[0] + t.ncand[1] + t.ncand[2]));
    ck_assert_int_eq(warmups, t.ncand[0] + t.ncand[1] + t.ncand[2]);
    /* settled: rounds are no longer counted */
    for (int r = 0; r < 100; r++)
        ck_assert_int_eq(kolo__autotune_round(&t, 1000, 10), 0);
}
END_TEST

START_TEST(same_numbers_same_decisions)
{
    kolo__autotune_t a, b;
    unsigned seed = 99;
    kolo__autotune_init(&a, &dflt, 3);
    kolo__autotune_init(&b, &dflt, 3);
    while (!kolo__autotune_settled(&a)) {
        kolo__tune_row_t ra, rb;
        double busy_a = model_peaked(&a.cur, &seed);
        double busy_b = busy_a * 1.3; /* the other rank is slower */
        for (int r = 0; r < 3; r++) {
            kolo__autotune_round(&a, 1000000, (int64_t)(busy_a / 3 * 1e6));
            kolo__autotune_round(&b, 1000000, (int64_t)(busy_b / 3 * 1e6));
        }
        /* the ranks agree on the slowest busy time */
        double agreed = kolo__autotune_busy_s(&b);
        kolo__autotune_window(&a, agreed, &ra);
        kolo__autotune_window(&b, agreed, &rb);
        ck_assert(ra.params.fusion_threshold == rb.params.fusion_threshold &&
                  ra.params.chunk_bytes == rb.params.chunk_bytes &&
                  ra.params.cycle_ms == rb.params.cycle_ms);
        ck_assert(a.cur.fusion_threshold == b.cur.fusion_threshold &&
                  a.cur.chunk_bytes == b.cur.chunk_bytes &&
                  a.cur.cycle_ms == b.cur.cycle_ms);
    }
    ck_assert(kolo__autotune_settled(&b));
}
END_TEST

KOLO_UNIT_MAIN("autotune", 30,
        settles_on_the_faster_settings, noise_alone_keeps_the_defaults,
        windows_warmups_and_samples, same_numbers_same_decisions)
