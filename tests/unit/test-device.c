/*
 * test-device.c — the runtime's device path on the simulated device
 * (ops/simdev), ranks as threads over ops/mem (ranks.h).
 *
 * Why these tests: the NCCL backend needs a GPU, which CI does not have,
 * yet what makes a training step cheap and safe on a GPU is the runtime's:
 * a CUDA batch completes its handles once it is queued on the device
 * (inflight.c), the program's stream is made to wait for it, several
 * batches are in flight at once, and a failure found afterwards (an
 * asynchronous error, a device that never finishes) still reaches the
 * program, naming the tensor, while nothing hangs. The simulated device
 * runs that path for real: its streams are worker threads that can be
 * held, so a test sees what the runtime did before the device did
 * anything. Every rank computes the expected results itself, including
 * Horovod's CUDA arithmetic: float16 scaled in half precision (the factor
 * rounded to float16 first), AVERAGE as NCCL's ncclAvg.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "half.h"
#include "timeline.h"
#include "ranks.h"
#include "simdev/simdev_ops.h"
#include "unit.h"

static const kolo__dev_ops_t *const dev = &kolo__dev_ops_simdev;

/* Each rank's tensors live on its own simulated device. */
static int device_of(const prank_t *p) { return p->rank; }

static void *dmalloc(prank_t *p, size_t bytes)
{
    void *m = kolo__simdev_malloc(device_of(p), bytes);
    EXPECT(p, m != NULL, "rank %d: out of simulated device memory", p->rank);
    return m;
}

/* Pushes a tensor in device memory as enqueue.c does for
 * KOLO_DEVICE_CUDA: the device backend checks it and records its ready
 * event on the program's stream (NULL: the device's default stream). */
static kolo_handle_t dpush(prank_t *p, const char *name, kolo__params_t pr,
                           const void *in, void *out, void *stream,
                           int64_t rows, const int64_t *splits)
{
    kolo__dev_check_t t = {
        .coll = kolo__coll_name(pr.coll), .name = name, .dtype = pr.dtype,
        .reduces = pr.coll == KOLO__COLL_ALLREDUCE ||
                   pr.coll == KOLO__COLL_REDUCESCATTER,
        .device = device_of(p), .input = in, .output = out, .stream = stream,
        .rank = p->rank, .set_id = 0, .set_device = -1};
    char detail[KOLO__ERR_LEN];
    kolo__entry_t *e;
    kolo__err_t err;
    kolo_handle_t h = 0;
    void *ev = NULL;
    int rc;

    kolo__err_clear(&err);
    rc = dev->prepare(&t, &ev, detail, sizeof(detail));
    EXPECT(p, rc == KOLO_OK, "rank %d: prepare of '%s': %s", p->rank, name,
           detail);
    if (rc != KOLO_OK || (e = kolo__entry_new(name)) == NULL)
        return 0;
    e->params = pr;
    e->params.device_type = KOLO_DEVICE_CUDA;
    e->device = device_of(p);
    e->ready_event = ev;
    e->ready_free = dev->event_free;
    e->stream = stream;
    e->input = in;
    e->output = out;
    e->rows = rows;
    if (splits != NULL) {
        e->splits = malloc((size_t)p->job->size * sizeof(int64_t));
        memcpy(e->splits, splits, (size_t)p->job->size * sizeof(int64_t));
    }
    e->enqueued_us = kolo__now_us();
    /* The handle is read before the push: once queued, the background
     * thread may complete and free the entry at any time. */
    if (kolo__handles_new(p->rt.handles, &e->handle, &err) != KOLO_OK ||
        (h = e->handle, kolo__queue_push(&p->world->queue, e, &err)) != KOLO_OK) {
        EXPECT(p, 0, "rank %d: push of '%s': %s", p->rank, name, err.msg);
        if (e->handle > 0) {
            kolo__handles_complete(p->rt.handles, e->handle, err.code, err.msg);
            kolo__handles_wait(p->rt.handles, e->handle, NULL);
        }
        kolo__entry_free(e);
        return 0;
    }
    return h;
}

/* A float32 SUM allreduce of n elements in place on the device, on
 * `stream` (NULL: the default one). */
static kolo_handle_t dsum(prank_t *p, const char *name, float *buf, int64_t n,
                          void *stream)
{
    return dpush(p, name,
                 params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_SUM, n),
                 buf, buf, stream, 0, NULL);
}

/* Waits a handle as kolo_wait does (api.c): the result ordered on
 * `stream`, or with host set, on the host; hands over a result. */
static int dwait(prank_t *p, kolo_handle_t h, void *stream, int host,
                 kolo__result_t **res, char *msg, size_t len)
{
    kolo__handoff_t ho;
    kolo__err_t err;
    int rc;

    kolo__err_clear(&err);
    rc = kolo__handles_wait_handoff(p->rt.handles, h, &err, &ho);
    if (rc == KOLO_OK && ho.done != NULL)
        rc = kolo__done_settle(ho.done, stream, host, &err);
    if (ho.done != NULL)
        ho.done_free(ho.done);
    if (res != NULL) {
        *res = ho.output;
        ho.output = NULL;
    }
    if (ho.output != NULL)
        ho.output_free(ho.output);
    if (msg != NULL)
        snprintf(msg, len, "%s", rc == KOLO_OK ? "" : err.msg);
    return rc;
}

static void dexpect_ok(prank_t *p, kolo_handle_t h, void *stream,
                       const char *what)
{
    char msg[KOLO__ERR_LEN];
    int rc = dwait(p, h, stream, 0, NULL, msg, sizeof(msg));
    EXPECT(p, rc == KOLO_OK, "rank %d: %s failed (%d): %s", p->rank, what, rc,
           msg);
}

/* Polls a handle until it is done, for at most 10 s; its status. */
static int poll_done(prank_t *p, kolo_handle_t h)
{
    kolo__err_t err;
    for (int i = 0; i < 1000; i++) {
        int rc = kolo__handles_poll(p->rt.handles, h, &err);
        if (rc != KOLO_IN_PROGRESS)
            return rc;
        usleep(10000);
    }
    return KOLO_IN_PROGRESS;
}

/* Waits until the set has stopped (its queue refuses work), for at most
 * 10 s: KOLO_OK if it did not, else the code of the message every later
 * call gets (into msg). */
static int wait_set_stopped(prank_t *p, char *msg, size_t len)
{
    kolo__queue_t *q = &p->world->queue;
    for (int i = 0; i < 1000; i++) {
        int closed;
        pthread_mutex_lock(&q->mu);
        closed = q->closed;
        if (closed)
            snprintf(msg, len, "%s", q->close_err.msg);
        pthread_mutex_unlock(&q->mu);
        if (closed)
            return q->close_err.code != KOLO_OK ? q->close_err.code
                                                : KOLO_ERR_SHUTDOWN;
        usleep(10000);
    }
    snprintf(msg, len, "the set still runs");
    return KOLO_OK;
}


/* float16 arithmetic for the references: to float16 and back. */
static float h16(float x) { return kolo__f16_to_float(kolo__float_to_f16(x)); }

/* ---- results ------------------------------------------------------------- */

#define NT 5
static const int64_t counts[NT] = {1, 7, 1000, 33, 4096};

/* Fused float32 sums, a float64 MAX, an int32 AVERAGE (ncclAvg:
 * integer sum, then an exact division), float16 with Horovod's CUDA
 * prescale and postscale, float32 sent as float16. */
static void body_results(prank_t *p)
{
    int n = p->job->size, me = p->rank;
    float *in[NT], *out[NT];
    kolo_handle_t h[NT], hm, ha, hs, hw;
    double *d = dmalloc(p, 4 * sizeof(double));
    int32_t *iv = dmalloc(p, 6 * sizeof(int32_t));
    uint16_t *hv = dmalloc(p, 3 * sizeof(uint16_t));
    float *wv = dmalloc(p, 5 * sizeof(float));
    kolo__params_t pm = params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT64, KOLO_OP_MAX, 4);
    kolo__params_t pa = params(KOLO__COLL_ALLREDUCE, KOLO_INT32, KOLO_OP_AVERAGE, 6);
    kolo__params_t ps = params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT16, KOLO_OP_SUM, 3);
    kolo__params_t pw = params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_SUM, 5);
    char name[32];

    for (int t = 0; t < NT; t++) {
        in[t] = dmalloc(p, (size_t)counts[t] * sizeof(float));
        out[t] = dmalloc(p, (size_t)counts[t] * sizeof(float));
        for (int64_t i = 0; i < counts[t]; i++)
            in[t][i] = rank_val(me, t, i);
    }
    for (int i = 0; i < 4; i++)
        d[i] = rank_max_val(me, i);
    for (int i = 0; i < 6; i++)
        iv[i] = (me + 1) * 10 + i;
    /* 3.0 prescaled by 0.1: Horovod's CUDA kernels multiply by the factor
     * rounded to float16 (0.0999755859375) in half precision. */
    for (int i = 0; i < 3; i++)
        hv[i] = kolo__float_to_f16(3.0f);
    ps.prescale = 0.1;
    ps.postscale = 2.0;
    pw.wire = KOLO_FLOAT16;
    for (int i = 0; i < 5; i++)
        wv[i] = (float)(me + i) + 0.25f;
    for (int t = 0; t < NT; t++) {
        snprintf(name, sizeof(name), "dev.%d", t);
        h[t] = dpush(p, name, params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT32,
                                     KOLO_OP_SUM, counts[t]),
                     in[t], out[t], NULL, 0, NULL);
    }
    hm = dpush(p, "dev.max64", pm, d, d, NULL, 0, NULL);
    ha = dpush(p, "dev.avg32", pa, iv, iv, NULL, 0, NULL);
    hs = dpush(p, "dev.half", ps, hv, hv, NULL, 0, NULL);
    hw = dpush(p, "dev.wire16", pw, wv, wv, NULL, 0, NULL);
    for (int t = 0; t < NT; t++)
        dexpect_ok(p, h[t], NULL, "a float32 allreduce");
    dexpect_ok(p, hm, NULL, "the float64 MAX");
    dexpect_ok(p, ha, NULL, "the int32 AVERAGE");
    dexpect_ok(p, hs, NULL, "the scaled float16 allreduce");
    dexpect_ok(p, hw, NULL, "the float32 allreduce sent as float16");
    /* Ordered on the default stream: the host reads after syncing it. */
    kolo__simdev_sync(NULL, device_of(p));
    for (int t = 0; t < NT; t++) {
        snprintf(name, sizeof(name), "dev.%d", t);
        expect_sum(p, name, t, out[t], counts[t]);
    }
    expect_max(p, "dev.max64", d, 4);
    for (int i = 0; i < 6; i++) {
        int32_t sum = 0;
        for (int r = 0; r < n; r++)
            sum += (r + 1) * 10 + i;
        EXPECT(p, iv[i] == sum / n, "dev.avg32[%d] = %d, expected %d", i,
               (int)iv[i], (int)(sum / n));
    }
    for (int i = 0; i < 3; i++) {
        /* Every rank adds half(3 * half(0.1)) = 0.2998046875 (the host's
         * float32 factor would give 0.300048828125); the sum, exact in
         * float16 here, is then doubled. */
        float one = h16(3.0f * h16(0.1f)), want = 0;
        for (int r = 0; r < n; r++)
            want = h16(want + one);
        want = h16(want * 2.0f);
        EXPECT(p, one == 0.2998046875f, "half(3 * half(0.1)) = %.10g",
               (double)one);
        EXPECT(p, kolo__f16_to_float(hv[i]) == want,
               "dev.half[%d] = %.10g, expected %.10g (Horovod's CUDA "
               "half-precision scaling)", i,
               (double)kolo__f16_to_float(hv[i]), (double)want);
    }
    for (int i = 0; i < 5; i++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want = h16(want + h16((float)(r + i) + 0.25f));
        EXPECT(p, wv[i] == want, "dev.wire16[%d] = %g, expected %g", i,
               (double)wv[i], (double)want);
    }
    for (int t = 0; t < NT; t++) {
        kolo__simdev_free(in[t]);
        kolo__simdev_free(out[t]);
    }
    kolo__simdev_free(d);
    kolo__simdev_free(iv);
    kolo__simdev_free(hv);
    kolo__simdev_free(wv);
}

START_TEST(allreduce_on_the_device)
{
    kolo__ops_device_use(dev);
    for (int n = 1; n <= 4; n++)
        run_job(n, body_results);
}
END_TEST

/* Waits for a result handed to the host; NULL (reported) when the wait
 * failed. */
static kolo__result_t *dresult(prank_t *p, kolo_handle_t h, const char *what)
{
    kolo__result_t *res = NULL;
    char msg[KOLO__ERR_LEN];
    int rc = dwait(p, h, NULL, 1, &res, msg, sizeof(msg));

    EXPECT(p, rc == KOLO_OK, "rank %d: %s: %s", p->rank, what, msg);
    if (rc == KOLO_OK)
        return res;
    kolo__result_free(res);
    return NULL;
}

/* Rank r gave r + 1 rows of 3, r * 1000 + i; the result stays on the
 * device. */
static void check_allgather(prank_t *p, kolo__result_t *res)
{
    int n = p->job->size;
    int64_t total = 0;

    if (res == NULL)
        return;
    const int32_t *g = res->data;
    for (int r = 0, k = 0; r < n; r++) {
        total += r + 1;
        EXPECT(p, res->splits[r] == r + 1, "allgather split %d = %lld", r,
               (long long)res->splits[r]);
        for (int i = 0; i < (r + 1) * 3; i++, k++)
            EXPECT(p, g[k] == r * 1000 + i, "allgather[%d] = %d, "
                   "expected %d", k, (int)g[k], r * 1000 + i);
    }
    EXPECT(p, res->shape[0] == total, "allgather rows %lld",
           (long long)res->shape[0]);
    EXPECT(p, res->device_type == KOLO_DEVICE_CUDA,
           "allgather's result is not in device memory");
    kolo__result_free(res);
}

/* Rank j sent this rank me + 1 rows, j * 100 + me * 10 + r. */
static void check_alltoall(prank_t *p, kolo__result_t *res)
{
    int n = p->job->size, me = p->rank;

    if (res == NULL)
        return;
    const int32_t *g = res->data;
    for (int j = 0, k = 0; j < n; j++) {
        EXPECT(p, res->splits[j] == me + 1, "alltoall received %lld rows "
               "from %d", (long long)res->splits[j], j);
        for (int r = 0; r <= me; r++, k++)
            EXPECT(p, g[k] == j * 100 + me * 10 + r, "alltoall[%d] = %d",
                   k, (int)g[k]);
    }
    kolo__result_free(res);
}

/* This rank's share of rows of the float16 AVERAGE with a postscale of 3
 * (3 / n, in half precision) of every rank's (r + 1 + i % 3). */
static void check_reducescatter(prank_t *p, kolo__result_t *res,
                                int64_t rs_rows)
{
    int n = p->job->size, me = p->rank;

    if (res == NULL)
        return;
    const uint16_t *g = res->data;
    int64_t mine = rs_rows / n + (me < rs_rows % n ? 1 : 0), first = 0;
    for (int r = 0; r < me; r++)
        first += rs_rows / n + (r < rs_rows % n ? 1 : 0);
    EXPECT(p, res->shape[0] == mine, "reducescatter rows %lld, expected "
           "%lld", (long long)res->shape[0], (long long)mine);
    for (int64_t i = 0; i < mine * 2; i++) {
        int64_t at = first * 2 + i;
        float sum = 0, want;
        for (int r = 0; r < n; r++)
            sum = h16(sum + (float)(r + 1 + at % 3));
        /* AVERAGE folded into the postscale: 3 / n, in half. */
        want = h16(sum * h16((float)(3.0 / n)));
        EXPECT(p, kolo__f16_to_float(g[i]) == want, "reducescatter[%lld] "
               "= %.10g, expected %.10g", (long long)i,
               (double)kolo__f16_to_float(g[i]), (double)want);
    }
    kolo__result_free(res);
}

/* Broadcast, uneven allgather, alltoall with splits, and a reducescatter
 * AVERAGE of float16 with a postscale (Horovod folds the division into
 * the postscale; float16 scaled in half precision). */
static void body_others(prank_t *p)
{
    int n = p->job->size, me = p->rank, rows = me + 1;
    int32_t *bc = dmalloc(p, 6 * sizeof(int32_t));
    int32_t *ag = dmalloc(p, (size_t)rows * 3 * sizeof(int32_t));
    int64_t a2a_rows = 0, splits[MAXR];
    int32_t *a2a;
    int64_t rs_rows = 2 * n + 1;
    uint16_t *rs = dmalloc(p, (size_t)rs_rows * 2 * sizeof(uint16_t));
    kolo__params_t pb = params(KOLO__COLL_BROADCAST, KOLO_INT32, 0, 6);
    kolo__params_t pg = params(KOLO__COLL_ALLGATHER, KOLO_INT32, 0, 3);
    kolo__params_t pt = params(KOLO__COLL_ALLTOALL, KOLO_INT32, 0, 1);
    kolo__params_t pr = params(KOLO__COLL_REDUCESCATTER, KOLO_FLOAT16,
                               KOLO_OP_AVERAGE, rs_rows * 2);
    kolo_handle_t hb, hg, ht, hr;

    for (int i = 0; i < 6; i++)
        bc[i] = me == n - 1 ? 100 + i : -1;
    pb.root = n - 1;
    for (int i = 0; i < rows * 3; i++)
        ag[i] = me * 1000 + i;
    pg.ndim = 2;
    pg.shape[1] = 3;
    /* alltoall: rank me sends j + 1 rows of one element to rank j. */
    for (int j = 0; j < n; j++) {
        splits[j] = j + 1;
        a2a_rows += j + 1;
    }
    a2a = dmalloc(p, (size_t)a2a_rows * sizeof(int32_t));
    for (int j = 0, k = 0; j < n; j++)
        for (int r = 0; r <= j; r++, k++)
            a2a[k] = me * 100 + j * 10 + r;
    pt.ndim = 1;
    for (int i = 0; i < rs_rows * 2; i++)
        rs[i] = kolo__float_to_f16((float)(me + 1 + i % 3));
    pr.ndim = 2;
    pr.shape[0] = rs_rows;
    pr.shape[1] = 2;
    pr.postscale = 3.0;

    hb = dpush(p, "dev.bcast", pb, bc, bc, NULL, 0, NULL);
    hg = dpush(p, "dev.allgather", pg, ag, NULL, NULL, rows, NULL);
    ht = dpush(p, "dev.alltoall", pt, a2a, NULL, NULL, a2a_rows, splits);
    hr = dpush(p, "dev.reducescatter", pr, rs, NULL, NULL, 0, NULL);

    dexpect_ok(p, hb, NULL, "the broadcast");
    kolo__simdev_sync(NULL, device_of(p));
    for (int i = 0; i < 6; i++)
        EXPECT(p, bc[i] == 100 + i, "dev.bcast[%d] = %d", i, (int)bc[i]);

    /* Results handed to the host: kolo_wait_result waits for the device. */
    check_allgather(p, dresult(p, hg, "allgather"));
    check_alltoall(p, dresult(p, ht, "alltoall"));
    check_reducescatter(p, dresult(p, hr, "reducescatter"), rs_rows);
    kolo__simdev_free(bc);
    kolo__simdev_free(ag);
    kolo__simdev_free(a2a);
    kolo__simdev_free(rs);
}

START_TEST(other_collectives_on_the_device)
{
    kolo__ops_device_use(dev);
    for (int n = 1; n <= 3; n++)
        run_job(n, body_others);
}
END_TEST

/* ---- completion on the stream ------------------------------------------- */

typedef struct peek {
    const float *at;
    float seen;
} peek_t;

static void peek_run(void *arg)
{
    peek_t *k = arg;
    k->seen = *k->at;
}

/* While the device is held, the handles complete (the background thread
 * did not wait for it), several batches are queued, and none has run; the
 * program's stream, ordered after them, sees the results once the device
 * goes on. */
static void body_ordered(prank_t *p)
{
    int n = p->job->size, me = p->rank;
    void *stream = kolo__simdev_stream_new(device_of(p));
    float *buf[3];
    kolo_handle_t h[3];
    peek_t peek[3];
    uint64_t queued0 = 0, finished0 = 0, queued = 0, finished = 0;
    char name[32];

    kolo__simdev_counts(me, &queued0, &finished0);
    kolo__simdev_hold(device_of(p), 1);
    for (int b = 0; b < 3; b++) {
        buf[b] = dmalloc(p, 4 * sizeof(float));
        for (int i = 0; i < 4; i++)
            buf[b][i] = (float)(me + b + i);
        snprintf(name, sizeof(name), "ordered.%d", b);
        /* One round each: separate batches. */
        h[b] = dsum(p, name, buf[b], 4, stream);
        EXPECT(p, poll_done(p, h[b]) == KOLO_OK, "rank %d: '%s' did not "
               "complete while the device was held", me, name);
    }
    kolo__simdev_counts(me, &queued, &finished);
    queued -= queued0;
    finished -= finished0;
    EXPECT(p, queued == 3 && finished == 0, "rank %d: %llu collectives "
           "queued and %llu finished on a held device (expected 3 and 0)", me,
           (unsigned long long)queued, (unsigned long long)finished);
    for (int b = 0; b < 3; b++) {
        EXPECT(p, buf[b][0] == (float)(me + b), "rank %d: ordered.%d changed "
               "before the device ran", me, b);
        dexpect_ok(p, h[b], stream, "an ordered allreduce");
        peek[b].at = &buf[b][1];
        peek[b].seen = -1;
        kolo__simdev_launch(stream, device_of(p), peek_run, &peek[b]);
    }
    pthread_barrier_wait(&p->job->bar);
    kolo__simdev_hold(device_of(p), 0);
    kolo__simdev_sync(stream, device_of(p));
    for (int b = 0; b < 3; b++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want += (float)(r + b + 1);
        EXPECT(p, peek[b].seen == want, "rank %d: the program's stream saw "
               "%g in ordered.%d[1], expected %g", me, (double)peek[b].seen,
               b, (double)want);
        kolo__simdev_free(buf[b]);
    }
    kolo__simdev_stream_free(stream);
}

START_TEST(completion_is_ordered_on_the_stream)
{
    kolo__ops_device_use(dev);
    run_job(2, body_ordered);
    run_job(3, body_ordered);
}
END_TEST

/* The program's stream is slow: kolo's work waits for the ready event, the
 * handle completes meanwhile, and the result is right. */
typedef struct fill {
    float *at;
    int n;
    float v;
    useconds_t us; /* the program's work first (0: 50 ms) */
    int64_t done_us; /* when it was done (kolo__now_us) */
} fill_t;

static void fill_run(void *arg)
{
    fill_t *f = arg;
    usleep(f->us ? f->us : 50000);
    for (int i = 0; i < f->n; i++)
        f->at[i] = f->v;
    f->done_us = kolo__now_us();
}

static void body_ready(prank_t *p)
{
    int n = p->job->size;
    void *stream = kolo__simdev_stream_new(device_of(p));
    float *buf = dmalloc(p, 8 * sizeof(float));
    fill_t f = {buf, 8, (float)(p->rank + 1), 0, 0};
    kolo_handle_t h;

    kolo__simdev_launch(stream, device_of(p), fill_run, &f);
    h = dsum(p, "ready", buf, 8, stream);
    dexpect_ok(p, h, stream, "an allreduce behind the program's work");
    kolo__simdev_sync(stream, device_of(p));
    for (int i = 0; i < 8; i++)
        EXPECT(p, buf[i] == (float)(n * (n + 1) / 2), "rank %d: ready[%d] = "
               "%g: the collective read the input before the program wrote "
               "it", p->rank, i, (double)buf[i]);
    kolo__simdev_stream_free(stream);
    kolo__simdev_free(buf);
}

START_TEST(inputs_wait_for_the_programs_stream)
{
    kolo__ops_device_use(dev);
    run_job(2, body_ready);
}
END_TEST

/* ---- failures ------------------------------------------------------------ */

/* Rank 1's device fails the first collective of two in flight, after
 * their handles completed: on every rank both fail when waited, naming a
 * tensor and the rank, and the set stops, so the next call says why. */
static void body_async_failure(prank_t *p)
{
    float *a = dmalloc(p, 4 * sizeof(float)), *b = dmalloc(p, 4 * sizeof(float));
    char msg[KOLO__ERR_LEN], expect[64];
    kolo_handle_t ha, hb;
    int rc;

    kolo__simdev_hold(device_of(p), 1);
    ha = dsum(p, "fail.a", a, 4, NULL);
    EXPECT(p, poll_done(p, ha) == KOLO_OK, "rank %d: fail.a did not complete",
           p->rank);
    hb = dsum(p, "fail.b", b, 4, NULL);
    EXPECT(p, poll_done(p, hb) == KOLO_OK, "rank %d: fail.b did not complete",
           p->rank);
    pthread_barrier_wait(&p->job->bar);
    if (p->rank == 1)
        kolo__simdev_fail_next(1);
    pthread_barrier_wait(&p->job->bar);
    kolo__simdev_hold(device_of(p), 0);

    rc = wait_set_stopped(p, msg, sizeof(msg));
    EXPECT(p, rc != KOLO_OK, "rank %d: the set goes on after rank 1's device "
           "failed", p->rank);
    /* Rank 1 found the failure: its next call names the tensor and the
     * rank; the others stop in the next round, told that rank 1 did, or
     * see first that rank 1 aborted the communicator. */
    snprintf(expect, sizeof(expect), "rank %d: allreduce of CUDA tensor "
             "'fail.a'", p->rank);
    EXPECT(p, strstr(msg, expect) != NULL ||
              (p->rank != 1 && strstr(msg, "rank 1 has shut down") != NULL),
           "rank %d: the next call's message names neither the tensor nor "
           "rank 1: %s", p->rank, msg);
    rc = dwait(p, ha, NULL, 0, NULL, msg, sizeof(msg));
    EXPECT(p, rc != KOLO_OK && strstr(msg, "'fail.a'") != NULL,
           "rank %d: waiting fail.a gave %d: %s", p->rank, rc, msg);
    rc = dwait(p, hb, NULL, 0, NULL, msg, sizeof(msg));
    EXPECT(p, rc != KOLO_OK && strstr(msg, "'fail.b'") != NULL,
           "rank %d: waiting fail.b gave %d: %s", p->rank, rc, msg);
    kolo__simdev_free(a);
    kolo__simdev_free(b);
}

START_TEST(a_failure_after_completion_reaches_the_program)
{
    kolo__ops_device_use(dev);
    run_job(2, body_async_failure);
    run_job(3, body_async_failure);
}
END_TEST

/* A device that never finishes: after KOLO_TIMEOUT_SECONDS (1 s here) the
 * communicator is aborted, the handle's wait fails with the timeout naming
 * the tensor, and nothing hangs (the test's own time bound). */
static int g_stuck_codes[MAXR];

static void body_stuck(prank_t *p)
{
    float *a = dmalloc(p, 4 * sizeof(float));
    char msg[KOLO__ERR_LEN];
    kolo_handle_t h;
    int rc;

    kolo__simdev_hold(device_of(p), 1);
    h = dsum(p, "stuck", a, 4, NULL);
    EXPECT(p, poll_done(p, h) == KOLO_OK, "rank %d: 'stuck' did not complete "
           "while the device was held", p->rank);
    rc = wait_set_stopped(p, msg, sizeof(msg));
    EXPECT(p, rc != KOLO_OK, "rank %d: the set goes on with a stuck device",
           p->rank);
    /* The first rank to time out aborts the communicator; the others
     * may see that first. */
    rc = dwait(p, h, NULL, 1, NULL, msg, sizeof(msg));
    EXPECT(p, rc < 0 && strstr(msg, "'stuck'") != NULL &&
              (strstr(msg, "did not finish within 1 s") != NULL ||
               strstr(msg, "aborted the communicator") != NULL),
           "rank %d: waiting 'stuck' gave %d, expected a timeout naming it: "
           "%s", p->rank, rc, msg);
    g_stuck_codes[p->rank] = rc;
    kolo__simdev_hold(device_of(p), 0);
    kolo__simdev_free(a);
}

START_TEST(a_stuck_device_times_out)
{
    kolo__ops_device_use(dev);
    run_job_timeout(2, body_stuck, 1.0);
    ck_assert_msg(g_stuck_codes[0] == KOLO_ERR_TIMEOUT ||
                      g_stuck_codes[1] == KOLO_ERR_TIMEOUT,
                  "no rank failed with KOLO_ERR_TIMEOUT (%d, %d)",
                  g_stuck_codes[0], g_stuck_codes[1]);
}
END_TEST

/* A device that cannot start on one rank (its context, at the set's
 * first device batch): every rank's handle fails at once, naming the
 * tensor, that rank and its reason; no rank waits for it to arrive. */
static int g_start_code;

static void body_start_fails(prank_t *p)
{
    float *a = dmalloc(p, 4 * sizeof(float));
    char msg[KOLO__ERR_LEN];
    const char *why = g_start_code == KOLO_ERR_NO_MEMORY ? "out of memory"
                                                         : "failed to start";
    kolo_handle_t h;
    int rc;

    h = dsum(p, "start.a", a, 4, NULL);
    rc = dwait(p, h, NULL, 1, NULL, msg, sizeof(msg));
    EXPECT(p, rc < 0 && strstr(msg, "'start.a'") != NULL &&
              strstr(msg, "rank 1") != NULL && strstr(msg, why) != NULL,
           "rank %d: waiting 'start.a' gave %d, expected an error naming the "
           "tensor, rank 1 and '%s': %s", p->rank, rc, why, msg);
    kolo__simdev_free(a);
}

START_TEST(a_device_that_cannot_start_fails_every_rank)
{
    static const int codes[] = {KOLO_ERR_NO_MEMORY, KOLO_ERR_BACKEND};
    kolo__ops_device_use(dev);
    for (int n = 2; n <= 3; n++)
        for (size_t c = 0; c < sizeof(codes) / sizeof(codes[0]); c++) {
            g_start_code = codes[c];
            kolo__simdev_fail_start(1, codes[c]);
            run_job(n, body_start_fails);
            kolo__simdev_fail_start(1, KOLO_OK);
        }
}
END_TEST

/* Shutdown while the device still works on the last batch: the set's end
 * waits for it (the results are complete afterwards), nothing is freed
 * under it. */
static void *release_later(void *arg)
{
    prank_t *p = arg;
    usleep(200000);
    kolo__simdev_hold(device_of(p), 0);
    return NULL;
}

static float *g_late[MAXR];
static pthread_t g_releaser[MAXR];

static void body_shutdown(prank_t *p)
{
    float *a = dmalloc(p, 16 * sizeof(float));
    kolo_handle_t h;

    for (int i = 0; i < 16; i++)
        a[i] = (float)(p->rank + i);
    kolo__simdev_hold(device_of(p), 1);
    h = dsum(p, "late", a, 16, NULL);
    dexpect_ok(p, h, NULL, "an allreduce in flight at shutdown");
    g_late[p->rank] = a;
    pthread_create(&g_releaser[p->rank], NULL, release_later, p);
    /* The body returns: the harness shuts the rank down. */
}

START_TEST(shutdown_waits_for_work_in_flight)
{
    int n = 2;
    kolo__ops_device_use(dev);
    run_job(n, body_shutdown);
    for (int r = 0; r < n; r++) {
        pthread_join(g_releaser[r], NULL);
        for (int i = 0; i < 16; i++)
            ck_assert_msg(g_late[r][i] == (float)(n * i + 1),
                          "rank %d: late[%d] = %g after shutdown", r, i,
                          (double)g_late[r][i]);
        kolo__simdev_free(g_late[r]);
    }
}
END_TEST

/* ---- the timeline's device side ------------------------------------------ */

/* The timeline files of the timeline test, one per rank. */
static char g_tl_dir[512];

/* The value of the number after `"key":` in the event `ev` (up to its
 * closing brace), or -1. */
static long long json_num(const char *ev, const char *key)
{
    char pat[64];
    const char *end = strchr(ev, '}'), *at;

    snprintf(pat, sizeof(pat), "\"%s\":", key);
    at = strstr(ev, pat);
    if (at == NULL || (end != NULL && at > end))
        return -1;
    return strtoll(at + strlen(pat), NULL, 10);
}

/* The pid of the lane of `tensor` in the file's text, or -1. */
static int lane_of(const char *text, const char *tensor)
{
    char pat[160];
    const char *at;

    snprintf(pat, sizeof(pat), "\"args\":{\"name\":\"%s\"}}", tensor);
    for (at = strstr(text, pat); at != NULL; at = strstr(at + 1, pat)) {
        const char *ev = at;
        while (ev > text && *ev != '{')
            ev--;
        if (strncmp(ev, "{\"name\":\"process_name\"", 22) == 0)
            return (int)json_num(ev, "pid");
    }
    return -1;
}

/* Over the device spans `phase` on the lane `pid`, row `tid`: how many,
 * the shortest and the longest (microseconds). */
static int device_spans(const char *text, int pid, int tid, const char *phase,
                        long long *min_dur, long long *max_dur)
{
    char pat[96];
    int n = 0;

    snprintf(pat, sizeof(pat), "{\"name\":\"%s\",\"cat\":\"device\",\"ph\":\"X\"",
             phase);
    *min_dur = -1;
    *max_dur = -1;
    for (const char *at = strstr(text, pat); at != NULL;
         at = strstr(at + 1, pat)) {
        long long d = json_num(at, "dur");
        if (json_num(at, "pid") != pid || json_num(at, "tid") != tid)
            continue;
        n++;
        if (*min_dur < 0 || d < *min_dur)
            *min_dur = d;
        if (d > *max_dur)
            *max_dur = d;
    }
    return n;
}

/* How many of the device spans `phase` on lane `pid` start at or after
 * the instant `mark` of the same step (the n-th of each, in time). */
static int starts_after(const char *text, int pid, const char *mark,
                        const char *phase)
{
    long long marks[16], spans[16];
    int nm = 0, ns = 0, ok = 0;
    char pm[96], ps[96];

    snprintf(pm, sizeof(pm), "{\"name\":\"%s\",\"ph\":\"i\"", mark);
    snprintf(ps, sizeof(ps), "{\"name\":\"%s\",\"cat\":\"device\"", phase);
    for (const char *at = strstr(text, pm); at != NULL && nm < 16;
         at = strstr(at + 1, pm))
        if (json_num(at, "pid") == pid)
            marks[nm++] = json_num(at, "ts");
    for (const char *at = strstr(text, ps); at != NULL && ns < 16;
         at = strstr(at + 1, ps))
        if (json_num(at, "pid") == pid)
            spans[ns++] = json_num(at, "ts");
    /* Both lists are in file order; a step's spans are written after its
     * instant, but keep to time order. */
    for (int i = 1; i < nm; i++)
        for (int j = i; j > 0 && marks[j] < marks[j - 1]; j--) {
            long long t = marks[j]; marks[j] = marks[j - 1]; marks[j - 1] = t;
        }
    for (int i = 1; i < ns; i++)
        for (int j = i; j > 0 && spans[j] < spans[j - 1]; j--) {
            long long t = spans[j]; spans[j] = spans[j - 1]; spans[j - 1] = t;
        }
    for (int i = 0; i < nm && i < ns; i++)
        ok += spans[i] >= marks[i] && (i + 1 >= nm || spans[i] < marks[i + 1]);
    return ok;
}

#define TL_STEPS 3
#define TL_FILL_US 30000 /* the program's work before each step's input */
#define TL_HOLD_US 40000 /* the device held while the program's stream waits */

/* Three steps of two tensors with the timeline recording. Each step, the
 * program's stream works 30 ms on the first tensor's input before kolo
 * may read it (an instant FILLED marks when it was done); the second
 * tensor is queued while kolo's stream is held, and the program's stream,
 * waiting for it, waits until the device goes on 40 ms later
 * (WAIT_FOR_DATA and PROGRAM_STREAM_WAIT). Only causes are checked, not
 * how long anything took beyond what the test itself held. */
static void body_timeline(prank_t *p)
{
    int n = p->job->size, me = p->rank;
    void *stream = kolo__simdev_stream_new(device_of(p));
    float *a = dmalloc(p, 8 * sizeof(float)), *b = dmalloc(p, 8 * sizeof(float));
    char path[600];
    kolo__err_t err;

    snprintf(path, sizeof(path), "%s/rank%d.json", g_tl_dir, me);
    EXPECT(p, kolo__timeline_start(p->rt.timeline, path, 0, &err) == KOLO_OK,
           "rank %d: the timeline did not start: %s", me, err.msg);
    for (int step = 0; step < TL_STEPS; step++) {
        fill_t f = {a, 8, (float)(me + step), TL_FILL_US, 0};
        kolo_handle_t ha, hb;

        usleep(TL_FILL_US / 3); /* the step's host work */
        kolo__simdev_launch(stream, device_of(p), fill_run, &f);
        ha = dsum(p, "grad.a", a, 8, stream);
        dexpect_ok(p, ha, stream, "grad.a");
        kolo__simdev_sync(stream, device_of(p));
        /* When the program's work on the input was done, on the lane. */
        kolo__tl_instant(p->rt.timeline, "grad.a", "FILLED", f.done_us);
        pthread_barrier_wait(&p->job->bar);
        kolo__simdev_hold(device_of(p), 1);
        for (int i = 0; i < 8; i++)
            b[i] = (float)(me * step + i);
        hb = dsum(p, "grad.b", b, 8, stream);
        EXPECT(p, poll_done(p, hb) == KOLO_OK, "rank %d: grad.b did not "
               "complete while the device was held", me);
        dexpect_ok(p, hb, stream, "grad.b");
        pthread_barrier_wait(&p->job->bar);
        usleep(TL_HOLD_US);
        kolo__simdev_hold(device_of(p), 0);
        kolo__simdev_sync(stream, device_of(p));
        for (int i = 0; i < 8; i++) {
            float wa = 0, wb = 0;
            for (int r = 0; r < n; r++) {
                wa += (float)(r + step);
                wb += (float)(r * step + i);
            }
            EXPECT(p, a[i] == wa && b[i] == wb, "rank %d step %d: [%d] = %g "
                   "and %g, expected %g and %g", me, step, i, (double)a[i],
                   (double)b[i], (double)wa, (double)wb);
        }
    }
    kolo__simdev_stream_free(stream);
    kolo__simdev_free(a);
    kolo__simdev_free(b);
    /* The harness shuts the rank down: the set writes what the device
     * passed, then the timeline is closed. */
}

START_TEST(device_times_in_the_timeline)
{
    const char *keep = getenv("KOLO_TEST_TIMELINE_DIR");
    int n = 2;

    if (keep != NULL && keep[0] != '\0') {
        snprintf(g_tl_dir, sizeof(g_tl_dir), "%s", keep);
    } else {
        snprintf(g_tl_dir, sizeof(g_tl_dir), "%s/kolo-devtl.XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        ck_assert_ptr_nonnull(mkdtemp(g_tl_dir));
    }
    kolo__ops_device_use(dev);
    run_job(n, body_timeline);
    for (int r = 0; r < n; r++) {
        char path[600], *text;
        long long lo, hi;
        int pa, pb, k;
        FILE *f;
        long len;

        snprintf(path, sizeof(path), "%s/rank%d.json", g_tl_dir, r);
        f = fopen(path, "r");
        ck_assert_msg(f != NULL, "rank %d wrote no timeline at %s", r, path);
        fseek(f, 0, SEEK_END);
        len = ftell(f);
        rewind(f);
        text = calloc(1, (size_t)len + 1);
        ck_assert(fread(text, 1, (size_t)len, f) == (size_t)len);
        fclose(f);
        pa = lane_of(text, "grad.a");
        pb = lane_of(text, "grad.b");
        ck_assert_msg(pa > 0 && pb > 0, "rank %d: no lanes for grad.a (%d) "
                      "and grad.b (%d)", r, pa, pb);
        /* Every step's collective ran on the device, under Horovod's
         * name, with its size. */
        k = device_spans(text, pa, 1, "NCCL_ALLREDUCE", &lo, &hi);
        ck_assert_msg(k == TL_STEPS, "rank %d: %d device NCCL_ALLREDUCE "
                      "spans of grad.a, expected %d", r, k, TL_STEPS);
        ck_assert_msg(device_spans(text, pb, 1, "NCCL_ALLREDUCE", &lo, &hi) ==
                          TL_STEPS, "rank %d: grad.b's device spans", r);
        ck_assert_msg(strstr(text, "\"tensors\":1,\"bytes\":32") != NULL,
                      "rank %d: the device span's args", r);
        /* grad.a: the device started each step's collective only after
         * the program's work on its input was done. */
        k = starts_after(text, pa, "FILLED", "NCCL_ALLREDUCE");
        ck_assert_msg(k == TL_STEPS, "rank %d: grad.a: %d of %d collectives "
                      "started on the device after the program's work on "
                      "their input", r, k, TL_STEPS);
        /* grad.b, queued on a held device: the device waited to start it
         * (from before the hold's 40 ms until the release), and the
         * program's stream, which reached its wait at once, waited too. */
        k = device_spans(text, pb, 1, "WAIT_FOR_DATA", &lo, &hi);
        ck_assert_msg(k == TL_STEPS && lo >= TL_HOLD_US,
                      "rank %d: grad.b's WAIT_FOR_DATA: %d spans, the "
                      "shortest %lld us (the device was held %d us)", r, k,
                      lo, TL_HOLD_US);
        k = device_spans(text, pb, 2, "PROGRAM_STREAM_WAIT", &lo, &hi);
        ck_assert_msg(k == TL_STEPS && lo >= TL_HOLD_US / 4,
                      "rank %d: grad.b's PROGRAM_STREAM_WAIT: %d spans, the "
                      "shortest %lld us (the device was held %d us)", r, k,
                      lo, TL_HOLD_US);
        ck_assert_msg(strstr(text, "\"name\":\"thread_name\",\"ph\":\"M\","
                                   "\"pid\":") != NULL &&
                          strstr(text, "\"args\":{\"name\":\"device\"}") != NULL &&
                          strstr(text, "\"args\":{\"name\":\"program stream\"}") != NULL,
                      "rank %d: the device rows are not named", r);
        free(text);
        if (keep == NULL || keep[0] == '\0')
            unlink(path);
    }
    if (keep == NULL || keep[0] == '\0')
        rmdir(g_tl_dir);
}
END_TEST

KOLO_UNIT_MAIN("device", 60,
        allreduce_on_the_device, other_collectives_on_the_device,
        completion_is_ordered_on_the_stream,
        inputs_wait_for_the_programs_stream,
        a_failure_after_completion_reaches_the_program,
        a_stuck_device_times_out, a_device_that_cannot_start_fails_every_rank,
        shutdown_waits_for_work_in_flight, device_times_in_the_timeline)
