/*
 * test-timeline.c — a known sequence of collectives, for the timeline tests
 * (tests/timeline/run-timeline.sh runs it under kolorun and checks the
 * files it leaves with tests/timeline/check-timeline.py and kolo-timeline).
 *
 *   test-timeline MODE [ARG]
 *
 * The workload ("steps"): STEPS (3, or $TL_STEPS) steps of
 *   - four allreduces enqueued together, then waited (SUM):
 *       grad.a  float32 [1000]      4000 bytes
 *       grad.b  float32 [64, 32]    8192 bytes
 *       grad.c  float64 [300]       2400 bytes
 *       grad.d  int32   [5000]     20000 bytes
 *   - one allgather  gather.x  float32 [3, 4] per rank (48 bytes per rank)
 *   - one broadcast  bcast.w   float32 [256] from rank 0 (1024 bytes)
 * every result checked. The checker knows these numbers; keep them in step
 * with WORKLOAD in check-timeline.py.
 *
 * Modes:
 *   api FILE       rank 0 starts the timeline with kolo_start_timeline(FILE)
 *                  after an allreduce "pre.start" and stops it before an
 *                  allreduce "post.stop"; neither may appear in FILE. Then
 *                  it starts FILE.again.json, runs one more step and stops.
 *   steps          the workload alone (KOLO_TIMELINE, KOLO_TIMELINE_ALL_RANKS
 *                  and the rest come from the environment)
 *   straggler [MS] after a barrier (tensor "kolo.barrier"), rank 1 (or
 *                  $TL_LATE_RANK) sleeps MS (50) before every enqueue: it is
 *                  the last rank to become ready for every tensor
 *   restart FILE   rank 0 starts FILE.<i>.json (i = 0..5) while allreduces
 *                  are in flight; every other one it stops in flight and
 *                  starts FILE.<i>b.json at once: each file must be valid
 *                  and balanced (no end without its begin)
 *   loop           allreduces of 8 small tensors without end; every rank
 *                  writes its pid to $TL_DIR/pid.R. After 20 rounds (160
 *                  allreduces done) one allreduce of "loop.mark": once its
 *                  name is in the file, so are the ends of those 160 (the
 *                  writer keeps the order). The driver SIGKILLs rank 0; the
 *                  others must see an error and exit (3)
 *   stall-warn     every rank allreduces "grad.withheld" once (it is then
 *                  in the response cache); the second time, the last rank
 *                  withholds it for $TL_WITHHOLD_S (2.5) s, then enqueues
 *                  it: every handle succeeds. Rank 0 must have warned,
 *                  naming the last rank and the tensor (the driver checks).
 *   stall-shutdown the same first step; then the last rank skips
 *                  "grad.withheld" and enqueues "grad.next" (what the others
 *                  would enqueue after it): a deadlock. Every rank's handle
 *                  must fail with an error naming the last rank and
 *                  'grad.withheld', within $TL_STALL_BOUND_S (10) s of the
 *                  enqueue; a later enqueue must fail too.
 *   names FILE     rank 0 writes FILE while every rank allreduces tensors
 *                  whose names are not valid UTF-8 (and some that are):
 *                  the file must load, each name on a lane of its own
 *   fill FILE NEXT rank 0 writes FILE, on a disk too small for it (the
 *                  driver mounts a 64 KiB tmpfs), while every rank
 *                  allreduces tensors of long names; kolo_stop_timeline
 *                  must then report the failed write ("No space left on
 *                  device"); rank 0 then writes NEXT (one step), which
 *                  must work. The driver checks that FILE loads and that
 *                  the failure was logged once.
 *
 * Each rank prints "rank R of N: PASS MODE" and exits 0, or prints FAIL
 * lines and exits 1. A watchdog (alarm) turns a hang into a FAIL line.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo.h"
#include "../multi/testutil.h"

static int rank = -1, size;
static const char *mode = "?";
static int failures;

#define MUST(call) TU_MUST(call, "rank %d: FAIL %s: ", rank, mode)

static void sleep_ms(double ms)
{
    if (ms > 0)
        usleep((useconds_t)(ms * 1000));
}

static void watchdog(const char *what, unsigned seconds)
{
    tu_watchdog(rank, mode, what, seconds);
}

/* ---- the workload ------------------------------------------------------- */

static double delay_ms; /* straggler: the late rank waits this long */
static int late_rank = 1;

static void straggle(void)
{
    if (rank == late_rank)
        sleep_ms(delay_ms);
}

static void allreduces(int step)
{
    enum { NA = 1000, NB = 64 * 32, NC = 300, ND = 5000 };
    static float a[NA], b[NB];
    static double c[NC];
    static int32_t d[ND];
    static const int64_t shape_b[2] = {64, 32};
    kolo_handle_t h[4];
    kolo_opts_t opts;
    int64_t tri = (int64_t)size * (size - 1) / 2; /* sum of the ranks */

    for (int i = 0; i < NA; i++)
        a[i] = (float)(rank + i % 7 + step);
    for (int i = 0; i < NB; i++)
        b[i] = (float)(rank * 2 + 1);
    for (int i = 0; i < NC; i++)
        c[i] = rank + 0.5 * i;
    for (int i = 0; i < ND; i++)
        d[i] = rank * 1000 + i;
    straggle();
    MUST(kolo_allreduce_async("grad.a", a, a, NA, KOLO_FLOAT32, KOLO_OP_SUM, &h[0]));
    kolo_opts_init(&opts);
    opts.ndim = 2;
    opts.shape = shape_b;
    MUST(kolo_allreduce_async_opts("grad.b", b, b, NB, KOLO_FLOAT32, &opts, &h[1]));
    MUST(kolo_allreduce_async("grad.c", c, c, NC, KOLO_FLOAT64, KOLO_OP_SUM, &h[2]));
    MUST(kolo_allreduce_async("grad.d", d, d, ND, KOLO_INT32, KOLO_OP_SUM, &h[3]));
    for (int i = 0; i < 4; i++)
        MUST(kolo_wait(h[i]));
    CHECK(a[5] == (float)(tri + size * (5 % 7 + step)), "grad.a[5] = %g", a[5]);
    CHECK(b[7] == (float)(2 * tri + size), "grad.b[7] = %g", b[7]);
    CHECK(c[2] == tri + size * 1.0, "grad.c[2] = %g", c[2]);
    CHECK(d[9] == 1000 * tri + size * 9, "grad.d[9] = %d", (int)d[9]);
}

static void gather_and_broadcast(int step)
{
    float x[12], w[256];
    int64_t shape[2] = {3, 4};
    kolo_handle_t h;
    kolo_result_t res;

    for (int i = 0; i < 12; i++)
        x[i] = (float)(rank * 100 + i);
    straggle();
    MUST(kolo_allgather_async("gather.x", x, 2, shape, KOLO_FLOAT32, NULL, &h));
    MUST(kolo_wait_result(h, &res));
    CHECK(res.bytes == (size_t)size * sizeof(x), "gather.x: %zu bytes", res.bytes);
    if (res.bytes == (size_t)size * sizeof(x))
        for (int r = 0; r < size; r++)
            CHECK(((float *)res.data)[r * 12 + 11] == (float)(r * 100 + 11),
                  "gather.x: row of rank %d", r);
    kolo_result_free(&res);

    for (int i = 0; i < 256; i++)
        w[i] = rank == 0 ? (float)(i + step) : -1.0f;
    straggle();
    MUST(kolo_broadcast_async("bcast.w", w, 256, KOLO_FLOAT32, 0, NULL, &h));
    MUST(kolo_wait(h));
    CHECK(w[255] == (float)(255 + step), "bcast.w[255] = %g", w[255]);
}

static void steps(int first, int n)
{
    for (int s = first; s < first + n; s++) {
        allreduces(s);
        gather_and_broadcast(s);
    }
}

static void one_allreduce(const char *name)
{
    float v[16];
    kolo_handle_t h;
    for (int i = 0; i < 16; i++)
        v[i] = 1.0f;
    MUST(kolo_allreduce_async(name, v, v, 16, KOLO_FLOAT32, KOLO_OP_SUM, &h));
    MUST(kolo_wait(h));
    CHECK(v[0] == (float)size, "%s: %g", name, v[0]);
}

/* ---- modes -------------------------------------------------------------- */

static void mode_api(const char *path, int nsteps)
{
    char again[4096];

    one_allreduce("pre.start");
    /* Rank 0 starts its timeline after the other ranks' first requests
     * have reached it (as under load they may): their ready instants must
     * still be in the file, at the times the requests came. */
    if (rank == 0) {
        usleep(size > 1 ? 100000 : 0);
        MUST(kolo_start_timeline(path, 0));
    }
    steps(0, nsteps);
    /* The others enqueue "post.stop" only once rank 0 has stopped its
     * timeline: their requests reach rank 0, the coordinator, as soon as
     * they enqueue, and a request that came before the stop is rightly in
     * the file. They learn of the stop through a file, not a collective
     * (which would be in the file too). */
    snprintf(again, sizeof(again), "%s.stopped", path);
    if (rank == 0) {
        MUST(kolo_stop_timeline());
        FILE *f = fopen(again, "w");
        CHECK(f != NULL && fclose(f) == 0, "cannot create %s", again);
    } else {
        for (int ms = 0; access(again, F_OK) != 0; ms++) {
            if (ms == 120000) {
                CHECK(0, "rank 0 did not stop its timeline in 120 s");
                break;
            }
            usleep(1000);
        }
    }
    one_allreduce("post.stop");
    /* A second start writes a new file; a second stop is harmless. */
    snprintf(again, sizeof(again), "%s.again.json", path);
    if (rank == 0)
        MUST(kolo_start_timeline(again, 1));
    steps(nsteps, 1);
    if (rank == 0) {
        MUST(kolo_stop_timeline());
        MUST(kolo_stop_timeline());
    }
}

/* Rank 0 starts and stops the timeline while allreduces are in flight:
 * every file must stay valid and balanced (no end without its begin). */
static void mode_restart(const char *path, int rounds)
{
    enum { N = 4, COUNT = 256 * 1024 };
    static float v[N][COUNT];
    kolo_handle_t h[N];
    char name[32], file[4096];

    for (int it = 0; it < rounds; it++) {
        for (int t = 0; t < N; t++) {
            for (int i = 0; i < COUNT; i += 1024)
                v[t][i] = 1.0f;
            snprintf(name, sizeof(name), "restart.%d", t);
            MUST(kolo_allreduce_async(name, v[t], v[t], COUNT, KOLO_FLOAT32,
                                      KOLO_OP_SUM, &h[t]));
            if (rank == 0 && t == N / 2) {
                snprintf(file, sizeof(file), "%s.%d.json", path, it);
                MUST(kolo_start_timeline(file, it % 2));
            }
        }
        for (int t = 0; t < N; t++) {
            MUST(kolo_wait(h[t]));
            if (rank == 0 && it % 2 == 1 && t == 0) {
                /* Stopped and started again with the others in flight. */
                MUST(kolo_stop_timeline());
                snprintf(file, sizeof(file), "%s.%db.json", path, it);
                MUST(kolo_start_timeline(file, 0));
            }
        }
    }
    if (rank == 0)
        MUST(kolo_stop_timeline());
}

static void mode_loop(void)
{
    const char *dir = getenv("TL_DIR");
    char name[64], path[4096];
    float v[8][64];
    kolo_handle_t h[8];
    FILE *f;

    if (dir == NULL) {
        fprintf(stderr, "rank %d: FAIL loop: TL_DIR is not set\n", rank);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/pid.%d", dir, rank);
    f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    fprintf(f, "%ld\n", (long)getpid());
    fclose(f);
    alarm(0); /* the driver ends it */
    for (long it = 0;; it++) {
        if (it == 20) {
            float one = 1.0f;
            kolo_handle_t m;
            MUST(kolo_allreduce_async("loop.mark", &one, &one, 1, KOLO_FLOAT32,
                                      KOLO_OP_SUM, &m));
            MUST(kolo_wait(m));
        }
        for (int t = 0; t < 8; t++) {
            int rc;
            snprintf(name, sizeof(name), "loop.%d", t);
            for (int i = 0; i < 64; i++)
                v[t][i] = 1.0f;
            rc = kolo_allreduce_async(name, v[t], v[t], 64, KOLO_FLOAT32,
                                      KOLO_OP_SUM, &h[t]);
            if (rc != KOLO_OK) {
                fprintf(stderr, "rank %d: loop ends at iteration %ld: %s\n",
                        rank, it, kolo_last_error());
                exit(3);
            }
        }
        for (int t = 0; t < 8; t++)
            if (kolo_wait(h[t]) != KOLO_OK) {
                fprintf(stderr, "rank %d: loop ends at iteration %ld: %s\n",
                        rank, it, kolo_last_error());
                exit(3);
            }
    }
}

/* Names that are not valid UTF-8, and some that are. Keep in step with
 * ODD_NAMES in check-timeline.py. */
static const char *const odd_names[] = {
    "odd.plain",
    "odd.\xc3\xa9",           /* U+00E9, valid */
    "odd.\xe9",               /* the Latin-1 byte of U+00E9: invalid */
    "odd.\xc3",               /* a sequence cut short at the end */
    "odd.\xc3(",              /* ... and before an ASCII byte */
    "odd.\xe2\x82",           /* a three-byte sequence cut short */
    "odd.\xe2\x82\xac",       /* U+20AC, valid */
    "odd.\xf0\x9f\x98\x80",   /* U+1F600, valid */
    "odd.\xed\xa0\x80",       /* an encoded surrogate (U+D800): invalid */
    "odd.\xc0\xaf",           /* an overlong '/': invalid */
    "odd.\xf4\x90\x80\x80",   /* above U+10FFFF: invalid */
    "odd.\xff\xfe",
    "odd.\\udce9",            /* the text of an escape, valid */
    "odd.\"q\\\x01",          /* JSON's own escapes */
};

static void mode_names(const char *path)
{
    enum { N = sizeof(odd_names) / sizeof(odd_names[0]) + 1, COUNT = 16 };
    /* 1009 bytes, the most of them not UTF-8, each written "\udcff": its
     * events are larger than a page of the file */
    enum { LONG = 1000 };
    static char long_name[LONG + 16];
    float v[N][COUNT];
    kolo_handle_t h[N];

    memcpy(long_name, "odd.long.", 9);
    memset(long_name + 9, 0xff, LONG);
    long_name[9 + LONG] = '\0';
    if (rank == 0)
        MUST(kolo_start_timeline(path, 0));
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < COUNT; i++)
            v[t][i] = 1.0f;
        MUST(kolo_allreduce_async(t < N - 1 ? odd_names[t] : long_name, v[t],
                                  v[t], COUNT, KOLO_FLOAT32, KOLO_OP_SUM, &h[t]));
    }
    for (int t = 0; t < N; t++) {
        MUST(kolo_wait(h[t]));
        CHECK(v[t][0] == (float)size, "odd name %d: %g", t, v[t][0]);
    }
    if (rank == 0)
        MUST(kolo_stop_timeline());
}

/* Rank 0's timeline goes to a disk that fills up: about 200 KiB of events
 * (192 lanes named by 900 bytes each) for a 64 KiB file system. */
static void mode_fill(const char *path, const char *next)
{
    enum { ROUNDS = 12, N = 16, COUNT = 64, PAD = 900 };
    static char names[N][PAD + 64];
    float v[N][COUNT];
    kolo_handle_t h[N];

    if (rank == 0)
        MUST(kolo_start_timeline(path, 1));
    for (int r = 0; r < ROUNDS; r++) {
        for (int t = 0; t < N; t++) {
            int n = snprintf(names[t], sizeof(names[t]), "fill.%d.%d.", r, t);
            memset(names[t] + n, 'x', PAD);
            names[t][n + PAD] = '\0';
            for (int i = 0; i < COUNT; i++)
                v[t][i] = 1.0f;
            MUST(kolo_allreduce_async(names[t], v[t], v[t], COUNT, KOLO_FLOAT32,
                                      KOLO_OP_SUM, &h[t]));
        }
        for (int t = 0; t < N; t++) {
            MUST(kolo_wait(h[t]));
            CHECK(v[t][0] == (float)size, "fill.%d.%d: %g", r, t, v[t][0]);
        }
    }
    if (rank == 0) {
        int rc = kolo_stop_timeline();
        const char *msg = kolo_last_error();
        CHECK(rc < 0, "kolo_stop_timeline after the disk filled up: status %d, "
                      "want the write error", rc);
        if (rc < 0) {
            CHECK(strstr(msg, path) != NULL && strstr(msg, strerror(ENOSPC)) != NULL,
                  "kolo_stop_timeline's error does not name %s and '%s': %s",
                  path, strerror(ENOSPC), msg);
            fprintf(stderr, "rank 0: kolo_stop_timeline: %d %s\n", rc, msg);
        }
        MUST(kolo_start_timeline(next, 0));
    }
    /* The next file must see every rank's request of its step: no rank
     * may send one before rank 0's timeline is on (seen under
     * ThreadSanitizer: rank 1's request for grad.a reached rank 0 first,
     * and its ready instant was never recorded). */
    MUST(kolo_barrier(KOLO_GLOBAL_PROCESS_SET));
    steps(0, 1);
    if (rank == 0)
        MUST(kolo_stop_timeline());
}

/* 1 if msg names rank k ("rank K" followed by a non-digit). */
static int names_rank(const char *msg, int k)
{
    char want[32];
    size_t n = (size_t)snprintf(want, sizeof(want), "rank %d", k);
    for (const char *p = msg; (p = strstr(p, want)) != NULL; p++)
        if (p[n] < '0' || p[n] > '9')
            return 1;
    return 0;
}

static void mode_stall(int shutdown)
{
    int withholder = size - 1;
    double withhold = env_double("TL_WITHHOLD_S", 2.5);
    double bound = env_double("TL_STALL_BOUND_S", 10.0);
    const char *name = "grad.withheld";
    float v[32];
    kolo_handle_t h;
    int rc;
    double t0;

    for (int i = 0; i < 32; i++)
        v[i] = 1.0f;
    /* Step 1: every rank, so that the name is in the response cache: the
     * stall of step 2 must be found on a cached name too. */
    one_allreduce("grad.withheld");
    if (shutdown && rank == withholder)
        name = "grad.next"; /* goes on to what the others enqueue next */
    else if (rank == withholder)
        sleep_ms(withhold * 1000);
    t0 = now();
    rc = kolo_allreduce_async(name, v, v, 32, KOLO_FLOAT32, KOLO_OP_SUM, &h);
    if (rc == KOLO_OK)
        rc = kolo_wait(h);
    if (!shutdown) {
        CHECK(rc == KOLO_OK, "%s failed: %d %s", name, rc, kolo_last_error());
        CHECK(rc != KOLO_OK || v[0] == (float)size, "%s = %g", name, v[0]);
        one_allreduce("grad.after");
        return;
    }
    {
        const char *msg = kolo_last_error();
        CHECK(rc < 0, "%s: status %d, want an error", name, rc);
        CHECK(strstr(msg, "'grad.withheld'") != NULL,
              "the error does not name the tensor 'grad.withheld': %s", msg);
        CHECK(names_rank(msg, withholder),
              "the error does not name rank %d: %s", withholder, msg);
        CHECK(now() - t0 < bound, "the error came after %.1f s (bound %.1f s)",
              now() - t0, bound);
        fprintf(stderr, "rank %d: %s failed after %.1f s: %s\n", rank, name,
                now() - t0, msg);
    }
    /* The job is stopped: a later enqueue fails at once. */
    rc = kolo_allreduce_async("grad.later", v, v, 32, KOLO_FLOAT32, KOLO_OP_SUM, &h);
    if (rc == KOLO_OK)
        rc = kolo_wait(h);
    CHECK(rc < 0, "an enqueue after the stall shutdown: status %d", rc);
}

int main(int argc, char **argv)
{
    int nsteps = (int)env_double("TL_STEPS", 3);
    double t0 = now();

    if (argc < 2) {
        fprintf(stderr, "usage: test-timeline api FILE | steps | straggler [MS] "
                        "| restart FILE | loop | stall-warn | stall-shutdown "
                        "| names FILE | fill FILE NEXT\n");
        return 2;
    }
    mode = argv[1];
    signal(SIGALRM, tu_on_alarm);
    watchdog("kolo_init", 30);
    MUST(kolo_init());
    rank = kolo_rank();
    size = kolo_size();
    watchdog(mode, 30);

    if (strcmp(mode, "api") == 0 && argc > 2) {
        mode_api(argv[2], nsteps);
    } else if (strcmp(mode, "steps") == 0) {
        steps(0, nsteps);
    } else if (strcmp(mode, "straggler") == 0) {
        delay_ms = argc > 2 ? atof(argv[2]) : 50.0;
        late_rank = (int)env_double("TL_LATE_RANK", 1);
        /* Start together: on a loaded machine the ranks' starts differ by
         * more than the delay. */
        MUST(kolo_barrier(KOLO_GLOBAL_PROCESS_SET));
        steps(0, nsteps);
    } else if (strcmp(mode, "restart") == 0 && argc > 2) {
        mode_restart(argv[2], 6);
    } else if (strcmp(mode, "names") == 0 && argc > 2) {
        mode_names(argv[2]);
    } else if (strcmp(mode, "fill") == 0 && argc > 3) {
        mode_fill(argv[2], argv[3]);
    } else if (strcmp(mode, "loop") == 0) {
        mode_loop();
    } else if (strcmp(mode, "stall-warn") == 0) {
        mode_stall(0);
    } else if (strcmp(mode, "stall-shutdown") == 0) {
        mode_stall(1);
    } else {
        fprintf(stderr, "test-timeline: unknown mode '%s'\n", mode);
        kolo_shutdown();
        return 2;
    }
    watchdog("kolo_shutdown", 15);
    kolo_shutdown();
    alarm(0);
    if (failures) {
        fprintf(stderr, "rank %d of %d: FAIL %s (%d checks failed)\n", rank, size,
                mode, failures);
        return 1;
    }
    printf("rank %d of %d: PASS %s (%.2f s)\n", rank, size, mode, now() - t0);
    return 0;
}
