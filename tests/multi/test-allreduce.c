/*
 * test-allreduce.c — multi-rank allreduce tests, run as real processes under
 * kolorun (tests/multi/run-multirank.sh runs every mode at 2, 3 and 4 ranks).
 *
 *   test-allreduce random [steps]   random tensors, counts, dtypes, ops;
 *                                   names enqueued in a different random
 *                                   order on every rank
 *   test-allreduce many [steps]     96 float32 tensors at once, most of
 *                                   them small: batches fuse many
 *   test-allreduce mismatch         same name, different count/dtype/op
 *   test-allreduce accumulate       backward_passes > 1
 *   test-allreduce shutdown         shutdown with work pending
 *   test-allreduce idle [seconds]   an idle job uses (almost) no CPU
 *   test-allreduce soak [steps]     many steps, heap in use flat
 *
 * Every rank generates every rank's data from (seed, rank, tensor, step), so
 * it computes the expected result itself, without the library. Values are
 * multiples of 1/8 small enough that float32 and float16 sums are exact;
 * averages are compared within one rounding. Prints "PASS ..." and exits 0,
 * or prints what differs and exits 1.
 */
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo.h"
#include "testutil.h"

static int rank, size;
static int failures;

#define MUST(call) TU_MUST(call, "rank %d: ", rank)

/* The value rank r holds at element i of tensor t in step s. */
static float value(uint64_t seed, int r, int t, int s, int64_t i)
{
    uint64_t h = mix(seed ^ mix((uint64_t)r * 1000003 + (uint64_t)t * 7919 +
                                (uint64_t)s * 104729 + (uint64_t)i * 31));
    return (float)((int)(h % 201) - 100) / 8.0f;
}

/* float16 by hand, for values that are exactly representable (multiples of
 * 1/8 below 2048) — independent of the library's conversions. */
static uint16_t exact_to_half(float f)
{
    uint16_t sign = f < 0 ? 0x8000 : 0;
    int e;
    float m;

    if (f == 0)
        return sign;
    m = frexpf(fabsf(f), &e); /* f = m * 2^e, m in [0.5, 1) */
    /* half: (1 + frac/1024) * 2^(E-15), E = e - 1 + 15 */
    return (uint16_t)(sign | (uint16_t)((e + 14) << 10) |
                      (uint16_t)((m * 2 - 1) * 1024));
}

/* float16 to float: testutil.h's h2f, exact in float for every float16. */
static float half_to_float(uint16_t h) { return (float)h2f(h); }

typedef struct tensor {
    char name[64];
    int64_t count;
    kolo_dtype_t dtype;
    kolo_op_t op;
    int in_place;
    void *in, *out;
    kolo_handle_t handle;
} tensor_t;

static void fill(tensor_t *t, uint64_t seed, int r, int idx, int step)
{
    for (int64_t i = 0; i < t->count; i++) {
        float v = value(seed, r, idx, step, i);
        if (t->dtype == KOLO_FLOAT32)
            ((float *)t->in)[i] = v;
        else
            ((uint16_t *)t->in)[i] = exact_to_half(v);
    }
}

static int check_tensor(const tensor_t *t, uint64_t seed, int idx, int step)
{
    int bad = 0;
    for (int64_t i = 0; i < t->count && bad < 3; i++) {
        double sum = 0, expect, got, tol;
        for (int r = 0; r < size; r++)
            sum += value(seed, r, idx, step, i);
        expect = t->op == KOLO_OP_AVERAGE ? sum / size : sum;
        if (t->dtype == KOLO_FLOAT32) {
            got = ((float *)t->out)[i];
            tol = t->op == KOLO_OP_AVERAGE ? 1e-6 * fmax(1, fabs(expect)) : 0;
        } else {
            got = half_to_float(((uint16_t *)t->out)[i]);
            tol = t->op == KOLO_OP_AVERAGE ? fmax(1, fabs(expect)) / 1024 : 0;
        }
        if (fabs(got - expect) > tol) {
            CHECK(0, "step %d tensor %s (%lld %s %s) element %lld: got %.9g, "
                     "expected %.9g",
                  step, t->name, (long long)t->count, kolo_dtype_name(t->dtype),
                  kolo_op_name(t->op), (long long)i, got, expect);
            bad++;
        }
    }
    return bad;
}

static void maybe_pause(void)
{
    if (rnd() % 8 == 0)
        usleep((useconds_t)(rnd() % 2000));
}

/* Random tensors; several steps so that later steps go through the
 * response cache. many: 96 float32 tensors, most of 64-463 elements, four
 * of 200K-700K, enqueued without pauses, so that batches fuse many small
 * tensors (a rank's share of a batch spans more tensors than a backend
 * reads where they lie) and run to megabytes (ops/hier cuts them). */
static void mode_random(int steps, int many)
{
    const uint64_t seed = many ? 54321 : 12345;
    int ntensors;
    tensor_t *ts;
    int *order;

    rng_state = seed; /* the tensor list is the same on every rank */
    ntensors = many ? 96 : 20 + (int)(rnd() % 30);
    ts = calloc((size_t)ntensors, sizeof(*ts));
    order = malloc((size_t)ntensors * sizeof(*order));
    for (int i = 0; i < ntensors; i++) {
        tensor_t *t = &ts[i];
        uint64_t k = rnd() % 10;
        snprintf(t->name, sizeof(t->name), "grad/layer%d/w", i);
        /* 0 and 1 element, small, medium, and some above the fusion
         * threshold the driver sets (64 KiB). */
        t->count = k == 0 ? 0 : k == 1 ? 1 : k < 7 ? (int64_t)(rnd() % 1000)
                 : k < 9 ? (int64_t)(rnd() % 20000) : 40000 + (int64_t)(rnd() % 40000);
        t->dtype = rnd() % 2 ? KOLO_FLOAT32 : KOLO_FLOAT16;
        t->op = rnd() % 2 ? KOLO_OP_SUM : KOLO_OP_AVERAGE;
        t->in_place = rnd() % 2;
        if (many) { /* and every 24th of 200K-700K: batches of megabytes */
            t->count = i % 24 == 5 ? 200000 + (int64_t)(rnd() % 500000)
                                   : 64 + (int64_t)(rnd() % 400);
            t->dtype = KOLO_FLOAT32;
        }
        t->in = malloc((size_t)t->count * 4 + 1);
        t->out = t->in_place ? t->in : malloc((size_t)t->count * 4 + 1);
        order[i] = i;
    }

    rng_state = mix(seed + (uint64_t)rank + 1); /* per-rank order and timing */
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < ntensors; i++)
            fill(&ts[i], seed, rank, i, step);
        shuffle(order, ntensors);
        for (int k = 0; k < ntensors; k++) {
            tensor_t *t = &ts[order[k]];
            if (!many)
                maybe_pause();
            MUST(kolo_allreduce_async(t->name, t->in, t->out, t->count,
                                      t->dtype, t->op, &t->handle));
        }
        shuffle(order, ntensors);
        for (int k = 0; k < ntensors; k++) {
            tensor_t *t = &ts[order[k]];
            int rc = kolo_wait(t->handle);
            CHECK(rc == KOLO_OK, "wait %s: %d %s", t->name, rc, kolo_last_error());
            if (rc == KOLO_OK)
                check_tensor(t, seed, order[k], step);
        }
    }
    for (int i = 0; i < ntensors; i++) {
        if (!ts[i].in_place)
            free(ts[i].out);
        free(ts[i].in);
    }
    free(ts);
    free(order);
}

/* Enqueues and waits one float32 tensor; returns the status. */
static int one(const char *name, int64_t count, kolo_dtype_t dtype,
               kolo_op_t op, float *buf)
{
    kolo_handle_t h;
    int rc = kolo_allreduce_async(name, buf, buf, count, dtype, op, &h);
    if (rc != KOLO_OK)
        return rc;
    return kolo_wait(h);
}

static void expect_mismatch(const char *name, int64_t count, kolo_dtype_t dtype,
                            kolo_op_t op, const char *w1, const char *w2)
{
    float buf[64] = {0};
    int rc = one(name, count, dtype, op, buf);
    const char *msg = kolo_last_error();
    CHECK(rc == KOLO_ERR_MISMATCH, "%s: expected a mismatch, got %d (%s)", name,
          rc, msg);
    CHECK(strstr(msg, name) != NULL, "%s: message does not name the tensor: %s",
          name, msg);
    CHECK(strstr(msg, w1) != NULL && strstr(msg, w2) != NULL,
          "%s: message lacks '%s' or '%s': %s", name, w1, w2, msg);
    if (rank == 0 && rc == KOLO_ERR_MISMATCH)
        printf("mismatch message: %s\n", msg);
}

/* A tensor that every rank agrees on; the job must still work. */
static void expect_ok(const char *name)
{
    float buf[8];
    for (int i = 0; i < 8; i++)
        buf[i] = (float)(rank + i);
    CHECK(one(name, 8, KOLO_FLOAT32, KOLO_OP_SUM, buf) == KOLO_OK,
          "%s after a mismatch: %s", name, kolo_last_error());
    for (int i = 0; i < 8; i++)
        CHECK(buf[i] == (float)(size * (size - 1) / 2 + size * i),
              "%s[%d] = %g", name, i, buf[i]);
}

static void mode_mismatch(void)
{
    int odd = rank == size - 1; /* the last rank disagrees */
    char w1[64], w2[64];

    snprintf(w1, sizeof(w1), "rank 0 has 10");
    snprintf(w2, sizeof(w2), "rank %d has 20", size - 1);
    expect_mismatch("mismatch/count", odd ? 20 : 10, KOLO_FLOAT32, KOLO_OP_SUM,
                    w1, w2);
    expect_ok("after/count");
    expect_mismatch("mismatch/dtype", 10, odd ? KOLO_FLOAT16 : KOLO_FLOAT32,
                    KOLO_OP_SUM, "float32", "float16");
    expect_ok("after/dtype");
    expect_mismatch("mismatch/op", 10, KOLO_FLOAT32,
                    odd ? KOLO_OP_AVERAGE : KOLO_OP_SUM, "sum", "average");
    expect_ok("after/op");

    /* A name negotiated and cached, then enqueued with another count by one
     * rank: the cache entry is invalidated and the mismatch reported. */
    {
        float buf[64] = {0};
        CHECK(one("cached", 16, KOLO_FLOAT32, KOLO_OP_SUM, buf) == KOLO_OK,
              "cached step 1: %s", kolo_last_error());
        CHECK(one("cached", 16, KOLO_FLOAT32, KOLO_OP_SUM, buf) == KOLO_OK,
              "cached step 2: %s", kolo_last_error());
        snprintf(w2, sizeof(w2), "rank %d has 32", size - 1);
        expect_mismatch("cached", odd ? 32 : 16, KOLO_FLOAT32, KOLO_OP_SUM,
                        "rank 0 has 16", w2);
        CHECK(one("cached", 16, KOLO_FLOAT32, KOLO_OP_SUM, buf) == KOLO_OK,
              "cached after mismatch: %s", kolo_last_error());
    }
    expect_ok("after/cached");
}

/* N passes of g1..gN must equal one allreduce of their sum (or mean). */
static void mode_accumulate(void)
{
    const uint64_t seed = 777;
    const int64_t count = 1000;
    enum { PASSES = 3, STEPS = 4 };
    float *g = malloc(count * sizeof(float));
    float *out = malloc(count * sizeof(float));
    uint16_t *gh = malloc(count * sizeof(uint16_t));

    for (int average = 0; average <= 1; average++) {
        for (int step = 0; step < STEPS; step++) {
            kolo_allreduce_opts_t o;
            kolo_allreduce_opts_init(&o);
            o.op = KOLO_OP_SUM;
            o.backward_passes = PASSES;
            o.average_passes = average;
            for (int pass = 0; pass < PASSES; pass++) {
                kolo_handle_t h, hh;
                for (int64_t i = 0; i < count; i++) {
                    g[i] = value(seed, rank, pass, step, i);
                    gh[i] = exact_to_half(g[i]);
                }
                MUST(kolo_allreduce_async_opts("acc/f32", g, out, count,
                                               KOLO_FLOAT32, &o, &h));
                MUST(kolo_allreduce_async_opts("acc/f16", gh, gh, count,
                                               KOLO_FLOAT16, &o, &hh));
                if (pass < PASSES - 1) {
                    /* Intermediate passes complete at once. */
                    CHECK(kolo_poll(h) == KOLO_OK, "pass %d not done at once",
                          pass);
                    CHECK(kolo_poll(hh) == KOLO_OK, "pass %d not done at once",
                          pass);
                }
                MUST(kolo_wait(h));
                MUST(kolo_wait(hh));
            }
            for (int64_t i = 0; i < count; i++) {
                double sum = 0, expect;
                for (int r = 0; r < size; r++)
                    for (int pass = 0; pass < PASSES; pass++)
                        sum += value(seed, r, pass, step, i);
                /* Each rank divides its own sum by N before the allreduce. */
                expect = average ? sum / PASSES : sum;
                CHECK(fabs(out[i] - expect) <= 1e-5 * fmax(1, fabs(expect)),
                      "avg=%d step %d f32[%lld] = %.9g, expected %.9g", average,
                      step, (long long)i, out[i], expect);
                /* Each rank rounds its own mean (|mean| <= 12.5, so by at
                 * most 2^-8) before the exact sum; the sum rounds once. */
                CHECK(fabs(half_to_float(gh[i]) - expect) <=
                          size / 256.0 + fabs(expect) / 1024,
                      "avg=%d step %d f16[%lld] = %.9g, expected %.9g", average,
                      step, (long long)i, half_to_float(gh[i]), expect);
                if (failures > 5)
                    exit(1);
            }
        }
    }
    /* A pass that changes the count is refused. */
    {
        kolo_allreduce_opts_t o;
        kolo_handle_t h;
        kolo_allreduce_opts_init(&o);
        o.backward_passes = 2;
        MUST(kolo_allreduce_async_opts("acc/bad", g, g, 10, KOLO_FLOAT32, &o, &h));
        MUST(kolo_wait(h));
        CHECK(kolo_allreduce_async_opts("acc/bad", g, g, 11, KOLO_FLOAT32, &o,
                                        &h) == KOLO_ERR_INVALID_ARGUMENT,
              "changed count accepted");
        CHECK(strstr(kolo_last_error(), "acc/bad") != NULL, "message: %s",
              kolo_last_error());
    }
    free(g);
    free(out);
    free(gh);
}

/* Rank 0 shuts down while a tensor only it enqueued is pending; the other
 * ranks have a tensor pending that rank 0 never enqueues. */
static void mode_shutdown(void)
{
    float buf[4] = {1, 2, 3, 4};
    kolo_handle_t h;
    int rc;

    if (rank == 0) {
        MUST(kolo_allreduce_async("only/rank0", buf, buf, 4, KOLO_FLOAT32,
                                  KOLO_OP_SUM, &h));
        usleep(100000);
        MUST(kolo_shutdown());
        rc = kolo_wait(h);
        CHECK(rc == KOLO_ERR_SHUTDOWN, "pending handle after shutdown: %d", rc);
        CHECK(strstr(kolo_last_error(), "only/rank0") != NULL, "message: %s",
              kolo_last_error());
        rc = kolo_allreduce_async("late", buf, buf, 4, KOLO_FLOAT32,
                                  KOLO_OP_SUM, &h);
        CHECK(rc == KOLO_ERR_NOT_INITIALIZED, "enqueue after shutdown: %d", rc);
        CHECK(kolo_shutdown() == KOLO_ERR_NOT_INITIALIZED, "double shutdown");
        return;
    }
    rc = kolo_allreduce_async("only/others", buf, buf, 4, KOLO_FLOAT32,
                              KOLO_OP_SUM, &h);
    if (rc == KOLO_OK)
        rc = kolo_wait(h);
    CHECK(rc == KOLO_ERR_SHUTDOWN, "others: expected a shutdown error, got %d",
          rc);
    CHECK(strstr(kolo_last_error(), "rank 0 has shut down") != NULL,
          "message: %s", kolo_last_error());
    /* Later enqueues fail at once with the same reason. */
    rc = kolo_allreduce_async("later", buf, buf, 4, KOLO_FLOAT32, KOLO_OP_SUM,
                              &h);
    CHECK(rc == KOLO_ERR_SHUTDOWN, "enqueue after a peer's shutdown: %d", rc);
    MUST(kolo_shutdown());
}

/* Bytes the allocator has handed out and not taken back. */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* Many steps of a realistic set of gradients (mixed sizes, fused and not,
 * float32 and float16, sum and average): the heap in use after the warm-up
 * and at the end must be the same, give or take a page. */
static void mode_soak(long steps)
{
    enum { NT = 8 };
    static const int64_t counts[NT] = {1, 10, 100, 1000, 4096, 10000, 3, 7};
    float *bufs[NT];
    kolo_handle_t hs[NT];
    size_t before = 0, after;
    char name[32];

    for (int t = 0; t < NT; t++) {
        bufs[t] = calloc((size_t)counts[t], sizeof(float));
        for (int64_t i = 0; i < counts[t]; i++)
            bufs[t][i] = 1.0f;
    }
    for (long s = 0; s < steps; s++) {
        if (s == steps / 10)
            before = heap_in_use();
        for (int t = 0; t < NT; t++) {
            kolo_dtype_t dt = t % 3 == 2 ? KOLO_FLOAT16 : KOLO_FLOAT32;
            snprintf(name, sizeof(name), "soak/%d", t);
            if (dt == KOLO_FLOAT16)
                for (int64_t i = 0; i < counts[t]; i++)
                    ((uint16_t *)bufs[t])[i] = exact_to_half(1.0f);
            MUST(kolo_allreduce_async(name, bufs[t], bufs[t], counts[t], dt,
                                      t % 2 ? KOLO_OP_AVERAGE : KOLO_OP_SUM,
                                      &hs[t]));
        }
        for (int t = 0; t < NT; t++) {
            float expect = t % 2 ? 1.0f : (float)size, got;
            MUST(kolo_wait(hs[t]));
            got = t % 3 == 2 ? half_to_float(((uint16_t *)bufs[t])[0])
                             : bufs[t][0];
            if (got != expect) {
                CHECK(0, "soak step %ld tensor %d: got %g, expected %g", s, t,
                      got, expect);
                exit(1);
            }
            if (t % 2 == 0 && t % 3 != 2) /* reset the sums */
                for (int64_t i = 0; i < counts[t]; i++)
                    bufs[t][i] = 1.0f;
        }
    }
    after = heap_in_use();
    printf("rank %d: %ld steps, heap in use %zu bytes after warm-up, %zu at "
           "the end\n",
           rank, steps, before, after);
    CHECK(after <= before + 65536, "heap grew by %zu bytes over %ld steps",
          after - before, steps);
    for (int t = 0; t < NT; t++)
        free(bufs[t]);
}

/* CPU seconds this process has used (all threads). */
static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* An idle job must not spin: ranks that enqueue nothing for a while use
 * almost no CPU. A spinning background thread would use a whole core; the
 * bound (5% of a core) is twenty times below that, not a timing figure. */
static void mode_idle(double seconds)
{
    double c0, c1;
    float x = 1;

    expect_ok("warmup");
    c0 = cpu_seconds();
    usleep((useconds_t)(seconds * 1e6));
    c1 = cpu_seconds();
    printf("rank %d: idle for %.1f s used %.1f ms of CPU (%.2f%% of a core)\n",
           rank, seconds, (c1 - c0) * 1e3, 100 * (c1 - c0) / seconds);
    CHECK(c1 - c0 < 0.05 * seconds, "idle job used %.3f s of CPU in %.1f s",
          c1 - c0, seconds);
    /* And it still works after the idle period. */
    CHECK(one("after/idle", 1, KOLO_FLOAT32, KOLO_OP_SUM, &x) == KOLO_OK &&
              x == (float)size,
          "allreduce after idle: %s", kolo_last_error());
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "random";

    MUST(kolo_init());
    rank = kolo_rank();
    size = kolo_size();

    if (strcmp(mode, "random") == 0)
        mode_random(argc > 2 ? atoi(argv[2]) : 4, 0);
    else if (strcmp(mode, "many") == 0)
        mode_random(argc > 2 ? atoi(argv[2]) : 3, 1);
    else if (strcmp(mode, "mismatch") == 0)
        mode_mismatch();
    else if (strcmp(mode, "accumulate") == 0)
        mode_accumulate();
    else if (strcmp(mode, "soak") == 0)
        mode_soak(argc > 2 ? atol(argv[2]) : 100000);
    else if (strcmp(mode, "idle") == 0)
        mode_idle(argc > 2 ? atof(argv[2]) : 3.0);
    else if (strcmp(mode, "shutdown") == 0) {
        mode_shutdown();
        goto done;
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    MUST(kolo_shutdown());
done:
    if (failures) {
        fprintf(stderr, "rank %d: %s: %d failures\n", rank, mode, failures);
        return 1;
    }
    printf("rank %d of %d: PASS %s\n", rank, size, mode);
    return 0;
}
